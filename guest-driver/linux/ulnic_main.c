// SPDX-License-Identifier: GPL-2.0
/*
 * ulnic: Linux driver for the ulnic emulated user-level NIC (docs/spec.md).
 *
 * Binds the device, sets up the control, notification and doorbell
 * virtqueues, and exposes /dev/ulnicN (spec 9): one protection domain per
 * open file, endpoints whose memory and doorbell page the driver maps into
 * the owning process only, and blocking through ioctl or poll.
 */
#include <linux/completion.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/poll.h>
#include <linux/scatterlist.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_pci.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "ulnic.h"

static DEFINE_IDA(ulnic_ida);

/* Fault injection for tests: while set, endpoint allocations fail (ENOMEM). */
static bool fail_alloc;
module_param(fail_alloc, bool, 0644);
MODULE_PARM_DESC(fail_alloc, "test only: make endpoint memory allocation fail");

/*
 * Endpoint memory is sized by the user and pinned in the kernel: without a
 * bound, a few large endpoints run a small guest out of memory and wake the
 * OOM killer. Past the budget, CREATE_EP is ENOMEM.
 */
static unsigned int mem_limit_mb;
module_param(mem_limit_mb, uint, 0644);
MODULE_PARM_DESC(mem_limit_mb, "endpoint memory per device in MiB (0: a quarter of RAM)");

static void ulnic_release_dev(struct kref *ref)
{
	struct ulnic *u = container_of(ref, struct ulnic, ref);

	kvfree(u->owners);
	kvfree(u->watches);
	bitmap_free(u->notified);
	kfree(u->notify_bufs);
	kfree(u->cmd_buf);
	kfree(u->vqs);
	if (u->dummy)
		__free_page(u->dummy);
	kfree(u);
}

void ulnic_put(struct ulnic *u)
{
	kref_put(&u->ref, ulnic_release_dev);
}

static void ulnic_control_done(struct virtqueue *vq)
{
	struct ulnic *u = vq->vdev->priv;

	complete(&u->cmd_done);
}

/* Posts notification buffer @i to the device. */
static int ulnic_post_notify(struct ulnic *u, unsigned int i)
{
	struct scatterlist sg;
	struct ulnic_notify_record *rec = &u->notify_bufs[i];

	sg_init_one(&sg, rec, sizeof(*rec));
	return virtqueue_add_inbuf(u->vqs[ULNIC_NOTIFY_QUEUE], &sg, 1, rec,
				   GFP_ATOMIC);
}

static void ulnic_notify_done(struct virtqueue *vq)
{
	struct ulnic *u = vq->vdev->priv;
	struct ulnic_notify_record *rec;
	unsigned int len;

	while ((rec = virtqueue_get_buf(vq, &len)) != NULL) {
		u32 ep = le32_to_cpu(rec->endpoint);

		u->notifications++;
		if (len >= sizeof(*rec) &&
		    le32_to_cpu(rec->reason) == ULNIC_NOTIFY_REASON_RESET) {
			/* Commands sleep: acknowledged from a work item. */
			WRITE_ONCE(u->reset_number, ep);
			schedule_work(&u->reset_work);
		} else if (len >= sizeof(*rec) &&
			   le32_to_cpu(rec->reason) == ULNIC_NOTIFY_REASON_PIO_UNMAPPED) {
			/* The record names a PIO window or import (spec 6). */
			ulnic_pio_unmapped(u, ep);
		} else if (len >= sizeof(*rec) && !rec->reason && ep < u->endpoints) {
			/*
			 * The device names the endpoint; trust only ids we have.
			 * A reason this driver does not know is ignored (spec 6).
			 */
			set_bit(ep, u->notified);
			wake_up_interruptible_all(&u->wq);
			ulnic_watch_notify(u, ep);
		}
		ulnic_post_notify(u, rec - u->notify_bufs);
		u->notify_unkicked++;
	}
	/*
	 * The device reads the available ring whenever it has a record to
	 * post, so a repost need not wake it (a kick is an exit to the
	 * hypervisor). It runs out only when every buffer holds a record not
	 * yet drained, and reposting those counts at least notify_count,
	 * which kicks (spec 6).
	 */
	if (u->notify_unkicked >= max(u->notify_count / 2, 1U)) {
		u->notify_unkicked = 0;
		virtqueue_kick(vq);
	}
}

/*
 * Runs one control command (spec 4). On success returns the number of result
 * bytes copied to @result; a device status other than OK is stored in
 * @status (which callers set to OK first) and becomes its errno. A command the device does not answer in time is
 * -ETIMEDOUT and breaks the device: its buffer may still be written, and a
 * late answer must not be read as the next command's, so every later command
 * is -EIO (spec 9).
 */
static int ulnic_command_locked(struct ulnic *u, const struct ulnic_file *uf,
				u32 opcode, const void *payload, size_t plen,
				void *result, size_t rlen, u32 *status)
{
	struct virtqueue *vq = u->vqs[ULNIC_CONTROL_QUEUE];
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	u8 *req = u->cmd_buf, *resp = u->cmd_buf + ULNIC_CMD_BUF_SIZE / 2;
	struct ulnic_cmd_header *hdr = (struct ulnic_cmd_header *)req;
	struct ulnic_resp_header *rhdr = (struct ulnic_resp_header *)resp;
	unsigned long answered;
	unsigned int len;
	int err;

	if (sizeof(*hdr) + plen > ULNIC_CMD_BUF_SIZE / 2 ||
	    sizeof(*rhdr) + rlen > ULNIC_CMD_BUF_SIZE / 2)
		return -EINVAL;

	if (!u->vdev || READ_ONCE(u->removing)) {
		err = -ENODEV;
		goto out;
	}
	/* A stale file's numbers name nothing, or someone else's objects. */
	if (uf && uf->generation != u->generation) {
		err = -ENODEV;
		goto out;
	}
	if (virtqueue_is_broken(vq)) {
		err = -EIO;
		goto out;
	}
	hdr->opcode = cpu_to_le32(opcode);
	hdr->reserved = 0;
	if (plen)
		memcpy(hdr + 1, payload, plen);
	sg_init_one(&out, req, sizeof(*hdr) + plen);
	sg_init_one(&in, resp, sizeof(*rhdr) + rlen);
	reinit_completion(&u->cmd_done);
	err = virtqueue_add_sgs(vq, sgs, 1, 1, u, GFP_KERNEL);
	if (err)
		goto out;
	u->commands++;
	virtqueue_kick(vq);
	answered = wait_for_completion_timeout(&u->cmd_done, ULNIC_CMD_TIMEOUT);
	if (READ_ONCE(u->removing)) {
		/* Reset by remove(): it can no longer touch the buffer. */
		err = -ENODEV;
		goto out;
	}
	if (!answered || !virtqueue_get_buf(vq, &len)) {
		/* The buffer is still the device's: it can never be reused. */
		dev_err(&u->vdev->dev, "command %#x timed out\n", opcode);
		virtio_break_device(u->vdev);
		err = -ETIMEDOUT;
		goto out;
	}
	if (len < sizeof(*rhdr)) {
		err = -EPROTO;
		goto out;
	}
	*status = le32_to_cpu(rhdr->status);
	if (*status != ULNIC_STATUS_OK) {
		err = -ulnic_status_errno(*status);
		goto out;
	}
	len -= sizeof(*rhdr);
	err = min_t(size_t, len, rlen);
	memcpy(result, rhdr + 1, err);
out:
	return err;
}

