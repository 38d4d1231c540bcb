/* amqp.c: one AMQP 0-9-1 connection and channel through librabbitmq; see
 * amqp.h for the rules. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "conn/amqp.h"
#include "core/outcome.h"
#include "core/util.h"
#include "dl/amqp_dl.h"

#define CHANNEL 1
#define DEFAULT_TIMEOUT_MS 10000
#define FRAME_MAX 131072
#define SECRET_MAX 4096

static const char expected[] =
	"expected amqp://USER@HOST[:PORT][/VHOST]#QUEUE (or amqps://), "
	"the password in IDEMKIT_AMQP_PASSWORD or IDEMKIT_AMQP_PASSWORD_FILE";

static amqp_bytes_t
bytes(const char *s)
{
	return (amqp_bytes_t){ strlen(s), (void *)s };
}

static char *
dupbytes(amqp_bytes_t b)
{
	char *s = malloc(b.len + 1);

	if (s) {
		if (b.len)
			memcpy(s, b.bytes, b.len);
		s[b.len] = '\0';
	}
	return s;
}

/* %XX decoding (a vhost "/" is %2F); -1 on a bad escape. */
static int
pct_decode(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (*s == '%') {
			unsigned v;
			if (!s[1] || !s[2] || sscanf(s + 1, "%2x", &v) != 1)
				return -1;
			*o++ = (char)v;
			s += 2;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
	return 0;
}

void
ik_amqp_url_free(struct ik_amqp_url *u)
{
	free(u->host), free(u->vhost), free(u->user), free(u->queue), free(u->params);
	memset(u, 0, sizeof *u);
}

int
ik_amqp_url_parse(const char *url, struct ik_amqp_url *u, ik_err *err)
{
	const char *p, *at, *hash, *slash, *colon, *q;
	char *end;
	long port;

	memset(u, 0, sizeof *u);
	if (strncmp(url, "amqps://", 8) == 0)
		u->tls = 1, p = url + 8;
	else if (strncmp(url, "amqp://", 7) == 0)
		p = url + 7;
	else
		return ik_errf(err, IK_CONFIG, "queue URL '%s': unknown scheme; %s", url, expected);
	/* the password first: a URL that has one is never printed */
	at = strchr(p, '@');
	if (at && memchr(p, ':', (size_t)(at - p)))
		return ik_errf(err, IK_CONFIG, "queue URL: a password in the URL is refused "
		    "(it would be in argv and in logs); %s", expected);
	if (!(hash = strchr(p, '#')))
		return ik_errf(err, IK_CONFIG, "queue URL '%s': no #QUEUE; %s", url, expected);
	if (!at || at == p || at > hash)
		return ik_errf(err, IK_CONFIG, "queue URL '%s': no USER@; %s", url, expected);
	slash = memchr(at, '/', (size_t)(hash - at));
	if (!slash)
		slash = hash;
	colon = memchr(at, ':', (size_t)(slash - at));
	u->user = strndup(p, (size_t)(at - p));
	u->host = strndup(at + 1, (size_t)((colon ? colon : slash) - at - 1));
	/* no path, or an empty one: RabbitMQ's default vhost "/" */
	u->vhost = slash + 1 < hash ? strndup(slash + 1, (size_t)(hash - slash - 1))
	                            : strdup("/");
	q = strchr(hash, '?');
	u->queue = q ? strndup(hash + 1, (size_t)(q - hash - 1)) : strdup(hash + 1);
	u->params = strdup(q ? q + 1 : "");
	if (!u->user || !u->host || !u->vhost || !u->queue || !u->params) {
		ik_amqp_url_free(u);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	u->port = u->tls ? 5671 : 5672;
	if (colon) {
		port = strtol(colon + 1, &end, 10);
		if (end != slash || port < 1 || port > 65535) {
			ik_amqp_url_free(u);
			return ik_errf(err, IK_CONFIG, "queue URL '%s': bad port; %s", url, expected);
		}
		u->port = (int)port;
	}
	if (!*u->host || strpbrk(u->host, " /?") || pct_decode(u->vhost) < 0 ||
	    pct_decode(u->user) < 0 || !*u->vhost) {
		ik_amqp_url_free(u);
		return ik_errf(err, IK_CONFIG, "queue URL '%s': bad host, user or vhost; %s", url,
		               expected);
	}
	/* RabbitMQ's queue names: up to 255 bytes; ours: SQS's alphabet */
	if (!*u->queue || strlen(u->queue) > 80 ||
	    strspn(u->queue, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
	        != strlen(u->queue)) {
		ik_amqp_url_free(u);
		return ik_errf(err, IK_CONFIG, "queue URL '%s': the queue name must be 1-80 of "
		    "[A-Za-z0-9_.-]; %s", url, expected);
	}
	snprintf(u->label, sizeof u->label, "amqp %s:%d%s%s", u->host, u->port,
	         *u->vhost == '/' ? "" : "/", u->vhost);
	return IK_OK;
}

void
ik_amqp_msg_free(struct ik_amqp_msg *m)
{
	free(m->body);
	free(m->message_id);
	for (size_t i = 0; i < m->nattrs; i++)
		free(m->names[i]), free(m->values[i]);
	free(m->names), free(m->values);
	memset(m, 0, sizeof *m);
}

/* ---- errors ---- */

void
ik_amqp_close(struct ik_amqp *a, int polite)
{
	if (!a->c)
		return;
	if (polite)
		amqp_connection_close(a->c, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(a->c);
	a->c = NULL;
	a->confirm = 0;
	a->seq = 0;
	a->prefetch = 0;
}

/* A broker's close (connection or channel): the code decides the class. */
static int
server_close(struct ik_amqp *a, const char *what, int code, amqp_bytes_t text, ik_err *err)
{
	int ik = IK_TEMPFAIL;

	switch (code) {
	case AMQP_ACCESS_REFUSED:        /* 403: login, vhost or queue refused */
	case AMQP_NOT_FOUND:             /* 404 */
	case AMQP_PRECONDITION_FAILED:   /* 406: declared with other arguments */
	case AMQP_NOT_ALLOWED:           /* 530: no such vhost */
	case AMQP_RESOURCE_LOCKED:
		ik = IK_CONFIG;
		break;
	}
	ik_amqp_close(a, 0);
	return ik_errf(err, ik, "%s %s: %d %.*s", a->u->label, what, code,
	               (int)(text.len > 300 ? 300 : text.len), (const char *)text.bytes);
}

static int
lib_err(struct ik_amqp *a, const char *what, int status, ik_err *err)
{
	ik_amqp_close(a, 0);
	return ik_errf(err, IK_TEMPFAIL, "%s %s: %s", a->u->label, what,
	               amqp_error_string2(status));
}

static int
reply_err(struct ik_amqp *a, const char *what, amqp_rpc_reply_t r, ik_err *err)
{
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		return IK_OK;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		return lib_err(a, what, r.library_error, err);
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			amqp_connection_close_t *c = r.reply.decoded;
			return server_close(a, what, c->reply_code, c->reply_text, err);
		}
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			amqp_channel_close_t *c = r.reply.decoded;
			return server_close(a, what, c->reply_code, c->reply_text, err);
		}
		break;
	default:
		break;
	}
	ik_amqp_close(a, 0);
	return ik_errf(err, IK_TEMPFAIL, "%s %s: no answer", a->u->label, what);
}

/* ---- connection ---- */

static struct timeval
tv_ms(int64_t ms)
{
	return (struct timeval){ (time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000) };
}

/* The password: IDEMKIT_AMQP_PASSWORD, else IDEMKIT_AMQP_PASSWORD_FILE's. */
static int
password(struct ik_buf *b, ik_err *err)
{
	const char *env = getenv("IDEMKIT_AMQP_PASSWORD");
	const char *file = getenv("IDEMKIT_AMQP_PASSWORD_FILE");

	if (env && *env)
		return ik_buf_addstr(b, env) ? ik_errf(err, IK_SOFTWARE, "out of memory") : IK_OK;
	if (file && *file) {
		int rc = ik_read_secret(file, SECRET_MAX, b, err);
		if (rc != IK_OK)
			return ik_errwrap(err, "IDEMKIT_AMQP_PASSWORD_FILE");
		while (b->len && (b->p[b->len - 1] == '\n' || b->p[b->len - 1] == '\r'))
			b->p[--b->len] = '\0';
		return IK_OK;
	}
	return ik_errf(err, IK_CONFIG, "no password for the queue: set IDEMKIT_AMQP_PASSWORD "
	               "or IDEMKIT_AMQP_PASSWORD_FILE");
}

int
ik_amqp_has_password(ik_err *err)
{
	const char *env = getenv("IDEMKIT_AMQP_PASSWORD");
	const char *file = getenv("IDEMKIT_AMQP_PASSWORD_FILE");

	if ((env && *env) || (file && *file))
		return IK_OK;
	return ik_errf(err, IK_CONFIG, "no password for the queue: set IDEMKIT_AMQP_PASSWORD "
	               "or IDEMKIT_AMQP_PASSWORD_FILE");
}

static int
open_socket(struct ik_amqp *a, ik_err *err)
{
	const char *ca = getenv("IDEMKIT_AMQP_CACERT");
	const char *cert = getenv("IDEMKIT_AMQP_CERT"), *key = getenv("IDEMKIT_AMQP_KEY");
	struct timeval tv = tv_ms(a->timeout_ms);
	amqp_socket_t *s;
	int st;

	if (!a->u->tls) {
		s = amqp_tcp_socket_new(a->c);
	} else {
		if (!ca || !*ca)
			return ik_errf(err, IK_CONFIG, "%s: amqps:// needs IDEMKIT_AMQP_CACERT (the "
			               "CA file that signed the broker's certificate)", a->u->label);
		if (!(s = amqp_ssl_socket_new(a->c)))
			return ik_errf(err, IK_SOFTWARE, "%s: no TLS socket", a->u->label);
		amqp_ssl_socket_set_verify_peer(s, 1);
		amqp_ssl_socket_set_verify_hostname(s, 1);
		if (amqp_ssl_socket_set_cacert(s, ca) != AMQP_STATUS_OK)
			return ik_errf(err, IK_CONFIG, "%s: cannot read IDEMKIT_AMQP_CACERT",
			               a->u->label);
		if (cert && *cert && amqp_ssl_socket_set_key(s, cert, key && *key ? key : cert) !=
		    AMQP_STATUS_OK)
			return ik_errf(err, IK_CONFIG, "%s: cannot read IDEMKIT_AMQP_CERT/KEY",
			               a->u->label);
	}
	if (!s)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((st = amqp_socket_open_noblock(s, a->u->host, a->u->port, &tv)) != AMQP_STATUS_OK)
		/* a certificate refused is a fix to make (78); a handshake cut
		 * or failed otherwise (a broker restarting, the network) is for
		 * later, as any connect (75): it says so if it never heals */
		return ik_errf(err, st == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED ||
		               st == AMQP_STATUS_SSL_PEER_VERIFY_FAILED ? IK_CONFIG : IK_TEMPFAIL,
		               "%s: connect: %s%s", a->u->label, amqp_error_string2(st),
		               st == AMQP_STATUS_SSL_PEER_VERIFY_FAILED
		                   ? " (the broker's certificate is not signed by the CA in "
		                     "IDEMKIT_AMQP_CACERT)"
		               : st == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED
		                   ? " (the broker's certificate does not name the URL's host)"
		               : st == AMQP_STATUS_SSL_CONNECTION_FAILED
		                   ? " (the TLS handshake failed: is the port the broker's TLS "
		                     "listener?)"
		                   : "");
	return IK_OK;
}

int
ik_amqp_ensure(struct ik_amqp *a, ik_err *err)
{
	struct ik_buf pw = { 0 };
	struct timeval tv;
	amqp_rpc_reply_t r;
	int rc;

	if (a->c)
		return IK_OK;
	if ((rc = ik_amqp_load(err)) != IK_OK)
		return rc;
	if (!a->timeout_ms) {
		const char *t = getenv("IDEMKIT_AMQP_TIMEOUT");
		a->timeout_ms = DEFAULT_TIMEOUT_MS;
		if (t && *t && (ik_parse_duration(t, &a->timeout_ms) != 0 || a->timeout_ms < 1))
			return ik_errf(err, IK_CONFIG, "IDEMKIT_AMQP_TIMEOUT=%s: expected a duration "
			               "(10s, 500ms)", t);
	}
	if ((rc = password(&pw, err)) != IK_OK) {
		ik_buf_wipe_free(&pw);
		return rc;
	}
	if (!(a->c = amqp_new_connection())) {
		ik_buf_wipe_free(&pw);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	tv = tv_ms(a->timeout_ms);
	amqp_set_handshake_timeout(a->c, &tv);
	amqp_set_rpc_timeout(a->c, &tv);
	if ((rc = open_socket(a, err)) != IK_OK) {
		ik_buf_wipe_free(&pw);
		ik_amqp_close(a, 0);
		return rc;
	}
	r = amqp_login(a->c, a->u->vhost, 0, FRAME_MAX, a->heartbeat_s, AMQP_SASL_METHOD_PLAIN,
	               a->u->user,
	               pw.p ? pw.p : "");
	ik_buf_wipe_free(&pw);
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
	    r.library_error == AMQP_STATUS_CONNECTION_CLOSED) {
		ik_amqp_close(a, 0);   /* how RabbitMQ refuses a login */
		return ik_errf(err, IK_CONFIG, "%s: login refused for user %s (user, password "
		               "or vhost)", a->u->label, a->u->user);
	}
	if ((rc = reply_err(a, "login", r, err)) != IK_OK)
		return rc;
	amqp_channel_open(a->c, CHANNEL);
	if ((rc = reply_err(a, "channel.open", amqp_get_rpc_reply(a->c), err)) != IK_OK)
		return rc;
	a->gen++;
	return IK_OK;
}

int
ik_amqp_fd(struct ik_amqp *a)
{
	return a->c ? amqp_get_sockfd(a->c) : -1;
}

/* ---- queues ---- */

int
ik_amqp_declare(struct ik_amqp *a, const char *name, int passive,
                const struct ik_amqp_qdecl *d, int64_t *ready, ik_err *err)
{
	amqp_table_entry_t e[8];
	amqp_table_t args = { 0, e };
	amqp_queue_declare_ok_t *ok;
	char what[128];
	int rc;

	if ((rc = ik_amqp_ensure(a, err)) != IK_OK)
		return rc;
	if (d && d->quorum) {
		e[args.num_entries].key = bytes("x-queue-type");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_UTF8;
		e[args.num_entries++].value.value.bytes = bytes("quorum");
	}
	if (d && d->delivery_limit >= 0) {
		e[args.num_entries].key = bytes("x-delivery-limit");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_I64;
		e[args.num_entries++].value.value.i64 = d->delivery_limit;
	}
	if (d && d->dlx_key) {
		e[args.num_entries].key = bytes("x-dead-letter-exchange");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_UTF8;
		e[args.num_entries++].value.value.bytes = bytes("");
		e[args.num_entries].key = bytes("x-dead-letter-routing-key");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_UTF8;
		e[args.num_entries++].value.value.bytes = bytes(d->dlx_key);
	}
	if (d && d->message_ttl_ms > 0) {
		e[args.num_entries].key = bytes("x-message-ttl");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_I64;
		e[args.num_entries++].value.value.i64 = d->message_ttl_ms;
	}
	if (d && d->expires_ms > 0) {
		e[args.num_entries].key = bytes("x-expires");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_I64;
		e[args.num_entries++].value.value.i64 = d->expires_ms;
	}
	if (d && d->dl_at_least_once) {
		e[args.num_entries].key = bytes("x-dead-letter-strategy");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_UTF8;
		e[args.num_entries++].value.value.bytes = bytes("at-least-once");
		e[args.num_entries].key = bytes("x-overflow");
		e[args.num_entries].value.kind = AMQP_FIELD_KIND_UTF8;
		e[args.num_entries++].value.value.bytes = bytes("reject-publish");
	}
	snprintf(what, sizeof what, "queue.declare %.80s", name);
	ok = amqp_queue_declare(a->c, CHANNEL, bytes(name), passive, 1, 0, 0, args);
	if ((rc = reply_err(a, what, amqp_get_rpc_reply(a->c), err)) != IK_OK)
		return rc;
	if (ready)
		*ready = ok ? ok->message_count : 0;
	amqp_maybe_release_buffers(a->c);
	return IK_OK;
}

/* ---- publishing with confirms ---- */

static int
confirm_mode(struct ik_amqp *a, ik_err *err)
{
	if (a->confirm)
		return IK_OK;
	amqp_confirm_select(a->c, CHANNEL);
	if (reply_err(a, "confirm.select", amqp_get_rpc_reply(a->c), err) != IK_OK)
		return err->code;
	a->confirm = 1;
	a->seq = 0;
	return IK_OK;
}

static int
publish_one(struct ik_amqp *a, const char *queue, const struct ik_amqp_msg *m, ik_err *err)
{
	amqp_table_entry_t *e = calloc(m->nattrs + 1, sizeof *e);
	amqp_basic_properties_t p = { 0 };
	size_t n = 0;
	int st;

	if (!e)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	e[n].key = bytes("x-idemkit-sent-at");
	e[n].value.kind = AMQP_FIELD_KIND_I64;
	e[n++].value.value.i64 = m->sent_at;
	for (size_t i = 0; i < m->nattrs; i++, n++) {
		e[n].key = bytes(m->names[i]);
		e[n].value.kind = AMQP_FIELD_KIND_UTF8;
		e[n].value.value.bytes = bytes(m->values[i]);
	}
	p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
	           AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
	p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p.message_id = bytes(m->message_id);
	p.timestamp = (uint64_t)(m->sent_at / 1000);
	p.headers = (amqp_table_t){ (int)n, e };
	st = amqp_basic_publish(a->c, CHANNEL, bytes(""), bytes(queue), 1, 0, &p,
	                        (amqp_bytes_t){ m->len, m->body });
	free(e);
	if (st != AMQP_STATUS_OK)
		return lib_err(a, "basic.publish", st, err);
	a->seq++;
	return IK_OK;
}

/* Which of the batch a confirm (tag, multiple) settles. */
static void
settle(uint64_t first, size_t n, uint64_t tag, int multiple, int code, int *codes,
       int *known, size_t *left)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t s = first + i;
		if (known[i] || (multiple ? s > tag : s != tag))
			continue;
		known[i] = 1;
		if (codes[i] == IK_OK)   /* a return came before: keep it refused */
			codes[i] = code;
		(*left)--;
	}
}

