// SPDX-License-Identifier: GPL-2.0
/*
 * ulnic: PIO windows (docs/spec.md 6.2, 9). The device maps a window into
 * this device's shared-memory region (BAR 4) with vhost-user SHMEM_MAP;
 * the driver maps it, write-back, into the process whose endpoint
 * exported or imported it, and zaps those mappings when the device says
 * it took the window away (a PIO_UNMAPPED record), so a later access
 * faults (SIGBUS) instead of reaching whatever the range holds next.
 */
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/virtio_config.h>

#include "ulnic.h"

/* Zaps the user mappings of every slot the device unmapped. */
static void ulnic_pio_zap_work(struct work_struct *work)
{
	struct ulnic *u = container_of(work, struct ulnic, pio.zap_work);
	struct address_space *mapping = READ_ONCE(u->mapping);
	struct ulnic_pio_space *p = &u->pio;
	unsigned int i;

	for (i = 0; i < ULNIC_PIO_SLOTS; i++) {
		u64 off = 0, len = 0;

		spin_lock_irq(&p->lock);
		if (p->slots[i].id && p->slots[i].unmapped && !p->slots[i].zapped) {
			p->slots[i].zapped = true;
			off = ((u64)p->slots[i].ep << ULNIC_MMAP_ID_SHIFT) |
			      ULNIC_MMAP_PIO | p->slots[i].offset;
			len = p->slots[i].len;
		}
		spin_unlock_irq(&p->lock);
		if (len && mapping)
			unmap_mapping_range(mapping, off, len, 1);
	}
}

void ulnic_pio_init(struct ulnic *u)
{
	struct virtio_shm_region r;

	spin_lock_init(&u->pio.lock);
	INIT_WORK(&u->pio.zap_work, ulnic_pio_zap_work);
	if (virtio_get_shm_region(u->vdev, &r, 0) && r.len) {
		u->pio.addr = r.addr;
		u->pio.len = r.len;
	}
}

void ulnic_pio_stop(struct ulnic *u)
{
	cancel_work_sync(&u->pio.zap_work);
}

/* A free slot's index, or -1. Under the lock. */
static int ulnic_pio_free_slot(struct ulnic_pio_space *p)
{
	unsigned int i;

	for (i = 0; i < ULNIC_PIO_SLOTS; i++)
		if (!p->slots[i].id)
			return i;
	return -1;
}

/*
 * Before a PIO command goes to the device: the aperture must exist, and
 * an export or import must have a slot to be recorded in.
 */
int ulnic_pio_before(struct ulnic *u, u32 opcode)
{
	int free;

	if (!u->pio.len)
		return -EOPNOTSUPP;
	if (opcode != ULNIC_CMD_EXPORT_PIO && opcode != ULNIC_CMD_IMPORT_PIO)
		return 0;
	spin_lock_irq(&u->pio.lock);
	free = ulnic_pio_free_slot(&u->pio);
	spin_unlock_irq(&u->pio.lock);
	return free < 0 ? -ENOSPC : 0;
}

/* Records a window or import the device just mapped, or drops a released one. */
void ulnic_pio_after(struct ulnic *u, const struct ulnic_file *uf, u32 opcode,
		     const void *req, const void *result)
{
	struct ulnic_pio_space *p = &u->pio;
	struct ulnic_pio_slot s = { .owner = uf };
	int i;

	if (opcode == ULNIC_CMD_EXPORT_PIO) {
		const struct ulnic_export_pio *r = req;
		const struct ulnic_pio_exported *e = result;

		s.id = le32_to_cpu(e->window);
		s.ep = le32_to_cpu(r->endpoint);
		s.offset = le64_to_cpu(e->offset);
		s.len = (u64)le32_to_cpu(r->pages) * PAGE_SIZE;
	} else if (opcode == ULNIC_CMD_IMPORT_PIO) {
		const struct ulnic_import_pio *r = req;
		const struct ulnic_pio_imported *m = result;

		s.id = le32_to_cpu(m->import);
		s.ep = le32_to_cpu(r->endpoint);
		s.offset = le64_to_cpu(m->offset);
		s.len = (u64)le32_to_cpu(m->pages) * PAGE_SIZE;
	} else if (opcode == ULNIC_CMD_RELEASE_PIO) {
		const struct ulnic_pio_object *o = req;

		/* The device sends PIO_UNMAPPED too; zap now all the same. */
		ulnic_pio_unmapped(u, le32_to_cpu(o->id));
		flush_work(&p->zap_work);
		spin_lock_irq(&p->lock);
		for (i = 0; i < ULNIC_PIO_SLOTS; i++)
			if (p->slots[i].id == le32_to_cpu(o->id) && p->slots[i].owner == uf)
				p->slots[i].id = 0;
		spin_unlock_irq(&p->lock);
		return;
	} else {
		return;
	}
	if (!s.id || s.offset >= p->len || s.len > p->len - s.offset)
		return;	/* not where a window can be: never mapped */
	spin_lock_irq(&p->lock);
	i = ulnic_pio_free_slot(p);
	if (i >= 0)
		p->slots[i] = s;
	spin_unlock_irq(&p->lock);
}

