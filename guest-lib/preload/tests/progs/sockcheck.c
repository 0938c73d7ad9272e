/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * An ordinary sockets program (it knows nothing of ulnic) that the
 * preload layer's tests run with and without LD_PRELOAD. Every mode
 * prints one line "ok ..." when it saw what it should, else "fail ..."
 * and exits 1.
 *
 *   sockcheck serve PORT                      accept one connection, echo it
 *   sockcheck serve-in-child PORT             listen, fork; the child accepts one connection and echoes
 *                                             it, the parent reports the child's exit status
 *   sockcheck stream IP PORT BYTES            send BYTES (a pattern), read the echo, check it
 *   sockcheck prefork PORT WORKERS CONNS      a pre-forking server: WORKERS forked after listen, each
 *                                             in its own epoll set, accept and echo; after CONNS, say
 *                                             how many connections each worker served
 *   sockcheck prefork-clients IP PORT CONNS K CONNS connections, K open at once, 5000 bytes each, echo checked
 *   sockcheck hold-server PORT N              accept N connections, all kept open, echo each in one
 *                                             epoll set until it ends; say how many were open at once
 *   sockcheck hold-clients IP PORT N          open N connections at once, then send 2000 bytes on each,
 *                                             check every echo, and only then close them all
 *   sockcheck zero-copy IP PORT BYTES         send BYTES (a pattern, from a file) with sendfile, with and
 *                                             without an offset, and with splice from a pipe; take the
 *                                             echo with splice into a pipe, check it
 *   sockcheck sink PORT                       accept one connection, read until it ends, report how
 *   sockcheck source IP PORT                  connect and send a pattern until the write fails, report how
 *   sockcheck udp-echo PORT COUNT             echo COUNT datagrams
 *   sockcheck udp IP PORT COUNT               send COUNT datagrams of sizes 0..1500, check the echoes
 *   sockcheck epoll IP PORT                   one epoll set: a ulnic connection, a pipe, a kernel TCP
 *                                             connection on 127.0.0.1; each fires for what it got
 *   sockcheck epoll-readd IP PORT             as event libraries do: a non-blocking connect, writable
 *                                             with EPOLLOUT, write, then
 *                                             DEL and ADD (or MOD) for EPOLLIN, with the echo arriving
 *                                             before, between or after; each round wakes for the reply
 *   sockcheck fork-child-closes IP PORT       connect, fork; the child closes its copy, the parent uses the connection
 *   sockcheck fork-child-uses IP PORT         connect, fork; the child uses it; the parent's copy then says EBUSY
 *   sockcheck tcp-info IP PORT                TCP_INFO's state: a listener LISTEN, a connection ESTABLISHED,
 *                                             after both ends ended and the echo came, CLOSE or TIME_WAIT
 *   sockcheck exec                            exec itself with an empty environment; the child says whether the layer is loaded
 *   sockcheck loaded                          (what exec runs)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *what)
{
	printf("fail %s: %s\n", what, strerror(errno));
	fflush(stdout);
	exit(1);
}

static unsigned char pat(unsigned long i)
{
	return (unsigned char)((i * 2654435761u) >> 11);
}

static int listener(int port, int type)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, s = socket(AF_INET, type, 0);

	if (s < 0)
		fail("socket");
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)&a, sizeof(a)))
		fail("bind");
	if (type == SOCK_STREAM && listen(s, 16))
		fail("listen");
	printf("ready\n");
	fflush(stdout);
	return s;
}

static int dial(const char *ip, int port, int type)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, type, 0);

	if (s < 0)
		fail("socket");
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (connect(s, (struct sockaddr *)&a, sizeof(a)))
		fail("connect");
	return s;
}

/* Accepts one connection on `l` and echoes it until it ends. */
static int echo_one(int l)
{
	int c = accept(l, NULL, NULL);
	char buf[65536];
	long total = 0;
	ssize_t n;

	if (c < 0)
		fail("accept");
	while ((n = read(c, buf, sizeof(buf))) > 0) {
		for (ssize_t at = 0; at < n;) {
			ssize_t w = write(c, buf + at, n - at);
			if (w <= 0)
				fail("write");
			at += w;
		}
		total += n;
	}
	if (n < 0)
		fail("read");
	close(c);
	printf("ok served %ld bytes\n", total);
	return 0;
}