int
ik_amqp_publish(struct ik_amqp *a, const char *queue, const struct ik_amqp_msg *m,
                size_t n, int *codes, ik_err *err)
{
	int64_t deadline;
	uint64_t first;
	int *known = calloc(n ? n : 1, sizeof *known);
	size_t left = n;
	int rc = IK_OK;

	for (size_t i = 0; i < n; i++)
		codes[i] = IK_TEMPFAIL;
	if (!known)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((rc = ik_amqp_ensure(a, err)) != IK_OK || (rc = confirm_mode(a, err)) != IK_OK)
		goto out;
	first = a->seq + 1;
	for (size_t i = 0; i < n; i++) {
		if ((rc = publish_one(a, queue, &m[i], err)) != IK_OK)
			goto out;
		codes[i] = IK_OK;   /* until a return or a nack says otherwise */
	}
	deadline = ik_mono_ms() + a->timeout_ms;
	while (left > 0) {
		amqp_frame_t f;
		int64_t wait = deadline - ik_mono_ms();
		struct timeval tv = tv_ms(wait > 0 ? wait : 0);
		int st = amqp_simple_wait_frame_noblock(a->c, &f, &tv);

		if (st == AMQP_STATUS_TIMEOUT) {
			ik_amqp_close(a, 0);
			rc = ik_errf(err, IK_TEMPFAIL, "%s: no publisher confirm within %lld ms "
			             "(broker blocked: disk or memory alarm?)", a->u->label,
			             (long long)a->timeout_ms);
			goto out;
		}
		if (st != AMQP_STATUS_OK) {
			rc = lib_err(a, "waiting for publisher confirms", st, err);
			goto out;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue;
		switch (f.payload.method.id) {
		case AMQP_BASIC_ACK_METHOD: {
			amqp_basic_ack_t *k = f.payload.method.decoded;
			settle(first, n, k->delivery_tag, k->multiple, IK_OK, codes, known, &left);
			break;
		}
		case AMQP_BASIC_NACK_METHOD: {
			amqp_basic_nack_t *k = f.payload.method.decoded;
			settle(first, n, k->delivery_tag, k->multiple, IK_TEMPFAIL, codes, known,
			       &left);
			break;
		}
		case AMQP_BASIC_RETURN_METHOD: {
			/* unroutable (no such queue): the confirm follows; the returned
			 * message's id says which one it was */
			amqp_message_t rm;
			amqp_rpc_reply_t r = amqp_read_message(a->c, f.channel, &rm, 0);
			if ((rc = reply_err(a, "basic.return", r, err)) != IK_OK)
				goto out;
			for (size_t i = 0; i < n; i++)
				if (!known[i] && rm.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG &&
				    rm.properties.message_id.len == strlen(m[i].message_id) &&
				    memcmp(rm.properties.message_id.bytes, m[i].message_id,
				           rm.properties.message_id.len) == 0)
					codes[i] = IK_CONFIG;
			amqp_destroy_message(&rm);
			break;
		}
		case AMQP_CHANNEL_CLOSE_METHOD: {
			amqp_channel_close_t *c = f.payload.method.decoded;
			rc = server_close(a, "basic.publish", c->reply_code, c->reply_text, err);
			goto out;
		}
		case AMQP_CONNECTION_CLOSE_METHOD: {
			amqp_connection_close_t *c = f.payload.method.decoded;
			rc = server_close(a, "basic.publish", c->reply_code, c->reply_text, err);
			goto out;
		}
		default:   /* connection.blocked / unblocked: the deadline decides */
			break;
		}
	}
out:
	if (rc != IK_OK)
		for (size_t i = 0; i < n; i++)
			if (!known[i])
				codes[i] = IK_TEMPFAIL;
	if (a->c)
		amqp_maybe_release_buffers(a->c);
	free(known);
	return rc;
}

/* ---- receiving ---- */

static int
field_int(const amqp_field_value_t *v, int64_t *out)
{
	switch (v->kind) {
	case AMQP_FIELD_KIND_I8: *out = v->value.i8; return 0;
	case AMQP_FIELD_KIND_U8: *out = v->value.u8; return 0;
	case AMQP_FIELD_KIND_I16: *out = v->value.i16; return 0;
	case AMQP_FIELD_KIND_U16: *out = v->value.u16; return 0;
	case AMQP_FIELD_KIND_I32: *out = v->value.i32; return 0;
	case AMQP_FIELD_KIND_U32: *out = v->value.u32; return 0;
	case AMQP_FIELD_KIND_I64: *out = v->value.i64; return 0;
	case AMQP_FIELD_KIND_U64: *out = (int64_t)v->value.u64; return 0;
	case AMQP_FIELD_KIND_TIMESTAMP: *out = (int64_t)v->value.u64; return 0;
	default: return -1;
	}
}

static int
keyis(amqp_bytes_t k, const char *s)
{
	return k.len == strlen(s) && memcmp(k.bytes, s, k.len) == 0;
}

/* The headers of a received message into m: ours, the broker's count and
 * dead-letter reason, and string ones as attributes. */
static int
read_headers(const amqp_basic_properties_t *p, struct ik_amqp_msg *m)
{
	const amqp_table_t *h = &p->headers;
	size_t cap;

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return 0;
	cap = (size_t)h->num_entries + 1;
	if (!(m->names = calloc(cap, sizeof *m->names)) ||
	    !(m->values = calloc(cap, sizeof *m->values)))
		return -1;
	for (int i = 0; i < h->num_entries; i++) {
		const amqp_table_entry_t *e = &h->entries[i];
		const char *as = NULL;
		if (keyis(e->key, "x-idemkit-sent-at")) {
			field_int(&e->value, &m->sent_at);
			continue;
		}
		if (keyis(e->key, "x-delivery-count")) {
			field_int(&e->value, &m->delivery_count);
			continue;
		}
		if (e->value.kind != AMQP_FIELD_KIND_UTF8 && e->value.kind != AMQP_FIELD_KIND_BYTES)
			continue;
		/* the broker's reason for dead-lettering, as an attribute */
		if (keyis(e->key, "x-first-death-reason"))
			as = "deathReason";
		else if (keyis(e->key, "x-first-death-queue"))
			as = "deathQueue";
		else if (e->key.len > 2 && memcmp(e->key.bytes, "x-", 2) == 0)
			continue;
		m->names[m->nattrs] = as ? strdup(as) : dupbytes(e->key);
		m->values[m->nattrs] = dupbytes(e->value.value.bytes);
		if (!m->names[m->nattrs++] || !m->values[m->nattrs - 1])
			return -1;
	}
	return 0;
}

/* m from a message read after basic.deliver or basic.get-ok. */
static int
take_message(amqp_message_t *msg, struct ik_amqp_msg *m)
{
	int rc;

	m->body = dupbytes(msg->body);
	m->len = msg->body.len;
	if (msg->properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		m->message_id = dupbytes(msg->properties.message_id);
	else
		m->message_id = strdup("");
	if (msg->properties._flags & AMQP_BASIC_TIMESTAMP_FLAG)
		m->sent_at = (int64_t)msg->properties.timestamp * 1000;
	rc = read_headers(&msg->properties, m);
	return rc < 0 || !m->body || !m->message_id ? -1 : 0;
}

int
ik_amqp_get_start(struct ik_amqp *a, const char *queue, ik_err *err)
{
	amqp_basic_get_t g = { 0, bytes(queue), 0 };
	int st, rc;

	if ((rc = ik_amqp_ensure(a, err)) != IK_OK)
		return rc;
	if ((st = amqp_send_method(a->c, CHANNEL, AMQP_BASIC_GET_METHOD, &g)) != AMQP_STATUS_OK)
		return lib_err(a, "basic.get", st, err);
	return IK_OK;
}

int
ik_amqp_consume(struct ik_amqp *a, const char *queue, const char *tag, int prefetch,
                ik_err *err)
{
	amqp_basic_consume_t c = { 0, bytes(queue), bytes(tag), 0, 0, 0, 1, { 0, NULL } };
	int st, rc;

	if ((rc = ik_amqp_ensure(a, err)) != IK_OK)
		return rc;
	/* a per-consumer prefetch applies to the consumers made after it */
	if (prefetch != a->prefetch) {
		amqp_basic_qos_t q = { 0, (uint16_t)prefetch, 0 };
		if ((st = amqp_send_method(a->c, CHANNEL, AMQP_BASIC_QOS_METHOD, &q)) !=
		    AMQP_STATUS_OK)
			return lib_err(a, "basic.qos", st, err);
		a->prefetch = prefetch;
	}
	if ((st = amqp_send_method(a->c, CHANNEL, AMQP_BASIC_CONSUME_METHOD, &c)) !=
	    AMQP_STATUS_OK)
		return lib_err(a, "basic.consume", st, err);
	return IK_OK;
}

int
ik_amqp_cancel(struct ik_amqp *a, const char *tag, ik_err *err)
{
	amqp_basic_cancel_t c = { bytes(tag), 1 };
	int st;

	if (!a->c)
		return ik_errf(err, IK_TEMPFAIL, "%s: connection lost", a->u->label);
	if ((st = amqp_send_method(a->c, CHANNEL, AMQP_BASIC_CANCEL_METHOD, &c)) !=
	    AMQP_STATUS_OK)
		return lib_err(a, "basic.cancel", st, err);
	return IK_OK;
}

/* A delivery (ctag its consumer's tag) or a basic.get-ok (ctag NULL): its
 * content follows on the channel at once (the broker writes a message's
 * frames together); the read waits for it without a timeout of its own,
 * so a broker that falls silent mid-message is seen by the heartbeats. */
static int
delivered(struct ik_amqp *a, const char *ctag, uint64_t tag, int redelivered,
          ik_amqp_deliver_fn *fn, void *arg, ik_err *err)
{
	struct ik_amqp_msg m = { 0 };
	amqp_message_t msg;
	amqp_rpc_reply_t r;
	int rc;

	r = amqp_read_message(a->c, CHANNEL, &msg, 0);
	if ((rc = reply_err(a, "basic.deliver", r, err)) != IK_OK)
		return rc;
	m.tag = tag;
	m.redelivered = redelivered;
	rc = take_message(&msg, &m);
	amqp_destroy_message(&msg);
	if (rc < 0) {
		ik_amqp_msg_free(&m);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	fn(arg, ctag, &m);
	return IK_OK;
}

int
ik_amqp_ack(struct ik_amqp *a, uint64_t tag, ik_err *err)
{
	int st;

	if (!a->c)
		return ik_errf(err, IK_LEASE_LOST, "%s: the connection that received it is gone",
		               a->u->label);
	if ((st = amqp_basic_ack(a->c, CHANNEL, tag, 0)) != AMQP_STATUS_OK)
		return lib_err(a, "basic.ack", st, err);
	return IK_OK;
}

int
ik_amqp_requeue(struct ik_amqp *a, uint64_t tag, ik_err *err)
{
	int st;

	if (!a->c)
		return ik_errf(err, IK_LEASE_LOST, "%s: the connection that received it is gone",
		               a->u->label);
	if ((st = amqp_basic_reject(a->c, CHANNEL, tag, 1)) != AMQP_STATUS_OK)
		return lib_err(a, "basic.reject", st, err);
	return IK_OK;
}

int
ik_amqp_input(struct ik_amqp *a, ik_amqp_deliver_fn *fn, void *arg, ik_err *err)
{
	while (a->c) {
		amqp_frame_t f;
		struct timeval tv = { 0, 0 };
		char ctag[256];
		int st = amqp_simple_wait_frame_noblock(a->c, &f, &tv), rc;

		if (st == AMQP_STATUS_TIMEOUT)
			break;
		if (st != AMQP_STATUS_OK)
			return lib_err(a, "connection", st, err);
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue;
		switch (f.payload.method.id) {
		case AMQP_BASIC_DELIVER_METHOD: {
			amqp_basic_deliver_t *d = f.payload.method.decoded;
			snprintf(ctag, sizeof ctag, "%.*s", (int)d->consumer_tag.len,
			         (const char *)d->consumer_tag.bytes);
			if ((rc = delivered(a, ctag, d->delivery_tag, d->redelivered, fn, arg,
			                    err)) != IK_OK)
				return rc;
			break;
		}
		case AMQP_BASIC_GET_OK_METHOD: {
			amqp_basic_get_ok_t *g = f.payload.method.decoded;
			if ((rc = delivered(a, NULL, g->delivery_tag, g->redelivered, fn, arg,
			                    err)) != IK_OK)
				return rc;
			break;
		}
		case AMQP_BASIC_GET_EMPTY_METHOD:
			fn(arg, NULL, NULL);
			break;
		case AMQP_BASIC_CANCEL_METHOD:
			/* the broker cancelled a consumer (its queue deleted): what
			 * it held is unknown, start again */
			ik_amqp_close(a, 0);
			return ik_errf(err, IK_TEMPFAIL, "%s: the broker cancelled the consumer "
			               "(queue deleted?)", a->u->label);
		case AMQP_CONNECTION_CLOSE_METHOD: {
			amqp_connection_close_t *c = f.payload.method.decoded;
			return server_close(a, "connection", c->reply_code, c->reply_text, err);
		}
		case AMQP_CHANNEL_CLOSE_METHOD: {
			amqp_channel_close_t *c = f.payload.method.decoded;
			return server_close(a, "channel", c->reply_code, c->reply_text, err);
		}
		default:   /* qos-ok, connection.blocked/unblocked */
			break;
		}
	}
	if (a->c)
		amqp_maybe_release_buffers(a->c);
	return a->c ? IK_OK : ik_errf(err, IK_TEMPFAIL, "%s: connection lost", a->u->label);
}
