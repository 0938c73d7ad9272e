// SPDX-License-Identifier: GPL-2.0
/*
 * ulnic watchers (spec 6 "Several waiters", 9): a file of its own that
 * counts the notifications of the endpoints it watches, so that several
 * waiters of one endpoint (threads, processes after fork, poll calls and
 * epoll sets) each get every notification instead of one taking
 * another's. The watch lists live in struct ulnic, by endpoint id, under
 * owners_lock: the lock that says which file owns an endpoint, so a watch
 * is only ever added for the owner and is gone when the endpoint is.
 */

#include <linux/anon_inodes.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "ulnic.h"

struct ulnic_watcher {
	struct ulnic *u;
	/* Waiters in poll/epoll; its lock guards @count. */
	wait_queue_head_t wq;
	u64 count;
	/* Its watches, under u->owners_lock. */
	struct list_head watches;
	/* The device was reset or removed after the watcher was made. */
	u32 generation;
};

/* One endpoint watched by one watcher. */
struct ulnic_watch {
	struct list_head by_ep;		/* in u->watches[id] */
	struct list_head by_watcher;	/* in w->watches */
	struct ulnic_watcher *w;
	u32 id;
};

static void ulnic_watcher_add(struct ulnic_watcher *w, u64 n)
{
	unsigned long flags;

	spin_lock_irqsave(&w->wq.lock, flags);
	w->count += n;
	wake_up_locked_poll(&w->wq, EPOLLIN);
	spin_unlock_irqrestore(&w->wq.lock, flags);
}

/* A notification record for endpoint @id: every watcher of it counts one. */
void ulnic_watch_notify(struct ulnic *u, u32 id)
{
	struct ulnic_watch *watch;
	unsigned long flags;

	if (id >= u->endpoints)
		return;
	spin_lock_irqsave(&u->owners_lock, flags);
	list_for_each_entry(watch, &u->watches[id], by_ep)
		ulnic_watcher_add(watch->w, 1);
	spin_unlock_irqrestore(&u->owners_lock, flags);
}

static void ulnic_watch_free(struct ulnic_watch *watch)
{
	list_del(&watch->by_ep);
	list_del(&watch->by_watcher);
	kfree(watch);
}

/* Endpoint @id is gone: its watches go. Under u->owners_lock. */
void ulnic_watch_forget_locked(struct ulnic *u, u32 id)
{
	struct ulnic_watch *watch, *next;

	if (id >= u->endpoints)
		return;
	list_for_each_entry_safe(watch, next, &u->watches[id], by_ep) {
		/* Woken so that a waiter finds out (its endpoint is gone). */
		ulnic_watcher_add(watch->w, 1);
		ulnic_watch_free(watch);
	}
}

static int ulnic_watcher_release(struct inode *inode, struct file *f)
{
	struct ulnic_watcher *w = f->private_data;
	struct ulnic *u = w->u;
	struct ulnic_watch *watch, *next;

	spin_lock_irq(&u->owners_lock);
	list_for_each_entry_safe(watch, next, &w->watches, by_watcher)
		ulnic_watch_free(watch);
	spin_unlock_irq(&u->owners_lock);
	kfree(w);
	ulnic_put(u);
	return 0;
}

static bool ulnic_watcher_broken(const struct ulnic_watcher *w)
{
	return !READ_ONCE(w->u->vdev) || w->generation != READ_ONCE(w->u->generation);
}

static ssize_t ulnic_watcher_read(struct file *f, char __user *buf,
				  size_t len, loff_t *pos)
{
	struct ulnic_watcher *w = f->private_data;
	u64 count;

	if (len < sizeof(count))
		return -EINVAL;
	spin_lock_irq(&w->wq.lock);
	count = w->count;
	w->count = 0;
	spin_unlock_irq(&w->wq.lock);
	if (!count)
		return ulnic_watcher_broken(w) ? -ENODEV : -EAGAIN;
	if (put_user(count, (u64 __user *)buf))
		return -EFAULT;
	return sizeof(count);
}

static ssize_t ulnic_watcher_write(struct file *f, const char __user *buf,
				   size_t len, loff_t *pos)
{
	struct ulnic_watcher *w = f->private_data;
	u64 n;

	if (len < sizeof(n))
		return -EINVAL;
	if (get_user(n, (const u64 __user *)buf))
		return -EFAULT;
	if (!n || n > U32_MAX)
		return -EINVAL;
	ulnic_watcher_add(w, n);
	return sizeof(n);
}

