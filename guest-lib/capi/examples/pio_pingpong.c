/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * PIO windows in C (CLAN's PIO apertures, docs/spec.md §6.2): the owner
 * exports a window and hands its grant to the writer, which maps it and
 * plays ping-pong through two words of it with plain stores: no send,
 * no doorbell, no device step per round trip. Then the owner revokes the
 * window and the writer is told.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./pio_pingpong owner 21
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./pio_pingpong writer 1 21 10000
 *
 * Build: gcc pio_pingpong.c $(pkg-config --cflags --libs ulnic) -o pio_pingpong
 */
#include "example.h"

#define PING 0 /* word the writer stores, the owner watches */
#define PONG 8 /* word the owner stores, the writer watches */
#define DONE (~0ull)

/* Spins until the word at `p` is `want` or DONE, giving the core away
 * now and then (two spinners and the device share two cores in CI). */
static uint64_t wait_word(volatile uint64_t *p, uint64_t want)
{
	for (unsigned spins = 1;; spins++) {
		uint64_t v = __atomic_load_n(p, __ATOMIC_ACQUIRE);

		if (v == want || v == DONE)
			return v;
		if (spins % 256 == 0)
			sched_yield();
	}
}

static int owner(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 4, &nic);
	struct ulnic_pio_window *w;
	struct ulnic_pio_grant grant;
	struct ulnic_recv hello;
	uint64_t rounds = 0;
	int err;

	err = ulnic_pio_export(ep, 4096, ULNIC_ANY, &w);
	if (err < 0)
		die(err, "cannot export a PIO window");
	ulnic_pio_window_grant(w, &grant);
	char *base = ulnic_pio_window_addr(w);
	printf("pio_pingpong: owner on node %u port %u, window %u of %llu bytes\n", ulnic_node(nic),
	       port, grant.window, (unsigned long long)ulnic_pio_window_len(w));
	fflush(stdout);
	next_message(ep, &hello, 600000);
	send_small(ep, hello.src, 0, &grant, sizeof(grant));
	for (uint64_t i = 1;; i++) {
		if (wait_word((volatile uint64_t *)(base + PING), i) == DONE)
			break;
		__atomic_store_n((uint64_t *)(base + PONG), i, __ATOMIC_RELEASE);
		rounds = i;
	}
	err = ulnic_pio_window_revoke(w);
	if (err < 0)
		die(err, "cannot revoke");
	printf("pio_pingpong: answered %llu round trips, then revoked the window\n",
	       (unsigned long long)rounds);
	ulnic_pio_window_free(w);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int writer(uint32_t node, uint32_t port, uint64_t rounds)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 4, &nic);
	struct ulnic_address to = { .node = node, .port = port };
	struct ulnic_pio_import *imp;
	struct ulnic_pio_grant grant;
	struct ulnic_event ev;
	struct ulnic_recv m;
	double *rtt = calloc(rounds, sizeof(*rtt));
	int err;

	if (!rtt)
		die(0, "out of memory");
	send_small(ep, to, 0, "hi", 2);
	next_message(ep, &m, 10000);
	memcpy(&grant, m.data, sizeof(grant));
	err = ulnic_pio_import(ep, &grant, &imp);
	if (err < 0)
		die(err, "cannot import window %u of node %u", grant.window, grant.node);
	char *base = ulnic_pio_import_addr(imp);
	for (uint64_t i = 1; i <= rounds; i++) {
		double t = now_us();

		__atomic_store_n((uint64_t *)(base + PING), i, __ATOMIC_RELEASE);
		if (wait_word((volatile uint64_t *)(base + PONG), i) != i)
			die(0, "the owner stopped");
		rtt[i - 1] = now_us() - t;
	}
	__atomic_store_n((uint64_t *)(base + PING), DONE, __ATOMIC_RELEASE);
	ulnic_pio_flush();
	qsort(rtt, rounds, sizeof(*rtt), cmp);
	printf("pio_pingpong: %llu round trips through node %u's window: median %.2f us, p95 %.2f us\n",
	       (unsigned long long)rounds, node, rtt[rounds / 2], rtt[rounds * 95 / 100]);
	/* The owner revokes once it sees DONE: the import's memory is gone. */
	for (double deadline = now_us() + 10e6;;) {
		if (ulnic_ep_poll_event(ep, &ev) == 1 && ev.kind == ULNIC_EVENT_PIO_REVOKED) {
			if (ev.code != ulnic_pio_import_id(imp) || ev.id != grant.key)
				die(0, "a revocation of another import (%u)", ev.code);
			break;
		}
		if (now_us() > deadline)
			die(0, "no revocation within 10 s");
		sched_yield();
	}
	printf("pio_pingpong: window revoked by node %u, import %u released\n", ev.addr.node,
	       ulnic_pio_import_id(imp));
	ulnic_pio_import_free(imp);
	free(rtt);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "owner"))
		return owner((uint32_t)strtoul(argv[2], NULL, 0));
	if (argc == 5 && !strcmp(argv[1], "writer")) {
		uint64_t rounds = strtoull(argv[4], NULL, 0);

		if (rounds == 0)
			die(0, "ROUNDS must be at least 1");
		return writer((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0),
			      rounds);
	}
	fprintf(stderr, "usage: %s owner PORT\n       %s writer NODE PORT ROUNDS\n", argv[0], argv[0]);
	return 2;
}