static int serve(int port)
{
	return echo_one(listener(port, SOCK_STREAM));
}

/* A pre-forking server with one worker: the listener is made before the
 * fork and only the child accepts and serves; the parent reports how the
 * child ended. */
static int serve_in_child(int port)
{
	int l = listener(port, SOCK_STREAM), status;
	pid_t pid = fork();

	if (pid < 0)
		fail("fork");
	if (pid == 0)
		exit(echo_one(l));
	if (waitpid(pid, &status, 0) != pid)
		fail("waitpid");
	printf("%s the child exited with %d\n", WIFEXITED(status) ? "ok" : "fail",
	       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	return !WIFEXITED(status);
}

/* Sends `bytes` of the pattern in writes of odd, changing sizes while
 * reading the echo, with poll, so neither side waits for the other. */
static int stream(const char *ip, int port, long bytes)
{
	int s = dial(ip, port, SOCK_STREAM);
	long sent = 0, got = 0, step = 1;
	static char buf[70000];

	fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
	while (got < bytes) {
		struct pollfd p = { .fd = s, .events = POLLIN | (sent < bytes ? POLLOUT : 0) };

		if (poll(&p, 1, 10000) != 1)
			fail("poll timed out");
		if ((p.revents & POLLOUT) && sent < bytes) {
			long n = step < bytes - sent ? step : bytes - sent;

			for (long i = 0; i < n; i++)
				buf[i] = pat(sent + i);
			ssize_t w = write(s, buf, n);
			if (w < 0 && errno != EAGAIN)
				fail("write");
			if (w > 0)
				sent += w;
			step = step * 3 + 1 > 65536 ? 7 : step * 3 + 1;
			if (sent == bytes)
				shutdown(s, SHUT_WR);
		}
		if (p.revents & (POLLIN | POLLHUP)) {
			ssize_t r = read(s, buf, sizeof(buf));
			if (r < 0 && errno != EAGAIN)
				fail("read");
			if (r == 0)
				break;
			for (ssize_t i = 0; i < r; i++)
				if ((unsigned char)buf[i] != pat(got + i)) {
					printf("fail byte %ld differs\n", got + i);
					return 1;
				}
			if (r > 0)
				got += r;
		}
	}
	if (got != bytes) {
		printf("fail echo ended after %ld of %ld bytes\n", got, bytes);
		return 1;
	}
	printf("ok %ld bytes echoed intact\n", got);
	return 0;
}

/* Reads until the stream ends; every byte must be the pattern's. */
static int sink(int port)
{
	int l = listener(port, SOCK_STREAM), c = accept(l, NULL, NULL);
	static char buf[65536];
	long got = 0;
	ssize_t n;

	if (c < 0)
		fail("accept");
	printf("connected\n");
	fflush(stdout);
	while ((n = read(c, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < n; i++)
			if ((unsigned char)buf[i] != pat(got + i)) {
				printf("fail byte %ld differs\n", got + i);
				return 1;
			}
		got += n;
	}
	printf("ok read %ld intact bytes, then %s\n", got, n == 0 ? "end of stream" : strerror(errno));
	return 0;
}

/* Writes the pattern until a write fails. */
static int source(const char *ip, int port)
{
	int s = dial(ip, port, SOCK_STREAM);
	static char buf[16384];
	long sent = 0;

	signal(SIGPIPE, SIG_IGN);
	printf("connected\n");
	fflush(stdout);
	for (;;) {
		for (unsigned i = 0; i < sizeof(buf); i++)
			buf[i] = pat(sent + i);
		ssize_t w = write(s, buf, sizeof(buf));
		if (w < 0) {
			printf("ok wrote %ld bytes, then %s\n", sent, strerror(errno));
			return 0;
		}
		sent += w;
	}
}

static int udp_echo(int port, int count)
{
	int s = listener(port, SOCK_DGRAM);
	static char buf[65536];

	for (int i = 0; i < count; i++) {
		struct sockaddr_storage from;
		socklen_t len = sizeof(from);
		ssize_t n = recvfrom(s, buf, sizeof(buf), 0, (struct sockaddr *)&from, &len);

		if (n < 0)
			fail("recvfrom");
		if (sendto(s, buf, n, 0, (struct sockaddr *)&from, len) != n)
			fail("sendto");
	}
	printf("ok echoed %d datagrams\n", count);
	return 0;
}

static int udp(const char *ip, int port, int count)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	static char buf[2000], back[2000];

	inet_pton(AF_INET, ip, &a.sin_addr);
	for (int i = 0; i < count; i++) {
		int n = (i * 37) % 1501;

		for (int b = 0; b < n; b++)
			buf[b] = pat(i + b);
		if (sendto(s, buf, n, 0, (struct sockaddr *)&a, sizeof(a)) != n)
			fail("sendto");
		struct pollfd p = { .fd = s, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1)
			fail("no echo within 5 s");
		struct sockaddr_in from;
		socklen_t len = sizeof(from);
		ssize_t r = recvfrom(s, back, sizeof(back), 0, (struct sockaddr *)&from, &len);
		if (r != n || memcmp(buf, back, n) || from.sin_addr.s_addr != a.sin_addr.s_addr ||
		    from.sin_port != a.sin_port) {
			printf("fail datagram %d came back wrong (%zd bytes)\n", i, r);
			return 1;
		}
	}
	printf("ok %d datagrams echoed intact from %s:%d\n", count, ip, port);
	return 0;
}

/* One epoll set watches a ulnic connection (to an echo server), a pipe
 * and a kernel TCP connection on loopback; each is made ready in turn
 * and must be the one, and the only one, reported. */
static int epoll_mix(const char *ip, int port)
{
	int u = dial(ip, port, SOCK_STREAM), pf[2], ep = epoll_create1(0);
	int kl = listener(0, SOCK_STREAM);
	struct sockaddr_in ka;
	socklen_t kal = sizeof(ka);
	struct epoll_event ev, got[8];
	char buf[64];

	if (pipe(pf) || ep < 0)
		fail("pipe or epoll");
	getsockname(kl, (struct sockaddr *)&ka, &kal);
	ka.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int kc = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(kc, (struct sockaddr *)&ka, sizeof(ka)))
		fail("kernel connect");
	int ks = accept(kl, NULL, NULL);
	if (ks < 0)
		fail("kernel accept");
	int fds[3] = { u, pf[0], kc };
	for (int i = 0; i < 3; i++) {
		ev.events = EPOLLIN;
		ev.data.u64 = 1000 + i;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev))
			fail("epoll_ctl");
	}
	if (epoll_wait(ep, got, 8, 100) != 0) {
		printf("fail an idle set reported readiness\n");
		return 1;
	}
	for (int round = 0; round < 30; round++) {
		int which = round % 3;

		if (which == 0 && write(u, "u", 1) != 1)
			fail("write ulnic");
		if (which == 1 && write(pf[1], "p", 1) != 1)
			fail("write pipe");
		if (which == 2 && write(ks, "k", 1) != 1)
			fail("write kernel");
		int n = epoll_wait(ep, got, 8, 5000);
		if (n != 1 || got[0].data.u64 != (uint64_t)(1000 + which) || !(got[0].events & EPOLLIN)) {
			printf("fail round %d: %d ready, first %llu, expected %d\n", round, n,
			       n > 0 ? (unsigned long long)got[0].data.u64 : 0ULL, 1000 + which);
			return 1;
		}
		if (read(fds[which], buf, sizeof(buf)) != 1)
			fail("read");
	}
	/* Removed from the set, the ulnic socket is quiet there. */
	epoll_ctl(ep, EPOLL_CTL_DEL, u, NULL);
	if (write(u, "u", 1) != 1)
		fail("write ulnic");
	if (epoll_wait(ep, got, 8, 200) != 0) {
		printf("fail a removed socket still fired\n");
		return 1;
	}
	printf("ok 30 rounds: ulnic, pipe and kernel socket each woke the set alone\n");
	return 0;
}