/*
 * The device tells a running driver from a new one after a ring stop by
 * the control queue's avail index (0: new, spec 2.5), so it never rests
 * at a multiple of 65536: one more GET_INFO when it would. Under cmd_lock.
 */
static void ulnic_keep_index_off_zero(struct ulnic *u)
{
	struct ulnic_device_info info;
	u32 status = 0;

	if (!u->commands)
		ulnic_command_locked(u, NULL, ULNIC_CMD_GET_INFO, NULL, 0, &info,
				     sizeof(info), &status);
}

/*
 * Runs one command for @uf (NULL: for the driver itself), one at a time;
 * see ulnic_command_locked().
 */
static int ulnic_command(struct ulnic *u, const struct ulnic_file *uf,
			 u32 opcode, const void *payload, size_t plen,
			 void *result, size_t rlen, u32 *status)
{
	int err;

	mutex_lock(&u->cmd_lock);
	err = ulnic_command_locked(u, uf, opcode, payload, plen, result, rlen,
				   status);
	ulnic_keep_index_off_zero(u);
	mutex_unlock(&u->cmd_lock);
	return err;
}

/* Whether @uf's objects are gone: its device removed, or reset (spec 2.5). */
static bool ulnic_stale(const struct ulnic_file *uf)
{
	return !READ_ONCE(uf->u->vdev) ||
	       uf->generation != READ_ONCE(uf->u->generation);
}

static int ulnic_cmd_ep(struct ulnic_file *uf, u32 opcode, u32 id)
{
	struct ulnic_object_id p = { .id = cpu_to_le32(id) };
	u32 status = 0;
	int err = ulnic_command(uf->u, uf, opcode, &p, sizeof(p), NULL, 0,
				&status);

	return err < 0 ? err : 0;
}

static u64 ulnic_mem_limit(void)
{
	u64 mb = READ_ONCE(mem_limit_mb);

	return mb ? mb << 20 : ((u64)totalram_pages() << PAGE_SHIFT) / 4;
}

/*
 * The endpoint memory budget in sysfs (spec 9), so libraries can size new
 * endpoints before the budget runs out. The misc device's drvdata is its
 * struct miscdevice.
 */
static struct ulnic *ulnic_of_dev(struct device *dev)
{
	struct miscdevice *misc = dev_get_drvdata(dev);

	return container_of(misc, struct ulnic, misc);
}

static ssize_t mem_bytes_show(struct device *dev, struct device_attribute *attr,
			      char *buf)
{
	return sysfs_emit(buf, "%lld\n",
			  (long long)atomic64_read(&ulnic_of_dev(dev)->mem_bytes));
}
static DEVICE_ATTR_RO(mem_bytes);

static ssize_t mem_limit_bytes_show(struct device *dev,
				    struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%llu\n", (unsigned long long)ulnic_mem_limit());
}
static DEVICE_ATTR_RO(mem_limit_bytes);

static struct attribute *ulnic_attrs[] = {
	&dev_attr_mem_bytes.attr,
	&dev_attr_mem_limit_bytes.attr,
	NULL,
};
ATTRIBUTE_GROUPS(ulnic);

/* Frees @ep and gives its size back to @u's budget (a leaked one keeps it). */
static void ulnic_free_ep(struct ulnic *u, struct ulnic_ep *ep)
{
	if (ep->ctrl)
		free_pages_exact(ep->ctrl, ep->ctrl_len);
	vfree(ep->seg);
	atomic64_sub(ep->ctrl_len + ep->seg_len, &u->mem_bytes);
	kfree(ep);
}

static int ulnic_open(struct inode *inode, struct file *f)
{
	struct ulnic *u = container_of(f->private_data, struct ulnic, misc);
	struct ulnic_file *uf;
	struct ulnic_create_pd req;
	struct ulnic_pd_created pd;
	u32 status = 0;
	int err;

	uf = kzalloc(sizeof(*uf), GFP_KERNEL);
	if (!uf)
		return -ENOMEM;
	uf->generation = READ_ONCE(u->generation);
	uf->eps = kvcalloc(u->endpoints, sizeof(*uf->eps), GFP_KERNEL);
	uf->doorbell_bits = (unsigned long *)get_zeroed_page(GFP_KERNEL);
	if (!uf->eps || !uf->doorbell_bits) {
		err = -ENOMEM;
		goto err_free;
	}
	req.doorbell_gpa = cpu_to_le64(virt_to_phys(uf->doorbell_bits));
	err = ulnic_command(u, uf, ULNIC_CMD_CREATE_PD, &req, sizeof(req), &pd,
			    sizeof(pd), &status);
	if (err < (int)sizeof(pd)) {
		/* Refused or unanswered: the device may hold the page. */
		if (err == -ETIMEDOUT || err == -EIO)
			uf->doorbell_bits = NULL;
		err = err < 0 ? err : -EPROTO;
		goto err_free;
	}
	uf->pd = le32_to_cpu(pd.id);
	uf->doorbell_queue = le32_to_cpu(pd.doorbell_queue);
	/*
	 * The device names the queue; trust only doorbell queues we have.
	 * Without one the domain's endpoints could never be rung: give it back.
	 */
	if (uf->doorbell_queue < ULNIC_FIRST_DOORBELL_QUEUE ||
	    uf->doorbell_queue >= u->nvqs) {
		struct ulnic_object_id id = { .id = pd.id };

		pr_err("%s: device gave doorbell queue %u\n", u->name,
		       uf->doorbell_queue);
		if (ulnic_command(u, uf, ULNIC_CMD_DESTROY_PD, &id, sizeof(id),
				  NULL, 0, &status) < 0)
			uf->doorbell_bits = NULL;	/* the device may still read it */
		err = -EPROTO;
		goto err_free;
	}
	uf->u = u;
	mutex_init(&uf->lock);
	kref_get(&u->ref);
	f->private_data = uf;
	return 0;

err_free:
	if (uf->doorbell_bits)
		free_page((unsigned long)uf->doorbell_bits);
	kvfree(uf->eps);
	kfree(uf);
	return err;
}

/*
 * Forgets that @uf owns @id; the device no longer touches its memory. After
 * a reset (spec 2.5) the id may be another file's already: left alone.
 */
