/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * Sockets over ulnic endpoints in C. The server echoes one datagram and
 * then one byte stream until its end. The client sends a datagram and
 * checks the echo, then streams BYTES bytes in writes of odd sizes while
 * reading the echo back, never blocking: when neither direction can move
 * it arms the connection and sleeps in poll() on the notification
 * descriptor, as a program with many sockets would.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./sock_echo server 7
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./sock_echo client 1 7 1000000
 *
 * Build: gcc sock_echo.c $(pkg-config --cflags --libs ulnic) -o sock_echo
 */
#include <poll.h>
#include <sys/socket.h>
#include "example.h"

static unsigned char pattern(uint64_t i)
{
	return (unsigned char)(i * 31 + 7);
}

static struct ulnic_sock_net *open_net(void)
{
	struct ulnic_sock_net *net;
	int err = ulnic_sock_open(&net);

	if (err < 0)
		die(err, "cannot open sockets");
	return net;
}

static int server(uint16_t port)
{
	struct ulnic_sock_net *net = open_net();
	struct ulnic_listener *l;
	struct ulnic_dgram *d;
	struct ulnic_stream *s;
	struct ulnic_sockaddr from;
	static char buf[65536];
	uint64_t echoed = 0;
	int64_t n;
	int err;

	err = ulnic_listen(net, port, 4, &l);
	if (err < 0)
		die(err, "cannot listen on port %u", port);
	err = ulnic_dgram_bind(net, port, &d);
	if (err < 0)
		die(err, "cannot bind a datagram socket to port %u", port);
	printf("listening on node %u port %u\n", ulnic_sock_node(net), port);
	fflush(stdout);

	n = ulnic_dgram_recv_from(d, buf, sizeof buf, &from, 20000);
	if (n < 0)
		die((int)n, "no datagram came");
	if (ulnic_dgram_send_to(d, buf, (size_t)n, from, -1) != n)
		die(-EIO, "cannot echo the datagram");

	err = ulnic_accept(l, 20000, &s, &from);
	if (err < 0)
		die(err, "no connection came");
	while ((n = ulnic_stream_read(s, buf, sizeof buf, -1)) > 0) {
		int64_t off = 0;

		while (off < n) {
			int64_t w = ulnic_stream_write(s, buf + off, (size_t)(n - off), -1);

			if (w < 0)
				die((int)w, "cannot echo");
			off += w;
		}
		echoed += (uint64_t)n;
	}
	if (n < 0)
		die((int)n, "read failed");
	printf("echoed a datagram and %llu bytes from node %u\n",
	       (unsigned long long)echoed, from.node);
	ulnic_stream_close(s);
	ulnic_dgram_close(d);
	ulnic_listener_close(l);
	ulnic_sock_close_net(net);
	return 0;
}

static int client(uint32_t node, uint16_t port, uint64_t total)
{
	struct ulnic_sock_net *net = open_net();
	struct ulnic_sockaddr to = { .node = node, .port = port };
	struct ulnic_sockaddr from;
	struct ulnic_dgram *d;
	struct ulnic_stream *s;
	static unsigned char out[8192], in[65536];
	uint64_t sent = 0, received = 0, sleeps = 0;
	size_t chunk = 1;
	struct pollfd p;
	int64_t n;
	int err, i;

	/* One datagram there and back. */
	err = ulnic_dgram_bind(net, 0, &d);
	if (err < 0)
		die(err, "cannot bind a datagram socket");
	for (i = 0; i < 1000; i++)
		out[i] = pattern((uint64_t)i);
	if (ulnic_dgram_send_to(d, out, 1000, to, -1) != 1000)
		die(-EIO, "cannot send the datagram: %s", ulnic_last_error());
	n = ulnic_dgram_recv_from(d, in, sizeof in, &from, 20000);
	if (n != 1000 || memcmp(in, out, 1000) != 0 || from.node != node)
		die(n < 0 ? (int)n : -EIO, "the datagram's echo is wrong");
	ulnic_dgram_close(d);

	/* A stream both ways at once, without blocking in a call. */
	err = ulnic_connect(net, to, &s);
	if (err < 0)
		die(err, "cannot connect to node %u port %u", node, port);
	p.fd = ulnic_sock_notification_fd(net);
	p.events = POLLIN;
	if (p.fd < 0)
		die(p.fd, "no notification descriptor");
	while (received < total) {
		int moved = 0;

		if (sent < total) {
			size_t len = chunk;

			if (len > total - sent)
				len = (size_t)(total - sent);
			for (size_t k = 0; k < len; k++)
				out[k] = pattern(sent + k);
			n = ulnic_stream_write(s, out, len, 0);
			if (n > 0) {
				sent += (uint64_t)n;
				chunk = chunk * 7 % 8191 + 1; /* odd sizes, 1 to 8191 */
				moved = 1;
				if (sent == total && ulnic_stream_shutdown(s, SHUT_WR) < 0)
					die(-EIO, "cannot shut down: %s", ulnic_last_error());
			} else if (n != -EAGAIN) {
				die((int)n, "write failed after %llu bytes",
				    (unsigned long long)sent);
			}
		}
		n = ulnic_stream_read(s, in, sizeof in, 0);
		if (n > 0) {
			for (int64_t k = 0; k < n; k++)
				if (in[k] != pattern(received + (uint64_t)k))
					die(-EIO, "byte %llu is wrong",
					    (unsigned long long)(received + (uint64_t)k));
			received += (uint64_t)n;
			moved = 1;
		} else if (n == 0) {
			die(-EIO, "the stream ended after %llu bytes",
			    (unsigned long long)received);
		} else if (n != -EAGAIN) {
			die((int)n, "read failed");
		}
		if (!moved && ulnic_stream_arm(s) == 0) {
			sleeps++;
			if (poll(&p, 1, 1000) < 0)
				die(-errno, "poll");
			ulnic_sock_take_notified(net);
		}
	}
	n = ulnic_stream_read(s, in, sizeof in, 20000);
	if (n != 0)
		die(n < 0 ? (int)n : -EIO, "no end of stream after the echo");
	printf("a datagram and %llu bytes echoed by node %u, every byte checked (%llu sleeps in poll)\n",
	       (unsigned long long)received, node, (unsigned long long)sleeps);
	ulnic_stream_close(s);
	ulnic_sock_close_net(net);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "server") == 0)
		return server((uint16_t)atoi(argv[2]));
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return client((uint32_t)atoi(argv[2]), (uint16_t)atoi(argv[3]),
			      strtoull(argv[4], NULL, 10));
	fprintf(stderr, "usage: %s server PORT | client NODE PORT BYTES\n", argv[0]);
	return 2;
}