/* What event libraries do on every change of interest: the socket leaves
 * the set and comes back (or is modified) with the new interest, while
 * the reply may already be there, arrive in between, or come later. */
static int epoll_readd(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int u = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), ep = epoll_create1(0);
	struct epoll_event ev, got[4];
	char buf[64];

	if (u < 0 || ep < 0)
		fail("socket or epoll_create1");
	/* A non-blocking connect, its completion seen as EPOLLOUT. */
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (connect(u, (struct sockaddr *)&a, sizeof(a)) && errno != EINPROGRESS)
		fail("connect");
	for (int round = 0; round < 60; round++) {
		int how = round % 3; /* 0: DEL+ADD, 1: MOD, 2: DEL+ADD after the reply came */

		ev.events = EPOLLOUT;
		ev.data.u64 = 7;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, u, &ev))
			fail("epoll_ctl add out");
		if (epoll_wait(ep, got, 4, 5000) != 1 || !(got[0].events & EPOLLOUT)) {
			printf("fail round %d: not writable\n", round);
			return 1;
		}
		if (round == 0) {
			int e = 0;
			socklen_t el = sizeof(e);
			if (getsockopt(u, SOL_SOCKET, SO_ERROR, &e, &el) || e) {
				errno = e;
				fail("connect completion");
			}
		}
		if (write(u, "r", 1) != 1)
			fail("write");
		if (how == 2)
			usleep(20000);
		ev.events = EPOLLIN;
		ev.data.u64 = 8;
		if (how == 1) {
			if (epoll_ctl(ep, EPOLL_CTL_MOD, u, &ev))
				fail("epoll_ctl mod in");
		} else {
			if (epoll_ctl(ep, EPOLL_CTL_DEL, u, NULL))
				fail("epoll_ctl del");
			if (epoll_ctl(ep, EPOLL_CTL_ADD, u, &ev))
				fail("epoll_ctl add in");
		}
		int n = epoll_wait(ep, got, 4, 5000);
		if (n != 1 || got[0].data.u64 != 8 || !(got[0].events & EPOLLIN)) {
			printf("fail round %d (%s): %d ready waiting for the reply\n", round,
			       how == 1 ? "MOD" : "DEL+ADD", n);
			return 1;
		}
		if (read(u, buf, sizeof(buf)) != 1)
			fail("read");
		if (epoll_ctl(ep, EPOLL_CTL_DEL, u, NULL))
			fail("epoll_ctl del at end");
		/* Nothing more to read: a non-blocking read says so. */
		if (read(u, buf, sizeof(buf)) != -1 || errno != EAGAIN)
			fail("read of nothing");
	}
	printf("ok 60 rounds of DEL+ADD and MOD each woke for the reply\n");
	return 0;
}