static void ulnic_disown(struct ulnic_file *uf, u32 id)
{
	struct ulnic *u = uf->u;

	spin_lock_irq(&u->owners_lock);
	if (u->owners[id] == uf) {
		u->owners[id] = NULL;
		clear_bit(id, u->notified);
		ulnic_watch_forget_locked(u, id);
	}
	spin_unlock_irq(&u->owners_lock);
}

/*
 * Unpins the non-NULL pages of @pages[0..n) (they may have been written)
 * and gives them back to @mm's locked-memory account.
 */
static void ulnic_unpin(struct mm_struct *mm, struct page **pages, u32 n)
{
	u32 i, kept = 0;

	for (i = 0; i < n; i++)
		if (pages[i])
			pages[kept++] = pages[i];
	if (kept) {
		unpin_user_pages_dirty_lock(pages, kept, true);
		account_locked_vm(mm, kept, false);
	}
}

/* Frees the UTLB once the device no longer reads it (after DESTROY_PD). */
static void ulnic_utlb_free(struct ulnic_utlb *t)
{
	if (!t->table)
		return;
	ulnic_unpin(t->mm, t->pages, t->entries);
	kvfree(t->pages);
	free_pages_exact(t->table, t->table_bytes);
	t->table = NULL;
	mmdrop(t->mm);
}

static int ulnic_release(struct inode *inode, struct file *f)
{
	struct ulnic_file *uf = f->private_data;
	struct ulnic *u = uf->u;
	struct ulnic_object_id pd = { .id = cpu_to_le32(uf->pd) };
	u32 status = 0, i;
	int err;

	/* Destroying the domain destroys its endpoints in the device. */
	err = ulnic_command(u, uf, ULNIC_CMD_DESTROY_PD, &pd, sizeof(pd), NULL,
			    0, &status);
	ulnic_pio_forget(u, uf);
	for (i = 0; i < u->endpoints; i++) {
		if (!uf->eps[i])
			continue;
		ulnic_disown(uf, i);
		/*
		 * If the device could not be told, it may still write this
		 * memory: leak it rather than hand it back to the allocator.
		 * A stale file's objects the device forgot already (RESET:
		 * before this driver took the record).
		 */
		if (err >= 0 || status == ULNIC_STATUS_RESET || ulnic_stale(uf))
			ulnic_free_ep(u, uf->eps[i]);
	}
	/* Same rule for the table, the pages it pins and the doorbell bitmap. */
	if (err >= 0 || status == ULNIC_STATUS_RESET || ulnic_stale(uf)) {
		ulnic_utlb_free(&uf->utlb);
		free_page((unsigned long)uf->doorbell_bits);
	}
	kvfree(uf->eps);
	kfree(uf);
	kref_put(&u->ref, ulnic_release_dev);
	return 0;
}

/* The caller's endpoint @id, or NULL when it is not theirs. */
static struct ulnic_ep *ulnic_owned(struct ulnic_file *uf, u32 id)
{
	if (id >= uf->u->endpoints)
		return NULL;
	/* KICK, WAIT and poll look without the file's lock. */
	return READ_ONCE(uf->eps[id]);
}

static long ulnic_create_ep(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic *u = uf->u;
	struct ulnic_ioc_create_ep a;
	struct ulnic_create_endpoint req;
	struct ulnic_endpoint_created out;
	u32 send, recv, fre, event, status = 0, id, pages, i;
	struct ulnic_ep *ep;
	u64 seg_bytes, ctrl_bytes;
	__le64 *table;
	long err;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	send = le32_to_cpu(a.send_entries);
	recv = le32_to_cpu(a.recv_entries);
	fre = le32_to_cpu(a.free_entries);
	event = le32_to_cpu(a.event_entries);
	seg_bytes = le64_to_cpu(a.segment_bytes);
	if (!send || !recv || !fre || !event ||
	    send > ULNIC_MAX_RING_ENTRIES || recv > ULNIC_MAX_RING_ENTRIES ||
	    fre > ULNIC_MAX_RING_ENTRIES || event > ULNIC_MAX_RING_ENTRIES ||
	    !seg_bytes || seg_bytes > ULNIC_MAX_SEGMENT_BYTES)
		return -EINVAL;
	ctrl_bytes = ULNIC_CTRL_RING_OFFSET +
		     (u64)send * sizeof(struct ulnic_send_desc) +
		     (u64)recv * sizeof(struct ulnic_recv_desc) +
		     (u64)fre * sizeof(struct ulnic_free_desc) +
		     (u64)event * sizeof(struct ulnic_event_record);
	if (ctrl_bytes > ULNIC_MAX_CTRL_BYTES)
		return -EINVAL;
	ctrl_bytes = PAGE_ALIGN(ctrl_bytes);
	seg_bytes = PAGE_ALIGN(seg_bytes);
	pages = seg_bytes >> PAGE_SHIFT;

	ep = kzalloc(sizeof(*ep), GFP_KERNEL);
	if (!ep)
		return -ENOMEM;
	ep->ctrl_len = ctrl_bytes;
	ep->seg_len = seg_bytes;
	if (atomic64_add_return(ctrl_bytes + seg_bytes, &u->mem_bytes) >
	    ulnic_mem_limit()) {
		atomic64_sub(ctrl_bytes + seg_bytes, &u->mem_bytes);
		kfree(ep);
		return -ENOMEM;
	}
	/* Sized by the user: a failure is ENOMEM for them, not a splat. */
	if (!READ_ONCE(fail_alloc))
		ep->ctrl = alloc_pages_exact(ctrl_bytes, GFP_KERNEL | __GFP_ZERO |
					     __GFP_NOWARN);
	ep->seg = vmalloc_user(seg_bytes);
	/* Linear memory: the device reads the table by physical address. */
	table = kmalloc_array(pages, sizeof(*table), GFP_KERNEL | __GFP_NOWARN);
	if (!ep->ctrl || !ep->seg || !table) {
		err = -ENOMEM;
		goto err_free;
	}
	for (i = 0; i < pages; i++)
		table[i] = cpu_to_le64(page_to_phys(vmalloc_to_page(ep->seg + ((size_t)i << PAGE_SHIFT))));

	req = (struct ulnic_create_endpoint) {
		.pd = cpu_to_le32(uf->pd),
		.send_entries = cpu_to_le32(send),
		.recv_entries = cpu_to_le32(recv),
		.free_entries = cpu_to_le32(fre),
		.event_entries = cpu_to_le32(event),
		.seg_pages = cpu_to_le32(pages),
		.ctrl_gpa = cpu_to_le64(virt_to_phys(ep->ctrl)),
		.ctrl_len = cpu_to_le64(ctrl_bytes),
		.seg_table_gpa = cpu_to_le64(virt_to_phys(table)),
	};

	mutex_lock(&uf->lock);
	err = ulnic_command(u, uf, ULNIC_CMD_CREATE_ENDPOINT, &req, sizeof(req),
			    &out, sizeof(out), &status);
	if (err < (long)sizeof(out)) {
		mutex_unlock(&uf->lock);
		if (err == -ETIMEDOUT) {
			/*
			 * The rule everywhere: memory the device was given is
			 * never freed after a timeout, as it may still write it.
			 */
			pr_warn("ulnic: leaking an endpoint's memory after a command timeout\n");
			kfree(ep);
			return err;
		}
		err = err < 0 ? err : -EPROTO;
		goto err_free;
	}
	id = le32_to_cpu(out.id);
	if (id >= u->endpoints || uf->eps[id]) {
		/* The device holds an endpoint on this memory: leak it. */
		mutex_unlock(&uf->lock);
		pr_warn("ulnic: device answered CREATE_ENDPOINT with unusable id %u\n", id);
		kfree(table);
		return -EPROTO;
	}
	ep->id = id;
	WRITE_ONCE(uf->eps[id], ep);
	spin_lock_irq(&u->owners_lock);
	u->owners[id] = uf;
	clear_bit(id, u->notified);
	spin_unlock_irq(&u->owners_lock);
	mutex_unlock(&uf->lock);
	kfree(table);

	a.id = out.id;
	a.doorbell_queue = out.doorbell_queue;
	a.ctrl_len = cpu_to_le64(ctrl_bytes);
	a.segment_len = cpu_to_le64(seg_bytes);
	if (copy_to_user(arg, &a, sizeof(a)))
		return -EFAULT;
	return 0;

err_free:
	kfree(table);
	ulnic_free_ep(u, ep);
	return err;
}

