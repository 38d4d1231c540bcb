/* amqp_holder.c: the child that holds a receiver's deliveries (see
 * amqp_queue.h for its protocol, idemkit(7) "RabbitMQ" for why).
 *
 * Rules:
 *  - it owns the only connection its deliveries were received on: it is
 *    the one process that can ack (DEL) or return them (basic.reject,
 *    requeue: the broker counts the delivery);
 *  - a GET takes what it asks for and no more: a consumer of its own
 *    whose prefetch is the GET's max (one basic.get at a time for a GET
 *    that may not wait: only basic.get-empty says "empty now"), cancelled
 *    before the answer; what comes after that (a cancel is not waited
 *    for) is kept for the next GET, and returned when the receiver is
 *    gone or no GET took it within SPARE_MS: on a quorum queue every
 *    return counts toward the delivery limit (idemkit(7) "RabbitMQ");
 *  - a delivery handed out is held until DEL, or until its visibility
 *    ends (then returned); VIS moves that end;
 *  - a lost connection loses the deliveries (the broker has them back):
 *    it forgets them, and a DEL of one is then IK_LEASE_LOST;
 *  - it leaves the receiver's session (setsid) and every inherited file
 *    (a pipe held open would stall the pipeline), and ends once its
 *    receiver has gone and it holds nothing;
 *  - only a peer of its own user is answered (SO_PEERCRED);
 *  - with IDEMKIT_LOG=debug it writes one line per delivery it takes,
 *    ack, return (and why), visibility moved, settle refused, consumer
 *    started or cancelled, connection made or lost (and what that
 *    forgot), each with the message id, the delivery tag and the
 *    connection it belongs to: what a run's history needs to follow a
 *    message id.  Its receiver's stderr is kept for them only when that
 *    is a file or a terminal (nothing waits there for its end).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "conn/amqp.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "queue/amqp/amqp_queue.h"

#define MAX_PEERS 32
#define SPARE_MS 2000      /* a delivery no GET took is returned then */
#define QUIET_MS 2         /* a GET with some answers once none came for this */

struct held {
	uint64_t tag;
	char key[33];
	int64_t until;      /* monotonic ms: returned then */
	char *id;           /* the message id, for the logs */
};

/* A delivery no GET has taken yet. */
struct spare {
	struct ik_amqp_msg m;
	int64_t at;         /* monotonic ms it came */
};

struct holder {
	struct amqp_queue *s;
	struct ik_amqp a;
	struct held *h;
	size_t n, cap;
	struct spare *sp;
	size_t nsp, capsp;
	/* a GET in progress: its consumer (ctag), or one basic.get out */
	int get_max, got;
	int64_t get_vis, get_deadline, get_last;
	cJSON *get_out;
	int getting, get_one, get_empty;
	char ctag[32];
	unsigned long nconsumers;
	int fd;             /* the receiver's socket, -1: gone */
	pid_t pid;          /* ours, for the logs */
	char tagid[9];      /* our id's first 8 hex digits, for the logs: pids
	                     * are reused (the rest of the id, and the key, are
	                     * what a receipt needs) */
};

/* A debug line of the holder: its pid and the connection its tags belong
 * to first, then the fields given (ik_log's, ending with NULL). */
#define HLOG(h, msg, ...) \
	ik_log(IK_LOG_DEBUG, msg, "step", "amqp-holder", \
	       IK_LOG_NUM("holder", (h)->pid), "holderId", (h)->tagid, \
	       IK_LOG_NUM("conn", (h)->a.gen), __VA_ARGS__)

static int
write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w, n -= (size_t)w;
	}
	return 0;
}

/* why: the error that lost the connection. */
static void
forget_all(struct holder *h, const char *why)
{
	/* the broker has them back with the connection */
	HLOG(h, "connection lost, deliveries forgotten", IK_LOG_NUM("held", h->n),
	     IK_LOG_NUM("spares", h->nsp), "error", why, NULL);
	for (size_t i = 0; i < h->n; i++)
		free(h->h[i].id);
	h->n = 0;
	for (size_t i = 0; i < h->nsp; i++)
		ik_amqp_msg_free(&h->sp[i].m);
	h->nsp = 0;
	h->ctag[0] = '\0';
	h->get_one = 0;
}