/* Reads what the echo server sends back until it ends. */
static void read_echo(int s, char *buf, size_t cap)
{
	size_t got = 0;
	ssize_t n;

	while (got < cap - 1 && (n = read(s, buf + got, cap - 1 - got)) > 0)
		got += n;
	buf[got] = 0;
}

/* After a fork the child closes its copy; the parent goes on using the
 * connection. */
static int tcp_state(int s)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len))
		fail("getsockopt TCP_INFO");
	return ti.tcpi_state;
}

static int tcp_info_check(const char *ip, int port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), s, st = -1;
	struct sockaddr_in a = { .sin_family = AF_INET };
	char buf[16];

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1))
		fail("listen");
	if ((st = tcp_state(l)) != TCP_LISTEN) {
		printf("fail a listener is in state %d\n", st);
		return 1;
	}
	s = dial(ip, port, SOCK_STREAM);
	if ((st = tcp_state(s)) != TCP_ESTABLISHED) {
		printf("fail a connection is in state %d\n", st);
		return 1;
	}
	if (write(s, "state", 5) != 5)
		fail("write");
	if (shutdown(s, SHUT_WR))
		fail("shutdown");
	read_echo(s, buf, sizeof(buf));
	if (strcmp(buf, "state")) {
		printf("fail the echo was \"%s\"\n", buf);
		return 1;
	}
	/* The server closed after our FIN; our FIN's delivery may come a
	 * moment later. */
	for (int i = 0; i < 2000; i++) {
		st = tcp_state(s);
		if (st == TCP_CLOSE || st == TCP_TIME_WAIT)
			break;
		usleep(1000);
	}
	if (st != TCP_CLOSE && st != TCP_TIME_WAIT) {
		printf("fail an ended connection stays in state %d\n", st);
		return 1;
	}
	printf("ok tcp states: LISTEN, ESTABLISHED, then %s\n", st == TCP_CLOSE ? "CLOSE" : "TIME_WAIT");
	return 0;
}

