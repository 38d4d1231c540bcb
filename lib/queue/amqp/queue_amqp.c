/* queue_amqp.c: the RabbitMQ queue (AMQP 0-9-1), the port's operations.
 *
 * URL: amqp[s]://USER@HOST[:PORT][/VHOST]#QUEUE[?maxReceiveCount=N&dlq=NAME&
 *      visibility=SECS].  The model is in idemkit(7) "RabbitMQ":
 *  - receive asks this process's holder (amqp_holder.c, forked on the
 *    first receive), which consumes with a prefetch of the receive's max
 *    and keeps the deliveries on its connection;
 *  - delete and change-visibility go to the holder the receipt names,
 *    from whatever process has the receipt;
 *  - send publishes on this process's own connection, with publisher
 *    confirms (conn/amqp.c): OK only once the broker confirmed;
 *  - QUEUE is a durable quorum queue whose x-delivery-limit and dead-letter
 *    routing are the redrive policy (default 10 deliveries to QUEUE-dlq; a
 *    queue named NAME-dlq has none); both are declared on first use.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "conn/amqp.h"
#include "core/outcome.h"
#include "core/util.h"
#include "queue/amqp/amqp_queue.h"
#include "queue/amqp/queue_amqp.h"
#include "queue/queue.h"

#define DELAY_EXPIRES_MS (3600LL * 1000)

/* ---- declarations ---- */

static int
is_dlq_name(const char *name)
{
	size_t n = strlen(name);

	return n > 4 && strcmp(name + n - 4, "-dlq") == 0;
}

static int
ensure_send(struct amqp_queue *s, ik_err *err)
{
	int rc;

	if (s->send.c && s->declared)
		return IK_OK;
	if ((rc = ik_amqp_ensure(&s->send, err)) != IK_OK)
		return rc;
	if (!s->declared && (rc = ik_amqp_declare_queues(s, &s->send, err)) != IK_OK)
		return rc;
	s->declared = 1;
	return IK_OK;
}

/* ---- the holder, from the receiver's side ---- */

static void
holder_gone(struct amqp_queue *s)
{
	if (s->holder_fd >= 0)
		close(s->holder_fd);
	s->holder_fd = -1;
	if (s->holder > 0)
		waitpid(s->holder, NULL, WNOHANG);
	s->holder = 0;
}

/* One line from fd within ms into b (without the newline).  stop (may be
 * NULL): once it is set, "STOP" is sent on fd, once. */
static int
read_line(int fd, int64_t ms, volatile sig_atomic_t *stop, struct ik_buf *b, ik_err *err)
{
	int stopped = 0;

	int64_t deadline = ik_mono_ms() + ms;
	char chunk[4096];

	ik_buf_reset(b);
	for (;;) {
		char *nl = b->len ? memchr(b->p, '\n', b->len) : NULL;
		struct pollfd p = { fd, POLLIN, 0 };
		int64_t left = deadline - ik_mono_ms();
		ssize_t r;

		if (nl) {
			*nl = '\0';
			b->len = (size_t)(nl - b->p);
			return IK_OK;
		}
		if (left <= 0)
			return ik_errf(err, IK_TEMPFAIL, "amqp holder: no answer");
		if (stop && *stop && !stopped) {
			stopped = 1;
			send(fd, "STOP\n", 5, MSG_NOSIGNAL);
		}
		if (poll(&p, 1, stop && !stopped && left > 100 ? 100 : (int)left) < 0 &&
		    errno != EINTR)
			return ik_errf(err, IK_TEMPFAIL, "amqp holder: %s", strerror(errno));
		if (!p.revents)
			continue;
		if ((r = read(fd, chunk, sizeof chunk)) < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return ik_errf(err, IK_LEASE_LOST, "amqp holder: gone");
		if (ik_buf_add(b, chunk, (size_t)r))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
}

static int
send_line(int fd, const char *line, ik_err *err)
{
	size_t n = strlen(line);

	while (n > 0) {
		ssize_t w = send(fd, line, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return ik_errf(err, IK_LEASE_LOST, "amqp holder: gone");
		line += w, n -= (size_t)w;
	}
	return IK_OK;
}

static char *
jstr(cJSON *o, const char *k)
{
	cJSON *v = cJSON_GetObjectItem(o, k);

	return strdup(cJSON_IsString(v) ? v->valuestring : "");
}

static int
to_msg(struct amqp_queue *s, cJSON *o, struct ik_qmsg *m)
{
	cJSON *at = cJSON_GetObjectItem(o, "attrs"), *it;
	char receipt[128];
	size_t n = 0;

	memset(m, 0, sizeof *m);
	snprintf(receipt, sizeof receipt, "amqp1.%s.%.0f.%s", s->holder_id,
	         cJSON_GetNumberValue(cJSON_GetObjectItem(o, "tag")),
	         cJSON_GetStringValue(cJSON_GetObjectItem(o, "key")));
	m->receipt = strdup(receipt);
	m->body = jstr(o, "body");
	m->message_id = jstr(o, "id");
	m->sent_at = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "sentAt"));
	m->receive_count = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "count")) + 1;
	if (cJSON_IsObject(at) && cJSON_GetArraySize(at) > 0) {
		m->attrs = calloc((size_t)cJSON_GetArraySize(at), sizeof *m->attrs);
		if (!m->attrs)
			return -1;
		cJSON_ArrayForEach(it, at) {
			m->attrs[n].name = strdup(it->string);
			m->attrs[n].value = strdup(cJSON_IsString(it) ? it->valuestring : "");
			m->nattrs = ++n;
			if (!m->attrs[n - 1].name || !m->attrs[n - 1].value)
				return -1;
		}
	}
	return m->receipt && m->body && m->message_id ? 0 : -1;
}

