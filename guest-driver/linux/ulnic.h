/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ulnic: what the driver's files share: the device, an open file, an
 * endpoint, and the PIO windows' entry points (ulnic_pio.c).
 */
#ifndef ULNIC_H
#define ULNIC_H

#include <linux/completion.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "ulnic_abi.h"

#define ULNIC_CMD_TIMEOUT (10 * HZ)
#define ULNIC_CMD_BUF_SIZE 1024
/* Notification buffers posted at most (8 bytes each). */
#define ULNIC_NOTIFY_MAX 256

struct ulnic_file;

/* PIO windows and imports this node maps, by id (spec 6.2, 9). */
#define ULNIC_PIO_SLOTS 32

struct ulnic_pio_slot {
	u32 id;			/* window or import id; 0: a free slot */
	u32 ep;			/* the endpoint that made it */
	u64 offset;		/* in the aperture */
	u64 len;
	const struct ulnic_file *owner;
	bool unmapped;		/* the device took it away */
	bool zapped;		/* and its user mappings are gone */
};

struct ulnic_pio_space {
	u64 addr;		/* guest-physical address of the aperture */
	u64 len;		/* 0: the device offers none */
	spinlock_t lock;	/* the slots; taken from the notification callback */
	struct ulnic_pio_slot slots[ULNIC_PIO_SLOTS];
	struct work_struct zap_work;
};


/* One endpoint: memory the driver allocated, owned by one open file. */
struct ulnic_ep {
	u32 id;
	void *ctrl;		/* physically contiguous */
	size_t ctrl_len;
	void *seg;		/* vmalloc_user: any pages */
	size_t seg_len;
	/* Live user mappings: the memory is never freed while mapped. */
	atomic_t maps;
};

struct ulnic {
	struct kref ref;
	struct virtio_device *vdev;	/* NULL once the device is gone */
	struct miscdevice misc;
	char name[16];
	int index;
	/* Endpoint id -> owning file, and pending notifications. */
	spinlock_t owners_lock;
	struct ulnic_file **owners;
	unsigned long *notified;
	wait_queue_head_t wq;
	/* Watchers of each endpoint (ulnic_watch.c), under owners_lock. */
	struct list_head *watches;
	struct virtqueue **vqs;
	unsigned int nvqs;
	u32 node;
	u32 nodes;
	u32 endpoints;
	/* Endpoint memory allocated and not yet freed (see mem_limit_mb). */
	atomic64_t mem_bytes;

	/*
	 * Queue lifetime for doorbells: IOC_KICK holds it for reading, so a
	 * kick never waits behind a slow command; remove() for writing.
	 */
	struct rw_semaphore vq_sem;

	/* One control command at a time; the response lands in cmd_buf. */
	struct mutex cmd_lock;
	struct completion cmd_done;
	u8 *cmd_buf;
	/*
	 * Set by remove() once the device is reset: a command in flight will
	 * never be answered, and ends with ENODEV rather than a timeout.
	 */
	bool removing;

	/* Notification records, as many as the queue holds (spec 6). */
	struct ulnic_notify_record *notify_bufs;
	unsigned long notifications;
	/*
	 * Bumped, under cmd_lock, when the device says it forgot this node's
	 * objects (the RESET record, spec 2.5): files opened before are stale.
	 */
	u32 generation;
	struct work_struct reset_work;
	/* The latest RESET record's number, for ACK_RESET (spec 2.5). */
	u32 reset_number;
	/* Commands added to the control queue, mod 2^16 (its avail index). */
	u16 commands;

	/*
	 * Physical address of each doorbell queue's page (page-per-vq), by
	 * doorbell slot, or 0 when doorbells share pages and cannot be given
	 * to one process.
	 */
	phys_addr_t doorbell_pa[ULNIC_DOORBELL_QUEUES];
	/* Notification buffers posted (the queue's size, at most ULNIC_NOTIFY_MAX). */
	unsigned int notify_count;
	/* Buffers reposted since the notification queue was last kicked. */
	unsigned int notify_unkicked;
	/*
	 * Where doorbell pages are mapped (the device node's address space,
	 * set by the first doorbell mmap), so that remove() can revoke them:
	 * after removal the BAR behind them may belong to another device.
	 * A revoked doorbell faults in @dummy instead, so a late store lands
	 * in a page nobody reads rather than killing the process.
	 */
	struct address_space *mapping;
	struct page *dummy;

	/* PIO windows (spec 6.2, 9): ulnic_pio.c. */
	struct ulnic_pio_space pio;
};

/*
 * A domain's UTLB (spec 5.14): the table the device reads by physical
 * address, and the page each entry holds pinned.
 */
struct ulnic_utlb {
	__le64 *table;		/* physically contiguous; NULL until IOC_UTLB_INIT */
	size_t table_bytes;
	struct page **pages;	/* by entry */
	u32 entries;
	/* Pinned pages count against this process's RLIMIT_MEMLOCK. */
	struct mm_struct *mm;
};

/* An open /dev/ulnicN: one protection domain and its endpoints. */
struct ulnic_file {
	struct ulnic *u;
	/* The device's generation at open (see struct ulnic.generation). */
	u32 generation;
	u32 pd;
	/* The domain's doorbell queue and bitmap (spec 5.8). */
	u32 doorbell_queue;
	unsigned long *doorbell_bits;	/* one zeroed page */
	struct mutex lock;
	struct ulnic_ep **eps;	/* by endpoint id */
	struct ulnic_utlb utlb;	/* under lock */
};

/* ulnic_main.c */
void ulnic_put(struct ulnic *u);

static inline void ulnic_get(struct ulnic *u)
{
	kref_get(&u->ref);
}

/* ulnic_watch.c */
void ulnic_watch_notify(struct ulnic *u, u32 id);
void ulnic_watch_forget_locked(struct ulnic *u, u32 id);
void ulnic_watch_wake_all(struct ulnic *u);
long ulnic_watcher_new(struct ulnic *u, u32 __user *arg);
long ulnic_watch_ioctl(struct ulnic_file *uf, void __user *arg);

/* ulnic_pio.c */
void ulnic_pio_init(struct ulnic *u);
void ulnic_pio_stop(struct ulnic *u);
int ulnic_pio_before(struct ulnic *u, u32 opcode);
void ulnic_pio_after(struct ulnic *u, const struct ulnic_file *uf, u32 opcode,
		     const void *req, const void *result);
void ulnic_pio_unmapped(struct ulnic *u, u32 id);
void ulnic_pio_forget(struct ulnic *u, const struct ulnic_file *uf);
int ulnic_pio_mmap(struct ulnic_file *uf, struct file *f,
		   struct vm_area_struct *vma, u64 off);

#endif