static int fork_child_closes(const char *ip, int port)
{
	int s = dial(ip, port, SOCK_STREAM), status;
	pid_t pid = fork();
	char buf[64];

	if (pid < 0)
		fail("fork");
	if (pid == 0) {
		close(s);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	if (write(s, "parent", 6) != 6)
		fail("parent write after the child closed its copy");
	shutdown(s, SHUT_WR);
	read_echo(s, buf, sizeof(buf));
	if (strcmp(buf, "parent")) {
		printf("fail the echo was \"%s\"\n", buf);
		return 1;
	}
	printf("ok the child closed its copy and the parent's connection went on: \"%s\"\n", buf);
	return 0;
}

/* After a fork the child uses the connection (and so owns it); the
 * parent's copy may then only be closed. */
static int fork_child_uses(const char *ip, int port)
{
	int s = dial(ip, port, SOCK_STREAM), p[2], status;
	char buf[64] = { 0 };

	if (pipe(p))
		fail("pipe");
	pid_t pid = fork();
	if (pid < 0)
		fail("fork");
	if (pid == 0) {
		if (write(s, "child", 5) != 5)
			_exit(2);
		shutdown(s, SHUT_WR);
		read_echo(s, buf, sizeof(buf));
		close(s);
		_exit(strcmp(buf, "child") ? 3 : 0);
	}
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		printf("fail the child's exchange failed (status %d)\n", WEXITSTATUS(status));
		return 1;
	}
	errno = 0;
	if (write(s, "parent", 6) != -1 || errno != EBUSY) {
		printf("fail the parent's write after the child used the connection gave %s\n", strerror(errno));
		return 1;
	}
	close(s);
	printf("ok the child used the inherited connection; the parent's copy said EBUSY\n");
	return 0;
}

static int loaded(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int yes = 0;

	while (f && fgets(line, sizeof(line), f))
		yes |= strstr(line, "libulnic_preload") != NULL;
	printf("%s\n", yes ? "loaded" : "not loaded");
	return 0;
}

/* The echo of a zero-copy send, taken by a thread with splice into a
 * pipe and checked against the pattern. */
struct echo_check {
	int s;
	long bytes, got, bad;
};

static void *take_echo(void *arg)
{
	struct echo_check *e = arg;
	char buf[65536];
	int p[2];

	if (pipe(p))
		fail("pipe");
	while (e->got < e->bytes) {
		ssize_t n = splice(e->s, NULL, p[1], NULL, sizeof(buf), 0);

		if (n <= 0)
			break;
		for (ssize_t at = 0; at < n;) {
			ssize_t r = read(p[0], buf, n - at);

			if (r <= 0)
				fail("read from the pipe");
			for (ssize_t i = 0; i < r; i++)
				e->bad += buf[i] != (char)pat(e->got + i);
			e->got += r;
			at += r;
		}
	}
	close(p[0]);
	close(p[1]);
	return NULL;
}

/* Sends BYTES of the pattern, kept in a file, as servers send files: a
 * third with sendfile and an offset (the file position stays), a third
 * with sendfile from the file position (which moves), a third from a
 * pipe with splice; a thread takes the echo with splice into a pipe. */
