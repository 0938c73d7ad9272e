/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * CLAN's event queue in C: a server with SOURCES endpoints (ports PORT,
 * PORT+1, ...) attached to one queue endpoint sleeps in epoll on the
 * queue's descriptor alone; each QUEUED report names a source by its
 * cookie, the server answers what that source received, then arms it
 * again. The client sends rounds of one message to each source, in a
 * rotating order, and checks every answer.
 *
 * With `server-evq` the sources are attached to a ulnic_evq instead: the
 * main thread serves all but the last through ulnic_evq_wait, and a
 * thread of its own blocks in ulnic_ep_wait on the last one; both sleep
 * on the one queue, which hands each its own reports.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./event_queue server 30
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./event_queue server-evq 30
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./event_queue client 1 30 500
 *
 * Build: gcc event_queue.c $(pkg-config --cflags --libs ulnic) -o event_queue
 */
#include <pthread.h>
#include <sys/epoll.h>

#include "example.h"

#define SOURCES 4
#define TAG_DATA 1
#define TAG_DONE 2

static struct ulnic_ep *make_endpoint(struct ulnic_pd *pd, uint32_t port, unsigned buffers)
{
	struct ulnic_ep *ep;
	int err = ulnic_ep_create(pd, NULL, &ep);

	if (err < 0)
		die(err, "cannot create an endpoint");
	if (port && (err = ulnic_ep_bind(ep, port)) < 0)
		die(err, "cannot bind port %u", port);
	for (unsigned i = 0; i < buffers; i++)
		if ((err = ulnic_ep_post_free(ep, (uint64_t)i << 16, 1 << 16, i)) < 0)
			die(err, "cannot post a receive buffer");
	return ep;
}

/* Answers everything `ep` holds; true once the client said it is done. */
static int serve(struct ulnic_ep *ep, unsigned long *answered)
{
	struct ulnic_recv m;
	int done = 0;

	while (ulnic_ep_poll_recv(ep, &m) == 1) {
		if (m.tag == TAG_DONE) {
			done = 1;
		} else {
			send_small(ep, m.src, TAG_DATA, m.data, m.len);
			(*answered)++;
		}
		if (!(m.flags & ULNIC_RECV_INLINE))
			ulnic_ep_post_free(ep, m.buffer_offset, 1 << 16, m.buffer_id);
	}
	return done;
}

static int server(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_pd *pd;
	struct ulnic_ep *queue, *src[SOURCES];
	int armed[SOURCES], err, ep_fd, done = 0;
	unsigned long answered = 0, wakeups = 0, reports = 0, duplicates = 0;
	struct epoll_event ev = { .events = EPOLLIN };
	struct ulnic_event e;

	if ((err = ulnic_open(&nic)) < 0 || (err = ulnic_pd_alloc(nic, &pd)) < 0)
		die(err, "cannot open the NIC");
	queue = make_endpoint(pd, 0, 0);
	if (ulnic_ep_set_event_queue(queue, queue, 1) != -EINVAL)
		die(0, "an endpoint was accepted as its own queue");
	for (int i = 0; i < SOURCES; i++) {
		src[i] = make_endpoint(pd, port + i, 4);
		if ((err = ulnic_ep_set_event_queue(src[i], queue, i)) < 0)
			die(err, "cannot attach source %d", i);
		armed[i] = ulnic_ep_arm(src[i]) == 0;
	}
	ep_fd = epoll_create1(0);
	if (ep_fd < 0 || epoll_ctl(ep_fd, EPOLL_CTL_ADD, ulnic_ep_fd(queue), &ev))
		die(-errno, "epoll");
	printf("event_queue: server on node %u ports %u-%u, one queue\n", ulnic_node(nic), port,
	       port + SOURCES - 1);
	fflush(stdout);
	while (!done) {
		if (ulnic_ep_arm(queue) == 0 && epoll_wait(ep_fd, &ev, 1, 600000) != 1)
			die(0, "no report within 600 s");
		wakeups++;
		ulnic_ep_take_notification(queue);
		while (ulnic_ep_poll_event(queue, &e) == 1) {
			if (e.kind != ULNIC_EVENT_QUEUED || e.id >= SOURCES)
				die(0, "the queue got event kind %u", e.kind);
			reports++;
			duplicates += !armed[e.id];
			armed[e.id] = 0;
			/* Serve, arm again, and serve what came meanwhile. */
			do
				done |= serve(src[e.id], &answered);
			while (ulnic_ep_arm(src[e.id]) == 1);
			armed[e.id] = 1;
		}
	}
	printf("event_queue: answered %lu messages on %d endpoints after %lu wake-ups of one queue: %lu reports, %lu duplicates\n",
	       answered, SOURCES, wakeups, reports, duplicates);
	for (int i = 0; i < SOURCES; i++)
		ulnic_ep_destroy(src[i]);
	ulnic_ep_destroy(queue);
	ulnic_pd_free(pd);
	ulnic_close(nic);
	return duplicates != 0;
}

