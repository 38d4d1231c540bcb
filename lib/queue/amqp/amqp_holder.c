/* amqp_holder.c: the child that holds a receiver's deliveries (see
 * amqp_queue.h for its protocol, idemkit(7) "RabbitMQ" for why).
 *
 * Rules:
 *  - it owns the only connection its deliveries were received on: it is
 *    the one process that can ack (DEL) or return them (basic.reject,
 *    requeue: the broker counts the delivery);
 *  - a delivery is held until DEL, or until its visibility ends (then
 *    returned); VIS moves that end; nothing else returns one;
 *  - a lost connection loses the deliveries (the broker has them back):
 *    it forgets them, and a DEL of one is then IK_LEASE_LOST;
 *  - it leaves the receiver's session (setsid) and every inherited file
 *    (a pipe held open would stall the pipeline), and ends once its
 *    receiver has gone and it holds nothing;
 *  - only a peer of its own user is answered (SO_PEERCRED).
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
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "conn/amqp.h"
#include "core/lines.h"
#include "core/outcome.h"
#include "core/util.h"
#include "queue/amqp/amqp_queue.h"

#define MAX_PEERS 32
#define POLL_MIN_MS 10
#define POLL_MAX_MS 100

struct held {
	uint64_t tag;
	char key[33];
	int64_t until;      /* monotonic ms: returned then */
};

struct holder {
	struct amqp_queue *s;
	struct ik_amqp a;
	struct held *h;
	size_t n, cap;
	/* a GET in progress */
	int get_max;
	int64_t get_vis, get_deadline, get_next, get_pause;
	cJSON *get_out;
	int getting;
};

static void
write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		p += w, n -= (size_t)w;
	}
}

static void
forget_all(struct holder *h)
{
	h->n = 0;   /* the broker has them back with the connection */
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
	*e = h->h[--h->n];
}

/* Returns every delivery whose visibility ended. */
static void
expire(struct holder *h)
{
	int64_t now = ik_mono_ms();
	ik_err err = { 0 };

	for (size_t i = 0; i < h->n;) {
		if (h->h[i].until > now) {
			i++;
			continue;
		}
		if (ik_amqp_requeue(&h->a, h->h[i].tag, &err) != IK_OK) {
			forget_all(h);
			return;
		}
		drop(h, &h->h[i]);
	}
}

static void
reply_get(struct holder *h, int fd, int rc, const char *msg)
{
	char *s;

	if (!h->get_out)
		h->get_out = cJSON_CreateObject();
	cJSON_AddNumberToObject(h->get_out, "rc", rc);
	if (msg)
		cJSON_AddStringToObject(h->get_out, "msg", msg);
	s = cJSON_PrintUnformatted(h->get_out);
	if (s) {
		write_all(fd, s, strlen(s));
		write_all(fd, "\n", 1);
		free(s);
	} else {
		write_all(fd, "{\"rc\":70,\"msg\":\"out of memory\"}\n", 33);
	}
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
			return -1;
		h->h = p, h->cap = cap;
	}
	e = &h->h[h->n++];
	e->tag = m->tag;
	e->until = ik_mono_ms() + h->get_vis;
	randombytes_buf(r, sizeof r);
	ik_hex(r, sizeof r, e->key);
	if (!(o = cJSON_CreateObject()))
		return -1;
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
}

/* Moves a GET on: as many as there are up to max; answers once it has
 * some, or its wait is over, or on an error. */
static void
get_step(struct holder *h, int fd)
{
	cJSON *arr = cJSON_GetObjectItem(h->get_out, "m");
	ik_err err = { 0 };
	int got = 1, rc = IK_OK;

	if (!h->a.c) {
		if ((rc = ik_amqp_ensure(&h->a, &err)) == IK_OK)
			rc = ik_amqp_declare_queues(h->s, &h->a, &err);
		if (rc != IK_OK) {
			forget_all(h);
			reply_get(h, fd, rc, err.msg);
			return;
		}
	}
	while (got && cJSON_GetArraySize(arr) < h->get_max) {
		struct ik_amqp_msg m;
		if ((rc = ik_amqp_get(&h->a, h->s->u.queue, &m, &got, &err)) != IK_OK) {
			ik_amqp_msg_free(&m);
			forget_all(h);   /* the connection is dropped: all went back */
			cJSON_DeleteItemFromObject(h->get_out, "m");
			cJSON_AddArrayToObject(h->get_out, "m");
			reply_get(h, fd, rc, err.msg);
			return;
		}
		if (got && add_msg(h, arr, &m) < 0) {
			ik_amqp_msg_free(&m);
			reply_get(h, fd, IK_SOFTWARE, "out of memory");
			return;
		}
		ik_amqp_msg_free(&m);
	}
	if (cJSON_GetArraySize(arr) > 0 || ik_mono_ms() >= h->get_deadline) {
		reply_get(h, fd, IK_OK, NULL);
		return;
	}
	h->get_next = ik_mono_ms() + h->get_pause;
	h->get_pause = h->get_pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : h->get_pause * 2;
}