static long ulnic_destroy_ep(struct ulnic_file *uf, u32 id)
{
	struct ulnic_ep *ep;
	long err;

	mutex_lock(&uf->lock);
	ep = ulnic_owned(uf, id);
	if (!ep) {
		mutex_unlock(&uf->lock);
		return -EPERM;
	}
	if (atomic_read(&ep->maps)) {
		/* Unmap first: freeing mapped pages would hand them to the user. */
		mutex_unlock(&uf->lock);
		return -EBUSY;
	}
	err = ulnic_cmd_ep(uf, ULNIC_CMD_DESTROY_ENDPOINT, id);
	if (!err) {
		WRITE_ONCE(uf->eps[id], NULL);
		ulnic_disown(uf, id);
		ulnic_free_ep(uf->u, ep);
	}
	mutex_unlock(&uf->lock);
	return err;
}

static long ulnic_passthrough(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic_ioc_command *a;
	/* Every command passed through names an endpoint first. */
	const struct ulnic_object_id *ep_id;
	u32 opcode, in_len, status = 0, id;
	u8 req[sizeof(struct ulnic_import_pio)];
	long err;

	a = kmalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	if (copy_from_user(a, arg, sizeof(*a))) {
		err = -EFAULT;
		goto out;
	}
	ep_id = (const struct ulnic_object_id *)a->data;
	opcode = le32_to_cpu(a->opcode);
	in_len = le32_to_cpu(a->in_len);
	id = le32_to_cpu(ep_id->id);
	switch (opcode) {
	case ULNIC_CMD_BIND_PORT:
	case ULNIC_CMD_SET_FILTER:
	case ULNIC_CMD_ARM:
	case ULNIC_CMD_DISARM:
	case ULNIC_CMD_GET_STATS:
	/* The queue must be in this file's domain: the device checks. */
	case ULNIC_CMD_SET_EVENT_QUEUE:
	case ULNIC_CMD_EXPORT:
	case ULNIC_CMD_REVOKE:
	case ULNIC_CMD_EXPORT_BUFFER:
	case ULNIC_CMD_SET_TRIPWIRE:
	case ULNIC_CMD_CLEAR_TRIPWIRE:
		break;
	/* Recorded for mmap (ulnic_pio.c); windows the device maps. */
	case ULNIC_CMD_EXPORT_PIO:
	case ULNIC_CMD_IMPORT_PIO:
	case ULNIC_CMD_REVOKE_PIO:
	case ULNIC_CMD_RELEASE_PIO:
		err = ulnic_pio_before(uf->u, opcode);
		if (err)
			goto out;
		break;
	default:
		err = -EOPNOTSUPP;
		goto out;
	}
	if (in_len < sizeof(*ep_id) || in_len > sizeof(a->data)) {
		err = -EINVAL;
		goto out;
	}
	mutex_lock(&uf->lock);
	if (!ulnic_owned(uf, id)) {
		mutex_unlock(&uf->lock);
		err = -EPERM;
		goto out;
	}
	/* The result overwrites the request: PIO records need both. */
	memcpy(req, a->data, min_t(size_t, in_len, sizeof(req)));
	err = ulnic_command(uf->u, uf, opcode, a->data, in_len, a->data,
			    sizeof(a->data) - sizeof(struct ulnic_resp_header),
			    &status);
	if (err >= 0 && status == ULNIC_STATUS_OK && in_len <= sizeof(req))
		ulnic_pio_after(uf->u, uf, opcode, req, a->data);
	mutex_unlock(&uf->lock);
	a->status = cpu_to_le32(status);
	a->out_len = cpu_to_le32(err < 0 ? 0 : (u32)err);
	if (err < 0 && status != ULNIC_STATUS_OK && status != ULNIC_STATUS_RESET)
		err = 0;	/* the device's status says why */
	if (err >= 0)
		err = copy_to_user(arg, a, sizeof(*a)) ? -EFAULT : 0;
out:
	kfree(a);
	return err;
}

static long ulnic_wait(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic *u = uf->u;
	struct ulnic_ioc_wait w;
	u32 id;
	long left;

	if (copy_from_user(&w, arg, sizeof(w)))
		return -EFAULT;
	id = le32_to_cpu(w.id);
	if (!ulnic_owned(uf, id))
		return -EPERM;
	left = wait_event_interruptible_timeout(u->wq,
			ulnic_stale(uf) || test_and_clear_bit(id, u->notified),
			msecs_to_jiffies(le32_to_cpu(w.timeout_ms)));
	if (left < 0)
		return left;
	if (ulnic_stale(uf))
		return -ENODEV;
	return left > 0 ? 1 : 0;
}

/*
 * IOC_TAKE_NOTIFIED: takes every notification of the file's endpoints at
 * once, for a process sleeping in poll or epoll on the file for many of
 * them (spec 9). A report that cannot be copied out is lost; the rings
 * still hold what the notifications were about.
 */
static long ulnic_take_notified(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic *u = uf->u;
	struct ulnic_ioc_notified *n;
	u32 i, last;
	long err = 0;

	if (ulnic_stale(uf))
		return -ENODEV;
	n = kzalloc(sizeof(*n), GFP_KERNEL);
	if (!n)
		return -ENOMEM;
	last = min_t(u32, u->endpoints, ARRAY_SIZE(n->bits) * ULNIC_BITMAP_WORD_BITS);
	/* Only the notified endpoints are looked at, not all 4096. */
	for_each_set_bit(i, u->notified, last)
		if (READ_ONCE(uf->eps[i]) && test_and_clear_bit(i, u->notified))
			n->bits[ULNIC_BITMAP_WORD(i)] |= cpu_to_le64(ULNIC_BITMAP_MASK(i));
	if (copy_to_user(arg, n, sizeof(*n)))
		err = -EFAULT;
	kfree(n);
	return err;
}