static int zero_copy(const char *ip, int port, long bytes)
{
	char path[] = "/tmp/sockcheck-XXXXXX", buf[65536];
	int f = mkstemp(path), p[2];
	struct echo_check e = { .bytes = bytes };
	long third = bytes / 3;
	off_t off = 0;
	pthread_t t;

	if (f < 0)
		fail("mkstemp");
	unlink(path);
	for (long i = 0; i < bytes; i += sizeof(buf)) {
		long n = bytes - i < (long)sizeof(buf) ? bytes - i : (long)sizeof(buf);

		for (long j = 0; j < n; j++)
			buf[j] = (char)pat(i + j);
		if (write(f, buf, n) != n)
			fail("write the file");
	}
	e.s = dial(ip, port, SOCK_STREAM);
	if (pthread_create(&t, NULL, take_echo, &e))
		fail("pthread_create");
	lseek(f, 0, SEEK_SET);
	while (off < third) {
		if (sendfile(e.s, f, &off, third - off) <= 0)
			fail("sendfile with an offset");
	}
	if (lseek(f, 0, SEEK_CUR) != 0)
		fail("sendfile with an offset moved the file position");
	lseek(f, off, SEEK_SET);
	while (off < 2 * third) {
		ssize_t n = sendfile(e.s, f, NULL, 2 * third - off);

		if (n <= 0)
			fail("sendfile from the file position");
		off += n;
	}
	if (lseek(f, 0, SEEK_CUR) != off)
		fail("sendfile did not move the file position by what it sent");
	if (pipe(p))
		fail("pipe");
	while (off < bytes) {
		ssize_t n = pread(f, buf, bytes - off < 16384 ? bytes - off : 16384, off);

		if (n <= 0 || write(p[1], buf, n) != n)
			fail("fill the pipe");
		for (ssize_t left = n; left > 0;) {
			ssize_t k = splice(p[0], NULL, e.s, NULL, left, 0);

			if (k <= 0)
				fail("splice from a pipe");
			left -= k;
		}
		off += n;
	}
	shutdown(e.s, SHUT_WR);
	pthread_join(t, NULL);
	if (e.got != bytes || e.bad) {
		printf("fail zero-copy: %ld of %ld bytes came back, %ld wrong\n", e.got, bytes, e.bad);
		return 1;
	}
	printf("ok zero-copy %ld bytes: sendfile with and without an offset, splice both ways\n", bytes);
	return 0;
}

/* A pre-forking server: the master listens, forks `workers`, and counts
 * the connections they report on a pipe; each worker waits in its own
 * epoll set on the listener it inherited (level-triggered, as nginx
 * without EPOLLEXCLUSIVE), accepts without blocking, echoes the
 * connection to its end and reports it. After `conns` the master stops
 * the workers and says how many served. */
static int prefork(int port, int workers, int conns)
{
	int l = listener(port, SOCK_STREAM), p[2], served[64] = { 0 };
	pid_t pids[64];
	char buf[65536];

	if (workers < 1 || workers > 64 || pipe(p))
		fail("workers or pipe");
	fcntl(l, F_SETFL, O_NONBLOCK);
	for (int w = 0; w < workers; w++) {
		pids[w] = fork();
		if (pids[w] < 0)
			fail("fork");
		if (pids[w])
			continue;
		int ep = epoll_create1(0);
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = l };

		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev))
			fail("worker epoll");
		for (;;) {
			if (epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR)
				fail("worker epoll_wait");
			int c = accept(l, NULL, NULL);

			if (c < 0) {
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					continue; /* another worker took it */
				fail("worker accept");
			}
			ssize_t n;
			while ((n = read(c, buf, sizeof(buf))) > 0)
				for (ssize_t at = 0; at < n;) {
					ssize_t k = write(c, buf + at, n - at);

					if (k <= 0)
						fail("worker write");
					at += k;
				}
			close(c);
			char who = (char)w;
			if (write(p[1], &who, 1) != 1)
				fail("worker report");
		}
	}
	for (int i = 0; i < conns; i++) {
		char who;

		if (read(p[0], &who, 1) != 1)
			fail("master read");
		served[(unsigned char)who % 64]++;
	}
	int busy = 0;
	for (int w = 0; w < workers; w++) {
		kill(pids[w], SIGTERM);
		waitpid(pids[w], NULL, 0);
		busy += served[w] > 0;
		printf("worker %d served %d\n", w, served[w]);
	}
	printf("ok prefork: %d connections served by %d of %d workers\n", conns, busy, workers);
	return 0;
}