/* The device took window or import @id away (from the notification callback). */
void ulnic_pio_unmapped(struct ulnic *u, u32 id)
{
	struct ulnic_pio_space *p = &u->pio;
	unsigned long flags;
	bool any = false;
	unsigned int i;

	if (!id)
		return;
	spin_lock_irqsave(&p->lock, flags);
	for (i = 0; i < ULNIC_PIO_SLOTS; i++) {
		if (p->slots[i].id == id && !p->slots[i].unmapped) {
			p->slots[i].unmapped = true;
			any = true;
		}
	}
	spin_unlock_irqrestore(&p->lock, flags);
	if (any)
		schedule_work(&p->zap_work);
}

/* A closing file's slots (its domain is gone in the device, and with it
 * every window and import; no mapping of the file is left). */
void ulnic_pio_forget(struct ulnic *u, const struct ulnic_file *uf)
{
	unsigned int i;

	spin_lock_irq(&u->pio.lock);
	for (i = 0; i < ULNIC_PIO_SLOTS; i++)
		if (u->pio.slots[i].owner == uf)
			u->pio.slots[i].id = 0;
	spin_unlock_irq(&u->pio.lock);
}

/* A PIO mapping faults only once zapped: SIGBUS, the window is gone. */
static vm_fault_t ulnic_pio_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct ulnic_pio_vm_ops = {
	.fault = ulnic_pio_fault,
};

/*
 * mmap of a window or import of one of the file's endpoints (offset
 * ulnic_abi::mmap_pio): write-back, the window's guest-physical pages in
 * BAR 4. A window the device takes away after the check below is zapped
 * when its PIO_UNMAPPED record comes; a mapping made between the two
 * reaches a range the device keeps reserved until this file releases it
 * (spec 6.2), and the release zaps again.
 */
int ulnic_pio_mmap(struct ulnic_file *uf, struct file *f,
		   struct vm_area_struct *vma, u64 off)
{
	struct ulnic *u = uf->u;
	struct ulnic_pio_space *p = &u->pio;
	u32 ep = off >> ULNIC_MMAP_ID_SHIFT;
	u64 at = off & (ULNIC_MMAP_PIO - 1);
	u64 len = vma->vm_end - vma->vm_start;
	bool found = false;
	unsigned int i;

	spin_lock_irq(&p->lock);
	for (i = 0; i < ULNIC_PIO_SLOTS; i++) {
		const struct ulnic_pio_slot *s = &p->slots[i];

		if (s->id && s->owner == uf && s->ep == ep && s->offset == at &&
		    !s->unmapped && len <= s->len)
			found = true;
	}
	spin_unlock_irq(&p->lock);
	if (!found)
		return -EPERM;
	if (!READ_ONCE(u->mapping))
		cmpxchg(&u->mapping, NULL, f->f_mapping);
	if (READ_ONCE(u->mapping) != f->f_mapping)
		return -EINVAL;	/* another device node: could not be zapped */
	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_ops = &ulnic_pio_vm_ops;
	return io_remap_pfn_range(vma, vma->vm_start, (p->addr + at) >> PAGE_SHIFT,
				  len, vma->vm_page_prot);
}