/* IOC_UTLB_INIT: gives the file's domain a translation table (spec 9). */
static long ulnic_utlb_init(struct ulnic_file *uf, u32 __user *arg)
{
	struct ulnic_utlb t = {};
	struct ulnic_utlb_set_table req;
	u32 entries, status = 0;
	long err;

	if (get_user(entries, arg))
		return -EFAULT;
	if (!entries || (u64)entries * sizeof(*t.table) > ULNIC_MAX_UTLB_TABLE_BYTES)
		return -EINVAL;
	t.entries = entries;
	t.table_bytes = PAGE_ALIGN((size_t)entries * sizeof(*t.table));
	t.table = alloc_pages_exact(t.table_bytes, GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN);
	t.pages = kvcalloc(entries, sizeof(*t.pages), GFP_KERNEL);
	if (!t.table || !t.pages) {
		err = -ENOMEM;
		goto err_free;
	}
	req = (struct ulnic_utlb_set_table) {
		.pd = cpu_to_le32(uf->pd),
		.entries = cpu_to_le32(entries),
		.table_gpa = cpu_to_le64(virt_to_phys(t.table)),
	};

	mutex_lock(&uf->lock);
	if (uf->utlb.table) {
		mutex_unlock(&uf->lock);
		err = -EEXIST;
		goto err_free;
	}
	err = ulnic_command(uf->u, uf, ULNIC_CMD_UTLB_SET_TABLE, &req, sizeof(req),
			    NULL, 0, &status);
	if (err < 0) {
		mutex_unlock(&uf->lock);
		if (err == -ETIMEDOUT) {
			/* The device may read the table: leak it (the rule). */
			kvfree(t.pages);
			return err;
		}
		goto err_free;
	}
	t.mm = current->mm;
	mmgrab(t.mm);
	uf->utlb = t;
	mutex_unlock(&uf->lock);
	return 0;

err_free:
	kvfree(t.pages);
	if (t.table)
		free_pages_exact(t.table, t.table_bytes);
	return err;
}

/*
 * IOC_UTLB_INSTALL: pins the caller's pages and installs them (spec 9).
 * The old pages are unpinned only after the device dropped its cached
 * translations of them (UTLB_INVALIDATE).
 */
static long ulnic_utlb_install(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic_ioc_utlb_install a;
	struct ulnic_utlb_invalidate req;
	u32 first, count, status = 0, i;
	struct page **pages;
	u64 va;
	long err;
	int pinned;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	first = le32_to_cpu(a.first);
	count = le32_to_cpu(a.count);
	va = le64_to_cpu(a.va);
	/* No table holds more entries than the largest the driver allocates. */
	if (!count || count > ULNIC_MAX_UTLB_TABLE_BYTES / sizeof(*uf->utlb.table) ||
	    va & ~PAGE_MASK)
		return -EINVAL;
	pages = kvcalloc(count, sizeof(*pages), GFP_KERNEL | __GFP_NOWARN);
	if (!pages)
		return -ENOMEM;

	/*
	 * Check the range and charge RLIMIT_MEMLOCK before pinning anything,
	 * so that a refused request cannot fault in and pin @count pages
	 * first (enough to run a small guest out of memory).
	 */
	mutex_lock(&uf->lock);
	if (!uf->utlb.table || first >= uf->utlb.entries ||
	    count > uf->utlb.entries - first) {
		err = -EINVAL;
		goto err_unlock;
	}
	/* Like other long-term pins (RDMA, VFIO): within RLIMIT_MEMLOCK. */
	err = account_locked_vm(uf->utlb.mm, count, true);
	if (err)
		goto err_unlock;
	pinned = pin_user_pages_fast(va, count, FOLL_WRITE | FOLL_LONGTERM, pages);
	if (pinned != (int)count) {
		if (pinned > 0)
			unpin_user_pages(pages, pinned);
		account_locked_vm(uf->utlb.mm, count, false);
		err = pinned < 0 ? pinned : -EFAULT;
		goto err_unlock;
	}
	/* Install the new pages; @pages then holds the old ones. */
	for (i = 0; i < count; i++) {
		swap(pages[i], uf->utlb.pages[first + i]);
		WRITE_ONCE(uf->utlb.table[first + i],
			   cpu_to_le64(page_to_phys(uf->utlb.pages[first + i])));
	}
	req = (struct ulnic_utlb_invalidate) {
		.pd = cpu_to_le32(uf->pd),
		.first = cpu_to_le32(first),
		.count = cpu_to_le32(count),
	};
	err = ulnic_command(uf->u, uf, ULNIC_CMD_UTLB_INVALIDATE, &req,
			    sizeof(req), NULL, 0, &status);
	/* If the device was not told, it may still use the old pages. */
	if (err >= 0 || status == ULNIC_STATUS_RESET || ulnic_stale(uf))
		ulnic_unpin(uf->utlb.mm, pages, count);
	mutex_unlock(&uf->lock);
	kvfree(pages);
	return err < 0 ? err : 0;

err_unlock:
	mutex_unlock(&uf->lock);
	kvfree(pages);
	return err;
}

static long ulnic_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct ulnic_file *uf = f->private_data;
	struct ulnic *u = uf->u;
	void __user *p = (void __user *)arg;
	struct ulnic_device_info info;
	u32 status = 0, id;
	int n;

	switch (cmd) {
	case ULNIC_IOC_INFO:
		n = ulnic_command(u, uf, ULNIC_CMD_GET_INFO, NULL, 0, &info,
				  sizeof(info), &status);
		if (n < 0)
			return n;
		return copy_to_user(p, &info, sizeof(info)) ? -EFAULT : 0;
	case ULNIC_IOC_CREATE_EP:
		return ulnic_create_ep(uf, p);
	case ULNIC_IOC_DESTROY_EP:
		if (get_user(id, (u32 __user *)p))
			return -EFAULT;
		return ulnic_destroy_ep(uf, id);
	case ULNIC_IOC_COMMAND:
		return ulnic_passthrough(uf, p);
	case ULNIC_IOC_KICK:
		if (get_user(id, (u32 __user *)p))
			return -EFAULT;
		if (!ulnic_owned(uf, id))
			return -EPERM;
		/*
		 * The endpoint's bit, then the domain's queue (spec 5.8);
		 * set_bit_le is ULNIC_BITMAP_WORD/MASK on little-endian words.
		 */
		set_bit_le(id, uf->doorbell_bits);
		/* remove() frees the queues under vq_sem held for writing. */
		down_read(&u->vq_sem);
		n = ulnic_stale(uf) ? -ENODEV : 0;
		if (!n)
			virtqueue_notify(u->vqs[uf->doorbell_queue]);
		up_read(&u->vq_sem);
		return n;
	case ULNIC_IOC_WAIT:
		return ulnic_wait(uf, p);
	case ULNIC_IOC_UTLB_INIT:
		return ulnic_utlb_init(uf, p);
	case ULNIC_IOC_UTLB_INSTALL:
		return ulnic_utlb_install(uf, p);
	case ULNIC_IOC_TAKE_NOTIFIED:
		return ulnic_take_notified(uf, p);
	case ULNIC_IOC_WATCHER:
		return ulnic_watcher_new(u, p);
	case ULNIC_IOC_WATCH:
		return ulnic_watch_ioctl(uf, p);
	default:
		return -ENOTTY;
	}
}

