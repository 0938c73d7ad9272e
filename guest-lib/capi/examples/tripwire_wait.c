/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * A tripwire in C (CLAN): the owner exports a word, sets a tripwire on
 * it and sleeps in the driver ("check, arm, re-check, block") until a
 * remote write lands there; the writer stores VALUE with a
 * write-immediate. The owner wakes, reads the value and answers.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./tripwire_wait owner 11
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./tripwire_wait writer 1 11 42
 *
 * Build: gcc tripwire_wait.c $(pkg-config --cflags --libs ulnic) -o tripwire_wait
 */
#include <unistd.h>

#include "example.h"

#define WORD (2u << 20)

static int owner(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 4, &nic);
	struct ulnic_cookie cookie;
	struct ulnic_recv hello;
	uint32_t tw;
	uint64_t seen;
	double slept;
	int err;

	err = ulnic_ep_export(ep, WORD, 8, ULNIC_PERM_WRITE, &cookie);
	if (err < 0)
		die(err, "cannot export");
	err = ulnic_ep_set_tripwire(ep, &cookie, 0, 8, ULNIC_TRIPWIRE_WRITES, 7, &tw);
	if (err < 0)
		die(err, "cannot set a tripwire");
	printf("tripwire_wait: owner on node %u port %u\n", ulnic_node(nic), port);
	fflush(stdout);
	next_message(ep, &hello, 600000);
	seen = ulnic_ep_read_u64(ep, WORD);
	send_small(ep, hello.src, 0, &cookie, sizeof(cookie));
	slept = now_us();
	err = ulnic_ep_wait_tripwire(ep, tw, WORD, seen, 10000);
	if (err < 0)
		die(err, "waiting on the tripwire");
	if (err == 0)
		die(0, "no remote write within 10 s");
	uint64_t value = ulnic_ep_read_u64(ep, WORD);
	printf("tripwire_wait: woken by a remote write after %.0f us asleep: the word is now %llu\n",
	       now_us() - slept, (unsigned long long)value);
	send_small(ep, hello.src, 0, &value, sizeof(value));
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

static int writer(uint32_t node, uint32_t port, uint64_t value)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 4, &nic);
	struct ulnic_address to = { .node = node, .port = port };
	struct ulnic_cookie cookie;
	struct ulnic_recv m;
	uint64_t echoed;
	int err;

	send_small(ep, to, 0, "hi", 2);
	next_message(ep, &m, 10000);
	memcpy(&cookie, m.data, sizeof(cookie));
	usleep(200 * 1000); /* let the owner fall asleep */
	err = ulnic_ep_write_immediate(ep, &cookie, 0, value, 8, 1, ULNIC_COMPLETION);
	if (err < 0)
		die(err, "write-immediate");
	next_message(ep, &m, 10000);
	memcpy(&echoed, m.data, sizeof(echoed));
	if (echoed != value)
		die(0, "the owner saw %llu, not %llu", (unsigned long long)echoed, (unsigned long long)value);
	printf("tripwire_wait: the owner on node %u woke and read %llu\n", node, (unsigned long long)echoed);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "owner"))
		return owner((uint32_t)strtoul(argv[2], NULL, 0));
	if (argc == 5 && !strcmp(argv[1], "writer"))
		return writer((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0),
			      strtoull(argv[4], NULL, 0));
	fprintf(stderr, "usage: %s owner PORT\n       %s writer NODE PORT VALUE\n", argv[0], argv[0]);
	return 2;
}
