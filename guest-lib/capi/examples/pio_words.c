/* SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause */
/*
 * A PIO window written word by word (CLAN's PIO apertures, docs/spec.md
 * §6.2): the owner exports a window of WORDS 8-byte words; the writer, on
 * another node, maps it with the grant and stores every word with plain
 * stores and then syncs the window (ulnic_pio_sync), which fires the
 * tripwire the owner sleeps on; the owner reads them all back. Then the
 * owner revokes the
 * window: a store the writer makes after that faults (the writer tries
 * in a child process), and the owner's memory is unchanged. In a guest
 * the writer also checks that the driver refuses to map beyond the
 * window it was granted.
 *
 *   ULNIC_SOCKET=/tmp/u/node1.sock ./pio_words owner 23 1000000
 *   ULNIC_SOCKET=/tmp/u/node0.sock ./pio_words writer 1 23 [GATE]
 *
 * With GATE the writer paces its stores for an observer: it creates
 * GATE.mapped once the window is mapped, waits for GATE.go, stores, creates
 * GATE.stored and waits for GATE.done (so counters read between .mapped
 * and .stored cover the stores and nothing else).
 *
 * Build: gcc pio_words.c $(pkg-config --cflags --libs ulnic) -o pio_words
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example.h"

#define TAG_GRANT 1
#define TAG_WRITTEN 2
#define TAG_REVOKED 3
#define TAG_FAULTED 4

static uint64_t word_value(uint64_t i)
{
	return i * 0x9e3779b97f4a7c15ull + 1;
}

/* Sleeps (up to 10 minutes) until tripwire TW of EP fires. */
static void await_tripwire(struct ulnic_ep *ep, uint32_t tw, struct ulnic_event *ev)
{
	double t = now_us();
	int err;

	for (;;) {
		if (ulnic_ep_poll_event(ep, ev) == 1) {
			if (ev->kind == ULNIC_EVENT_TRIPWIRE && ev->tripwire == tw)
				return;
			die(0, "expected tripwire %u, got event kind %u", tw, ev->kind);
		}
		if (now_us() - t > 600e6)
			die(0, "tripwire %u did not fire within 10 minutes", tw);
		if ((err = ulnic_ep_wait(ep, 100)) < 0)
			die(err, "wait");
	}
}

static int owner(uint32_t port, uint64_t words)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 4, &nic);
	struct ulnic_pio_window *w;
	struct ulnic_pio_grant grant;
	struct ulnic_event ev;
	struct ulnic_recv m;
	uint64_t bad = 0;
	uint32_t tw;
	int err;

	err = ulnic_pio_export(ep, words * 8, ULNIC_ANY, &w);
	if (err < 0)
		die(err, "cannot export a PIO window of %llu words", (unsigned long long)words);
	ulnic_pio_window_grant(w, &grant);
	volatile uint64_t *mine = ulnic_pio_window_addr(w);
	/* The device never sees the stores: the writer's sync fires this. */
	err = ulnic_pio_window_tripwire(ep, w, 0, words * 8, 0, 0x5e, &tw);
	if (err < 0)
		die(err, "cannot set a tripwire on the window");
	printf("pio_words: owner on node %u port %u\n", ulnic_node(nic), port);
	fflush(stdout);
	next_message(ep, &m, 600000);
	send_small(ep, m.src, TAG_GRANT, &grant, sizeof(grant));
	await_tripwire(ep, tw, &ev);
	if (ev.id != 0x5e || ev.addr.node != m.src.node || ev.code != 0)
		die(0, "tripwire event: user %llx from node %u, code %u", (unsigned long long)ev.id,
		    ev.addr.node, ev.code);
	printf("pio_words: woken by node %u's sync of %u bytes\n", ev.addr.node, ev.len);
	next_message(ep, &m, 600000);
	if (m.tag != TAG_WRITTEN)
		die(0, "expected the writer's word, got tag %u", m.tag);
	for (uint64_t i = 0; i < words; i++)
		bad += mine[i] != word_value(i);
	if (bad)
		die(0, "%llu of %llu words wrong", (unsigned long long)bad, (unsigned long long)words);
	printf("pio_words: all %llu words the writer stored read back\n", (unsigned long long)words);
	err = ulnic_pio_window_revoke(w);
	if (err < 0)
		die(err, "cannot revoke");
	send_small(ep, m.src, TAG_REVOKED, "", 0);
	next_message(ep, &m, 60000);
	if (m.tag != TAG_FAULTED)
		die(0, "expected the writer's fault report, got tag %u", m.tag);
	for (uint64_t i = 0; i < words; i++)
		bad += mine[i] != word_value(i);
	if (bad)
		die(0, "%llu words changed after the revocation", (unsigned long long)bad);
	printf("pio_words: revoked; the window is unchanged since\n");
	ulnic_pio_window_free(w);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