/* Clients of `prefork`: `conns` connections in rounds of `together` open
 * at once, each sending 5000 bytes of the pattern and checking the echo
 * before any of the round ends (so a server that serves one connection a
 * worker uses `together` workers at once). */
static int prefork_clients(const char *ip, int port, int conns, int together)
{
	int s[64];
	unsigned char buf[5000];

	if (together < 1 || together > 64)
		fail("together");
	for (int done = 0; done < conns;) {
		int k = conns - done < together ? conns - done : together;

		for (int i = 0; i < k; i++)
			s[i] = dial(ip, port, SOCK_STREAM);
		for (int i = 0; i < k; i++) {
			for (int j = 0; j < (int)sizeof(buf); j++)
				buf[j] = pat(j + done + i);
			if (write(s[i], buf, sizeof(buf)) != (ssize_t)sizeof(buf))
				fail("client write");
		}
		for (int i = 0; i < k; i++) {
			long got = 0;
			ssize_t n;

			while (got < (long)sizeof(buf) &&
			       (n = read(s[i], buf, sizeof(buf) - got)) > 0) {
				for (ssize_t j = 0; j < n; j++)
					if (buf[j] != pat(got + j + done + i)) {
						printf("fail echo of connection %d at byte %ld\n", done + i,
						       got + j);
						return 1;
					}
				got += n;
			}
			if (got != (long)sizeof(buf)) {
				printf("fail connection %d echoed %ld bytes\n", done + i, got);
				return 1;
			}
		}
		for (int i = 0; i < k; i++) {
			shutdown(s[i], SHUT_WR);
			if (read(s[i], buf, 1) != 0)
				fail("client end of stream");
			close(s[i]);
		}
		done += k;
	}
	printf("ok %d connections echoed\n", conns);
	return 0;
}

/* Room for `n` descriptors and some (a server raises its limit so). */
static void room_for(int n)
{
	struct rlimit r = { .rlim_cur = n + 64, .rlim_max = n + 64 };

	if (setrlimit(RLIMIT_NOFILE, &r))
		fail("setrlimit");
}

static int hold_server(int port, int n)
{
	room_for(n);
	int l = listener(port, SOCK_STREAM), ep = epoll_create1(0), accepted = 0, open = 0,
	    most = 0, ended = 0;
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = l }, got[64];
	char buf[65536];

	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev))
		fail("epoll");
	while (ended < n) {
		int k = epoll_wait(ep, got, 64, -1);

		if (k < 0 && errno != EINTR)
			fail("epoll_wait");
		for (int i = 0; i < k; i++) {
			int fd = got[i].data.fd;

			if (fd == l) {
				int c = accept(l, NULL, NULL);
				struct epoll_event cev = { .events = EPOLLIN };

				if (c < 0) {
					printf("fail accept of connection %d: %s\n", accepted + 1,
					       strerror(errno));
					return 1;
				}
				cev.data.fd = c;
				if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev))
					fail("epoll_ctl ADD");
				accepted++;
				if (++open > most)
					most = open;
				continue;
			}
			ssize_t r = read(fd, buf, sizeof(buf));

			if (r < 0)
				fail("server read");
			if (r == 0) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				open--;
				ended++;
				continue;
			}
			for (ssize_t at = 0; at < r;) {
				ssize_t w = write(fd, buf + at, r - at);

				if (w <= 0)
					fail("server write");
				at += w;
			}
		}
	}
	printf("ok hold-server: %d connections, %d open at once\n", accepted, most);
	return 0;
}