static int
aq_receive(struct ik_queue *q, int max, int wait_s, int visibility_s,
           struct ik_qmsg *msgs, size_t *n, ik_err *err)
{
	struct amqp_queue *s = q->impl;
	int64_t vis = (visibility_s < 0 ? s->visibility_s : visibility_s) * 1000LL;
	struct ik_buf b = { 0 };
	char req[128];
	cJSON *o = NULL, *arr, *it;
	int rc;

	*n = 0;
	if (max < 1 || max > IK_QUEUE_BATCH)
		return ik_errf(err, IK_USAGE, "receive: at most %d messages", IK_QUEUE_BATCH);
	if (s->holder_fd < 0 && (rc = ik_amqp_holder_start(s, err)) != IK_OK)
		return rc;
	snprintf(req, sizeof req, "GET %d %lld %lld\n", max, (long long)vis,
	         (long long)wait_s * 1000);
	if ((rc = send_line(s->holder_fd, req, err)) != IK_OK ||
	    (rc = read_line(s->holder_fd, wait_s * 1000LL + 2 * 10000 + 5000, q->stop,
	                     &b, err))
	        != IK_OK) {
		holder_gone(s);   /* the next receive starts another */
		ik_buf_free(&b);
		return rc == IK_LEASE_LOST ? ik_errf(err, IK_TEMPFAIL, "%s: the holder of this "
		    "receiver's deliveries is gone", s->u.label) : rc;
	}
	if (!(o = cJSON_Parse(b.p))) {
		ik_buf_free(&b);
		return ik_errf(err, IK_SOFTWARE, "amqp holder: bad answer");
	}
	ik_buf_free(&b);
	rc = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "rc"));
	if (rc != IK_OK) {
		ik_errf(err, rc, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(o, "msg"))
		        ? cJSON_GetStringValue(cJSON_GetObjectItem(o, "msg")) : "holder error");
		cJSON_Delete(o);
		return rc;
	}
	arr = cJSON_GetObjectItem(o, "m");
	cJSON_ArrayForEach(it, arr) {
		if (to_msg(s, it, &msgs[*n]) < 0) {
			for (size_t i = 0; i <= *n; i++)
				ik_qmsg_free(&msgs[i]);
			*n = 0;
			cJSON_Delete(o);
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		(*n)++;
	}
	cJSON_Delete(o);
	return IK_OK;
}

/* ---- settling, from any process with the receipt ---- */

/* "amqp1.ID.TAG.KEY" into id, "TAG KEY"; -1 when it is not one. */
static int
parse_receipt(const char *r, char id[33], char tagkey[80])
{
	const char *p, *dot;
	unsigned long long tag;
	char key[33];

	if (!r || strncmp(r, "amqp1.", 6) != 0)
		return -1;
	p = r + 6;
	if (!(dot = strchr(p, '.')) || dot - p != 32)
		return -1;
	memcpy(id, p, 32);
	id[32] = '\0';
	if (sscanf(dot + 1, "%llu.%32[0-9a-f]", &tag, key) != 2 || strlen(key) != 32)
		return -1;
	snprintf(tagkey, 80, "%llu %s", tag, key);
	return strspn(id, "0123456789abcdef") == 32 ? 0 : -1;
}