/* In a child: stores into the revoked window until one faults (the
 * driver zaps the mapping a moment after the device unmapped it; a store
 * before that reaches nothing). Returns the signal that ended it, or 0. */
static int store_after_revocation(volatile uint64_t *p)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		die(-errno, "fork");
	if (pid == 0) {
		for (int i = 0; i < 500; i++) {
			p[0] = 0xdeadull;
			usleep(10000);
		}
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid)
		die(-errno, "waitpid");
	return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

/* Creates GATE.STEP (a gate of NULL does nothing). */
static void gate_mark(const char *gate, const char *step)
{
	char path[512];
	int fd;

	if (!gate)
		return;
	snprintf(path, sizeof(path), "%s.%s", gate, step);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	if (fd < 0)
		die(-errno, "cannot create %s", path);
	close(fd);
}

/* Waits (up to 10 minutes) until GATE.STEP exists. */
static void gate_wait(const char *gate, const char *step)
{
	char path[512];
	double t = now_us();

	if (!gate)
		return;
	snprintf(path, sizeof(path), "%s.%s", gate, step);
	while (access(path, F_OK) != 0) {
		if (now_us() - t > 600e6)
			die(0, "%s did not appear within 10 minutes", path);
		usleep(20000);
	}
}

/* The file offset the library mapped ADDR at, if a device file is mapped
 * there (in a guest, /dev/ulnicN); -1 host-attached. */
static long long device_file_offset(const void *addr)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long long lo, hi, off;
	char line[512], file[256];
	long long found = -1;

	if (!f)
		die(-errno, "cannot read /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		file[0] = 0;
		if (sscanf(line, "%llx-%llx %*s %llx %*s %*s %255s", &lo, &hi, &off, file) >= 3 &&
		    lo == (uintptr_t)addr && !strncmp(file, "/dev/ulnic", 10))
			found = (long long)off;
	}
	fclose(f);
	return found;
}

/* In a guest: the driver maps only what the device mapped for this file,
 * so neither a longer mapping of the import nor one just past it is
 * allowed. Host-attached, the aperture's reservation faults a store past
 * the window (the device's tests check that). */
static void beyond_the_window(struct ulnic_ep *ep, struct ulnic_pio_import *imp)
{
	long long off = device_file_offset(ulnic_pio_import_addr(imp));
	uint64_t len = ulnic_pio_import_len(imp);
	long page = sysconf(_SC_PAGESIZE);
	void *p;

	if (off < 0) {
		printf("pio_words: host-attached: no device file to map beyond the window\n");
		return;
	}
	p = mmap(NULL, len + page, PROT_READ | PROT_WRITE, MAP_SHARED, ulnic_ep_fd(ep), off);
	if (p != MAP_FAILED || errno != EPERM)
		die(p == MAP_FAILED ? -errno : 0, "a mapping longer than the window was not refused with EPERM");
	p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, ulnic_ep_fd(ep), off + (long long)len);
	if (p != MAP_FAILED || errno != EPERM)
		die(p == MAP_FAILED ? -errno : 0, "a mapping past the window was not refused with EPERM");
	printf("pio_words: a mapping beyond the window is refused (EPERM)\n");
}