static __poll_t ulnic_watcher_poll(struct file *f, poll_table *wait)
{
	struct ulnic_watcher *w = f->private_data;
	__poll_t mask = 0;

	poll_wait(f, &w->wq, wait);
	if (READ_ONCE(w->count))
		mask |= EPOLLIN | EPOLLRDNORM;
	if (ulnic_watcher_broken(w))
		mask |= EPOLLERR;
	return mask;
}

static const struct file_operations ulnic_watcher_fops = {
	.owner = THIS_MODULE,
	.release = ulnic_watcher_release,
	.read = ulnic_watcher_read,
	.write = ulnic_watcher_write,
	.poll = ulnic_watcher_poll,
	.llseek = noop_llseek,
};

/* IOC_WATCHER: a new watcher of @u; returns its descriptor. */
long ulnic_watcher_new(struct ulnic *u, u32 __user *arg)
{
	struct ulnic_watcher *w;
	__le32 raw;
	u32 flags;
	int fd;

	if (get_user(raw, (__le32 __user *)arg))
		return -EFAULT;
	flags = le32_to_cpu(raw);
	if (flags & ~ULNIC_WATCHER_CLOEXEC)
		return -EINVAL;
	w = kzalloc(sizeof(*w), GFP_KERNEL_ACCOUNT);
	if (!w)
		return -ENOMEM;
	init_waitqueue_head(&w->wq);
	INIT_LIST_HEAD(&w->watches);
	w->u = u;
	w->generation = READ_ONCE(u->generation);
	ulnic_get(u);
	fd = anon_inode_getfd("[ulnic-watcher]", &ulnic_watcher_fops, w,
			      O_RDWR | (flags & ULNIC_WATCHER_CLOEXEC ? O_CLOEXEC : 0));
	if (fd < 0) {
		ulnic_put(u);
		kfree(w);
	}
	return fd;
}

/* Finds @w's watch of @id. Under u->owners_lock. */
static struct ulnic_watch *ulnic_watch_find(struct ulnic *u,
					    struct ulnic_watcher *w, u32 id)
{
	struct ulnic_watch *watch;

	list_for_each_entry(watch, &u->watches[id], by_ep)
		if (watch->w == w)
			return watch;
	return NULL;
}

/* IOC_WATCH on @uf: a watcher starts or stops watching one of its endpoints. */
long ulnic_watch_ioctl(struct ulnic_file *uf, void __user *arg)
{
	struct ulnic *u = uf->u;
	struct ulnic_ioc_watch a;
	struct ulnic_watch *watch, *fresh = NULL;
	struct ulnic_watcher *w;
	struct fd wf;
	bool remove;
	long err = 0;
	u32 id;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	id = le32_to_cpu(a.id);
	remove = le32_to_cpu(a.flags) & ULNIC_WATCH_REMOVE;
	if (le32_to_cpu(a.flags) & ~ULNIC_WATCH_REMOVE || a.reserved)
		return -EINVAL;
	if (id >= u->endpoints)
		return -EPERM;
	wf = fdget(le32_to_cpu(a.watcher));
	if (!fd_file(wf))
		return -EBADF;
	if (fd_file(wf)->f_op != &ulnic_watcher_fops) {
		err = -EINVAL;
		goto out;
	}
	w = fd_file(wf)->private_data;
	if (w->u != u) {
		err = -EINVAL;
		goto out;
	}
	if (!remove) {
		fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
		if (!fresh) {
			err = -ENOMEM;
			goto out;
		}
	}
	spin_lock_irq(&u->owners_lock);
	if (u->owners[id] != uf) {
		err = -EPERM;
	} else {
		watch = ulnic_watch_find(u, w, id);
		if (remove && watch) {
			ulnic_watch_free(watch);
		} else if (!remove && !watch) {
			fresh->w = w;
			fresh->id = id;
			list_add_tail(&fresh->by_ep, &u->watches[id]);
			list_add_tail(&fresh->by_watcher, &w->watches);
			fresh = NULL;
		}
	}
	spin_unlock_irq(&u->owners_lock);
	kfree(fresh);
out:
	fdput(wf);
	return err;
}

/* Wakes every watcher of @u (a reset or removal: their waiters look). */
void ulnic_watch_wake_all(struct ulnic *u)
{
	u32 id;

	spin_lock_irq(&u->owners_lock);
	for (id = 0; id < u->endpoints; id++)
		ulnic_watch_forget_locked(u, id);
	spin_unlock_irq(&u->owners_lock);
}
