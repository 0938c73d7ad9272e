/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * An echo pair on libevent (evconnlistener and bufferevents over epoll):
 * it knows nothing of ulnic.
 *
 *   evecho server PORT N          echo; exit after N connections ended
 *   evecho client IP PORT N BYTES N connections at once, each sending BYTES
 *                                 of its own pattern, in pieces, then
 *                                 reading it back; every byte checked
 *
 * Prints "ok ..." or "fail ..." (exit 1).
 */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ended, wanted;
static long bytes;

static unsigned char pat(int conn, long i)
{
	return (unsigned char)(((unsigned long)i * 2654435761u + (unsigned long)conn * 40503u) >> 11);
}

static void fail(const char *what)
{
	printf("fail %s\n", what);
	exit(1);
}

static void echo_read(struct bufferevent *bev, void *arg)
{
	(void)arg;
	evbuffer_add_buffer(bufferevent_get_output(bev), bufferevent_get_input(bev));
}

static void echo_event(struct bufferevent *bev, short what, void *arg)
{
	(void)arg;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		if (what & BEV_EVENT_ERROR)
			fail("server connection error");
		bufferevent_free(bev);
		if (++ended == wanted)
			event_base_loopexit(bufferevent_get_base(bev), NULL);
	}
}

static void accepted(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *a, int len,
		     void *arg)
{
	struct bufferevent *bev =
		bufferevent_socket_new(evconnlistener_get_base(l), fd, BEV_OPT_CLOSE_ON_FREE);

	(void)a, (void)len, (void)arg;
	if (!bev)
		fail("bufferevent_socket_new");
	bufferevent_setcb(bev, echo_read, NULL, echo_event, NULL);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static int server(int port, int n)
{
	struct event_base *base = event_base_new();
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct evconnlistener *l;

	wanted = n;
	l = evconnlistener_new_bind(base, accepted, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
				    128, (struct sockaddr *)&a, sizeof(a));
	if (!base || !l)
		fail("listen");
	printf("ready (%s)\n", event_base_get_method(base));
	fflush(stdout);
	event_base_dispatch(base);
	printf("ok libevent server: %d connections echoed\n", n);
	return 0;
}

struct conn {
	int id;
	long size, sent, got;
	struct bufferevent *bev;
};

/* Sends the next piece (at most 3000 bytes at a time, so writes and
 * reads interleave). */
static void send_some(struct conn *c)
{
	unsigned char piece[3000];
	long k = c->size - c->sent < (long)sizeof(piece) ? c->size - c->sent : (long)sizeof(piece);

	for (long i = 0; i < k; i++)
		piece[i] = pat(c->id, c->sent + i);
	if (k && bufferevent_write(c->bev, piece, k))
		fail("bufferevent_write");
	c->sent += k;
}

static void client_read(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	unsigned char buf[4096];
	int n;

	while ((n = evbuffer_remove(in, buf, sizeof(buf))) > 0) {
		for (int i = 0; i < n; i++)
			if (buf[i] != pat(c->id, c->got + i)) {
				printf("fail echo of connection %d at byte %ld\n", c->id, c->got + i);
				exit(1);
			}
		c->got += n;
	}
	if (c->got == c->size) {
		bytes += c->size;
		bufferevent_free(bev);
		if (++ended == wanted)
			event_base_loopexit(bufferevent_get_base(bev), NULL);
	}
}

static void client_write(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	(void)bev;
	if (c->sent < c->size)
		send_some(c);
}

static void client_event(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED) {
		send_some(c);
		return;
	}
	printf("fail connection %d: event 0x%x after %ld of %ld bytes back\n", c->id, what, c->got,
	       c->size);
	exit(1);
}

static int client(const char *ip, int port, int n, long size)
{
	struct event_base *base = event_base_new();
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct conn *conns = calloc(n, sizeof(*conns));

	if (!base || !conns || inet_pton(AF_INET, ip, &a.sin_addr) != 1)
		fail("setup");
	wanted = n;
	for (int i = 0; i < n; i++) {
		struct conn *c = &conns[i];

		c->id = i;
		c->size = size + i;
		c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
		if (!c->bev)
			fail("bufferevent_socket_new");
		bufferevent_setcb(c->bev, client_read, client_write, client_event, c);
		bufferevent_enable(c->bev, EV_READ | EV_WRITE);
		if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&a, sizeof(a)))
			fail("connect");
	}
	event_base_dispatch(base);
	if (ended != n)
		fail("the loop ended early");
	printf("ok libevent client: %d connections, %ld bytes echoed (%s)\n", n, bytes,
	       event_base_get_method(base));
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 6 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), atoi(argv[4]), atol(argv[5]));
	fprintf(stderr, "usage: evecho server PORT N | client IP PORT N BYTES\n");
	return 2;
}
