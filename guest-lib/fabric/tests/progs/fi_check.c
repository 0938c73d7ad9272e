/* Checks the ulnic provider through libfabric's public API only, as any
 * program would: two RDM endpoints of one domain exchange messages, and
 * every answer is compared with what fi_msg(3), fi_tagged(3) and
 * fi_cq(3) say. Prints "ok <name>" per check; exits 1 at the first
 * failure. */
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "FAILED line %d: ", __LINE__);        \
			fprintf(stderr, __VA_ARGS__);                         \
			fprintf(stderr, "\n");                                \
			exit(1);                                              \
		}                                                             \
	} while (0)

struct side {
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t peer;
};

static struct fid_domain *domain;
static struct fid_av *av;

static void open_side(struct fi_info *info, struct side *s)
{
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	CHECK(fi_endpoint(domain, info, &s->ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_cq_open(domain, &ca, &s->cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_ep_bind(s->ep, &av->fid, 0) == 0, "bind av");
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_enable(s->ep) == 0, "fi_enable");
}

/* Reads one completion from `cq`, moving both sides along. */
static ssize_t next(struct side *s, struct side *other, struct fi_cq_tagged_entry *e)
{
	for (long i = 0; i < 20000000; i++) {
		ssize_t r = fi_cq_read(s->cq, e, 1);
		if (r != -FI_EAGAIN)
			return r;
		struct fi_cq_tagged_entry x;
		ssize_t o = fi_cq_read(other->cq, &x, 0);
		(void)o;
	}
	return -FI_ETIMEDOUT;
}

/* A tagged receive of `tag` with `flags` and `ctx` through fi_trecvmsg. */
static ssize_t trecv_flags(struct side *s, char *in, size_t len, uint64_t tag, void *ctx, uint64_t flags)
{
	struct iovec iov = { .iov_base = in, .iov_len = len };
	struct fi_msg_tagged tm = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC,
				    .tag = tag, .ignore = 0, .context = ctx };
	return fi_trecvmsg(s->ep, &tm, flags);
}

/* FI_CLAIM and FI_DISCARD with FI_PEEK (fi_tagged(3)): a claimed message
 * is kept for the receive that names the peek's context; a discarded one
 * is gone. */
static void claim_and_discard(struct side *a, struct side *b)
{
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	char out[64], in[64];
	for (int i = 0; i < 64; i++)
		out[i] = (char)(i + 1);
	CHECK(fi_tsend(a->ep, out, 20, NULL, a->peer, 0x88, (void *)20) == 0, "tsend 88");
	CHECK(fi_tsend(a->ep, out, 30, NULL, a->peer, 0x99, (void *)21) == 0, "tsend 99");
	CHECK(next(a, b, &e) == 1 && next(a, b, &e) == 1, "sent 88 and 99");
	CHECK(trecv_flags(b, in, sizeof(in), 0x88, (void *)22, FI_PEEK | FI_CLAIM) == 0, "peek claim");
	CHECK(next(b, a, &e) == 1 && e.len == 20 && e.op_context == (void *)22, "claimed 88");
	/* A plain receive for the same tag does not take the claimed one. */
	CHECK(fi_trecv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 0x88, 0, (void *)23) == 0, "trecv 88");
	CHECK(fi_tsend(a->ep, out, 21, NULL, a->peer, 0x88, (void *)24) == 0, "tsend 88 again");
	CHECK(next(a, b, &e) == 1, "sent 88 again");
	CHECK(next(b, a, &e) == 1 && e.op_context == (void *)23 && e.len == 21, "plain receive took the later one");
	memset(in, 0, sizeof(in));
	CHECK(trecv_flags(b, in, sizeof(in), 0x88, (void *)22, FI_CLAIM) == 0, "claim receive");
	CHECK(next(b, a, &e) == 1 && e.op_context == (void *)22 && e.len == 20 && !memcmp(in, out, 20),
	      "the claimed message, whole");
	CHECK(trecv_flags(b, in, sizeof(in), 0x88, (void *)25, FI_CLAIM) == -FI_EINVAL, "nothing claimed with it");
	CHECK(trecv_flags(b, in, sizeof(in), 0x99, (void *)26, FI_PEEK | FI_DISCARD) == 0, "peek discard");
	CHECK(next(b, a, &e) == 1 && e.len == 30 && e.op_context == (void *)26, "discarded 99");
	CHECK(trecv_flags(b, in, sizeof(in), 0x99, (void *)27, FI_PEEK) == 0, "peek 99 again");
	CHECK(next(b, a, &e) == -FI_EAVAIL && fi_cq_readerr(b->cq, &err, 0) == 1 && err.err == FI_ENOMSG,
	      "99 is gone");
	CHECK(fi_tsend(a->ep, out, 10, NULL, a->peer, 0xaa, (void *)28) == 0 && next(a, b, &e) == 1, "tsend aa");
	CHECK(trecv_flags(b, in, sizeof(in), 0xaa, (void *)29, FI_PEEK | FI_CLAIM) == 0 && next(b, a, &e) == 1,
	      "claimed aa");
	CHECK(trecv_flags(b, in, sizeof(in), 0xaa, (void *)29, FI_CLAIM | FI_DISCARD) == 0, "claim discard");
	CHECK(next(b, a, &e) == 1 && e.op_context == (void *)29 && e.len == 0, "discarded claimed aa");
	printf("ok claim-discard\n");
}

