/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * One-sided RDMA write in C. The target exports part of its segment and
 * sends the cookie to the initiator, which writes SIZE bytes into it ROUNDS
 * times and then stores the round count with a write-immediate (which
 * never overtakes the writes before it). The target sees the count change,
 * checks every byte and says so; the initiator prints its rate.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./rdma_write target 9
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./rdma_write initiator 1 9 65536 100
 *
 * Build: gcc rdma_write.c $(pkg-config --cflags --libs ulnic) -o rdma_write
 */
#include "example.h"

/* The target's aperture: a flag word, then the data. */
#define APERTURE (2u << 20)
#define DATA 64u
#define MAX_SIZE (1u << 20)

static int target(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 4, &nic);
	unsigned char *seg = ulnic_ep_segment(ep, NULL);
	struct ulnic_cookie cookie;
	struct ulnic_recv hello;
	uint64_t rounds;
	uint32_t size;
	int err;

	err = ulnic_ep_export(ep, APERTURE, DATA + MAX_SIZE, ULNIC_PERM_WRITE, &cookie);
	if (err < 0)
		die(err, "cannot export");
	printf("rdma_write: target on node %u port %u\n", ulnic_node(nic), port);
	fflush(stdout);
	next_message(ep, &hello, 600000); /* the initiator says how much */
	memcpy(&size, hello.data, sizeof(size));
	if (size == 0 || size > MAX_SIZE)
		die(0, "asked for %u bytes", size);
	send_small(ep, hello.src, 0, &cookie, sizeof(cookie));
	while ((rounds = ulnic_ep_read_u64(ep, APERTURE)) == 0)
		sched_yield(); /* the write-immediate comes after every write */
	for (uint32_t b = 0; b < size; b++)
		if (seg[APERTURE + DATA + b] != (unsigned char)(b * 31 + rounds))
			die(0, "byte %u is wrong after %llu rounds", b, (unsigned long long)rounds);
	printf("rdma_write: %llu writes of %u bytes arrived, every byte checked\n",
	       (unsigned long long)rounds, size);
	send_small(ep, hello.src, 0, "ok", 2);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

static int initiator(uint32_t node, uint32_t port, uint32_t size, unsigned rounds)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 4, &nic);
	unsigned char *seg = ulnic_ep_segment(ep, NULL);
	struct ulnic_address to = { .node = node, .port = port };
	struct ulnic_cookie cookie;
	struct ulnic_event ev;
	struct ulnic_recv m;
	unsigned done = 0;
	double t0;
	int err;

	if (size == 0 || size > MAX_SIZE || rounds == 0)
		die(0, "SIZE must be 1..%u and ROUNDS at least 1", MAX_SIZE);
	send_small(ep, to, 0, &size, sizeof(size));
	next_message(ep, &m, 10000);
	memcpy(&cookie, m.data, sizeof(cookie));
	t0 = now_us();
	for (unsigned r = 1; r <= rounds; r++) {
		/* The last round's pattern is what the target checks. */
		for (uint32_t b = 0; b < size; b++)
			seg[APERTURE + b] = (unsigned char)(b * 31 + rounds);
		while ((err = ulnic_ep_rdma_write(ep, &cookie, DATA, APERTURE, size, r,
						  ULNIC_COMPLETION)) == -EAGAIN)
			sched_yield();
		if (err < 0)
			die(err, "RDMA write %u", r);
		/* Wait for completion before the source is written again. */
		while (done < r) {
			if (ulnic_ep_poll_event(ep, &ev) != 1) {
				sched_yield();
				continue;
			}
			if (ev.kind == ULNIC_EVENT_SEND_FAILED)
				die(-ev.error, "RDMA write %llu failed", (unsigned long long)ev.id);
			done += ev.kind == ULNIC_EVENT_SEND_DONE;
		}
	}
	double us = now_us() - t0;
	err = ulnic_ep_write_immediate(ep, &cookie, 0, rounds, 8, 0, 0);
	if (err < 0)
		die(err, "write-immediate");
	next_message(ep, &m, 10000);
	if (m.len != 2 || memcmp(m.data, "ok", 2))
		die(0, "the target did not confirm");
	printf("rdma_write: %u writes of %u bytes to node %u in %.0f us: %.1f MB/s (pattern written each round, one write in flight)\n",
	       rounds, size, node, us, (double)size * rounds / us);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "target"))
		return target((uint32_t)strtoul(argv[2], NULL, 0));
	if (argc == 6 && !strcmp(argv[1], "initiator"))
		return initiator((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0),
				 (uint32_t)strtoul(argv[4], NULL, 0), (unsigned)strtoul(argv[5], NULL, 0));
	fprintf(stderr, "usage: %s target PORT\n       %s initiator NODE PORT SIZE ROUNDS\n", argv[0], argv[0]);
	return 2;
}