/* basic.reject (requeue) of one delivery, and why; a failure loses the
 * connection (forgotten).  IK_OK or the error. */
static int
give_back(struct holder *h, uint64_t tag, const char *id, const char *why)
{
	ik_err err = { 0 };
	int rc = ik_amqp_requeue(&h->a, tag, &err);

	HLOG(h, "returned", "messageId", id, IK_LOG_NUM("tag", tag), "reason", why,
	     "error", rc == IK_OK ? NULL : err.msg, NULL);
	if (rc != IK_OK)
		forget_all(h, err.msg);
	return rc;
}

static struct held *
find(struct holder *h, uint64_t tag, const char *key)
{
	for (size_t i = 0; i < h->n; i++)
		if (h->h[i].tag == tag && strcmp(h->h[i].key, key) == 0)
			return &h->h[i];
	return NULL;
}

static void
drop(struct holder *h, struct held *e)
{
	free(e->id);
	*e = h->h[--h->n];
}

/* Returns every delivery whose visibility ended. */
static void
expire(struct holder *h)
{
	int64_t now = ik_mono_ms();

	for (size_t i = 0; i < h->n;) {
		if (h->h[i].until > now) {
			i++;
			continue;
		}
		if (give_back(h, h->h[i].tag, h->h[i].id, "visibility ended") != IK_OK)
			return;
		drop(h, &h->h[i]);
	}
	/* spares nobody asked for, or with nobody left to ask: back now */
	for (size_t i = 0; i < h->nsp;) {
		if (h->fd >= 0 && now - h->sp[i].at < SPARE_MS) {
			i++;
			continue;
		}
		if (give_back(h, h->sp[i].m.tag, h->sp[i].m.message_id, h->fd >= 0 ?
		              "spare: no receive took it" : "spare: the receiver is gone") != IK_OK)
			return;
		ik_amqp_msg_free(&h->sp[i].m);
		memmove(&h->sp[i], &h->sp[i + 1], (h->nsp - i - 1) * sizeof *h->sp);
		h->nsp--;
	}
}

/* The deliveries of an answer nobody read (its receiver is gone): back to
 * the broker now, not when their visibility ends. */
static void
unhand(struct holder *h, cJSON *arr)
{
	cJSON *it;

	cJSON_ArrayForEach(it, arr) {
		struct held *e = find(h, (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(it,
		    "tag")), cJSON_GetStringValue(cJSON_GetObjectItem(it, "key")));
		if (!e)
			continue;
		if (give_back(h, e->tag, e->id, "the receiver is gone (its answer unread)") !=
		    IK_OK)
			return;
		drop(h, e);
	}
}

static void
reply_get(struct holder *h, int fd, int rc, const char *msg)
{
	char *s;
	ik_err err = { 0 };
	int w = -1;

	/* no more for this GET: what still comes is a spare */
	if (h->ctag[0]) {
		HLOG(h, "consumer cancelled", "consumer", h->ctag, IK_LOG_NUM("taken", h->got),
		     NULL);
		if (ik_amqp_cancel(&h->a, h->ctag, &err) != IK_OK)
			forget_all(h, err.msg);
	}
	h->ctag[0] = '\0';
	if (!h->get_out)
		h->get_out = cJSON_CreateObject();
	cJSON_AddNumberToObject(h->get_out, "rc", rc);
	if (msg)
		cJSON_AddStringToObject(h->get_out, "msg", msg);
	s = cJSON_PrintUnformatted(h->get_out);
	if (s && fd >= 0) {
		w = write_all(fd, s, strlen(s));
		if (w == 0)
			w = write_all(fd, "\n", 1);
	} else if (fd >= 0) {
		write_all(fd, "{\"rc\":70,\"msg\":\"out of memory\"}\n", 33);
	}
	free(s);
	if (w < 0)
		unhand(h, cJSON_GetObjectItem(h->get_out, "m"));
	cJSON_Delete(h->get_out);
	h->get_out = NULL;
	h->getting = 0;
}