/* Endpoint mappings count against the endpoint; the file's doorbell
 * pages have none (the open file outlives them). */
static void ulnic_vma_open(struct vm_area_struct *vma)
{
	struct ulnic_ep *ep = vma->vm_private_data;

	if (ep)
		atomic_inc(&ep->maps);
}

static void ulnic_vma_close(struct vm_area_struct *vma)
{
	struct ulnic_ep *ep = vma->vm_private_data;

	if (ep)
		atomic_dec(&ep->maps);
}

/*
 * Every region is mapped whole at mmap time, so only a doorbell page that
 * remove() or a reset (ulnic_reset_work) revoked can fault: it gets the
 * device's dummy page (cached, never read), and the process learns of the
 * removal or reset from its next call.
 */
static vm_fault_t ulnic_vma_fault(struct vm_fault *vmf)
{
	struct ulnic_file *uf = vmf->vma->vm_file->private_data;

	return vmf_insert_pfn_prot(vmf->vma, vmf->address & PAGE_MASK,
				   page_to_pfn(uf->u->dummy),
				   vm_get_page_prot(vmf->vma->vm_flags));
}

static const struct vm_operations_struct ulnic_vm_ops = {
	.open = ulnic_vma_open,
	.close = ulnic_vma_close,
	.fault = ulnic_vma_fault,
};

/* Revokes every doorbell mapping of @u (see struct ulnic.mapping). */
static void ulnic_revoke_doorbells(struct ulnic *u)
{
	struct address_space *mapping = READ_ONCE(u->mapping);

	/* Every file maps its doorbell at the same offset. */
	if (mapping)
		unmap_mapping_range(mapping, ULNIC_MMAP_DOORBELL, PAGE_SIZE, 1);
}

/*
 * The device forgot this node's objects under us (the RESET record: the
 * VM was paused and resumed, spec 2.5). Every file opened before is stale
 * from now on, as after a removal: its calls fail with ENODEV, its waiters
 * wake, its doorbells are revoked. All of it under cmd_lock, before the
 * device runs commands again (ACK_RESET), so no stale number reaches the
 * new state and no new file's doorbell is revoked.
 */
static void ulnic_reset_work(struct work_struct *work)
{
	struct ulnic *u = container_of(work, struct ulnic, reset_work);
	struct ulnic_object_id number;
	u32 status = 0;
	int err;

	mutex_lock(&u->cmd_lock);
	WRITE_ONCE(u->generation, u->generation + 1);
	spin_lock_irq(&u->owners_lock);
	memset(u->owners, 0, u->endpoints * sizeof(*u->owners));
	bitmap_zero(u->notified, u->endpoints);
	spin_unlock_irq(&u->owners_lock);
	ulnic_watch_wake_all(u);
	ulnic_revoke_doorbells(u);
	/* The latest record: an earlier one's number lifts nothing. */
	number.id = cpu_to_le32(READ_ONCE(u->reset_number));
	err = ulnic_command_locked(u, NULL, ULNIC_CMD_ACK_RESET, &number,
				   sizeof(number), NULL, 0, &status);
	ulnic_keep_index_off_zero(u);
	mutex_unlock(&u->cmd_lock);
	wake_up_interruptible_all(&u->wq);
	if (u->vdev)
		dev_warn(&u->vdev->dev,
			 "the device forgot this node's endpoints (VM paused and resumed?); files opened before now fail with ENODEV (ACK_RESET: %d)\n",
			 err);
}

/*
 * The file's doorbell page (@bits false) or doorbell bitmap page (@bits
 * true): each file's own, and nothing else.
 */
static int ulnic_mmap_doorbell(struct file *f, struct vm_area_struct *vma,
			       bool bits)
{
	struct ulnic_file *uf = f->private_data;
	struct ulnic *u = uf->u;
	u32 slot = uf->doorbell_queue - ULNIC_FIRST_DOORBELL_QUEUE;
	phys_addr_t pa;
	int err;

	if (vma->vm_end - vma->vm_start != PAGE_SIZE)
		return -EINVAL;
	if (bits) {
		vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
		return remap_pfn_range(vma, vma->vm_start,
				       virt_to_phys(uf->doorbell_bits) >> PAGE_SHIFT,
				       PAGE_SIZE, vma->vm_page_prot);
	}
	/* ulnic_open() checked the queue: the slot is one of ours. */
	pa = u->doorbell_pa[slot];
	/*
	 * Under vq_sem: remove() clears vdev under it for writing and
	 * revokes afterwards, so a mapping made here is either refused or
	 * complete before the revocation.
	 */
	down_read(&u->vq_sem);
	if (!READ_ONCE(u->mapping))
		cmpxchg(&u->mapping, NULL, f->f_mapping);
	if (!pa || ulnic_stale(uf)) {
		err = -ENODEV;
	} else if (READ_ONCE(u->mapping) != f->f_mapping) {
		/* Another device node for the same device: cannot revoke. */
		err = -EINVAL;
	} else {
		vm_flags_set(vma, VM_IO | VM_DONTEXPAND | VM_DONTDUMP);
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
		err = io_remap_pfn_range(vma, vma->vm_start, pa >> PAGE_SHIFT,
					 PAGE_SIZE, vma->vm_page_prot);
	}
	up_read(&u->vq_sem);
	return err;
}