static int writer(uint32_t node, uint32_t port, const char *gate)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 4, &nic);
	struct ulnic_address to = { .node = node, .port = port };
	struct ulnic_pio_import *imp;
	struct ulnic_pio_grant grant;
	struct ulnic_event ev;
	struct ulnic_recv m;
	int err, sig;

	send_small(ep, to, 0, "hi", 2);
	next_message(ep, &m, 10000);
	memcpy(&grant, m.data, sizeof(grant));
	/* A grant with one bit of its key wrong maps nothing. */
	struct ulnic_pio_grant forged = grant;

	forged.key ^= 1;
	err = ulnic_pio_import(ep, &forged, &imp);
	if (err != -ENOENT)
		die(err, "a forged grant was not refused with ENOENT");
	printf("pio_words: a forged grant is refused (ENOENT)\n");
	err = ulnic_pio_import(ep, &grant, &imp);
	if (err < 0)
		die(err, "cannot import window %u of node %u", grant.window, grant.node);
	uint64_t words = ulnic_pio_import_len(imp) / 8;
	volatile uint64_t *theirs = ulnic_pio_import_addr(imp);

	beyond_the_window(ep, imp);
	gate_mark(gate, "mapped");
	gate_wait(gate, "go");
	double t = now_us();

	for (uint64_t i = 0; i < words; i++)
		theirs[i] = word_value(i);
	ulnic_pio_flush();
	t = now_us() - t;
	gate_mark(gate, "stored");
	gate_wait(gate, "done");
	printf("pio_words: stored %llu words into node %u's window in %.0f us\n",
	       (unsigned long long)words, node, t);
	/* Wakes the owner, who sleeps on a tripwire over the window. */
	err = ulnic_pio_sync(ep, &grant, 0, (uint32_t)(words * 8), 9, ULNIC_COMPLETION);
	if (err < 0)
		die(err, "cannot sync the window");
	for (t = now_us();;) {
		if (ulnic_ep_poll_event(ep, &ev) == 1) {
			if (ev.kind != ULNIC_EVENT_SEND_DONE || ev.id != 9)
				die(0, "the sync: event kind %u, code %u", ev.kind, ev.code);
			break;
		}
		if (now_us() - t > 60e6)
			die(0, "the sync did not complete within 60 s");
		ulnic_ep_wait(ep, 100);
	}
	printf("pio_words: synced the window: the owner's tripwire fired\n");
	t = now_us();
	send_small(ep, to, TAG_WRITTEN, "", 0);
	/* The owner's message and the device's event, in either order. */
	for (int told = 0, event = 0; !told || !event;) {
		if (ulnic_ep_poll_event(ep, &ev) == 1 && ev.kind == ULNIC_EVENT_PIO_REVOKED) {
			if (ev.code != ulnic_pio_import_id(imp))
				die(0, "a revocation of import %u, not ours", ev.code);
			event = 1;
		}
		if (ulnic_ep_poll_recv(ep, &m) == 1) {
			if (m.tag != TAG_REVOKED)
				die(0, "expected the revocation, got tag %u", m.tag);
			told = 1;
		}
		if (now_us() - t > 60e6)
			die(0, "no revocation (message %d, event %d) within 60 s", told, event);
		sched_yield();
	}
	sig = store_after_revocation(theirs);
	if (sig != SIGBUS && sig != SIGSEGV)
		die(0, "a store into the revoked window did not fault (child ended with signal %d)", sig);
	printf("pio_words: a store after the revocation faulted (%s)\n",
	       sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
	{
		struct ulnic_pio_import *again;

		err = ulnic_pio_import(ep, &grant, &again);
		if (err != -ENOENT)
			die(err, "the revoked grant was not refused with ENOENT");
		printf("pio_words: the revoked grant is refused (ENOENT)\n");
	}
	send_small(ep, to, TAG_FAULTED, "", 0);
	ulnic_pio_import_free(imp);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

/*
 * For lifecycle tests: the owner exports a page and hands over its grant,
 * then revokes it once REVOKE_FILE exists; the holder maps it, stores a
 * word, says "holding" and sleeps until killed, keeping the mapping live
 * while its VM is paused, reset or its device restarted.
 */
static int hold_owner(uint32_t port, const char *revoke_file)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port, 4, &nic);
	struct ulnic_pio_window *w;
	struct ulnic_pio_grant grant;
	struct ulnic_recv m;
	int err;

	err = ulnic_pio_export(ep, 4096, ULNIC_ANY, &w);
	if (err < 0)
		die(err, "cannot export");
	ulnic_pio_window_grant(w, &grant);
	printf("pio_words: hold-owner on node %u port %u\n", ulnic_node(nic), port);
	fflush(stdout);
	next_message(ep, &m, 600000);
	send_small(ep, m.src, TAG_GRANT, &grant, sizeof(grant));
	while (access(revoke_file, F_OK) != 0)
		usleep(50000);
	err = ulnic_pio_window_revoke(w);
	if (err < 0)
		die(err, "cannot revoke");
	printf("pio_words: revoked the held window\n");
	ulnic_pio_window_free(w);
	ulnic_ep_destroy(ep);
	ulnic_close(nic);
	return 0;
}

static int hold(uint32_t node, uint32_t port)
{
	struct ulnic_nic *nic;
	struct ulnic_ep *ep = open_endpoint(port + 1, 4, &nic);
	struct ulnic_address to = { .node = node, .port = port };
	struct ulnic_pio_import *imp;
	struct ulnic_pio_grant grant;
	struct ulnic_recv m;
	int err;

	send_small(ep, to, 0, "hi", 2);
	next_message(ep, &m, 10000);
	memcpy(&grant, m.data, sizeof(grant));
	err = ulnic_pio_import(ep, &grant, &imp);
	if (err < 0)
		die(err, "cannot import");
	*(volatile uint64_t *)ulnic_pio_import_addr(imp) = 42;
	printf("pio_words: holding window %u of node %u\n", grant.window, node);
	fflush(stdout);
	for (;;)
		pause();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "hold-owner"))
		return hold_owner((uint32_t)strtoul(argv[2], NULL, 0), argv[3]);
	if (argc == 4 && !strcmp(argv[1], "hold"))
		return hold((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0));
	if (argc == 4 && !strcmp(argv[1], "owner"))
		return owner((uint32_t)strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "writer"))
		return writer((uint32_t)strtoul(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0),
			      argc == 5 ? argv[4] : NULL);
	fprintf(stderr,
		"usage: %s owner PORT WORDS\n       %s writer NODE PORT [GATE]\n"
		"       %s hold-owner PORT REVOKE_FILE\n       %s hold NODE PORT\n",
		argv[0], argv[0], argv[0], argv[0]);
	return 2;
}