static int
add_msg(struct holder *h, cJSON *arr, struct ik_amqp_msg *m)
{
	unsigned char r[16];
	struct held *e;
	cJSON *o, *at;

	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct held *p = realloc(h->h, cap * sizeof *p);
		if (!p)
			goto oom;
		h->h = p, h->cap = cap;
	}
	if (!(o = cJSON_CreateObject()))
		goto oom;
	e = &h->h[h->n];
	if (!(e->id = strdup(m->message_id))) {
		cJSON_Delete(o);
		goto oom;
	}
	h->n++;
	e->tag = m->tag;
	e->until = ik_mono_ms() + h->get_vis;
	randombytes_buf(r, sizeof r);
	ik_hex(r, sizeof r, e->key);
	cJSON_AddItemToArray(arr, o);
	cJSON_AddNumberToObject(o, "tag", (double)m->tag);
	cJSON_AddStringToObject(o, "key", e->key);
	cJSON_AddStringToObject(o, "id", m->message_id);
	cJSON_AddStringToObject(o, "body", m->body);
	cJSON_AddNumberToObject(o, "sentAt", (double)m->sent_at);
	cJSON_AddNumberToObject(o, "count", (double)m->delivery_count);
	if (m->nattrs && (at = cJSON_AddObjectToObject(o, "attrs")))
		for (size_t i = 0; i < m->nattrs; i++)
			cJSON_AddStringToObject(at, m->names[i], m->values[i]);
	return 0;
oom:   /* not held, never handed out: back to the broker now */
	give_back(h, m->tag, m->message_id, "out of memory");
	return -1;
}

/* The GET's answer so far dropped (the connection, and with it every
 * delivery, is gone), then the error. */
static void
get_failed(struct holder *h, int rc, const char *msg)
{
	forget_all(h, msg);
	cJSON_DeleteItemFromObject(h->get_out, "m");
	cJSON_AddArrayToObject(h->get_out, "m");
	reply_get(h, h->fd, rc, msg);
}

/* One delivery into the GET's answer (held from now); -1: out of memory
 * (answered). */
static int
take(struct holder *h, struct ik_amqp_msg *m)
{
	if (add_msg(h, cJSON_GetObjectItem(h->get_out, "m"), m) < 0) {
		reply_get(h, h->fd, IK_SOFTWARE, "out of memory");
		return -1;
	}
	h->got++;
	h->get_last = ik_mono_ms();
	return 0;
}

/* ik_amqp_input's deliveries: the GET's own while it is open, else a
 * spare for the next GET. */
static void
on_delivery(void *arg, const char *ctag, struct ik_amqp_msg *m)
{
	struct holder *h = arg;
	int mine = h->getting && h->got < h->get_max &&
	           (ctag ? h->ctag[0] && strcmp(ctag, h->ctag) == 0 : h->get_one);

	if (!ctag)
		h->get_one = 0;
	if (!m) {   /* basic.get-empty */
		HLOG(h, "basic.get-empty", NULL);
		h->get_empty = 1;
		return;
	}
	HLOG(h, ctag ? "basic.deliver" : "basic.get-ok", "messageId", m->message_id,
	     IK_LOG_NUM("tag", m->tag), IK_LOG_NUM("redelivered", m->redelivered),
	     IK_LOG_NUM("deliveryCount", m->delivery_count), "consumer", ctag,
	     "to", mine ? "receive" : "spare", NULL);
	if (mine) {
		take(h, m);
		ik_amqp_msg_free(m);
		return;
	}
	if (h->nsp == h->capsp) {
		size_t cap = h->capsp ? h->capsp * 2 : 16;
		struct spare *p = realloc(h->sp, cap * sizeof *p);
		if (!p) {   /* cannot keep it: back to the broker */
			give_back(h, m->tag, m->message_id, "out of memory for a spare");
			ik_amqp_msg_free(m);
			return;
		}
		h->sp = p, h->capsp = cap;
	}
	h->sp[h->nsp].m = *m;
	h->sp[h->nsp++].at = ik_mono_ms();
}

/* Moves the GET in progress on, and answers it once it has max, or some
 * and none came for QUIET_MS, or a basic.get found the queue empty, or
 * its wait is over. */