static int
peer_connect(struct amqp_queue *s, const char *id, ik_err *err)
{
	struct sockaddr_un sa;
	socklen_t sl;
	int fd;

	if (s->peer_fd >= 0 && strcmp(s->peer_id, id) == 0)
		return IK_OK;
	if (s->peer_fd >= 0)
		close(s->peer_fd);
	s->peer_fd = -1;
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return ik_errf(err, IK_TEMPFAIL, "amqp: socket: %s", strerror(errno));
	sl = ik_amqp_holder_addr(id, &sa);
	if (connect(fd, (struct sockaddr *)&sa, sl) < 0) {
		close(fd);
		return ik_errf(err, IK_LEASE_LOST, "%s: the receiver that held this delivery "
		               "is gone (the broker delivers it again)", s->u.label);
	}
	s->peer_fd = fd;
	memcpy(s->peer_id, id, 33);
	return IK_OK;
}

/* One request to the holder the receipt names: "VERB TAG KEY[ ARG]". */
static int
settle(struct amqp_queue *s, const char *verb, const char *receipt, const char *arg,
       ik_err *err)
{
	char id[33], tagkey[80], line[160];
	struct ik_buf b = { 0 };
	int rc, tries;

	if (parse_receipt(receipt, id, tagkey) < 0)
		return ik_errf(err, IK_DATAERR, "%s#%s: not a receipt handle of this queue",
		               s->u.label, s->u.queue);
	snprintf(line, sizeof line, "%s %s%s%s\n", verb, tagkey, arg ? " " : "", arg ? arg : "");
	/* a kept connection may have been closed by a holder that ended: once
	 * more on a fresh one */
	for (tries = 0; tries < 2; tries++) {
		if ((rc = peer_connect(s, id, err)) != IK_OK)
			return rc;
		if ((rc = send_line(s->peer_fd, line, err)) == IK_OK &&
		    (rc = read_line(s->peer_fd, 2 * 10000 + 5000, NULL, &b, err)) == IK_OK)
			break;
		close(s->peer_fd);
		s->peer_fd = -1;
		if (rc != IK_LEASE_LOST)
			break;
	}
	if (rc == IK_OK) {
		char *sp = NULL;
		long code = strtol(b.p, &sp, 10);
		rc = (int)code;
		if (rc != IK_OK)
			ik_errf(err, rc, "%s", sp && *sp == ' ' ? sp + 1 : "holder error");
	}
	ik_buf_free(&b);
	return rc;
}

static int
aq_del(struct ik_queue *q, const char *receipt, ik_err *err)
{
	return settle(q->impl, "DEL", receipt, NULL, err);
}

static int
aq_del_batch(struct ik_queue *q, const char *const *receipts, size_t n,
             struct ik_qresult *res, ik_err *err)
{
	for (size_t i = 0; i < n; i++) {
		ik_err e = { 0 };
		res[i].code = settle(q->impl, "DEL", receipts[i], NULL, &e);
		snprintf(res[i].msg, sizeof res[i].msg, "%s", e.msg);
	}
	return IK_OK;
}

static int
aq_chvis(struct ik_queue *q, const char *receipt, int visibility_s, ik_err *err)
{
	char arg[24];

	snprintf(arg, sizeof arg, "%d", visibility_s);
	return settle(q->impl, "VIS", receipt, arg, err);
}

/* ---- sending ---- */

/* The queue a message with delay_s goes to first: QUEUE, or
 * QUEUE.delayq.N, whose TTL dead-letters it into QUEUE (declared here).
 * A quorum queue dead-lettering at least once: a classic queue's
 * dead-lettering is at most once, and a broker that dies in that hop loses
 * the message (idemkit(7) "RabbitMQ").  (".delayq.", not the classic
 * queues' ".delay." of before: a queue declared again with other
 * arguments is refused; an unused old one expires.) */
