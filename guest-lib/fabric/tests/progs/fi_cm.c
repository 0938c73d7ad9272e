/* Connection-oriented endpoints (FI_EP_MSG) of the ulnic provider through
 * libfabric's public API: a passive endpoint, a refused connect, a
 * rejected request, an accepted one with parameters both ways, data in
 * both directions, and shutdown seen by the peer (fi_cm(3), fi_eq(3)).
 * Prints "ok <name>" per check; exits 1 at the first failure. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "FAILED line %d: ", __LINE__);        \
			fprintf(stderr, __VA_ARGS__);                         \
			fprintf(stderr, "\n");                                \
			exit(1);                                              \
		}                                                             \
	} while (0)

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;

struct conn {
	struct fid_ep *ep;
	struct fid_eq *eq;
	struct fid_cq *cq;
};

static void open_ep(struct fi_info *fi, struct conn *c)
{
	struct fi_eq_attr ea = { .wait_obj = FI_WAIT_UNSPEC };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_MSG };
	CHECK(fi_endpoint(domain, fi, &c->ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_eq_open(fabric, &ea, &c->eq, NULL) == 0, "fi_eq_open");
	CHECK(fi_cq_open(domain, &ca, &c->cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_ep_bind(c->ep, &c->eq->fid, 0) == 0, "bind eq");
	CHECK(fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_enable(c->ep) == 0, "enable");
}

/* Waits for an event on `eq` while also reading `other` (both sides live
 * in this one process, so each must be moved along). */
static ssize_t event(struct fid_eq *eq, struct fid_eq *other, uint32_t *ev, void *buf, size_t len)
{
	for (int i = 0; i < 20000; i++) {
		ssize_t r = fi_eq_read(eq, ev, buf, len, 0);
		if (r != -FI_EAGAIN)
			return r;
		if (other) {
			uint32_t e2;
			char b2[512];
			r = fi_eq_read(other, &e2, b2, sizeof(b2), FI_PEEK);
			(void)r;
		}
		struct timespec ts = { 0, 100000 };
		nanosleep(&ts, NULL);
	}
	return -FI_ETIMEDOUT;
}

static void cq_wait(struct fid_cq *cq, struct fid_cq *other, struct fi_cq_msg_entry *e)
{
	for (long i = 0; i < 20000000; i++) {
		ssize_t r = fi_cq_read(cq, e, 1);
		if (r == 1)
			return;
		CHECK(r == -FI_EAGAIN, "cq read %zd", r);
		struct fi_cq_msg_entry x;
		fi_cq_read(other, &x, 0);
	}
	CHECK(0, "no completion");
}

