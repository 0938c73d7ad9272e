/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * ulnic ping-pong in C. The client sends SIZE-byte messages to the
 * server, which answers each with the same bytes; the client checks
 * every answer and prints the median and 95th percentile round trip.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./pingpong server 7
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./pingpong client 1 7 10000 64
 *
 * In a guest the driver's /dev/ulnic0 is found without ULNIC_SOCKET.
 * Build: gcc pingpong.c $(pkg-config --cflags --libs ulnic) -o pingpong
 */
#include "example.h"

#define TAG_DATA 1
#define TAG_DONE 2
/* Messages larger than inline ones are sent from here in the segment
 * (receive buffers take the first 16 x 64 KiB). */
#define SEND_AREA (2u << 20)

/* Sends `len` bytes that are at `data` (inline) or at `offset` in the
 * segment. */
static void send_message(struct ulnic_ep *ep, struct ulnic_address to, const void *data,
			 uint64_t offset, uint32_t len)
{
	int err;

	if (len <= ULNIC_INLINE_MAX) {
		send_small(ep, to, TAG_DATA, data, len);
		return;
	}
	while ((err = ulnic_ep_post_send(ep, to, TAG_DATA, offset, len, 0, 0)) == -EAGAIN)
		sched_yield();
	if (err < 0)
		die(err, "cannot send %u bytes", len);
}

/* The payload bytes of a received message. */
static const unsigned char *payload(const struct ulnic_recv *m, const unsigned char *seg)
{
	return (m->flags & ULNIC_RECV_INLINE) ? m->data : seg + m->buffer_offset;
}

static int server(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 16, &nic);
	unsigned char *seg = ulnic_ep_segment(ep, NULL);
	struct ulnic_recv m;
	unsigned long answered = 0;

	printf("pingpong: server on node %u port %u\n", ulnic_node(nic), port);
	fflush(stdout);
	for (;;) {
		next_message(ep, &m, 600000);
		if (m.tag == TAG_DONE)
			break;
		/* Answer from the send area, then give the buffer back. */
		memcpy(seg + SEND_AREA, payload(&m, seg), m.len);
		send_message(ep, m.src, payload(&m, seg), SEND_AREA, m.len);
		if (!(m.flags & ULNIC_RECV_INLINE)) {
			while (ulnic_ep_send_space(ep) < 256)
				sched_yield(); /* until the device has copied the answer */
			ulnic_ep_post_free(ep, m.buffer_offset, 1 << 16, m.buffer_id);
		}
		answered++;
	}
	printf("pingpong: server answered %lu messages\n", answered);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int client(uint32_t node, uint32_t port, unsigned iters, uint32_t size)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 16, &nic);
	unsigned char *seg = ulnic_ep_segment(ep, NULL);
	struct ulnic_address server_addr = { .node = node, .port = port };
	double *rtt = calloc(iters, sizeof(*rtt));
	struct ulnic_recv m;

	if (!rtt || size > (1u << 16))
		die(0, "SIZE must be at most 65536");
	for (unsigned i = 0; i < iters; i++) {
		unsigned char fill = (unsigned char)(i * 7 + 1);
		double t0 = now_us();

		memset(seg + SEND_AREA, fill, size);
		send_message(ep, server_addr, seg + SEND_AREA, SEND_AREA, size);
		next_message(ep, &m, 10000);
		rtt[i] = now_us() - t0;
		if (m.len != size)
			die(0, "answer %u has %u bytes, not %u", i, m.len, size);
		for (uint32_t b = 0; b < size; b++)
			if (payload(&m, seg)[b] != fill)
				die(0, "answer %u: byte %u is %u, not %u", i, b, payload(&m, seg)[b], fill);
		if (!(m.flags & ULNIC_RECV_INLINE))
			ulnic_ep_post_free(ep, m.buffer_offset, 1 << 16, m.buffer_id);
	}
	send_small(ep, server_addr, TAG_DONE, "", 0);
	qsort(rtt, iters, sizeof(*rtt), cmp_double);
	printf("pingpong: %u round trips of %u bytes with node %u: median %.2f us, p95 %.2f us, every byte checked\n",
	       iters, size, node, rtt[iters / 2], rtt[iters * 95 / 100]);
	free(rtt);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server((uint32_t)strtoul(argv[2], NULL, 0));
	if (argc == 6 && !strcmp(argv[1], "client")) {
		unsigned iters = (unsigned)strtoul(argv[4], NULL, 0);

		if (iters == 0)
			die(0, "ITERS must be at least 1");
		return client((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0),
			      iters, (uint32_t)strtoul(argv[5], NULL, 0));
	}
	fprintf(stderr, "usage: %s server PORT\n       %s client NODE PORT ITERS SIZE\n", argv[0], argv[0]);
	return 2;
}
