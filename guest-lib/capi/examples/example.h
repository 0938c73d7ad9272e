/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * What the C examples share: failing loudly, opening an endpoint, and
 * waiting for the next message with a deadline.
 */
#ifndef ULNIC_EXAMPLE_H
#define ULNIC_EXAMPLE_H

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ulnic.h>

/* Exits with a message; for a ulnic call's negative errno, with the
 * library's own account of it. */
static inline void die(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "error: ");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (err < 0)
		fprintf(stderr, ": %s (%s)", strerror(-err), ulnic_last_error());
	fputc('\n', stderr);
	exit(1);
}

static inline double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Opens the NIC the environment names (ULNIC_SOCKET on a host,
 * /dev/ulnic0 in a guest) and one endpoint bound to `port`, with
 * `buffers` receive buffers of 64 KiB at the start of its segment. */
static inline struct ulnic_ep *open_endpoint(uint32_t port, unsigned buffers,
				      struct ulnic_nic **nic_out)
{
	struct ulnic_nic *nic;
	struct ulnic_pd *pd;
	struct ulnic_ep *ep;
	int err;

	err = ulnic_open(&nic);
	if (err < 0)
		die(err, "cannot open a ulnic NIC");
	err = ulnic_pd_alloc(nic, &pd);
	if (err < 0)
		die(err, "cannot allocate a protection domain");
	err = ulnic_ep_create(pd, NULL, &ep);
	if (err < 0)
		die(err, "cannot create an endpoint");
	ulnic_pd_free(pd); /* the endpoint keeps its domain */
	err = ulnic_ep_bind(ep, port);
	if (err < 0)
		die(err, "cannot bind port %u", port);
	for (unsigned i = 0; i < buffers; i++) {
		err = ulnic_ep_post_free(ep, (uint64_t)i << 16, 1 << 16, i);
		if (err < 0)
			die(err, "cannot post receive buffer %u", i);
	}
	*nic_out = nic;
	return ep;
}

/* Waits for the next message, up to `timeout_ms`: polls a while, giving
 * the core away between looks (the device's engine may need it: two
 * programs and the engine spinning on two cores starve one another),
 * then sleeps in the driver. A failed send (an event) ends the program. */
static inline void next_message(struct ulnic_ep *ep, struct ulnic_recv *m, int timeout_ms)
{
	double deadline = now_us() + timeout_ms * 1e3;
	struct ulnic_event ev;

	for (unsigned spins = 0;; spins++) {
		int err;

		if (ulnic_ep_poll_recv(ep, m) == 1)
			return;
		while (ulnic_ep_poll_event(ep, &ev) == 1)
			if (ev.kind == ULNIC_EVENT_SEND_FAILED)
				die(-ev.error, "a send to %u:%u failed", ev.addr.node, ev.addr.port);
		if (now_us() > deadline)
			die(0, "no message within %d ms", timeout_ms);
		if (spins < 100000)
			sched_yield();
		else if ((err = ulnic_ep_wait(ep, 100)) < 0)
			die(err, "waiting failed");
	}
}

/* Sends `len` bytes (at most ULNIC_INLINE_MAX) to `to`, retrying while
 * the send ring is full. */
static inline void send_small(struct ulnic_ep *ep, struct ulnic_address to, uint32_t tag,
		       const void *data, size_t len)
{
	int err;

	while ((err = ulnic_ep_post_send_inline(ep, to, tag, data, len, 0)) == -EAGAIN)
		sched_yield();
	if (err < 0)
		die(err, "cannot send to %u:%u", to.node, to.port);
}

#endif