static void
get_step(struct holder *h)
{
	int64_t now = ik_mono_ms();
	ik_err err = { 0 };

	if (!h->getting)
		return;
	if (h->got >= h->get_max || h->get_empty ||
	    (h->got > 0 && h->ctag[0] && now - h->get_last >= QUIET_MS)) {
		reply_get(h, h->fd, IK_OK, NULL);
		return;
	}
	if (h->ctag[0] && now >= h->get_deadline) {
		reply_get(h, h->fd, IK_OK, NULL);
		return;
	}
	if (!h->ctag[0] && !h->get_one) {   /* a look that does not wait: one more */
		if (ik_amqp_get_start(&h->a, h->s->u.queue, &err) != IK_OK) {
			get_failed(h, err.code, err.msg);
			return;
		}
		h->get_one = 1;
		h->get_deadline = now + h->a.timeout_ms;
	} else if (!h->ctag[0] && now >= h->get_deadline) {
		ik_amqp_close(&h->a, 0);
		get_failed(h, IK_TEMPFAIL, "basic.get: no answer");
	}
}

static void
on_get(struct holder *h, const char *line)
{
	int max;
	long long vis, wait;
	ik_err err = { 0 };
	int rc = IK_OK;

	if (sscanf(line, "GET %d %lld %lld", &max, &vis, &wait) != 3 || max < 1) {
		write_all(h->fd, "{\"rc\":70,\"msg\":\"bad request\",\"m\":[]}\n", 37);
		return;
	}
	h->get_max = max;
	h->get_vis = vis;
	h->got = 0;
	h->get_empty = 0;
	h->get_out = cJSON_CreateObject();
	cJSON_AddArrayToObject(h->get_out, "m");
	h->getting = 1;
	/* what came after the last GET was answered, first: then no more */
	while (h->nsp > 0 && h->got < h->get_max) {
		struct ik_amqp_msg m = h->sp[0].m;
		memmove(&h->sp[0], &h->sp[1], (h->nsp - 1) * sizeof *h->sp);
		h->nsp--;
		HLOG(h, "spare taken", "messageId", m.message_id, IK_LOG_NUM("tag", m.tag), NULL);
		rc = take(h, &m);
		ik_amqp_msg_free(&m);
		if (rc < 0)
			return;
	}
	if (h->got > 0) {
		reply_get(h, h->fd, IK_OK, NULL);
		return;
	}
	if (!h->a.c) {
		/* a new connection numbers its deliveries from 1 again: a tag
		 * still held from the old one would name another message (an
		 * ack of it would delete that one, unprocessed) */
		if (h->n || h->nsp)
			forget_all(h, "not connected");
		if ((rc = ik_amqp_ensure(&h->a, &err)) == IK_OK)
			rc = ik_amqp_declare_queues(h->s, &h->a, &err);
		if (rc != IK_OK) {
			get_failed(h, rc, err.msg);
			return;
		}
		HLOG(h, "connected", NULL);
	}
	if (wait <= 0) {   /* basic.get, one at a time: its "empty" is exact */
		get_step(h);
		return;
	}
	snprintf(h->ctag, sizeof h->ctag, "ik.%lu", ++h->nconsumers);
	if (ik_amqp_consume(&h->a, h->s->u.queue, h->ctag, max, &err) != IK_OK) {
		get_failed(h, err.code, err.msg);
		return;
	}
	/* nowait: no consume-ok comes */
	HLOG(h, "basic.consume", "consumer", h->ctag, IK_LOG_NUM("prefetch", max), NULL);
	h->get_deadline = ik_mono_ms() + wait;
}