static int
target(struct amqp_queue *s, int delay_s, char *out, size_t cap, ik_err *err)
{
	struct ik_amqp_qdecl d = { .quorum = 1, .delivery_limit = -1, .dlx_key = s->u.queue,
	                           .message_ttl_ms = delay_s * 1000LL,
	                           .expires_ms = DELAY_EXPIRES_MS, .dl_at_least_once = 1 };

	if (delay_s <= 0) {
		snprintf(out, cap, "%s", s->u.queue);
		return IK_OK;
	}
	snprintf(out, cap, "%s.delayq.%d", s->u.queue, delay_s);
	return ik_amqp_declare(&s->send, out, 0, &d, NULL, err);
}

static int
aq_send_batch(struct ik_queue *q, struct ik_qsend *m, size_t n, struct ik_qresult *res,
              ik_err *err)
{
	struct amqp_queue *s = q->impl;
	struct ik_amqp_msg am[IK_QUEUE_BATCH];
	char ids[IK_QUEUE_BATCH][37], *names[IK_QUEUE_BATCH][16], *values[IK_QUEUE_BATCH][16];
	char dest[128];
	int codes[IK_QUEUE_BATCH], rc;
	size_t k = 0, idx[IK_QUEUE_BATCH];
	int64_t now = ik_now_ms();

	if (n > IK_QUEUE_BATCH)
		return ik_errf(err, IK_USAGE, "send: at most %d messages", IK_QUEUE_BATCH);
	if ((rc = ensure_send(s, err)) != IK_OK)
		return rc;
	/* one delay per call (sqs-send gives one to all): the first's */
	if ((rc = target(s, n ? m[0].delay_s : 0, dest, sizeof dest, err)) != IK_OK)
		return rc;
	for (size_t i = 0; i < n; i++) {
		ik_err e = { 0 };
		res[i].code = ik_qsend_check(&m[i], &e);
		if (res[i].code == IK_OK && m[i].delay_s != m[0].delay_s)
			res[i].code = ik_errf(&e, IK_USAGE, "one delay per batch");
		if (res[i].code == IK_OK && m[i].nattrs > 16)
			res[i].code = ik_errf(&e, IK_DATAERR, "at most 16 attributes");
		snprintf(res[i].msg, sizeof res[i].msg, "%s", e.msg);
		if (res[i].code != IK_OK)
			continue;
		ik_uuid4(ids[k]);
		for (size_t j = 0; j < m[i].nattrs; j++)
			names[k][j] = m[i].attrs[j].name, values[k][j] = m[i].attrs[j].value;
		am[k] = (struct ik_amqp_msg){ .body = (char *)m[i].body, .len = strlen(m[i].body),
		    .message_id = ids[k], .sent_at = now, .names = names[k], .values = values[k],
		    .nattrs = m[i].nattrs };
		idx[k++] = i;
	}
	rc = ik_amqp_publish(&s->send, dest, am, k, codes, err);
	for (size_t j = 0; j < k; j++) {
		size_t i = idx[j];
		res[i].code = codes[j];
		if (codes[j] == IK_OK) {
			if (!(m[i].message_id = strdup(ids[j])))
				res[i].code = IK_SOFTWARE;
		} else {
			snprintf(res[i].msg, sizeof res[i].msg, "%s", rc != IK_OK ? err->msg :
			         codes[j] == IK_CONFIG ? "the broker returned it: no such queue" :
			         "the broker refused it (nack)");
		}
	}
	if (rc != IK_OK)
		for (size_t i = 0; i < n; i++)
			m[i].message_id = (free(m[i].message_id), NULL);
	return rc;
}

static int
aq_send(struct ik_queue *q, struct ik_qsend *m, ik_err *err)
{
	struct ik_qresult r = { 0 };
	int rc = aq_send_batch(q, m, 1, &r, err);

	if (rc != IK_OK)
		return rc;
	if (r.code != IK_OK)
		return ik_errf(err, r.code, "%s", r.msg);
	return IK_OK;
}

static int
aq_stats(struct ik_queue *q, struct ik_qstats *st, ik_err *err)
{
	struct amqp_queue *s = q->impl;
	int rc;

	memset(st, 0, sizeof *st);
	if ((rc = ensure_send(s, err)) != IK_OK)
		return rc;
	return ik_amqp_declare(&s->send, s->u.queue, 1, NULL, &st->visible, err);
}