static int ulnic_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct ulnic_file *uf = f->private_data;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	size_t len = vma->vm_end - vma->vm_start;
	struct ulnic_ep *ep;
	int err = -EINVAL;

	/* The device writes what the user wrote: private copies make no sense. */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (off == ULNIC_MMAP_DOORBELL || off == ULNIC_MMAP_DOORBELL_BITS) {
		err = ulnic_mmap_doorbell(f, vma, off == ULNIC_MMAP_DOORBELL_BITS);
		if (!err) {
			vma->vm_private_data = NULL;
			vma->vm_ops = &ulnic_vm_ops;
		}
		return err;
	}
	if ((off & ULNIC_MMAP_OFFSET_MASK & ~(ULNIC_MMAP_PIO - 1)) == ULNIC_MMAP_PIO)
		return ulnic_pio_mmap(uf, f, vma, off);
	mutex_lock(&uf->lock);
	ep = ulnic_owned(uf, off >> ULNIC_MMAP_ID_SHIFT);
	if (!ep) {
		err = -EPERM;
	} else if ((off & ULNIC_MMAP_OFFSET_MASK) == 0 && len <= ep->ctrl_len) {
		/*
		 * Copied at fork like the file (spec 9): ulnic_vma_open counts
		 * the child's copy, so the memory outlives every mapping.
		 */
		vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
		err = remap_pfn_range(vma, vma->vm_start,
				      virt_to_phys(ep->ctrl) >> PAGE_SHIFT,
				      len, vma->vm_page_prot);
	} else if ((off & ULNIC_MMAP_OFFSET_MASK) == ULNIC_MMAP_SEGMENT &&
		   len <= ep->seg_len) {
		err = remap_vmalloc_range(vma, ep->seg, 0);
	}
	if (!err) {
		vma->vm_private_data = ep;
		vma->vm_ops = &ulnic_vm_ops;
		ulnic_vma_open(vma);
	}
	mutex_unlock(&uf->lock);
	return err;
}

static __poll_t ulnic_poll(struct file *f, poll_table *wait)
{
	struct ulnic_file *uf = f->private_data;
	struct ulnic *u = uf->u;
	__poll_t mask = 0;
	u32 i;

	poll_wait(f, &u->wq, wait);
	if (ulnic_stale(uf))
		return EPOLLERR;
	for (i = 0; i < u->endpoints; i++)
		if (READ_ONCE(uf->eps[i]) && test_bit(i, u->notified))
			mask |= EPOLLIN | EPOLLRDNORM;
	return mask;
}

static const struct file_operations ulnic_fops = {
	.owner = THIS_MODULE,
	.open = ulnic_open,
	.release = ulnic_release,
	.unlocked_ioctl = ulnic_ioctl,
	/*
	 * Every argument is a fixed-layout struct of naturally aligned
	 * fixed-width fields (asserted in ulnic_abi.h), the same for 32-bit
	 * programs: only the pointer needs converting.
	 */
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = ulnic_mmap,
	.poll = ulnic_poll,
};

static int ulnic_find_vqs(struct ulnic *u)
{
	struct virtqueue_info *info;
	unsigned int i;
	int err;

	u->nvqs = ULNIC_QUEUE_COUNT;
	u->vqs = kcalloc(u->nvqs, sizeof(*u->vqs), GFP_KERNEL);
	info = kcalloc(u->nvqs, sizeof(*info), GFP_KERNEL);
	if (!u->vqs || !info) {
		err = -ENOMEM;
		goto out;
	}
	info[ULNIC_CONTROL_QUEUE].name = "control";
	info[ULNIC_CONTROL_QUEUE].callback = ulnic_control_done;
	info[ULNIC_NOTIFY_QUEUE].name = "notify";
	info[ULNIC_NOTIFY_QUEUE].callback = ulnic_notify_done;
	/* Doorbell queues carry no buffers; only their notifications matter. */
	for (i = ULNIC_FIRST_DOORBELL_QUEUE; i < u->nvqs; i++)
		info[i].name = "doorbell";
	err = virtio_find_vqs(u->vdev, u->nvqs, u->vqs, info, NULL);
out:
	kfree(info);
	return err;
}

/*
 * Finds each doorbell queue's notify address in the virtio PCI transport,
 * so a domain's doorbell page can be mapped into its owner alone. The
 * virtio core keeps these addresses private, so they are read from the
 * device's own capabilities. Only when every doorbell has a page of its own
 * (page-per-vq); otherwise doorbells stay behind IOC_KICK.
 */
static void ulnic_find_doorbells(struct ulnic *u)
{
	struct device *parent = u->vdev->dev.parent;
	struct virtio_pci_common_cfg __iomem *common;
	u32 coff = 0, clen = 0, noff = 0, nlen = 0, mult = 0, off, len;
	u8 type, bar, cbar = 0, nbar = 0;
	bool have_common = false, have_notify = false;
	struct pci_dev *pdev;
	unsigned int slot;
	int pos;

	if (!parent || !dev_is_pci(parent))
		return;
	pdev = to_pci_dev(parent);
	for (pos = pci_find_capability(pdev, PCI_CAP_ID_VNDR); pos > 0;
	     pos = pci_find_next_capability(pdev, pos, PCI_CAP_ID_VNDR)) {
		pci_read_config_byte(pdev, pos + offsetof(struct virtio_pci_cap, cfg_type), &type);
		pci_read_config_byte(pdev, pos + offsetof(struct virtio_pci_cap, bar), &bar);
		pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_cap, offset), &off);
		pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_cap, length), &len);
		if (bar >= PCI_STD_NUM_BARS)
			continue;
		if (type == VIRTIO_PCI_CAP_COMMON_CFG && !have_common) {
			have_common = true;
			cbar = bar;
			coff = off;
			clen = len;
		} else if (type == VIRTIO_PCI_CAP_NOTIFY_CFG && !have_notify) {
			have_notify = true;
			nbar = bar;
			noff = off;
			nlen = len;
			pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_notify_cap,
								   notify_off_multiplier), &mult);
		}
	}
	if (!have_common || !have_notify || clen < sizeof(*common) ||
	    mult < PAGE_SIZE || mult % PAGE_SIZE ||
	    !PAGE_ALIGNED(pci_resource_start(pdev, nbar) + noff))
		return;
	common = pci_iomap_range(pdev, cbar, coff, sizeof(*common));
	if (!common)
		return;
	/* Queues are set up and idle: reading their notify offsets is safe. */
	for (slot = 0; slot < ULNIC_DOORBELL_QUEUES; slot++) {
		u64 qoff;

		iowrite16(ULNIC_FIRST_DOORBELL_QUEUE + slot, &common->queue_select);
		qoff = (u64)ioread16(&common->queue_notify_off) * mult;
		if (qoff + PAGE_SIZE <= nlen)
			u->doorbell_pa[slot] = pci_resource_start(pdev, nbar) + noff + qoff;
	}
	pci_iounmap(pdev, common);
}