/* One settle request from a peer: "DEL TAG KEY" or "VIS TAG KEY SECS". */
static void
on_peer(struct holder *h, int fd, const char *line)
{
	unsigned long long tag;
	char key[33], out[1100];
	long long secs = 0;
	ik_err err = { 0 };
	struct held *e;
	int rc = IK_OK, del = strncmp(line, "DEL ", 4) == 0;

	if ((del && sscanf(line, "DEL %llu %32s", &tag, key) != 2) ||
	    (!del && sscanf(line, "VIS %llu %32s %lld", &tag, key, &secs) != 3)) {
		rc = ik_errf(&err, IK_DATAERR, "bad request to the holder");
	} else if (!(e = find(h, tag, key))) {
		rc = ik_errf(&err, IK_LEASE_LOST, "the delivery is no longer held (its "
		             "visibility ended or the connection was lost): the broker "
		             "delivers it again");
		HLOG(h, "settle refused: not held", "request", del ? "DEL" : "VIS",
		     IK_LOG_NUM("tag", tag), NULL);
	} else if (del) {
		rc = ik_amqp_ack(&h->a, tag, &err);
		HLOG(h, "acked", "messageId", e->id, IK_LOG_NUM("tag", tag),
		     "error", rc == IK_OK ? NULL : err.msg, NULL);
		if (rc == IK_OK)
			drop(h, e);
		else
			forget_all(h, err.msg);
	} else if (secs == 0) {
		if ((rc = give_back(h, tag, e->id, "change-visibility 0")) == IK_OK)
			drop(h, e);
	} else {
		e->until = ik_mono_ms() + secs * 1000;
		HLOG(h, "visibility moved", "messageId", e->id, IK_LOG_NUM("tag", tag),
		     IK_LOG_NUM("seconds", secs), NULL);
	}
	snprintf(out, sizeof out, "%d %s\n", rc, rc == IK_OK ? "" : err.msg);
	write_all(fd, out, strlen(out));
}

static int
same_user(int fd)
{
	struct ucred c;
	socklen_t n = sizeof c;

	return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &n) == 0 && c.uid == getuid();
}

/* How long the loop may sleep: until the next visibility end, spare to
 * return, GET to answer or heartbeat to service; -1: no bound. */
static int
next_wake(const struct holder *h)
{
	int64_t now = ik_mono_ms(), t = -1;

#define SOONER(at) do { int64_t d_ = (at) - now; if (t < 0 || d_ < t) t = d_ < 0 ? 0 : d_; } while (0)
	for (size_t i = 0; i < h->n; i++)
		SOONER(h->h[i].until);
	for (size_t i = 0; i < h->nsp; i++)
		SOONER(h->fd >= 0 ? h->sp[i].at + SPARE_MS : now);
	if (h->getting) {
		SOONER(h->get_deadline);
		if (h->got > 0)
			SOONER(h->get_last + QUIET_MS);
	}
	if (h->a.c && h->a.heartbeat_s > 0)
		SOONER(now + h->a.heartbeat_s * 1000LL / 2);
#undef SOONER
	return t > 24 * 3600 * 1000LL ? 24 * 3600 * 1000 : (int)t;
}