static int hold_clients(const char *ip, int port, int n)
{
	room_for(n);
	int *s = calloc(n, sizeof(int));
	unsigned char buf[2000];

	if (!s)
		fail("calloc");
	for (int i = 0; i < n; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

		s[i] = socket(AF_INET, SOCK_STREAM, 0);
		inet_pton(AF_INET, ip, &a.sin_addr);
		if (s[i] < 0 || connect(s[i], (struct sockaddr *)&a, sizeof(a))) {
			printf("fail connection %d of %d: %s\n", i + 1, n, strerror(errno));
			return 1;
		}
	}
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < (int)sizeof(buf); j++)
			buf[j] = pat(j + i);
		if (write(s[i], buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			fail("client write");
	}
	for (int i = 0; i < n; i++) {
		long at = 0;
		ssize_t r;

		while (at < (long)sizeof(buf) && (r = read(s[i], buf, sizeof(buf) - at)) > 0) {
			for (ssize_t j = 0; j < r; j++)
				if (buf[j] != pat(at + j + i)) {
					printf("fail echo of connection %d at byte %ld\n", i, at + j);
					return 1;
				}
			at += r;
		}
		if (at != (long)sizeof(buf)) {
			printf("fail connection %d echoed %ld bytes\n", i, at);
			return 1;
		}
	}
	/* The driver's endpoint memory with every connection open (in a
	 * guest; spec 9). */
	FILE *used = fopen("/sys/class/misc/ulnic0/mem_bytes", "r");
	FILE *limit = fopen("/sys/class/misc/ulnic0/mem_limit_bytes", "r");
	long long u = -1, l = -1;

	if (used && limit && fscanf(used, "%lld", &u) == 1 && fscanf(limit, "%lld", &l) == 1)
		printf("endpoint memory with all open: %lld of %lld bytes\n", u, l);
	if (used)
		fclose(used);
	if (limit)
		fclose(limit);
	for (int i = 0; i < n; i++)
		close(s[i]);
	printf("ok %d connections open at once, each echoed\n", n);
	return 0;
}

static int exec_check(char *self)
{
	char *argv[] = { self, "loaded", NULL }, *envp[] = { "HOME=/", NULL };
	int p[2];

	if (pipe(p))
		fail("pipe");
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		execve(self, argv, envp);
		_exit(3);
	}
	close(p[1]);
	char buf[64] = { 0 };
	if (read(p[0], buf, sizeof(buf) - 1) < 0)
		fail("read");
	waitpid(pid, NULL, 0);
	printf("%s after exec with an empty environment: %s", strncmp(buf, "loaded", 6) ? "fail" : "ok",
	       buf);
	return strncmp(buf, "loaded", 6) != 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "serve-in-child"))
		return serve_in_child(atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "stream"))
		return stream(argv[2], atoi(argv[3]), atol(argv[4]));
	if (argc == 5 && !strcmp(argv[1], "prefork"))
		return prefork(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	if (argc == 6 && !strcmp(argv[1], "prefork-clients"))
		return prefork_clients(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
	if (argc == 4 && !strcmp(argv[1], "hold-server"))
		return hold_server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "hold-clients"))
		return hold_clients(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 5 && !strcmp(argv[1], "zero-copy"))
		return zero_copy(argv[2], atoi(argv[3]), atol(argv[4]));
	if (argc == 3 && !strcmp(argv[1], "sink"))
		return sink(atoi(argv[2]));
	if (argc == 4 && !strcmp(argv[1], "source"))
		return source(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "udp-echo"))
		return udp_echo(atoi(argv[2]), atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "udp"))
		return udp(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 4 && !strcmp(argv[1], "epoll"))
		return epoll_mix(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "epoll-readd"))
		return epoll_readd(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "fork-child-closes"))
		return fork_child_closes(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "fork-child-uses"))
		return fork_child_uses(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "tcp-info"))
		return tcp_info_check(argv[2], atoi(argv[3]));
	if (argc == 2 && !strcmp(argv[1], "exec"))
		return exec_check(argv[0]);
	if (argc == 2 && !strcmp(argv[1], "loaded"))
		return loaded();
	fprintf(stderr, "usage: see the comment at the top of sockcheck.c\n");
	return 2;
}
