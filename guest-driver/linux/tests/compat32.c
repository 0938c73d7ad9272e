// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * A 32-bit program on /dev/ulnic0: every ioctl through the driver's
 * compat_ioctl, the generated ulnic_abi.h used as is from user space.
 * Built by tools/tests/cluster_up.rs with `gcc -m32 -static` and run in a
 * guest; prints one line per step and "compat32: ok" at the end, or the
 * step that failed and exits 1.
 */
#define _GNU_SOURCE
#define _FILE_OFFSET_BITS 64
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ulnic_abi.h"

_Static_assert(sizeof(void *) == 4, "build this with -m32");

static int fail(const char *step)
{
	printf("compat32: %s failed: %s\n", step, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/dev/ulnic0";
	struct ulnic_device_info info;
	struct ulnic_ioc_create_ep ep;
	struct ulnic_ioc_command cmd;
	struct ulnic_bind_port bind;
	struct ulnic_ioc_wait wait;
	uint32_t id;
	void *ctrl;
	int fd, r;

	fd = open(path, O_RDWR);
	if (fd < 0)
		return fail("open");

	memset(&info, 0, sizeof(info));
	if (ioctl(fd, ULNIC_IOC_INFO, &info) < 0)
		return fail("IOC_INFO");
	if (info.version_major != ULNIC_SPEC_VERSION_MAJOR || !info.max_endpoints) {
		printf("compat32: IOC_INFO gave version %u, %u endpoints\n",
		       info.version_major, info.max_endpoints);
		return 1;
	}
	printf("compat32: IOC_INFO: node %u of %u, %u endpoints\n", info.node,
	       info.nodes, info.max_endpoints);

	memset(&ep, 0, sizeof(ep));
	ep.send_entries = 8;
	ep.recv_entries = 8;
	ep.free_entries = 8;
	ep.event_entries = 64;
	ep.segment_bytes = 4096;
	if (ioctl(fd, ULNIC_IOC_CREATE_EP, &ep) < 0)
		return fail("IOC_CREATE_EP");
	id = ep.id;
	printf("compat32: IOC_CREATE_EP: endpoint %u, doorbell queue %u, control %llu bytes\n",
	       id, ep.doorbell_queue, (unsigned long long)ep.ctrl_len);

	/* The endpoint's offset, id << 32, needs the 64-bit file offset. */
	ctrl = mmap(NULL, (size_t)ep.ctrl_len, PROT_READ | PROT_WRITE, MAP_SHARED,
		    fd, (off_t)id << ULNIC_MMAP_ID_SHIFT);
	if (ctrl == MAP_FAILED)
		return fail("mmap of the control region");
	printf("compat32: mmap: arm acknowledgement %u\n",
	       *(volatile uint32_t *)((char *)ctrl + ULNIC_CTRL_ARM_ACK));

	memset(&cmd, 0, sizeof(cmd));
	bind.endpoint = id;
	bind.port = 99;
	cmd.opcode = ULNIC_CMD_BIND_PORT;
	cmd.in_len = sizeof(bind);
	memcpy(cmd.data, &bind, sizeof(bind));
	if (ioctl(fd, ULNIC_IOC_COMMAND, &cmd) < 0)
		return fail("IOC_COMMAND");
	if (cmd.status != ULNIC_STATUS_OK) {
		printf("compat32: BIND_PORT answered status %u\n", cmd.status);
		return 1;
	}
	printf("compat32: IOC_COMMAND: BIND_PORT ok\n");

	if (ioctl(fd, ULNIC_IOC_KICK, &id) < 0)
		return fail("IOC_KICK");
	wait.id = id;
	wait.timeout_ms = 1;
	r = ioctl(fd, ULNIC_IOC_WAIT, &wait);
	if (r < 0)
		return fail("IOC_WAIT");
	printf("compat32: IOC_KICK ok, IOC_WAIT returned %d\n", r);

	if (munmap(ctrl, (size_t)ep.ctrl_len) < 0)
		return fail("munmap");
	if (ioctl(fd, ULNIC_IOC_DESTROY_EP, &id) < 0)
		return fail("IOC_DESTROY_EP");
	close(fd);
	printf("compat32: ok\n");
	return 0;
}
