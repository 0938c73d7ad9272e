// SPDX-License-Identifier: GPL-2.0
/*
 * ulnic: Linux driver for the ulnic emulated user-level NIC (docs/spec.md).
 *
 * This first part binds the device, checks its config space, sets up the
 * control, notification and doorbell virtqueues, and talks to the device
 * over the control queue. The character device (/dev/ulnicN with ioctl, mmap
 * and poll) builds on it.
 */
#include <linux/completion.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>

#include "ulnic_abi.h"

#define ULNIC_CMD_TIMEOUT (10 * HZ)
#define ULNIC_CMD_BUF_SIZE 1024
/* Config space offsets (spec 2.2). */
#define ULNIC_CFG_MAGIC 0
#define ULNIC_CFG_VERSION 4
#define ULNIC_CFG_NODE 8
#define ULNIC_CFG_ENDPOINTS 12
#define ULNIC_CFG_NODES 32

struct ulnic {
	struct virtio_device *vdev;
	struct virtqueue **vqs;
	unsigned int nvqs;
	u32 node;
	u32 nodes;
	u32 endpoints;

	/* One control command at a time; the response lands in cmd_buf. */
	struct mutex cmd_lock;
	struct completion cmd_done;
	u8 *cmd_buf;

	/* Notification records, one per endpoint (spec 6). */
	u8 *notify_bufs;
	unsigned long notifications;
};

static void ulnic_control_done(struct virtqueue *vq)
{
	struct ulnic *u = vq->vdev->priv;

	complete(&u->cmd_done);
}

/* Posts notification buffer @i to the device. */
static int ulnic_post_notify(struct ulnic *u, unsigned int i)
{
	struct scatterlist sg;
	u8 *rec = u->notify_bufs + i * ULNIC_NOTIFY_RECORD_SIZE;

	sg_init_one(&sg, rec, ULNIC_NOTIFY_RECORD_SIZE);
	return virtqueue_add_inbuf(u->vqs[ULNIC_NOTIFY_QUEUE], &sg, 1, rec,
				   GFP_ATOMIC);
}

static void ulnic_notify_done(struct virtqueue *vq)
{
	struct ulnic *u = vq->vdev->priv;
	unsigned int len;
	u8 *rec;

	while ((rec = virtqueue_get_buf(vq, &len)) != NULL) {
		u->notifications++;
		ulnic_post_notify(u, (rec - u->notify_bufs) /
					     ULNIC_NOTIFY_RECORD_SIZE);
	}
	virtqueue_kick(vq);
}

/*
 * Runs one control command (spec 4). On success returns the number of result
 * bytes copied to @result; a device status other than OK becomes -EIO and is
 * stored in @status.
 */
static int ulnic_command(struct ulnic *u, u32 opcode, const void *payload,
			 size_t plen, void *result, size_t rlen, u32 *status)
{
	struct virtqueue *vq = u->vqs[ULNIC_CONTROL_QUEUE];
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	u8 *req = u->cmd_buf, *resp = u->cmd_buf + ULNIC_CMD_BUF_SIZE / 2;
	unsigned int len;
	__le32 word;
	int err;

	if (ULNIC_CMD_HEADER_SIZE + plen > ULNIC_CMD_BUF_SIZE / 2 ||
	    ULNIC_RESP_HEADER_SIZE + rlen > ULNIC_CMD_BUF_SIZE / 2)
		return -EINVAL;

	mutex_lock(&u->cmd_lock);
	word = cpu_to_le32(opcode);
	memcpy(req, &word, 4);
	memset(req + 4, 0, 4);
	if (plen)
		memcpy(req + ULNIC_CMD_HEADER_SIZE, payload, plen);
	sg_init_one(&out, req, ULNIC_CMD_HEADER_SIZE + plen);
	sg_init_one(&in, resp, ULNIC_RESP_HEADER_SIZE + rlen);
	reinit_completion(&u->cmd_done);
	err = virtqueue_add_sgs(vq, sgs, 1, 1, u, GFP_KERNEL);
	if (err)
		goto out;
	virtqueue_kick(vq);
	if (!wait_for_completion_timeout(&u->cmd_done, ULNIC_CMD_TIMEOUT) ||
	    !virtqueue_get_buf(vq, &len)) {
		/* The buffer is still the device's: it can never be reused. */
		dev_err(&u->vdev->dev, "command %#x timed out\n", opcode);
		virtio_break_device(u->vdev);
		err = -ETIMEDOUT;
		goto out;
	}
	if (len < ULNIC_RESP_HEADER_SIZE) {
		err = -EPROTO;
		goto out;
	}
	memcpy(&word, resp, 4);
	*status = le32_to_cpu(word);
	if (*status != ULNIC_STATUS_OK) {
		err = -EIO;
		goto out;
	}
	len -= ULNIC_RESP_HEADER_SIZE;
	err = min_t(size_t, len, rlen);
	memcpy(result, resp + ULNIC_RESP_HEADER_SIZE, err);
out:
	mutex_unlock(&u->cmd_lock);
	return err;
}