/* FI_WAIT_FD: a queue hands out a descriptor; fi_trywait says when
 * sleeping on it is safe; a message arriving wakes epoll. */
static void wait_fd(struct fid_fabric *fabric, struct fi_info *info, struct side *a)
{
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD };
	struct side w;
	int fd = -1;
	CHECK(fi_endpoint(domain, info, &w.ep, NULL) == 0, "fi_endpoint w");
	CHECK(fi_cq_open(domain, &ca, &w.cq, NULL) == 0, "fi_cq_open FI_WAIT_FD");
	CHECK(fi_ep_bind(w.ep, &av->fid, 0) == 0, "bind av w");
	CHECK(fi_ep_bind(w.ep, &w.cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq w");
	CHECK(fi_enable(w.ep) == 0, "fi_enable w");
	CHECK(fi_control(&w.cq->fid, FI_GETWAIT, &fd) == 0 && fd >= 0, "FI_GETWAIT");
	CHECK(fi_control(&a->cq->fid, FI_GETWAIT, &fd) == -FI_ENODATA, "no wait object, no fd");
	struct fid *without = &a->cq->fid;
	CHECK(fi_trywait(fabric, &without, 1) == -FI_EINVAL, "trywait without a wait object");
	char name[64], in[64], out[48] = "woken by a message";
	size_t len = sizeof(name);
	fi_addr_t to_w;
	CHECK(fi_getname(&w.ep->fid, name, &len) == 0, "getname w");
	CHECK(fi_av_insert(av, name, 1, &to_w, 0, NULL) == 1, "insert w");
	CHECK(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)40) == 0, "recv w");
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN }, got;
	CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll");
	struct fid *fids = &w.cq->fid;
	CHECK(fi_trywait(fabric, &fids, 1) == 0, "nothing yet: may sleep");
	/* The descriptor is the process's: it may be readable for another
	 * queue's endpoint (a wake-up with nothing here is allowed), but
	 * this queue has nothing. */
	struct fi_cq_tagged_entry none;
	CHECK(fi_cq_read(w.cq, &none, 1) == -FI_EAGAIN, "nothing before anything came");
	CHECK(fi_trywait(fabric, &fids, 1) == 0, "still nothing: may sleep");
	CHECK(fi_send(a->ep, out, sizeof(out), NULL, to_w, (void *)41) == 0, "send to w");
	struct fi_cq_tagged_entry e;
	/* a's completion needs a's progress; the message needs none. */
	for (int i = 0; i < 100000 && fi_cq_read(a->cq, &e, 1) == -FI_EAGAIN; i++)
		;
	CHECK(epoll_wait(ep, &got, 1, 5000) == 1, "the arrival woke epoll");
	ssize_t r;
	while ((r = fi_cq_read(w.cq, &e, 1)) == -FI_EAGAIN)
		;
	CHECK(r == 1 && e.op_context == (void *)40 && e.len == sizeof(out) && !memcmp(in, out, sizeof(out)),
	      "received after the wake");
	/* Each sleep follows a fi_trywait (fi_trywait(3)). */
	CHECK(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)42) == 0, "recv w 2");
	CHECK(fi_trywait(fabric, &fids, 1) == 0, "nothing yet again");
	CHECK(fi_send(a->ep, out, 8, NULL, to_w, (void *)43) == 0, "send to w 2");
	for (int i = 0; i < 100000 && fi_cq_read(a->cq, &e, 1) == -FI_EAGAIN; i++)
		;
	CHECK(epoll_wait(ep, &got, 1, 5000) == 1, "woken again");
	CHECK(fi_trywait(fabric, &fids, 1) == -FI_EAGAIN, "trywait with a message waiting");
	while ((r = fi_cq_read(w.cq, &e, 1)) == -FI_EAGAIN)
		;
	CHECK(r == 1 && e.op_context == (void *)42, "second message");
	close(ep);
	fi_close(&w.ep->fid);
	fi_close(&w.cq->fid);
}