static void
on_get(struct holder *h, int fd, const char *line)
{
	int max;
	long long vis, wait;

	if (sscanf(line, "GET %d %lld %lld", &max, &vis, &wait) != 3 || max < 1) {
		write_all(fd, "{\"rc\":70,\"msg\":\"bad request\",\"m\":[]}\n", 37);
		return;
	}
	h->get_max = max;
	h->get_vis = vis;
	h->get_deadline = ik_mono_ms() + wait;
	h->get_pause = POLL_MIN_MS;
	h->get_out = cJSON_CreateObject();
	cJSON_AddArrayToObject(h->get_out, "m");
	h->getting = 1;
	get_step(h, fd);
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
	} else if (del || secs == 0) {
		rc = del ? ik_amqp_ack(&h->a, tag, &err) : ik_amqp_requeue(&h->a, tag, &err);
		if (rc == IK_OK)
			drop(h, e);
		else
			forget_all(h);
	} else {
		e->until = ik_mono_ms() + secs * 1000;
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

static void __attribute__((noreturn))
holder_main(struct amqp_queue *s, int pfd, int lfd)
{
	struct holder h = { .s = s };
	struct ik_lines parent, peers[MAX_PEERS];
	int npeers = 0;

	h.a.u = &s->u;
	ik_lines_init(&parent, pfd);
	for (;;) {
		struct pollfd p[MAX_PEERS + 3];
		int np = 0, afd = ik_amqp_fd(&h.a), timeout = -1;
		int64_t now = ik_mono_ms();

		if (pfd < 0 && h.n == 0 && !h.getting)
			break;
		for (size_t i = 0; i < h.n; i++) {
			int64_t t = h.h[i].until - now;
			if (timeout < 0 || t < timeout)
				timeout = t < 0 ? 0 : (int)t;
		}
		if (h.getting) {
			int64_t t = h.get_next - now;
			if (timeout < 0 || t < timeout)
				timeout = t < 0 ? 0 : (int)t;
		}
		p[np++] = (struct pollfd){ pfd, POLLIN, 0 };
		/* full: the others wait in the backlog (a readable listener
		 * polled and not accepted would spin) */
		p[np++] = (struct pollfd){ npeers < MAX_PEERS ? lfd : -1, POLLIN, 0 };
		p[np++] = (struct pollfd){ afd, POLLIN, 0 };
		for (int i = 0; i < npeers; i++)
			p[np++] = (struct pollfd){ peers[i].fd, POLLIN, 0 };
		if (poll(p, (nfds_t)np, timeout) < 0 && errno != EINTR)
			break;
		if (afd >= 0 && p[2].revents) {
			ik_err err = { 0 };
			if (ik_amqp_input(&h.a, &err) != IK_OK)
				forget_all(&h);
		}
		expire(&h);
		if (h.getting && ik_mono_ms() >= h.get_next)
			get_step(&h, pfd);
		if (pfd >= 0 && p[0].revents) {
			char *line;
			size_t len;
			if (ik_lines_fill(&parent) <= 0 && parent.len == 0) {
				close(pfd);
				pfd = -1;
			}
			while (pfd >= 0 && (line = ik_lines_take(&parent, &len))) {
				if (strcmp(line, "STOP") == 0) {
					/* the receiver was told to stop: answer with what
					 * there is (a STOP after the answer: nothing) */
					if (h.getting) {
						h.get_deadline = 0;
						get_step(&h, pfd);
					}
				} else if (!h.getting) {
					on_get(&h, pfd, line);
				}
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
			if (!p[3 + i].revents)
				continue;
			if (ik_lines_fill(&peers[i]) <= 0) {
				while ((line = ik_lines_take(&peers[i], &len)))
					on_peer(&h, peers[i].fd, line);
				close(peers[i].fd);
				ik_lines_free(&peers[i]);
				peers[i] = peers[--npeers];
				p[3 + i] = p[3 + npeers];
				i--;
				continue;
			}
			while ((line = ik_lines_take(&peers[i], &len)))
				on_peer(&h, peers[i].fd, line);
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
		setsid();
		signal(SIGPIPE, SIG_IGN);
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		dup2(nul, 0), dup2(nul, 1), dup2(nul, 2);
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