static void
aq_close(struct ik_queue *q)
{
	struct amqp_queue *s = q->impl;

	if (!s)
		return;
	ik_amqp_close(&s->send, 1);
	if (s->holder_fd >= 0)
		close(s->holder_fd);   /* the holder ends once it holds nothing */
	if (s->peer_fd >= 0)
		close(s->peer_fd);
	ik_amqp_url_free(&s->u);
	free(s->dlq);
	free(s);
	q->impl = NULL;
}

static const struct ik_queue_ops amqp_ops = {
	.name = "amqp",
	.receive = aq_receive,
	.del = aq_del,
	.del_batch = aq_del_batch,
	.change_visibility = aq_chvis,
	.send = aq_send,
	.send_batch = aq_send_batch,
	.stats = aq_stats,
	.close = aq_close,
};

static int
parse_params(struct amqp_queue *s, ik_err *err)
{
	char *dup = strdup(s->u.params), *save = NULL, *kv;
	int rc = IK_OK;

	if (!dup)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	s->max_receive = is_dlq_name(s->u.queue) ? 0 : IK_QUEUE_DEFAULT_MAX_RECEIVE;
	s->visibility_s = IK_AMQP_DEFAULT_VISIBILITY;
	for (kv = strtok_r(dup, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
		char *v = strchr(kv, '=');
		long long n;

		if (v)
			*v++ = '\0';
		if (v && strcmp(kv, "maxReceiveCount") == 0 && ik_parse_int(v, 0, 1000, &n) == 0) {
			s->max_receive = n;
		} else if (v && strcmp(kv, "dlq") == 0 && *v) {
			free(s->dlq);
			if (!(s->dlq = strdup(v)))
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		} else if (v && strcmp(kv, "visibility") == 0 &&
		           ik_parse_int(v, 0, IK_QUEUE_MAX_VISIBILITY, &n) == 0) {
			s->visibility_s = n;
		} else {
			rc = ik_errf(err, IK_CONFIG, "queue parameter %s: expected "
			             "maxReceiveCount=0..1000, dlq=NAME or visibility=0..43200", kv);
		}
		if (rc != IK_OK)
			break;
	}
	free(dup);
	if (rc == IK_OK && s->max_receive > 0 && !s->dlq) {
		size_t n = strlen(s->u.queue);
		if (!(s->dlq = malloc(n + 5)))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		memcpy(s->dlq, s->u.queue, n);
		memcpy(s->dlq + n, "-dlq", 5);
	}
	if (rc == IK_OK && s->max_receive == 0)
		s->dlq = (free(s->dlq), NULL);
	return rc;
}

/* IDEMKIT_AMQP_HEARTBEAT: the holder's heartbeat, whole seconds, 0: off
 * (a half-open connection is then seen only through TCP). */
static int
parse_heartbeat(struct amqp_queue *s, ik_err *err)
{
	const char *t = getenv("IDEMKIT_AMQP_HEARTBEAT");
	int64_t ms = IK_AMQP_DEFAULT_HEARTBEAT * 1000LL;

	if (t && *t && (ik_parse_duration(t, &ms) != 0 || ms < 0 || ms > 3600 * 1000LL ||
	                ms % 1000 != 0))
		return ik_errf(err, IK_CONFIG, "IDEMKIT_AMQP_HEARTBEAT=%s: expected whole seconds "
		               "up to an hour (30s, 0 for none)", t);
	s->heartbeat_s = (int)(ms / 1000);
	return IK_OK;
}

int
ik_queue_amqp_open(const char *url, struct ik_queue *q, ik_err *err)
{
	struct amqp_queue *s;
	int rc;

	if (sodium_init() < 0)
		return ik_errf(err, IK_SOFTWARE, "libsodium failed to initialise");
	if (!(s = calloc(1, sizeof *s)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	s->holder_fd = s->peer_fd = -1;
	if ((rc = ik_amqp_url_parse(url, &s->u, err)) != IK_OK) {
		free(s);
		return rc;
	}
	s->send.u = &s->u;
	/* misconfiguration said at once, before any receive is handed out */
	if ((rc = parse_params(s, err)) != IK_OK || (rc = parse_heartbeat(s, err)) != IK_OK ||
	    (rc = ik_amqp_has_password(err)) != IK_OK) {
		ik_amqp_url_free(&s->u);
		free(s->dlq);
		free(s);
		return rc;
	}
	q->max_receive = s->max_receive;
	q->ops = &amqp_ops;
	q->impl = s;
	return IK_OK;
}