/* Counters: every finished operation counts, also those that report no
 * completion (inject, selective completion); failures count apart. */
static void counters(struct fi_info *info, struct side *a)
{
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cntr_attr cta = { .events = FI_CNTR_EVENTS_COMP };
	struct fid_cntr *tx, *rx;
	struct side k;
	CHECK(fi_cntr_open(domain, &cta, &tx, NULL) == 0 && fi_cntr_open(domain, &cta, &rx, NULL) == 0, "fi_cntr_open");
	CHECK(fi_endpoint(domain, info, &k.ep, NULL) == 0, "fi_endpoint k");
	CHECK(fi_cq_open(domain, &ca, &k.cq, NULL) == 0, "cq k");
	CHECK(fi_ep_bind(k.ep, &av->fid, 0) == 0, "bind av k");
	CHECK(fi_ep_bind(k.ep, &k.cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION) == 0, "bind cq k");
	CHECK(fi_ep_bind(k.ep, &tx->fid, FI_REMOTE_WRITE) == -FI_ENOSYS, "target-side counters not offered");
	CHECK(fi_ep_bind(k.ep, &tx->fid, FI_SEND) == 0 && fi_ep_bind(k.ep, &rx->fid, FI_RECV) == 0, "bind counters");
	CHECK(fi_enable(k.ep) == 0, "fi_enable k");
	char name[64], in[64], out[32] = "counted";
	size_t len = sizeof(name);
	fi_addr_t to_k, nowhere;
	CHECK(fi_getname(&k.ep->fid, name, &len) == 0, "getname k");
	CHECK(fi_av_insert(av, name, 1, &to_k, 0, NULL) == 1, "insert k");
	/* Its node, a port nobody holds. */
	name[4] = 0x39, name[5] = 0x30, name[6] = 0, name[7] = 0;
	CHECK(fi_av_insert(av, name, 1, &nowhere, 0, NULL) == 1, "insert nowhere");
	for (int i = 0; i < 3; i++)
		CHECK(fi_recv(k.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL) == 0, "recv k");
	CHECK(fi_send(a->ep, out, 8, NULL, to_k, (void *)50) == 0, "send 1");
	CHECK(fi_inject(a->ep, out, 8, to_k) == 0, "inject 2");
	CHECK(fi_send(a->ep, out, 8, NULL, to_k, (void *)51) == 0, "send 3");
	struct fi_cq_tagged_entry e;
	for (int got = 0; got < 2;) {
		ssize_t r = fi_cq_read(a->cq, &e, 1);
		CHECK(r == 1 || r == -FI_EAGAIN, "a's sends");
		got += r == 1;
	}
	CHECK(fi_cntr_wait(rx, 3, 5000) == 0 && fi_cntr_read(rx) == 3, "three receives counted (%lu)",
	      (unsigned long)fi_cntr_read(rx));
	CHECK(fi_cq_read(k.cq, &e, 1) == -FI_EAGAIN, "selective: no receive completions");
	CHECK(fi_send(k.ep, out, 8, NULL, to_k, NULL) == 0, "k to itself, unreported");
	CHECK(fi_recv(k.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL) == 0, "recv k 4");
	CHECK(fi_cntr_wait(tx, 1, 5000) == 0 && fi_cntr_wait(rx, 4, 5000) == 0, "k's send and receive counted");
	CHECK(fi_cntr_wait(tx, 5, 10) == -FI_ETIMEDOUT, "wait times out");
	CHECK(fi_send(k.ep, out, 8, NULL, nowhere, NULL) == 0, "send nowhere");
	CHECK(fi_cntr_wait(tx, 5, 5000) == -FI_EAVAIL && fi_cntr_readerr(tx) == 1 && fi_cntr_read(tx) == 1,
	      "a failure counts as an error (%lu errors)", (unsigned long)fi_cntr_readerr(tx));
	CHECK(fi_cntr_add(tx, 10) == 0 && fi_cntr_read(tx) == 11, "add");
	CHECK(fi_cntr_set(tx, 2) == 0 && fi_cntr_read(tx) == 2, "set");
	CHECK(fi_cntr_adderr(tx, 2) == 0 && fi_cntr_readerr(tx) == 3, "adderr");
	CHECK(fi_cntr_seterr(tx, 0) == 0 && fi_cntr_readerr(tx) == 0, "seterr");
	fi_close(&k.ep->fid);
	fi_close(&k.cq->fid);
	fi_close(&tx->fid);
	fi_close(&rx->fid);
}