int main(void)
{
	struct fi_info *hints = fi_allocinfo();
	hints->fabric_attr->prov_name = strdup("ulnic");
	hints->ep_attr->type = FI_EP_MSG;
	hints->caps = FI_MSG;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0, "getinfo msg");
	CHECK(info->ep_attr->type == FI_EP_MSG, "type");
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fabric");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "domain");

	struct fid_pep *pep;
	struct fid_eq *peq;
	struct fi_eq_attr ea = { .wait_obj = FI_WAIT_UNSPEC };
	CHECK(fi_passive_ep(fabric, info, &pep, NULL) == 0, "passive_ep");
	CHECK(fi_eq_open(fabric, &ea, &peq, NULL) == 0, "pep eq");
	CHECK(fi_listen(pep) == -FI_ENOEQ, "listen needs an eq");
	CHECK(fi_pep_bind(pep, &peq->fid, 0) == 0, "pep bind");
	CHECK(fi_listen(pep) == 0, "listen");
	char name[16];
	size_t len = sizeof(name);
	CHECK(fi_getname(&pep->fid, name, &len) == 0 && len == 8, "pep name");
	printf("ok listen\n");

	struct fi_eq_cm_entry cm[4];
	struct fi_eq_err_entry err;
	uint32_t ev;

	/* Nobody at the address: refused. */
	struct conn nobody;
	open_ep(info, &nobody);
	char bogus[8];
	memcpy(bogus, name, 8);
	bogus[4] ^= 0x5a; /* another port on the same node */
	CHECK(fi_connect(nobody.ep, bogus, NULL, 0) == 0, "connect to nobody");
	CHECK(event(nobody.eq, NULL, &ev, cm, sizeof(cm)) == -FI_EAVAIL, "refused is an error");
	CHECK(fi_eq_readerr(nobody.eq, &err, 0) > 0 && err.err == FI_ECONNREFUSED, "ECONNREFUSED (%d)", err.err);
	CHECK(fi_send(nobody.ep, name, 1, NULL, 0, NULL) == -FI_ENOTCONN, "no data without a connection");
	printf("ok refused\n");

	/* Rejected, with the server's reason as parameters. */
	struct conn cli;
	open_ep(info, &cli);
	CHECK(fi_connect(cli.ep, name, "hello", 5) == 0, "connect");
	CHECK(fi_connect(cli.ep, name, NULL, 0) == -FI_EOPBADSTATE, "one connect at a time");
	ssize_t n = event(peq, cli.eq, &ev, cm, sizeof(cm));
	CHECK(n == (ssize_t)(sizeof(struct fi_eq_cm_entry) + 5) && ev == FI_CONNREQ &&
		      !memcmp(cm[0].data, "hello", 5) && cm[0].info && cm[0].info->handle,
	      "CONNREQ with params (%zd, ev %u)", n, ev);
	CHECK(fi_reject(pep, cm[0].info->handle, "no", 2) == 0, "reject");
	fi_freeinfo(cm[0].info);
	CHECK(event(cli.eq, peq, &ev, cm, sizeof(cm)) == -FI_EAVAIL, "rejected is an error");
	CHECK(fi_eq_readerr(cli.eq, &err, 0) > 0 && err.err == FI_ECONNREFUSED, "rejected: ECONNREFUSED");
	fi_close(&cli.ep->fid);
	printf("ok rejected\n");

	/* Accepted: CONNECTED on both sides, the accept's parameters on the
	 * client's, then data both ways. */
	open_ep(info, &cli);
	CHECK(fi_connect(cli.ep, name, "again", 5) == 0, "connect again");
	n = event(peq, cli.eq, &ev, cm, sizeof(cm));
	CHECK(n > 0 && ev == FI_CONNREQ, "second CONNREQ");
	struct conn srv;
	open_ep(cm[0].info, &srv);
	fi_freeinfo(cm[0].info);
	CHECK(fi_accept(srv.ep, "welcome", 7) == 0, "accept");
	CHECK(event(srv.eq, NULL, &ev, cm, sizeof(cm)) > 0 && ev == FI_CONNECTED && cm[0].fid == &srv.ep->fid,
	      "server CONNECTED");
	n = event(cli.eq, srv.eq, &ev, cm, sizeof(cm));
	CHECK(n == (ssize_t)(sizeof(struct fi_eq_cm_entry) + 7) && ev == FI_CONNECTED &&
		      cm[0].fid == &cli.ep->fid && !memcmp(cm[0].data, "welcome", 7),
	      "client CONNECTED with the accept's params (%zd)", n);
	char peer[8], srv_name[8];
	len = 8;
	CHECK(fi_getpeer(cli.ep, peer, &len) == 0, "getpeer");
	len = 8;
	CHECK(fi_getname(&srv.ep->fid, srv_name, &len) == 0 && !memcmp(peer, srv_name, 8),
	      "the client's peer is the server's endpoint");
	printf("ok accepted\n");

	struct fi_cq_msg_entry e;
	char in[100000], out[100000];
	for (int i = 0; i < (int)sizeof(out); i++)
		out[i] = (char)(i * 13);
	CHECK(fi_recv(srv.ep, in, sizeof(in), NULL, 0, (void *)1) == 0, "srv recv");
	CHECK(fi_send(cli.ep, out, sizeof(out), NULL, 0, (void *)2) == 0, "cli send");
	cq_wait(srv.cq, cli.cq, &e);
	CHECK(e.op_context == (void *)1 && e.len == sizeof(out) && !memcmp(in, out, sizeof(out)), "client to server");
	cq_wait(cli.cq, srv.cq, &e);
	CHECK(e.op_context == (void *)2 && (e.flags & FI_SEND), "send done");
	CHECK(fi_recv(cli.ep, in, sizeof(in), NULL, 0, (void *)3) == 0, "cli recv");
	CHECK(fi_send(srv.ep, out, 77, NULL, 0, (void *)4) == 0, "srv send");
	cq_wait(cli.cq, srv.cq, &e);
	CHECK(e.op_context == (void *)3 && e.len == 77 && !memcmp(in, out, 77), "server to client");
	cq_wait(srv.cq, cli.cq, &e);
	printf("ok data\n");

	/* Shutdown: the peer's queue says FI_SHUTDOWN; no more sends. */
	CHECK(fi_shutdown(cli.ep, 0) == 0, "shutdown");
	CHECK(event(srv.eq, cli.eq, &ev, cm, sizeof(cm)) > 0 && ev == FI_SHUTDOWN && cm[0].fid == &srv.ep->fid,
	      "server sees SHUTDOWN");
	CHECK(fi_send(cli.ep, out, 1, NULL, 0, NULL) == -FI_ENOTCONN, "no sends after shutdown");
	printf("ok shutdown\n");

	fi_close(&cli.ep->fid);
	fi_close(&srv.ep->fid);
	fi_close(&nobody.ep->fid);
	fi_close(&pep->fid);
	fi_close(&cli.cq->fid);
	fi_close(&srv.cq->fid);
	fi_close(&nobody.cq->fid);
	fi_close(&cli.eq->fid);
	fi_close(&srv.eq->fid);
	fi_close(&nobody.eq->fid);
	fi_close(&peq->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("ok all\n");
	return 0;
}
