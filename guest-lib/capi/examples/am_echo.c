/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * Active Messages in C (VN's AM-II over ulnic, docs/am.md). The server's
 * request handler 1 answers with the first word plus one; handler 2
 * takes 1,000-byte transfers into its region and answers with their byte
 * sum; handler 3 says stop. The client sends COUNT requests and COUNT /
 * 10 transfers, checks every reply, asks for a handler the server lacks
 * and checks that the request comes back refused to its error handler.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./am_echo server 9
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./am_echo client 1 9 10000
 *
 * Build: gcc am_echo.c $(pkg-config --cflags --libs ulnic) -o am_echo
 */
#include "example.h"

#define XFER 1000

struct server {
	unsigned long requests, bytes;
	int stop;
};

static void echo(struct ulnic_am_token *t, const struct ulnic_am_message *m, void *user)
{
	struct server *s = user;
	uint64_t w[4] = { m->words[0] + 1, m->words[1], 0, 0 };

	s->requests++;
	if (ulnic_am_reply4(t, 1, w) < 0 || ulnic_am_reply4(t, 1, w) != -EINVAL)
		die(0, "a request is replied to once");
}

static void bulk(struct ulnic_am_token *t, const struct ulnic_am_message *m, void *user)
{
	struct server *s = user;
	const unsigned char *p = m->data;
	uint64_t sum = 0;

	for (size_t i = 0; i < m->len; i++)
		sum += p[i];
	s->bytes += m->len;
	uint64_t w[4] = { sum, m->offset, m->len, 0 };
	ulnic_am_reply4(t, 2, w);
}

static void stop(struct ulnic_am_token *t, const struct ulnic_am_message *m, void *user)
{
	(void)t;
	(void)m;
	((struct server *)user)->stop = 1; /* no reply: the layer answers */
}

static struct ulnic_am *open_am(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 0, &nic);
	struct ulnic_am *am;
	int err = ulnic_am_create(ep, NULL, &am);

	if (err < 0)
		die(err, "cannot make an AM endpoint");
	return am;
}

static int serve(uint32_t port)
{
	struct server s = { 0 };
	struct ulnic_am *am = open_am(port);
	struct ulnic_am_stats st;

	ulnic_am_set_request_handler(am, 1, echo, &s);
	ulnic_am_set_request_handler(am, 2, bulk, &s);
	ulnic_am_set_request_handler(am, 3, stop, &s);
	printf("AM server on node 1 port %u\n", port);
	fflush(stdout);
	double deadline = now_us() + 60e6;
	while (!s.stop) {
		int n = ulnic_am_poll(am);
		if (n < 0)
			die(n, "poll");
		if (n == 0)
			sched_yield();
		if (now_us() > deadline)
			die(0, "no stop request within 60 s");
	}
	ulnic_am_stats(am, &st);
	printf("answered %lu requests and %lu transfer bytes (%lu refused)\n", s.requests, s.bytes,
	       (unsigned long)st.refusals_sent);
	ulnic_am_free(am);
	return 0;
}

struct client {
	unsigned long replies, bulk_replies, refused;
	uint64_t expect_sum;
};

static void replied(const struct ulnic_am_message *m, void *user)
{
	struct client *c = user;

	if (m->words[0] != m->words[1] + 1)
		die(0, "reply %lu carries %lu", (unsigned long)m->words[1], (unsigned long)m->words[0]);
	c->replies++;
}

static void bulk_replied(const struct ulnic_am_message *m, void *user)
{
	struct client *c = user;

	if (m->words[0] != c->expect_sum || m->words[2] != XFER)
		die(0, "transfer sum %lu, expected %lu", (unsigned long)m->words[0],
		    (unsigned long)c->expect_sum);
	c->bulk_replies++;
}

static void came_back(const struct ulnic_am_returned *r, void *user)
{
	struct client *c = user;

	if (r->refused != 1 || r->code != 1 || r->handler != 9 || !r->has_words || r->words[0] != 99)
		die(0, "unexpected return: kind %u handler %u refused %u code %lu", r->kind, r->handler,
		    r->refused, (unsigned long)r->code);
	c->refused++;
}

static void settle(struct ulnic_am *am)
{
	while (ulnic_am_credits(am) < 4)
		if (ulnic_am_poll(am) == 0)
			sched_yield();
}

static int client(uint32_t node, uint32_t port, unsigned long count)
{
	struct client c = { 0 };
	struct ulnic_am *am = open_am(port + 1);
	struct ulnic_address to = { node, port };
	unsigned char data[XFER];
	int err;

	ulnic_am_set_reply_handler(am, 1, replied, &c);
	ulnic_am_set_reply_handler(am, 2, bulk_replied, &c);
	ulnic_am_set_error_handler(am, came_back, &c);
	for (unsigned long i = 0; i < count; i++) {
		uint64_t w[4] = { i, i, 0, 0 };
		if ((err = ulnic_am_request4(am, &to, 1, w, 1)) < 0)
			die(err, "request %lu", i);
		if (i % 10 == 0) {
			/* One transfer in flight at a time: its sum is known. */
			settle(am);
			c.expect_sum = 0;
			for (int b = 0; b < XFER; b++)
				c.expect_sum += data[b] = (unsigned char)(i + b * 7);
			if ((err = ulnic_am_xfer(am, &to, (i % 64) * XFER, 2, data, XFER, w, 1)) < 0)
				die(err, "transfer %lu", i);
			settle(am);
		}
	}
	uint64_t w[4] = { 99, 0, 0, 0 };
	ulnic_am_request4(am, &to, 9, w, 1);
	settle(am);
	ulnic_am_request4(am, &to, 3, w, 1);
	settle(am);
	if (c.replies != count || c.bulk_replies != (count + 9) / 10 || c.refused != 1)
		die(0, "%lu replies, %lu transfer replies, %lu refused", c.replies, c.bulk_replies, c.refused);
	printf("%lu replies and %lu transfer replies checked, 1 refusal returned\n", c.replies, c.bulk_replies);
	ulnic_am_free(am);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "server"))
		return serve((uint32_t)atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), strtoul(argv[4], NULL, 10));
	fprintf(stderr, "usage: %s server PORT | client NODE PORT COUNT\n", argv[0]);
	return 2;
}