static int ulnic_find_vqs(struct ulnic *u)
{
	struct virtqueue_info *info;
	unsigned int i;
	int err;

	u->nvqs = ULNIC_FIRST_DOORBELL_QUEUE + u->endpoints;
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

static int ulnic_probe(struct virtio_device *vdev)
{
	u8 info[ULNIC_DEVICE_INFO_SIZE];
	struct ulnic *u;
	u32 magic, version, status = 0;
	unsigned int i;
	int err;

	if (!virtio_has_feature(vdev, ULNIC_F_MESSAGING_BIT)) {
		dev_err(&vdev->dev, "device lacks the messaging feature\n");
		return -ENODEV;
	}
	magic = virtio_cread32(vdev, ULNIC_CFG_MAGIC);
	version = virtio_cread32(vdev, ULNIC_CFG_VERSION);
	if (magic != ULNIC_CONFIG_MAGIC ||
	    (version & 0xffff) != ULNIC_SPEC_VERSION_MAJOR) {
		dev_err(&vdev->dev, "not a ulnic device of spec %u (magic %#x, version %#x)\n",
			ULNIC_SPEC_VERSION_MAJOR, magic, version);
		return -ENODEV;
	}

	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u)
		return -ENOMEM;
	vdev->priv = u;
	u->vdev = vdev;
	mutex_init(&u->cmd_lock);
	init_completion(&u->cmd_done);
	u->node = virtio_cread32(vdev, ULNIC_CFG_NODE);
	u->nodes = virtio_cread32(vdev, ULNIC_CFG_NODES);
	u->endpoints = virtio_cread32(vdev, ULNIC_CFG_ENDPOINTS);
	if (!u->endpoints || u->endpoints > ULNIC_MAX_ENDPOINTS_LIMIT) {
		err = -ENODEV;
		goto err_free;
	}

	u->cmd_buf = kzalloc(ULNIC_CMD_BUF_SIZE, GFP_KERNEL);
	u->notify_bufs = kcalloc(u->endpoints, ULNIC_NOTIFY_RECORD_SIZE,
				 GFP_KERNEL);
	if (!u->cmd_buf || !u->notify_bufs) {
		err = -ENOMEM;
		goto err_free;
	}

	err = ulnic_find_vqs(u);
	if (err) {
		dev_err(&vdev->dev, "cannot set up %u virtqueues: %d\n",
			u->nvqs, err);
		goto err_free;
	}
	virtio_device_ready(vdev);

	for (i = 0; i < u->endpoints; i++) {
		err = ulnic_post_notify(u, i);
		if (err)
			goto err_reset;
	}
	virtqueue_kick(u->vqs[ULNIC_NOTIFY_QUEUE]);

	err = ulnic_command(u, ULNIC_CMD_GET_INFO, NULL, 0, info, sizeof(info),
			    &status);
	if (err < 0) {
		dev_err(&vdev->dev, "GET_INFO failed: %d (status %u)\n", err,
			status);
		goto err_reset;
	}
	dev_info(&vdev->dev,
		 "ulnic: node %u of %u, %u endpoints, spec %u.%u\n",
		 u->node, u->nodes, u->endpoints, version & 0xffff,
		 version >> 16);
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
err_free:
	kfree(u->notify_bufs);
	kfree(u->cmd_buf);
	kfree(u->vqs);
	kfree(u);
	return err;
}

static void ulnic_remove(struct virtio_device *vdev)
{
	struct ulnic *u = vdev->priv;

	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	kfree(u->notify_bufs);
	kfree(u->cmd_buf);
	kfree(u->vqs);
	kfree(u);
}

static const struct virtio_device_id ulnic_id_table[] = {
	{ ULNIC_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, ulnic_id_table);

static unsigned int ulnic_features[] = {
	ULNIC_F_MESSAGING_BIT,
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