/* What is not offered says so. */
static void not_offered(struct side *a)
{
	struct fi_cntr_attr ctr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_FD };
	struct fid_cntr *cntr;
	CHECK(fi_cntr_open(domain, &ctr, &cntr, NULL) == -FI_ENOSYS, "counters with a wait fd");
	uint64_t word = 1;
	CHECK(fi_atomic(a->ep, &word, 1, NULL, a->peer, 0, 0, FI_UINT64, FI_SUM, NULL) == -FI_ENOSYS, "atomics");
}

/* A pair of endpoints for the RMA checks: x initiates, y is the target. */
static void rma_pair(struct fi_info *ri, struct side *x, struct side *y)
{
	char name[64];
	size_t len;
	open_side(ri, x);
	open_side(ri, y);
	len = sizeof(name);
	CHECK(fi_getname(&y->ep->fid, name, &len) == 0, "getname y");
	CHECK(fi_av_insert(av, name, 1, &x->peer, 0, NULL) == 1, "insert y");
	len = sizeof(name);
	CHECK(fi_getname(&x->ep->fid, name, &len) == 0, "getname x");
	CHECK(fi_av_insert(av, name, 1, &y->peer, 0, NULL) == 1, "insert x");
}

/* A remote access's outcome: 0, or the error entry's errno. */
static int rma_done(struct side *x, struct side *y, void *ctx, uint64_t flags)
{
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err = { 0 };
	ssize_t r = next(x, y, &e);
	if (r == -FI_EAVAIL) {
		CHECK(fi_cq_readerr(x->cq, &err, 0) == 1 && err.op_context == ctx, "error entry");
		return err.err;
	}
	CHECK(r == 1 && e.op_context == ctx && (e.flags & flags) == flags, "rma completion (flags %lx)",
	      (unsigned long)e.flags);
	return 0;
}

/* FI_RMA: writes and reads of registered regions, checked by the target
 * against keys it drew, bounds and rights. */