struct own_thread {
	struct ulnic_ep *ep;
	unsigned long answered, wakeups;
	int err;
};

/* The last source's own thread: blocks on it alone, through the queue. */
static void *serve_alone(void *arg)
{
	struct own_thread *t = arg;
	int done = 0, r;

	while (!done) {
		if ((r = ulnic_ep_wait(t->ep, 600000)) != 1) {
			t->err = r < 0 ? r : -ETIMEDOUT;
			return NULL;
		}
		t->wakeups++;
		done = serve(t->ep, &t->answered);
	}
	return NULL;
}

static int server_evq(uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_pd *pd;
	struct ulnic_evq *evq;
	struct ulnic_ep *src[SOURCES];
	struct own_thread alone = { 0 };
	pthread_t thread;
	unsigned long answered = 0, waits = 0, reports = 0;
	int err, done[SOURCES - 1] = { 0 }, left = SOURCES - 1;

	if ((err = ulnic_open(&nic)) < 0 || (err = ulnic_pd_alloc(nic, &pd)) < 0)
		die(err, "cannot open the NIC");
	if ((err = ulnic_evq_create(pd, &evq)) < 0)
		die(err, "cannot create the event queue");
	for (int i = 0; i < SOURCES; i++) {
		src[i] = make_endpoint(pd, port + i, 4);
		if ((err = ulnic_evq_attach(evq, src[i], i)) < 0)
			die(err, "cannot attach source %d", i);
	}
	alone.ep = src[SOURCES - 1];
	if ((err = pthread_create(&thread, NULL, serve_alone, &alone)))
		die(-err, "pthread_create");
	printf("event_queue: server on node %u ports %u-%u, one ulnic_evq\n", ulnic_node(nic), port,
	       port + SOURCES - 1);
	fflush(stdout);
	while (left) {
		uint64_t ready[SOURCES];
		int n = ulnic_evq_wait(evq, ready, SOURCES, 600000);

		if (n <= 0)
			die(n, "no report within 600 s");
		waits++;
		for (int k = 0; k < n; k++) {
			uint64_t i = ready[k];

			if (i >= SOURCES - 1)
				die(0, "ulnic_evq_wait reported source %lu, which a thread waits on",
				    (unsigned long)i);
			reports++;
			do {
				if (serve(src[i], &answered) && !done[i]) {
					done[i] = 1;
					left--;
				}
			} while (ulnic_ep_arm(src[i]) == 1);
		}
	}
	pthread_join(thread, NULL);
	if (alone.err)
		die(alone.err, "the thread blocked on source %d failed", SOURCES - 1);
	printf("event_queue: answered %lu messages on %d endpoints: %lu through ulnic_evq_wait (%lu waits, %lu reports), %lu by a thread blocked in ulnic_ep_wait (%lu wake-ups)\n",
	       answered + alone.answered, SOURCES, answered, waits, reports, alone.answered,
	       alone.wakeups);
	for (int i = 0; i < SOURCES; i++)
		ulnic_ep_destroy(src[i]);
	ulnic_evq_destroy(evq);
	ulnic_pd_free(pd);
	ulnic_close(nic);
	return 0;
}

static int client(uint32_t node, uint32_t port, unsigned rounds)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + SOURCES, 16, &nic);
	struct ulnic_recv m;
	unsigned long checked = 0;

	for (unsigned r = 0; r < rounds; r++) {
		uint32_t sent[SOURCES];

		for (int i = 0; i < SOURCES; i++) {
			struct ulnic_address to = { .node = node, .port = port + (r + i) % SOURCES };

			sent[i] = r * SOURCES + i;
			send_small(ep, to, TAG_DATA, &sent[i], sizeof(sent[i]));
		}
		for (int i = 0; i < SOURCES; i++) {
			uint32_t got;

			next_message(ep, &m, 10000);
			memcpy(&got, m.data, sizeof(got));
			if (m.len != sizeof(got) || got / SOURCES != r || m.src.port - port != (r + got % SOURCES) % SOURCES)
				die(0, "round %u: answer %u came from port %u", r, got, m.src.port);
			checked++;
		}
	}
	for (int i = 0; i < SOURCES; i++)
		send_small(ep, (struct ulnic_address){ .node = node, .port = port + i }, TAG_DONE, "", 0);
	printf("event_queue: %lu answers from %d endpoints of node %u checked\n", checked, SOURCES, node);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "server-evq"))
		return server_evq(atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: event_queue server PORT | event_queue server-evq PORT | event_queue client NODE PORT ROUNDS\n");
	return 2;
}
