/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * Runs sequences of epoll, read, write and shutdown calls read from stdin
 * and prints what each call saw, for the preload layer's model test: the
 * same sequences run over ulnic (under the layer, connecting to this
 * node's own address) and over kernel TCP on 127.0.0.1 must print the same.
 *
 *   epollmodel IP PORT
 *
 * Each sequence starts with two connection pairs (c0-s0, c1-s1: a
 * non-blocking connect, the accept, the connect's completion) and a pipe
 * (p reads, q writes), and two epoll sets (0, 1). Lines:
 *
 *   ctl SET add|mod|del NAME MASK   MASK: letters i(n) o(ut) r(dhup) e(dge) 1(shot), or -
 *   write NAME BYTES                non-blocking; then waits until the peer has them all
 *   read NAME BYTES                 non-blocking
 *   shut NAME                       shutdown(SHUT_WR); then waits until the peer sees it
 *   close NAME                      (later lines naming it print "closed")
 *   wait SET                        epoll_wait(SET, 8 entries, timeout 0)
 *   poll                            poll(every open name, in|out|rdhup, timeout 0)
 *   turns SET                       epoll_wait(SET, 1 entry, timeout 0) 8 times; the names
 *                                   reported, each once (ready entries take turns)
 *   bwait SET NAME BYTES            epoll_wait(SET, 8 entries, 300 ms) while another thread
 *                                   writes BYTES to NAME 5 ms after the wait began
 *   bpoll NAME BYTES                poll (as `poll`, 300 ms) while another thread writes
 *   tread SET NAME BYTES            NAME leaves both sets; one thread blocks in a read of
 *                                   NAME (150 ms SO_RCVTIMEO) while another writes BYTES to
 *                                   its peer 5 ms after and this one waits in
 *                                   epoll_wait(SET, 8 entries, 150 ms): the epoll wait must
 *                                   not take the reader's wake-up
 *   dwait NAME BYTES                NAME's peer moves to set 0 alone (input); a thread waits
 *                                   in epoll_wait(0, 8 entries, 300 ms), this one in
 *                                   epoll_wait(1, 8 entries, 300 ms), and a third writes
 *                                   BYTES to NAME 5 ms after: set 1's wait must not take
 *                                   set 0's wake-up
 *   fwait SET NAME BYTES            NAME leaves both sets and this process (closed here); a
 *                                   forked child writes BYTES to it 5 ms after
 *                                   epoll_wait(SET, 8 entries, 300 ms) began, then exits
 *                                   once the wait is over (its close ends the stream)
 *   end                             closes everything; prints "end"
 *
 * The blocking waits find what changed in another thread or process while
 * they slept: a wake-up lost there leaves them asleep to their timeout,
 * which reports less than the kernel does.
 *
 * A stream takes at most WRITES (4) writes a sequence (a ulnic connection
 * credits at least 4 messages unread; beyond, bytes wait for credit
 * where the kernel's window would still take them): later ones print
 * "skip".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define NAMES 6 /* c0 s0 c1 s1 p q */
/* Writes a stream takes per sequence: the fewest credits a ulnic
 * connection has (4, when the attachment's memory fills: docs/sockets.md
 * §3 "Sizes"; a forked child's closed connections keep theirs). */
#define WRITES 4
static const char *names[NAMES] = { "c0", "s0", "c1", "s1", "p", "q" };
static int fds[NAMES], peer[NAMES] = { 1, 0, 3, 2, -1, 4 };
static long unread[NAMES]; /* bytes written to a name's stream not yet read there */
static int writes[NAMES];
static int sets[2];

static void die(const char *what)
{
	printf("fail %s: %s\n", what, strerror(errno));
	exit(1);
}

static int name_of(const char *s)
{
	for (int i = 0; i < NAMES; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

static void nap_us(long us)
{
	struct timespec t = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000 };

	nanosleep(&t, NULL);
}

static void pair(const char *ip, int l, int port, int *c, int *s)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct pollfd pf;

	*c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (*c < 0 || (connect(*c, (struct sockaddr *)&a, sizeof(a)) && errno != EINPROGRESS))
		die("connect");
	pf = (struct pollfd){ .fd = l, .events = POLLIN };
	if (poll(&pf, 1, 5000) != 1)
		die("poll listener");
	*s = accept4(l, NULL, NULL, SOCK_NONBLOCK);
	if (*s < 0)
		die("accept");
	pf = (struct pollfd){ .fd = *c, .events = POLLOUT };
	if (poll(&pf, 1, 5000) != 1)
		die("poll connect");
}

/* Until the stream into `n` holds `unread[n]` bytes (2 s at most). */
static int settle_bytes(int n)
{
	for (int i = 0; i < 20000; i++) {
		int k = 0;

		if (ioctl(fds[n], FIONREAD, &k))
			return -1;
		if (k == unread[n])
			return 0;
		nap_us(100);
	}
	return -1;
}

static void masks(char *out, unsigned ev)
{
	out[0] = 0;
	if (ev & EPOLLIN)
		strcat(out, "i");
	if (ev & EPOLLOUT)
		strcat(out, "o");
	if (ev & EPOLLRDHUP)
		strcat(out, "r");
	if (ev & EPOLLHUP)
		strcat(out, "h");
	if (ev & EPOLLERR)
		strcat(out, "e");
}

static unsigned parse_mask(const char *m)
{
	unsigned ev = 0;

	for (; *m; m++)
		ev |= *m == 'i' ? EPOLLIN : *m == 'o' ? EPOLLOUT : *m == 'r' ? EPOLLRDHUP :
		      *m == 'e' ? EPOLLET : *m == '1' ? EPOLLONESHOT : 0;
	return ev;
}

static int by_name(const void *a, const void *b)
{
	return (int)((const struct epoll_event *)a)->data.u64 -
	       (int)((const struct epoll_event *)b)->data.u64;
}

static void wait_set(int set)
{
	struct epoll_event ev[8];
	int k = epoll_wait(sets[set], ev, 8, 0);
	char m[8];

	if (k < 0) {
		printf("wait -%d\n", errno);
		return;
	}
	qsort(ev, k, sizeof(ev[0]), by_name);
	printf("wait");
	for (int i = 0; i < k; i++) {
		masks(m, ev[i].events);
		printf(" %s:%s", names[ev[i].data.u64], m);
	}
	printf("\n");
}

/* poll(every open name, in|out|rdhup, `ms`): prints `label` and each
 * name's readiness. With `out` 0, POLLOUT is not asked for. */
static void poll_names(const char *label, int ms, int out)
{
	struct pollfd pf[NAMES];
	int k = 0;
	char m[8];

	for (int i = 0; i < NAMES; i++)
		if (fds[i] >= 0)
			pf[k++] = (struct pollfd){ .fd = fds[i],
						   .events = POLLIN | POLLRDHUP | (out ? POLLOUT : 0) };
	if (poll(pf, k, ms) < 0) {
		printf("%s -%d\n", label, errno);
		return;
	}
	printf("%s", label);
	for (int i = 0, j = 0; i < NAMES; i++)
		if (fds[i] >= 0) {
			unsigned r = pf[j++].revents;

			masks(m, (r & POLLIN ? EPOLLIN : 0) | (r & POLLOUT ? EPOLLOUT : 0) |
					 (r & POLLRDHUP ? EPOLLRDHUP : 0) | (r & POLLHUP ? EPOLLHUP : 0) |
					 (r & POLLERR ? EPOLLERR : 0));
			printf(" %s:%s", names[i], m);
		}
	printf("\n");
}

static void poll_all(void)
{
	poll_names("poll", 0, 1);
}

static void turns(int set)
{
	int seen[NAMES] = { 0 };

	for (int i = 0; i < 8; i++) {
		struct epoll_event ev;

		if (epoll_wait(sets[set], &ev, 1, 0) == 1)
			seen[ev.data.u64 % NAMES] = 1;
	}
	printf("turns");
	for (int i = 0; i < NAMES; i++)
		if (seen[i])
			printf(" %s", names[i]);
	printf("\n");
}

static void start(const char *ip, int l, int port)
{
	int p[2];

	pair(ip, l, port, &fds[0], &fds[1]);
	pair(ip, l, port, &fds[2], &fds[3]);
	if (pipe2(p, O_NONBLOCK))
		die("pipe");
	fds[4] = p[0];
	fds[5] = p[1];
	for (int i = 0; i < 2; i++)
		if ((sets[i] = epoll_create1(0)) < 0)
			die("epoll_create1");
	memset(unread, 0, sizeof(unread));
	memset(writes, 0, sizeof(writes));
}

static void finish(void)
{
	for (int i = 0; i < NAMES; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	close(sets[0]);
	close(sets[1]);
	printf("end\n");
}

/* After `n` ended its side: until its peer sees `what` (2 s at most when
 * it `must`, else 50 ms: a reset the kernel may not send); a closed peer
 * cannot be watched, so 20 ms (our FIN's failure, which the kernel's TCP
 * sees at once, comes from the device's thread). The peer seeing it also
 * means our own FIN's completion waits for us. */
static void settle_end(int n, short what, int must)
{
	int to = peer[n];

	if (to >= 0 && fds[to] >= 0) {
		struct pollfd pf = { .fd = fds[to], .events = what };

		for (int i = 0; i < (must ? 2000 : 50); i++) {
			pf.revents = 0;
			if (poll(&pf, 1, 1) == 1 && (pf.revents & what)) {
				/* The kernel delays its ACK of a FIN; asking for
				 * quick ACKs sends it now, so our side's state
				 * changes now, as the device's delivery does. */
				int one = 1;

				setsockopt(fds[to], IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
				return;
			}
		}
		if (must)
			printf("settle timed out\n");
	} else {
		nap_us(20000);
	}
}

/* Until the kernel's TCP has our FIN acknowledged (its state leaves
 * FIN_WAIT1, CLOSING or LAST_ACK; the ACK is processed a moment after
 * the FIN arrived). Under the layer a ulnic connection reports its own
 * state: LAST_ACK or FIN_WAIT1 until the device's delivery report for our
 * FIN is taken in (it can come a moment after the peer saw the FIN, and
 * is a change of state that wakes an edge-triggered registration, as the
 * kernel's ACK of the FIN is). */
static void settle_acked(int n)
{
	for (int i = 0; i < 20000; i++) {
		struct tcp_info ti;
		socklen_t len = sizeof(ti);

		if (getsockopt(fds[n], IPPROTO_TCP, TCP_INFO, &ti, &len))
			return;
		if (ti.tcpi_state != TCP_FIN_WAIT1 && ti.tcpi_state != TCP_CLOSING &&
		    ti.tcpi_state != TCP_LAST_ACK)
			return;
		nap_us(100);
	}
	printf("settle timed out\n");
}

/* The kernel's TCP acknowledges at once, not after its delayed-ACK
 * timer: a FIN's ACK (a state change for its sender) then comes when the
 * FIN does, not with later data, as the device delivers our FIN at once. */
static void quick_acks(void)
{
	int one = 1;

	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			setsockopt(fds[i], IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

/* A write 5 ms from now, by another thread. */
struct later {
	int fd;
	long bytes;
	ssize_t done;
};

static void *write_later(void *arg)
{
	struct later *w = arg;
	static char data[65536];

	nap_us(5000);
	memset(data, 'y', sizeof(data));
	w->done = write(w->fd, data, w->bytes);
	if (w->done < 0)
		w->done = -errno;
	return NULL;
}

/* Whether `n` may be written to now (a stream with an open peer and
 * writes left this sequence), else prints "skip". */
static int writable_name(int n)
{
	if (n < 0 || n >= 4 || fds[n] < 0 || fds[peer[n]] < 0 || writes[n] >= WRITES) {
		printf("skip\n");
		return 0;
	}
	return 1;
}

static void print_events(const char *what, struct epoll_event *ev, int k)
{
	char m[8];

	qsort(ev, k, sizeof(ev[0]), by_name);
	printf("%s", what);
	for (int i = 0; i < k; i++) {
		masks(m, ev[i].events);
		printf(" %s:%s", names[ev[i].data.u64], m);
	}
	printf("\n");
}

/* bwait and bpoll: a wait while another thread writes. */
static void blocked(int set, int n, long bytes, int use_poll)
{
	struct later w = { .fd = fds[n], .bytes = bytes % 65536 };
	struct epoll_event ev[8];
	pthread_t t;
	int k = 0;

	if (!w.bytes)
		w.bytes = 1;
	if (pthread_create(&t, NULL, write_later, &w))
		die("pthread_create");
	if (!use_poll)
		k = epoll_wait(sets[set], ev, 8, 300);
	else
		poll_names("woke", 300, 0);
	pthread_join(t, NULL);
	printf("%s %zd\n", use_poll ? "bpoll" : "bwait", w.done);
	if (!use_poll && k < 0)
		printf("wait -%d\n", errno);
	else if (!use_poll)
		print_events("woke", ev, k);
	if (w.done > 0) {
		writes[n]++;
		unread[peer[n]] += w.done;
		if (settle_bytes(peer[n]))
			printf("settle timed out\n");
	}
}

/* A blocking read of `fd` by another thread. */
struct reader {
	int fd;
	ssize_t got;
};

static void *read_now(void *arg)
{
	struct reader *r = arg;
	static char data[65536];

	r->got = read(r->fd, data, sizeof(data));
	if (r->got < 0)
		r->got = -errno;
	return NULL;
}

/* tread: a thread blocked in a read, a writer, and an epoll wait here. */
static void threaded_read(int set, int n, long bytes)
{
	int from = peer[n], fl = fcntl(fds[n], F_GETFL);
	struct timeval tv = { .tv_usec = 150000 }, none = { 0 };
	struct later w = { .fd = fds[from], .bytes = bytes % 65536 ? bytes % 65536 : 1 };
	struct reader r = { .fd = fds[n] };
	struct epoll_event ev[8];
	pthread_t tr, tw;
	int k;

	for (int i = 0; i < 2; i++)
		epoll_ctl(sets[i], EPOLL_CTL_DEL, fds[n], NULL);
	fcntl(fds[n], F_SETFL, fl & ~O_NONBLOCK);
	setsockopt(fds[n], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (pthread_create(&tr, NULL, read_now, &r) || pthread_create(&tw, NULL, write_later, &w))
		die("pthread_create");
	k = epoll_wait(sets[set], ev, 8, 150);
	pthread_join(tw, NULL);
	pthread_join(tr, NULL);
	setsockopt(fds[n], SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
	fcntl(fds[n], F_SETFL, fl);
	printf("tread %zd %zd\n", w.done, r.got);
	if (k < 0)
		printf("wait -%d\n", errno);
	else
		print_events("woke", ev, k);
	if (w.done > 0) {
		writes[from]++;
		unread[n] += w.done - (r.got > 0 ? r.got : 0);
		if (settle_bytes(n))
			printf("settle timed out\n");
	}
}

/* An epoll_wait on set 0 by another thread. */
struct set_wait {
	int k;
	struct epoll_event ev[8];
};

static void *wait_set0(void *arg)
{
	struct set_wait *w = arg;

	w->k = epoll_wait(sets[0], w->ev, 8, 300);
	if (w->k < 0)
		w->k = -errno;
	return NULL;
}

/* dwait: two threads in two epoll sets; a write wakes set 0's. */
static void two_sets(int n, long bytes)
{
	int to = peer[n];
	struct later w = { .fd = fds[n], .bytes = bytes % 65536 ? bytes % 65536 : 1 };
	struct epoll_event in = { .events = EPOLLIN, .data.u64 = to }, ev[8];
	struct set_wait s0;
	pthread_t t0, tw;
	int k;

	for (int i = 0; i < 2; i++)
		epoll_ctl(sets[i], EPOLL_CTL_DEL, fds[to], NULL);
	epoll_ctl(sets[0], EPOLL_CTL_ADD, fds[to], &in);
	if (pthread_create(&t0, NULL, wait_set0, &s0) || pthread_create(&tw, NULL, write_later, &w))
		die("pthread_create");
	k = epoll_wait(sets[1], ev, 8, 300);
	pthread_join(tw, NULL);
	pthread_join(t0, NULL);
	printf("dwait %zd\n", w.done);
	if (s0.k < 0)
		printf("wait0 %d\n", s0.k);
	else
		print_events("woke0", s0.ev, s0.k);
	if (k < 0)
		printf("wait1 -%d\n", errno);
	else
		print_events("woke1", ev, k);
	if (w.done > 0) {
		writes[n]++;
		unread[to] += w.done;
		if (settle_bytes(to))
			printf("settle timed out\n");
	}
}

/* fwait: a forked child writes while this process waits. */
static void forked(int set, int n, long bytes)
{
	int go[2], back[2], to = peer[n], reset;
	long want = bytes % 65536 ? bytes % 65536 : 1;
	struct epoll_event ev[8];
	ssize_t done = 0;
	pid_t pid;
	int k;

	for (int i = 0; i < 2; i++)
		epoll_ctl(sets[i], EPOLL_CTL_DEL, fds[n], NULL);
	if (pipe(go) || pipe(back))
		die("pipe");
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (!pid) {
		static char data[65536];
		char c;

		nap_us(5000);
		memset(data, 'z', sizeof(data));
		done = write(fds[n], data, want);
		if (done < 0)
			done = -errno;
		if (write(back[1], &done, sizeof(done)) != sizeof(done))
			_exit(3);
		if (read(go[0], &c, 1) != 1)
			_exit(4);
		/* Everything it holds closed in order, as a program's end
		 * closes it; then _exit: exit would rewind a stdin file the
		 * parent still reads. */
		for (int i = 0; i < NAMES; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		_exit(0);
	}
	close(fds[n]);
	fds[n] = -1;
	k = epoll_wait(sets[set], ev, 8, 300);
	if (read(back[0], &done, sizeof(done)) != sizeof(done))
		done = -EIO;
	printf("fwait %zd\n", done);
	if (k < 0)
		printf("wait -%d\n", errno);
	else
		print_events("woke", ev, k);
	if (done > 0) {
		writes[n]++;
		unread[to] += done;
		if (settle_bytes(to))
			printf("settle timed out\n");
	}
	/* The child's close is a reset when it leaves bytes unread. */
	reset = unread[n] > 0;
	if (write(go[1], "g", 1) != 1)
		die("write");
	waitpid(pid, NULL, 0);
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(back[i]);
	}
	settle_end(n, reset ? POLLERR : POLLRDHUP, !reset);
}

static void step(char *line)
{
	char op[16], a[16], b[16], c[16];
	int k = sscanf(line, "%15s %15s %15s %15s", op, a, b, c), n;
	static char buf[65536];

	quick_acks();
	if (k == 1 && !strcmp(op, "poll")) {
		poll_all();
		return;
	}
	if (k == 2 && !strcmp(op, "turns")) {
		turns(atoi(a) & 1);
		return;
	}
	if (k >= 1 && !strcmp(op, "wait") && k == 2) {
		wait_set(atoi(a) & 1);
		return;
	}
	if (k == 4 && (!strcmp(op, "bwait") || !strcmp(op, "fwait") || !strcmp(op, "tread"))) {
		n = name_of(b);
		if (!writable_name(n))
			return;
		if (!strcmp(op, "bwait"))
			blocked(atoi(a) & 1, n, atol(c), 0);
		else if (!strcmp(op, "tread"))
			threaded_read(atoi(a) & 1, peer[n], atol(c));
		else
			forked(atoi(a) & 1, n, atol(c));
		return;
	}
	if (k == 3 && !strcmp(op, "dwait")) {
		n = name_of(a);
		if (!writable_name(n))
			return;
		two_sets(n, atol(b));
		return;
	}
	if (k == 3 && !strcmp(op, "bpoll")) {
		n = name_of(a);
		if (!writable_name(n))
			return;
		blocked(0, n, atol(b), 1);
		return;
	}
	if (k == 4 && !strcmp(op, "ctl")) {
		int set = atoi(a) & 1, f = name_of(c);
		int how = !strcmp(b, "add") ? EPOLL_CTL_ADD : !strcmp(b, "mod") ? EPOLL_CTL_MOD :
									  EPOLL_CTL_DEL;
		char *mask = strchr(strchr(strchr(line, ' ') + 1, ' ') + 1, ' ') + 1;
		mask = strchr(mask, ' ');
		struct epoll_event ev = { .events = mask ? parse_mask(mask + 1) : 0 };

		if (f < 0 || fds[f] < 0) {
			printf("closed\n");
			return;
		}
		ev.data.u64 = f;
		printf("ctl %d\n", epoll_ctl(sets[set], how, fds[f], &ev) ? -errno : 0);
		return;
	}
	n = k >= 2 ? name_of(a) : -1;
	if (n < 0) {
		printf("bad line %s", line);
		return;
	}
	if (fds[n] < 0) {
		printf("closed\n");
		return;
	}
	if (!strcmp(op, "write") && k == 3) {
		int to = peer[n];
		long want = atol(b) % (long)sizeof(buf);
		ssize_t r;

		if (n == 4 || to < 0 || fds[to] < 0 || writes[n] >= WRITES) {
			printf("skip\n");
			return;
		}
		memset(buf, 'x', want);
		r = write(fds[n], buf, want);
		printf("write %zd\n", r < 0 ? -errno : r);
		if (r > 0) {
			writes[n]++;
			unread[to] += r;
			if (settle_bytes(to))
				printf("settle timed out\n");
		}
	} else if (!strcmp(op, "read") && k == 3) {
		ssize_t r = read(fds[n], buf, atol(b) % (long)sizeof(buf));

		printf("read %zd\n", r < 0 ? -errno : r);
		if (r > 0)
			unread[n] -= r;
	} else if (!strcmp(op, "shut") && k == 2) {
		if (n >= 4) {
			printf("skip\n");
			return;
		}
		printf("shut %d\n", shutdown(fds[n], SHUT_WR) ? -errno : 0);
		settle_end(n, POLLRDHUP, 1);
		settle_acked(n);
	} else if (!strcmp(op, "close") && k == 2) {
		/* Unread bytes make it a reset, unless both ends had ended. */
		int reset = unread[n] > 0;

		printf("close %d\n", close(fds[n]) ? -errno : 0);
		fds[n] = -1;
		if (n < 4)
			settle_end(n, reset ? POLLERR : POLLRDHUP, !reset);
	} else {
		printf("bad line %s", line);
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int one = 1, l;
	char line[256];

	if (argc != 3) {
		fprintf(stderr, "usage: epollmodel IP PORT\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN); /* writes to closed peers say EPIPE */
	a.sin_port = htons(atoi(argv[2]));
	l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 16))
		die("listen");
	printf("ready\n");
	int begun = 0;
	while (fgets(line, sizeof(line), stdin)) {
		if (!begun) {
			start(argv[1], l, atoi(argv[2]));
			begun = 1;
		}
		if (!strncmp(line, "end", 3)) {
			finish();
			begun = 0;
			continue;
		}
		step(line);
	}
	return 0;
}