static void __attribute__((noreturn))
holder_main(struct amqp_queue *s, int pfd, int lfd)
{
	struct holder h = { .s = s, .fd = pfd, .pid = getpid() };
	struct ik_lines parent, peers[MAX_PEERS];
	int npeers = 0;

	h.a.u = &s->u;
	h.a.heartbeat_s = s->heartbeat_s;
	memcpy(h.tagid, s->holder_id, 8);
	ik_lines_init(&parent, pfd);
	for (;;) {
		struct pollfd p[MAX_PEERS + 3];
		int np = 0, afd = ik_amqp_fd(&h.a);

		if (h.fd < 0 && h.n == 0 && h.nsp == 0 && !h.getting)
			break;
		p[np++] = (struct pollfd){ h.fd, POLLIN, 0 };
		/* full: the others wait in the backlog (a readable listener
		 * polled and not accepted would spin) */
		p[np++] = (struct pollfd){ npeers < MAX_PEERS ? lfd : -1, POLLIN, 0 };
		p[np++] = (struct pollfd){ afd, POLLIN, 0 };
		for (int i = 0; i < npeers; i++)
			p[np++] = (struct pollfd){ peers[i].fd, POLLIN, 0 };
		if (poll(p, (nfds_t)np, next_wake(&h)) < 0 && errno != EINTR)
			break;
		/* what the broker sent, and the heartbeats, on every wake: a
		 * frame already read into librabbitmq's buffer polls nothing */
		if (h.a.c) {
			ik_err err = { 0 };
			if (ik_amqp_input(&h.a, on_delivery, &h, &err) != IK_OK) {
				if (h.getting)
					get_failed(&h, err.code, err.msg);
				else
					forget_all(&h, err.msg);
			}
		}
		expire(&h);
		get_step(&h);
		if (h.fd >= 0 && p[0].revents) {
			char *line;
			size_t len;
			int r = ik_lines_fill(&parent);
			while ((line = ik_lines_take(&parent, &len))) {
				if (strcmp(line, "STOP") == 0) {
					/* the receiver was told to stop: answer with what
					 * there is (a STOP after the answer: nothing) */
					if (h.getting && h.ctag[0]) {
						h.get_deadline = 0;
						get_step(&h);
					}
				} else if (!h.getting) {
					on_get(&h, line);
				}
			}
			if (r < 0 || parent.eof) {
				/* the receiver is gone: its spares, and what a GET
				 * in progress took, go back now */
				close(h.fd);
				h.fd = -1;
				if (h.getting)
					reply_get(&h, h.fd, IK_OK, NULL);
				expire(&h);
			}
		}
		if (p[1].revents && npeers < MAX_PEERS) {
			int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0 && same_user(c))
				ik_lines_init(&peers[npeers++], c);
			else if (c >= 0)
				close(c);
		}
		for (int i = 0; i < npeers; i++) {
			char *line;
			size_t len;
			int r;
			if (!p[3 + i].revents)
				continue;
			/* a peer keeps its connection for its next settles (fill
			 * says 0 for data too: the end is eof) */
			r = ik_lines_fill(&peers[i]);
			while ((line = ik_lines_take(&peers[i], &len)))
				on_peer(&h, peers[i].fd, line);
			if (r < 0 || peers[i].eof) {
				close(peers[i].fd);
				ik_lines_free(&peers[i]);
				peers[i] = peers[--npeers];
				p[3 + i] = p[3 + npeers];
				i--;
			}
		}
	}
	ik_amqp_close(&h.a, 1);
	_exit(0);
}

int
ik_amqp_holder_start(struct amqp_queue *s, ik_err *err)
{
	unsigned char r[16];
	struct sockaddr_un sa;
	socklen_t sl;
	int sp[2], lfd;
	pid_t pid;

	randombytes_buf(r, sizeof r);
	ik_hex(r, sizeof r, s->holder_id);
	if ((lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return ik_errf(err, IK_TEMPFAIL, "amqp holder: socket: %s", strerror(errno));
	sl = ik_amqp_holder_addr(s->holder_id, &sa);
	if (bind(lfd, (struct sockaddr *)&sa, sl) < 0 || listen(lfd, 64) < 0) {
		close(lfd);
		return ik_errf(err, IK_TEMPFAIL, "amqp holder: bind: %s", strerror(errno));
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
		close(lfd);
		return ik_errf(err, IK_TEMPFAIL, "amqp holder: socketpair: %s", strerror(errno));
	}
	fflush(NULL);
	if ((pid = fork()) < 0) {
		close(lfd), close(sp[0]), close(sp[1]);
		return ik_errf(err, IK_TEMPFAIL, "amqp holder: fork: %s", strerror(errno));
	}
	if (pid == 0) {
		int nul = open("/dev/null", O_RDWR);
		struct stat st;
		setsid();
		signal(SIGPIPE, SIG_IGN);
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		dup2(nul, 0), dup2(nul, 1);
		/* stderr kept for the debug lines where nothing waits for its
		 * end: a file or a terminal, never a pipe or a socket */
		if (!ik_log_enabled(IK_LOG_DEBUG) || fstat(2, &st) < 0 ||
		    !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)))
			dup2(nul, 2);
		/* nothing inherited stays open: the receiver's pipes above all */
		for (int fd = 3; fd < 1024; fd++)
			if (fd != sp[1] && fd != lfd)
				close(fd);
		s->send.c = NULL;   /* the receiver's, not ours: never touched */
		holder_main(s, sp[1], lfd);
	}
	close(lfd);
	close(sp[1]);
	s->holder = pid;
	s->holder_fd = sp[0];
	return IK_OK;
}