static void rma(struct fi_info *hints)
{
	struct fi_info *ri, *none = NULL, *h = fi_dupinfo(hints);
	h->caps = FI_MSG | FI_RMA;
	h->domain_attr->mr_mode = 0;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &none) == -FI_ENODATA, "RMA without PROV_KEY");
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &ri) == 0, "getinfo RMA");
	CHECK(ri->domain_attr->mr_mode == FI_MR_PROV_KEY && (ri->caps & FI_RMA), "mr_mode %x", ri->domain_attr->mr_mode);
	struct side x, y;
	rma_pair(ri, &x, &y);
	enum { N = 300000 };
	static unsigned char region[N + 100000], ro[64], src[N], dst[N];
	for (int i = 0; i < N; i++)
		src[i] = (unsigned char)(i * 13 + 5);
	struct fid_mr *mr, *mr_ro;
	CHECK(fi_mr_reg(domain, region, sizeof(region), FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 7, 0, &mr, NULL) == 0, "reg");
	CHECK(fi_mr_reg(domain, ro, sizeof(ro), FI_REMOTE_READ, 0, 8, 0, &mr_ro, NULL) == 0, "reg ro");
	uint64_t key = fi_mr_key(mr), key_ro = fi_mr_key(mr_ro);
	CHECK(key != 7 && key != 0 && key_ro != key, "keys are the provider's (%lx %lx)", (unsigned long)key,
	      (unsigned long)key_ro);
	CHECK(fi_write(x.ep, src, 100, NULL, x.peer, 10, key, (void *)60) == 0, "write");
	CHECK(rma_done(&x, &y, (void *)60, FI_RMA | FI_WRITE) == 0 && !memcmp(region + 10, src, 100), "written");
	CHECK(fi_write(x.ep, src, N, NULL, x.peer, 50000, key, (void *)61) == 0, "large write");
	CHECK(rma_done(&x, &y, (void *)61, FI_RMA | FI_WRITE) == 0 && !memcmp(region + 50000, src, N), "large written");
	CHECK(fi_read(x.ep, dst, N, NULL, x.peer, 50000, key, (void *)62) == 0, "large read");
	CHECK(rma_done(&x, &y, (void *)62, FI_RMA | FI_READ) == 0 && !memcmp(dst, src, N), "large read back");
	CHECK(fi_inject_write(x.ep, src + 7, 16, x.peer, 0, key) == 0, "inject write");
	CHECK(fi_writedata(x.ep, src, 8, NULL, 0xabc, x.peer, 200, key, (void *)63) == 0, "writedata");
	CHECK(rma_done(&x, &y, (void *)63, FI_RMA | FI_WRITE) == 0 && !memcmp(region, src + 7, 16), "inject landed first");
	struct fi_cq_tagged_entry e;
	CHECK(next(&y, &x, &e) == 1 && e.data == 0xabc && (e.flags & (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA)) ==
		      (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA) && e.len == 8, "remote CQ data at the target");
	/* Refused: no write right, past the end, a guessed key, a closed one. */
	CHECK(fi_write(x.ep, src, 8, NULL, x.peer, 0, key_ro, (void *)64) == 0, "write ro");
	CHECK(rma_done(&x, &y, (void *)64, 0) == FI_EACCES && ro[0] == 0, "no write right");
	CHECK(fi_read(x.ep, dst, 8, NULL, x.peer, 60, key_ro, (void *)65) == 0, "read past");
	CHECK(rma_done(&x, &y, (void *)65, 0) == FI_EACCES, "past the end");
	CHECK(fi_read(x.ep, dst, 8, NULL, x.peer, 0, key ^ 1, (void *)66) == 0, "read guessed");
	CHECK(rma_done(&x, &y, (void *)66, 0) == FI_EACCES, "guessed key");
	fi_close(&mr->fid);
	memset(region, 0, 8);
	CHECK(fi_write(x.ep, src, 8, NULL, x.peer, 0, key, (void *)67) == 0, "write closed");
	CHECK(rma_done(&x, &y, (void *)67, 0) == FI_EACCES && region[0] == 0, "closed region");
	fi_close(&mr_ro->fid);
	fi_close(&x.ep->fid);
	fi_close(&y.ep->fid);
	fi_close(&x.cq->fid);
	fi_close(&y.cq->fid);
	fi_freeinfo(ri);
	fi_freeinfo(h);
}