static int ulnic_probe(struct virtio_device *vdev)
{
	struct ulnic_device_info info;
	struct ulnic *u;
	u32 magic, status = 0;
	u16 major, minor;
	unsigned int i;
	int err;

	if (!virtio_has_feature(vdev, ULNIC_F_MESSAGING_BIT)) {
		dev_err(&vdev->dev, "device lacks the messaging feature\n");
		return -ENODEV;
	}
	virtio_cread_le(vdev, struct ulnic_config, magic, &magic);
	virtio_cread_le(vdev, struct ulnic_config, version_major, &major);
	virtio_cread_le(vdev, struct ulnic_config, version_minor, &minor);
	/* Before 1.0 a minor version may change the wire (semver's rule). */
	if (magic != ULNIC_CONFIG_MAGIC || major != ULNIC_SPEC_VERSION_MAJOR ||
	    (ULNIC_SPEC_VERSION_MAJOR == 0 && minor != ULNIC_SPEC_VERSION_MINOR)) {
		dev_err(&vdev->dev, "not a ulnic device of spec %u.%u (magic %#x, version %u.%u)\n",
			ULNIC_SPEC_VERSION_MAJOR, ULNIC_SPEC_VERSION_MINOR, magic, major, minor);
		return -ENODEV;
	}

	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u)
		return -ENOMEM;
	vdev->priv = u;
	u->vdev = vdev;
	kref_init(&u->ref);
	spin_lock_init(&u->owners_lock);
	init_waitqueue_head(&u->wq);
	u->index = -1;
	mutex_init(&u->cmd_lock);
	init_rwsem(&u->vq_sem);
	init_completion(&u->cmd_done);
	INIT_WORK(&u->reset_work, ulnic_reset_work);
	ulnic_pio_init(u);
	virtio_cread_le(vdev, struct ulnic_config, node, &u->node);
	virtio_cread_le(vdev, struct ulnic_config, nodes, &u->nodes);
	virtio_cread_le(vdev, struct ulnic_config, endpoints, &u->endpoints);
	if (!u->endpoints || u->endpoints > ULNIC_MAX_ENDPOINTS_LIMIT) {
		err = -ENODEV;
		goto err_free;
	}

	u->cmd_buf = kzalloc(ULNIC_CMD_BUF_SIZE, GFP_KERNEL);
	u->notify_bufs = kcalloc(ULNIC_NOTIFY_MAX, sizeof(*u->notify_bufs),
				 GFP_KERNEL);
	u->owners = kvcalloc(u->endpoints, sizeof(*u->owners), GFP_KERNEL);
	u->notified = bitmap_zalloc(u->endpoints, GFP_KERNEL);
	u->watches = kvcalloc(u->endpoints, sizeof(*u->watches), GFP_KERNEL);
	u->dummy = alloc_page(GFP_KERNEL | __GFP_ZERO);
	if (!u->cmd_buf || !u->notify_bufs || !u->owners || !u->notified ||
	    !u->watches || !u->dummy) {
		err = -ENOMEM;
		goto err_free;
	}
	for (i = 0; i < u->endpoints; i++)
		INIT_LIST_HEAD(&u->watches[i]);

	err = ulnic_find_vqs(u);
	if (err) {
		dev_err(&vdev->dev, "cannot set up %u virtqueues: %d\n",
			u->nvqs, err);
		goto err_free;
	}
	ulnic_find_doorbells(u);
	virtio_device_ready(vdev);

	/*
	 * As many notification buffers as the queue holds, whatever the
	 * number of endpoints: reposts kick once per half of them (spec 6),
	 * and each kick is an exit to the hypervisor. The device keeps what
	 * finds no buffer until one comes.
	 */
	u->notify_count = min_t(unsigned int, ULNIC_NOTIFY_MAX,
			      virtqueue_get_vring_size(u->vqs[ULNIC_NOTIFY_QUEUE]));
	for (i = 0; i < u->notify_count; i++) {
		err = ulnic_post_notify(u, i);
		if (err)
			goto err_reset;
	}
	virtqueue_kick(u->vqs[ULNIC_NOTIFY_QUEUE]);

	err = ulnic_command(u, NULL, ULNIC_CMD_GET_INFO, NULL, 0, &info,
			    sizeof(info), &status);
	if (err < 0) {
		dev_err(&vdev->dev, "GET_INFO failed: %d (status %u)\n", err,
			status);
		goto err_reset;
	}

	u->index = ida_alloc(&ulnic_ida, GFP_KERNEL);
	if (u->index < 0) {
		err = u->index;
		goto err_reset;
	}
	snprintf(u->name, sizeof(u->name), "ulnic%d", u->index);
	u->misc.minor = MISC_DYNAMIC_MINOR;
	u->misc.name = u->name;
	u->misc.fops = &ulnic_fops;
	u->misc.mode = 0666;
	u->misc.groups = ulnic_groups;
	err = misc_register(&u->misc);
	if (err)
		goto err_ida;
	dev_info(&vdev->dev,
		 "ulnic: node %u of %u, %u endpoints, spec %u.%u, /dev/%s, doorbells %s\n",
		 u->node, u->nodes, u->endpoints, major, minor, u->name,
		 u->doorbell_pa[0] ? "mapped" : "by ioctl");
	return 0;

err_ida:
	ida_free(&ulnic_ida, u->index);
err_reset:
	virtio_reset_device(vdev);
	/* A RESET record taken during probe may have queued the work. */
	cancel_work_sync(&u->reset_work);
	ulnic_pio_stop(u);
	vdev->config->del_vqs(vdev);
err_free:
	kref_put(&u->ref, ulnic_release_dev);
	return err;
}

static void ulnic_remove(struct virtio_device *vdev)
{
	struct ulnic *u = vdev->priv;

	misc_deregister(&u->misc);
	ida_free(&ulnic_ida, u->index);
	virtio_reset_device(vdev);
	/* A command in flight (its device may be dead) ends now, not in 10 s. */
	WRITE_ONCE(u->removing, true);
	complete(&u->cmd_done);
	/* No more records come (the device is reset); none is left running. */
	cancel_work_sync(&u->reset_work);
	ulnic_pio_stop(u);
	/* Open files keep the struct; their calls now fail with ENODEV. */
	down_write(&u->vq_sem);
	mutex_lock(&u->cmd_lock);
	WRITE_ONCE(u->vdev, NULL);
	mutex_unlock(&u->cmd_lock);
	up_write(&u->vq_sem);
	ulnic_revoke_doorbells(u);
	wake_up_interruptible_all(&u->wq);
	ulnic_watch_wake_all(u);
	vdev->config->del_vqs(vdev);
	kref_put(&u->ref, ulnic_release_dev);
}

static const struct virtio_device_id ulnic_id_table[] = {
	{ ULNIC_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, ulnic_id_table);

/* The device acts only on features the driver accepted (spec 2). */
static unsigned int ulnic_features[] = {
	ULNIC_F_MESSAGING_BIT,
	ULNIC_F_UTLB_BIT,
	ULNIC_F_RDMA_BIT,
	ULNIC_F_TRIPWIRE_BIT,
	ULNIC_F_CLOSE_MESSAGE_BIT,
	ULNIC_F_RETURN_TO_SENDER_BIT,
	ULNIC_F_PIO_BIT,
};

static struct virtio_driver ulnic_driver = {
	.driver.name = KBUILD_MODNAME,
	.id_table = ulnic_id_table,
	.feature_table = ulnic_features,
	.feature_table_size = ARRAY_SIZE(ulnic_features),
	.probe = ulnic_probe,
	.remove = ulnic_remove,
};
module_virtio_driver(ulnic_driver);

MODULE_DESCRIPTION("ulnic emulated user-level network interface");
MODULE_LICENSE("GPL");