static void waits_counters_and_what_is_not_offered(struct fid_fabric *fabric, struct fi_info *info,
						   struct side *a)
{
	wait_fd(fabric, info, a);
	printf("ok wait-fd\n");
	counters(info, a);
	printf("ok counters\n");
	not_offered(a);
	printf("ok not-offered\n");
}

static void rma_checks(struct fi_info *hints)
{
	rma(hints);
	printf("ok rma\n");
}

/* Message i of bounded_unexpected: every tenth 64 KiB, the rest 8 bytes. */
static char *bounded_msg(int i, size_t *len)
{
	static char large[100][65536], small[1000][8];

	*len = i % 10 ? 8 : sizeof(large[0]);
	return i % 10 ? small[i] : large[i / 10];
}

/* Unexpected messages past ULNIC_FI_UNEXPECTED_MAX (docs/libfabric.md):
 * 1,000 tagged messages (every tenth 64 KiB, the rest 8 bytes) sent with
 * no receive posted are all received later, intact and in order. With
 * the bound set low (the host test sets 1 MiB) the receiver stops taking
 * packets part way: packets wait at the device or come back and are sent
 * again (not all sends complete before the receives are posted), the
 * small ones queued behind large ones (the device keeps each pair's
 * order); nothing is lost. Returns the sends done before any receive. */
static int bounded_unexpected(struct side *a, struct side *b)
{
	enum { N = 1000 };
	static char in[65536];
	struct fi_cq_tagged_entry e;
	int sent = 0;
	size_t len;

	for (int i = 0; i < N; i++) {
		char *m = bounded_msg(i, &len);

		memset(m, 'a' + i % 26, len);
		m[0] = (char)i;
		CHECK(fi_tsend(a->ep, m, len, NULL, a->peer, 0x5000 + i, (void *)(long)(10000 + i)) == 0,
		      "tsend %d", i);
	}
	/* Move both sides a while: what the bound lets through completes. */
	for (int k = 0; k < 200000 && sent < N; k++) {
		if (fi_cq_read(a->cq, &e, 1) == 1)
			sent++;
		fi_cq_read(b->cq, &e, 0);
	}
	int before = sent;
	for (int i = 0; i < N; i++) {
		char *m = bounded_msg(i, &len);
		ssize_t r;

		CHECK(fi_trecv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 0x5000 + i, 0,
			       (void *)(long)(20000 + i)) == 0,
		      "trecv %d", i);
		while ((r = fi_cq_read(b->cq, &e, 1)) == -FI_EAGAIN)
			if (fi_cq_read(a->cq, &e, 1) == 1)
				sent++;
		CHECK(r == 1 && e.op_context == (void *)(long)(20000 + i) && e.len == len &&
			      e.tag == 0x5000u + i && !memcmp(in, m, len),
		      "unexpected message %d (r %zd len %zu)", i, r, e.len);
	}
	for (; sent < N; sent++)
		CHECK(next(a, b, &e) == 1, "send completion %d", sent);
	return before;
}

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->fabric_attr->prov_name = strdup("ulnic");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0, "fi_getinfo");
	CHECK(!strcmp(info->fabric_attr->prov_name, "ulnic"), "provider %s", info->fabric_attr->prov_name);
	printf("ok getinfo\n");

	struct fi_info *h2 = fi_dupinfo(hints), *none = NULL;
	h2->caps |= FI_ATOMIC;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h2, &none) == -FI_ENODATA, "atomics refused");
	h2->caps = FI_MSG;
	h2->ep_attr->type = FI_EP_DGRAM;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h2, &none) == -FI_ENODATA, "dgram refused");
	printf("ok refuses-what-it-lacks\n");

	struct fid_fabric *fabric;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fi_fabric");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "fi_domain");
	struct fi_av_attr aa = { .type = FI_AV_MAP };
	CHECK(fi_av_open(domain, &aa, &av, NULL) == 0, "fi_av_open");
	struct side a, b;
	open_side(info, &a);
	open_side(info, &b);
	char name[64];
	size_t len = 1;
	CHECK(fi_getname(&a.ep->fid, name, &len) == -FI_ETOOSMALL && len == 8, "getname size");
	len = sizeof(name);
	CHECK(fi_getname(&a.ep->fid, name, &len) == 0, "getname a");
	CHECK(fi_av_insert(av, name, 1, &b.peer, 0, NULL) == 1, "insert a");
	len = sizeof(name);
	CHECK(fi_getname(&b.ep->fid, name, &len) == 0, "getname b");
	CHECK(fi_av_insert(av, name, 1, &a.peer, 0, NULL) == 1, "insert b");
	printf("ok endpoints\n");

	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	char out[256], in[256];
	for (int i = 0; i < 256; i++)
		out[i] = (char)i;

	/* Unexpected tagged messages, matched later with ignore bits, in
	 * arrival order among those that match. */
	CHECK(fi_tsend(a.ep, out, 10, NULL, a.peer, 0x1234, (void *)1) == 0, "tsend");
	CHECK(fi_tsend(a.ep, out + 10, 20, NULL, a.peer, 0x1299, (void *)2) == 0, "tsend 2");
	CHECK(next(&a, &b, &e) == 1 && e.op_context == (void *)1 && (e.flags & FI_SEND), "send done");
	CHECK(next(&a, &b, &e) == 1 && e.op_context == (void *)2, "send 2 done");
	CHECK(fi_trecv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 0x1299, 0, (void *)3) == 0, "trecv exact");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)3 && e.len == 20 && e.tag == 0x1299 &&
		      !memcmp(in, out + 10, 20) && (e.flags & (FI_RECV | FI_TAGGED)) == (FI_RECV | FI_TAGGED),
	      "exact tag took the second message (len %zu tag %lx)", e.len, (unsigned long)e.tag);
	CHECK(fi_trecv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 0x1200, 0xff, (void *)4) == 0, "trecv ignore");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)4 && e.len == 10 && e.tag == 0x1234 &&
		      !memcmp(in, out, 10),
	      "ignore bits matched the first");
	printf("ok tagged-unexpected-and-ignore\n");

	/* FI_PEEK sees a message without taking it; FI_ENOMSG when none. */
	struct iovec iov = { .iov_base = in, .iov_len = sizeof(in) };
	struct fi_msg_tagged tm = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC,
				    .tag = 0x77, .ignore = 0, .context = (void *)5 };
	CHECK(fi_trecvmsg(b.ep, &tm, FI_PEEK) == 0, "peek none");
	CHECK(next(&b, &a, &e) == -FI_EAVAIL, "peek none is an error entry");
	CHECK(fi_cq_readerr(b.cq, &err, 0) == 1 && err.err == FI_ENOMSG && err.op_context == (void *)5, "ENOMSG");
	CHECK(fi_tsend(a.ep, out, 33, NULL, a.peer, 0x77, (void *)6) == 0, "tsend 77");
	CHECK(next(&a, &b, &e) == 1, "sent 77");
	CHECK(fi_trecvmsg(b.ep, &tm, FI_PEEK) == 0, "peek");
	CHECK(next(&b, &a, &e) == 1 && e.len == 33 && e.tag == 0x77, "peek found it (len %zu)", e.len);
	CHECK(fi_trecv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 0x77, 0, (void *)7) == 0, "trecv 77");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)7 && e.len == 33, "still there after peek");
	printf("ok peek\n");
	claim_and_discard(&a, &b);
	printf("ok bounded-unexpected: %d of 1000 sends done before any receive\n", bounded_unexpected(&a, &b));

	/* Truncation: an error entry with the bytes that did not fit. */
	CHECK(fi_recv(b.ep, in, 10, NULL, FI_ADDR_UNSPEC, (void *)8) == 0, "short recv");
	CHECK(fi_send(a.ep, out, 100, NULL, a.peer, (void *)9) == 0, "send 100");
	CHECK(next(&b, &a, &e) == -FI_EAVAIL, "truncated is an error");
	CHECK(fi_cq_readerr(b.cq, &err, 0) == 1 && err.err == FI_ETRUNC && err.olen == 90 &&
		      err.op_context == (void *)8 && !memcmp(in, out, 10),
	      "ETRUNC olen %zu", err.olen);
	CHECK(next(&a, &b, &e) == 1 && e.op_context == (void *)9, "send 100 done");
	printf("ok truncation\n");

	/* Remote CQ data, and a message larger than a packet. */
	char *big = malloc(300000), *got = malloc(300000);
	for (int i = 0; i < 300000; i++)
		big[i] = (char)(i * 7);
	CHECK(fi_recv(b.ep, got, 300000, NULL, FI_ADDR_UNSPEC, (void *)10) == 0, "big recv");
	CHECK(fi_senddata(a.ep, big, 300000, NULL, 0xabcdef, a.peer, (void *)11) == 0, "senddata");
	CHECK(next(&b, &a, &e) == 1 && e.len == 300000 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0xabcdef &&
		      !memcmp(big, got, 300000),
	      "big message with data");
	CHECK(next(&a, &b, &e) == 1 && e.op_context == (void *)11, "senddata done");
	printf("ok data-and-large\n");

	/* Directed receive: only from the named sender. */
	struct side c;
	open_side(info, &c);
	len = sizeof(name);
	CHECK(fi_getname(&c.ep->fid, name, &len) == 0, "getname c");
	fi_addr_t c_addr;
	CHECK(fi_av_insert(av, name, 1, &c_addr, 0, NULL) == 1, "insert c");
	len = sizeof(name);
	fi_getname(&b.ep->fid, name, &len);
	fi_av_insert(av, name, 1, &c.peer, 0, NULL);
	CHECK(fi_recv(b.ep, in, sizeof(in), NULL, c_addr, (void *)12) == 0, "directed recv");
	CHECK(fi_send(a.ep, out, 5, NULL, a.peer, (void *)13) == 0, "send from a");
	CHECK(next(&a, &b, &e) == 1, "a's send done");
	CHECK(fi_send(c.ep, out, 6, NULL, c.peer, (void *)14) == 0, "send from c");
	CHECK(next(&c, &b, &e) == 1, "c's send done");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)12 && e.len == 6, "directed took c's (len %zu)", e.len);
	CHECK(fi_recv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)15) == 0, "any recv");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)15 && e.len == 5, "a's waited");
	printf("ok directed\n");

	/* Cancel: the receive comes back as FI_ECANCELED. */
	CHECK(fi_recv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)16) == 0, "recv to cancel");
	CHECK(fi_cancel(&b.ep->fid, (void *)16) == 0, "cancel");
	CHECK(next(&b, &a, &e) == -FI_EAVAIL, "cancelled is an error");
	CHECK(fi_cq_readerr(b.cq, &err, 0) == 1 && err.err == FI_ECANCELED && err.op_context == (void *)16, "ECANCELED");
	printf("ok cancel\n");

	/* Inject: no completion. */
	CHECK(fi_inject(a.ep, out, 40, a.peer) == 0, "inject");
	CHECK(fi_recv(b.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)17) == 0, "recv inject");
	CHECK(next(&b, &a, &e) == 1 && e.op_context == (void *)17 && e.len == 40, "inject arrived");
	CHECK(fi_cq_read(a.cq, &e, 1) == -FI_EAGAIN, "inject has no completion");
	printf("ok inject\n");

	waits_counters_and_what_is_not_offered(fabric, info, &a);
	rma_checks(hints);

	fi_close(&c.ep->fid);
	fi_close(&c.cq->fid);
	fi_close(&a.ep->fid);
	fi_close(&b.ep->fid);
	fi_close(&a.cq->fid);
	fi_close(&b.cq->fid);
	fi_close(&av->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	fi_freeinfo(h2);
	printf("ok all\n");
	return 0;
}
