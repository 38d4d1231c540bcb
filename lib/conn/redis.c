/* redis.c: the Redis URL, one connection, scripts by SHA; see redis.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <sodium.h>

#include "conn/redis.h"
#include "core/outcome.h"
#include "core/util.h"

#define DEFAULT_TIMEOUT_MS 5000

/* Percent-decodes [p, p+n) into a new string; NULL on a bad escape. */
static char *
pct_decode(const char *p, size_t n)
{
	char *out = malloc(n + 1), *o = out;

	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '%') {
			char hex[3] = { 0 };
			if (i + 2 >= n || !isxdigit((unsigned char)p[i + 1]) ||
			    !isxdigit((unsigned char)p[i + 2])) {
				sodium_memzero(out, n + 1);   /* not terminated yet */
				free(out);
				return NULL;
			}
			hex[0] = p[i + 1], hex[1] = p[i + 2];
			*o++ = (char)strtoul(hex, NULL, 16);
			i += 2;
		} else
			*o++ = p[i];
	}
	*o = '\0';
	return out;
}

int
ik_redis_url_has_password(const char *url)
{
	const char *p = strstr(url, "://"), *end;

	if (!p)
		return 0;
	p += 3;
	end = p + strcspn(p, "/?");
	for (const char *q = end; q > p; q--)
		if (q[-1] == '@')
			return memchr(p, ':', (size_t)(q - 1 - p)) != NULL;
	return 0;
}

static int
parse_query(char *q, struct ik_redis_url *u, ik_err *err)
{
	char *save = NULL;

	for (char *kv = strtok_r(q, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
		char *v = strchr(kv, '=');
		long long n;
		if (!v)
			return ik_errf(err, IK_CONFIG, "%s: URL option \"%.40s\" has no value",
			    u->label, kv);
		*v++ = '\0';
		if (strcmp(kv, "durability") == 0) {
			if (strcmp(v, "unsafe") == 0)
				u->durability_unsafe = 1;
			else if (strcmp(v, "checked") == 0)
				u->durability_unsafe = 0;
			else
				return ik_errf(err, IK_CONFIG, "%s: durability=%.40s: want checked "
				    "or unsafe", u->label, v);
		} else if (strcmp(kv, "wait") == 0) {
			if (ik_parse_int(v, 0, 100, &n) < 0)
				return ik_errf(err, IK_CONFIG, "%s: wait=%.40s: want a number of "
				    "replicas, 0 to 100", u->label, v);
			u->wait = (int)n;
		} else if (strcmp(kv, "timeout") == 0) {
			if (ik_parse_duration(v, &u->timeout_ms) < 0 || u->timeout_ms <= 0 ||
			    u->timeout_ms > 600000)
				return ik_errf(err, IK_CONFIG, "%s: timeout=%.40s: want a duration "
				    "up to 10m (e.g. 50ms, 2s)", u->label, v);
		} else
			return ik_errf(err, IK_CONFIG, "%s: unknown URL option \"%.40s\" (want "
			    "durability, wait or timeout)", u->label, kv);
	}
	return IK_OK;
}

int
ik_redis_url_parse(const char *rest, struct ik_redis_url *u, ik_err *err)
{
	char *s = strdup(rest), *q, *path, *at, *host, *port = NULL;
	long long n;
	int rc = IK_CONFIG;

	memset(u, 0, sizeof *u);
	u->port = 6379;
	snprintf(u->label, sizeof u->label, "redis");
	if (!s)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((q = strchr(s, '?')))
		*q++ = '\0';
	if ((path = strchr(s, '/')))
		*path++ = '\0';
	host = s;
	if ((at = strrchr(s, '@'))) {
		char *colon = memchr(s, ':', (size_t)(at - s));
		*at = '\0';
		host = at + 1;
		if (!colon) {
			ik_errf(err, IK_CONFIG, "redis URL: the part before '@' must be "
			    "USER:PASSWORD or :PASSWORD");
			goto out;
		}
		if ((colon > s && !(u->user = pct_decode(s, (size_t)(colon - s)))) ||
		    !(u->pass = pct_decode(colon + 1, strlen(colon + 1)))) {
			ik_errf(err, IK_CONFIG, "redis URL: bad %%-escape in the user or password");
			goto out;
		}
		sodium_memzero(s, (size_t)(at - s));
	}
	if (*host == '[') {
		char *close = strchr(host, ']');
		if (!close || (close[1] && close[1] != ':')) {
			ik_errf(err, IK_CONFIG, "redis URL: bad [IPv6] host");
			goto out;
		}
		*close = '\0';
		host++;
		if (close[1] == ':')
			port = close + 2;
	} else if ((port = strrchr(host, ':')))
		*port++ = '\0';
	if (!*host || strlen(host) > 253) {
		ik_errf(err, IK_CONFIG, "redis URL: no host (want redis://[USER:PASSWORD@]HOST:PORT[/DB])");
		goto out;
	}
	if (port && ik_parse_int(port, 1, 65535, &n) < 0) {
		ik_errf(err, IK_CONFIG, "redis URL: port \"%.20s\" is not 1 to 65535", port);
		goto out;
	}
	if (port)
		u->port = (int)n;
	if (path && *path) {
		if (ik_parse_int(path, 0, 100000, &n) < 0) {
			ik_errf(err, IK_CONFIG, "redis URL: database \"%.20s\" is not a number", path);
			goto out;
		}
		u->db = (int)n;
	}
	if (!(u->host = strdup(host))) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	snprintf(u->label, sizeof u->label, "redis %s:%d/%d", u->host, u->port, u->db);
	if (q && *q && (rc = parse_query(q, u, err)) != IK_OK)
		goto out;
	rc = IK_OK;
out:
	free(s);
	if (rc != IK_OK)
		ik_redis_url_free(u);
	return rc;
}

void
ik_redis_url_free(struct ik_redis_url *u)
{
	free(u->host);
	free(u->user);
	ik_str_wipe_free(u->pass);
	u->host = u->user = u->pass = NULL;
}

/* ---- connection -------------------------------------------------------- */

static void
drop(struct ik_redis *r)
{
	if (r->c)
		redisFree(r->c);
	r->c = NULL;
}

/* The context's error as an outcome; the connection is then unusable. */
static int
ctx_err(struct ik_redis *r, const char *what, ik_err *err)
{
	const char *m = r->c ? r->c->errstr : "cannot allocate a connection";
	int io = r->c && r->c->err == REDIS_ERR_IO;

	/* hiredis 0.14 reports a command timeout as an I/O error with EAGAIN. */
	if (io && (errno == EAGAIN || errno == EWOULDBLOCK || strstr(m, "temporarily")))
		m = "timed out";
	ik_errf(err, IK_TEMPFAIL, "%s: %s: %s", r->u.label, what, m);
	drop(r);
	return IK_TEMPFAIL;
}

/* An error reply as an outcome.  Server messages carry no secret. */
static int
reply_err(struct ik_redis *r, const char *what, const redisReply *rep, ik_err *err)
{
	static const char *const transient[] = { "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN",
	    "READONLY", "CLUSTERDOWN", "NOREPLICAS", "OOM", NULL };
	static const char *const config[] = { "NOAUTH", "WRONGPASS", "NOPERM", NULL };
	const char *m = rep->str ? rep->str : "";
	int code = IK_SOFTWARE;

	for (int i = 0; transient[i]; i++)
		if (strncmp(m, transient[i], strlen(transient[i])) == 0)
			code = IK_TEMPFAIL;
	for (int i = 0; config[i]; i++)
		if (strncmp(m, config[i], strlen(config[i])) == 0)
			code = IK_CONFIG;
	return ik_errf(err, code, "%s: %s: %.300s", r->u.label, what, m);
}

static struct timeval
tv(int64_t ms)
{
	return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

int
ik_redis_ensure(struct ik_redis *r, ik_err *err)
{
	int64_t ms = r->u.timeout_ms ? r->u.timeout_ms :
	    r->timeout_ms ? r->timeout_ms : DEFAULT_TIMEOUT_MS;
	redisReply *rep;
	char db[16];
	int rc;

	if (r->c && !r->c->err && !ik_fd_ready(r->c->fd))
		return IK_OK;
	/* A connection kept from an earlier command that the server has
	 * closed since (no answer is due on it, so anything to read is its end
	 * of file or reset): connect afresh now, before anything is sent,
	 * rather than lose the next command to it; a finish after the bank's
	 * yes would otherwise be refused and the charge sent to the bank
	 * again. */
	drop(r);
	if ((rc = ik_hiredis_load(err)) != IK_OK)
		return ik_errwrap(err, "%s", r->u.label);
	r->c = redisConnectWithTimeout(r->u.host, r->u.port, tv(ms));
	if (!r->c || r->c->err)
		return ctx_err(r, "connect", err);
	if (redisSetTimeout(r->c, tv(ms)) != REDIS_OK)
		return ctx_err(r, "set timeout", err);
	if (r->u.pass) {
		const char *av[3] = { "AUTH" };
		int ac = 1;
		if (r->u.user)
			av[ac++] = r->u.user;
		av[ac++] = r->u.pass;
		if (!(rep = ik_redis_cmd(r, "AUTH", ac, av, NULL, err))) {
			drop(r);
			return err->code;
		}
		freeReplyObject(rep);
	}
	if (r->u.db) {
		snprintf(db, sizeof db, "%d", r->u.db);
		if (!(rep = ik_redis_cmd(r, "SELECT", 2, (const char *[]){ "SELECT", db }, NULL, err))) {
			drop(r);
			/* The server refused the URL's database number (past its
			 * `databases`): the URL to fix, not our software. */
			if (err->code == IK_SOFTWARE)
				return ik_errf(err, IK_CONFIG, "%s: SELECT %s: the server has no "
				    "database %s (fewer `databases`); fix the URL's /DB", r->u.label,
				    db, db);
			return err->code;
		}
		freeReplyObject(rep);
	}
	if (r->on_connect && (rc = r->on_connect(r, err)) != IK_OK) {
		drop(r);
		return rc;
	}
	return IK_OK;
}

char *
ik_redis_str(const redisReply *v)
{
	char *p;

	if (!v || v->type != REDIS_REPLY_STRING || !(p = malloc(v->len + 1)))
		return NULL;
	memcpy(p, v->str, v->len);
	p[v->len] = '\0';
	return p;
}

void
ik_redis_close(struct ik_redis *r)
{
	drop(r);
	ik_redis_url_free(&r->u);
}

static redisReply *
get_reply(struct ik_redis *r, const char *what, ik_err *err)
{
	void *rep = NULL;

	if (redisGetReply(r->c, &rep) != REDIS_OK || !rep) {
		ctx_err(r, what, err);
		return NULL;
	}
	return rep;
}

redisReply *
ik_redis_cmd(struct ik_redis *r, const char *what, int argc, const char **argv,
    const size_t *lens, ik_err *err)
{
	redisReply *rep;

	r->unsure = 0;
	if (ik_redis_ensure(r, err) != IK_OK)
		return NULL;
	if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) {
		ctx_err(r, what, err);
		return NULL;
	}
	if (!(rep = get_reply(r, what, err))) {
		r->unsure = 1;
		return NULL;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		reply_err(r, what, rep, err);
		freeReplyObject(rep);
		return NULL;
	}
	return rep;
}

static int
load(struct ik_redis *r, struct ik_redis_script *s, ik_err *err)
{
	const char *av[3] = { "SCRIPT", "LOAD", s->src };
	redisReply *rep = ik_redis_cmd(r, "SCRIPT LOAD", 3, av, NULL, err);

	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
		freeReplyObject(rep);
		return ik_errf(err, IK_SOFTWARE, "%s: SCRIPT LOAD %s: unexpected reply",
		    r->u.label, s->name);
	}
	memcpy(s->sha, rep->str, 41);
	freeReplyObject(rep);
	return IK_OK;
}

static redisReply *eval_argv(struct ik_redis *r, struct ik_redis_script *s, int nkeys,
    int argc, const char **argv, const size_t *lens, int wait, const char **av, size_t *lv,
    ik_err *err);

redisReply *
ik_redis_eval(struct ik_redis *r, struct ik_redis_script *s, int nkeys, int argc,
    const char **argv, const size_t *lens, int wait, ik_err *err)
{
	/* As many arguments as the caller has: the relay's checkpoint passes
	 * one per event of its batch (up to IK_OUTBOX_BATCH_MAX); a bound here
	 * failed every checkpoint of a batch over it, after its publish.  On
	 * the stack for the claims' and finishes' few. */
	const char *sav[32], **av = sav;
	size_t slv[32], *lv = slv;
	redisReply *rep;

	if (argc + 3 > 32) {
		av = malloc((size_t)(argc + 3) * sizeof *av);
		lv = malloc((size_t)(argc + 3) * sizeof *lv);
		if (!av || !lv) {
			free(av);
			free(lv);
			return ik_errf(err, IK_SOFTWARE, "out of memory"), NULL;
		}
	}
	rep = eval_argv(r, s, nkeys, argc, argv, lens, wait, av, lv, err);
	if (av != sav) {
		free(av);
		free(lv);
	}
	return rep;
}

static redisReply *
eval_argv(struct ik_redis *r, struct ik_redis_script *s, int nkeys, int argc,
    const char **argv, const size_t *lens, int wait, const char **av, size_t *lv,
    ik_err *err)
{
	char nk[16], what[64], waitn[16];
	redisReply *rep = NULL, *w = NULL;

	snprintf(what, sizeof what, "EVALSHA %s", s->name);
	snprintf(nk, sizeof nk, "%d", nkeys);
	snprintf(waitn, sizeof waitn, "%d", wait);
	for (int attempt = 0; attempt < 2; attempt++) {
		if (ik_redis_ensure(r, err) != IK_OK)
			return NULL;
		if (!s->sha[0] && load(r, s, err) != IK_OK)
			return NULL;
		r->unsure = 0;
		r->sent_boot_ms = ik_boot_ms();
		av[0] = "EVALSHA", lv[0] = 7;
		av[1] = s->sha, lv[1] = 40;
		av[2] = nk, lv[2] = strlen(nk);
		for (int i = 0; i < argc; i++) {
			av[3 + i] = argv[i];
			lv[3 + i] = lens ? lens[i] : strlen(argv[i]);
		}
		if (redisAppendCommandArgv(r->c, argc + 3, av, lv) != REDIS_OK ||
		    (wait > 0 && redisAppendCommandArgv(r->c, 3,
		        (const char *[]){ "WAIT", waitn, "1000" }, NULL) != REDIS_OK)) {
			ctx_err(r, what, err);
			return NULL;
		}
		if (!(rep = get_reply(r, what, err))) {
			r->unsure = 1;
			return NULL;
		}
		if (wait > 0 && !(w = get_reply(r, "WAIT", err))) {
			freeReplyObject(rep);
			return NULL;
		}
		if (rep->type == REDIS_REPLY_ERROR && rep->str &&
		    strncmp(rep->str, "NOSCRIPT", 8) == 0 && attempt == 0) {
			/* The server lost its script cache (restart, SCRIPT FLUSH):
			 * nothing ran; load again and retry once. */
			freeReplyObject(rep);
			if (w)
				freeReplyObject(w);
			rep = w = NULL;
			s->sha[0] = '\0';
			continue;
		}
		break;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		reply_err(r, what, rep, err);
		freeReplyObject(rep);
		if (w)
			freeReplyObject(w);
		return NULL;
	}
	if (w) {
		long long got = w->type == REDIS_REPLY_INTEGER ? w->integer : -1;
		freeReplyObject(w);
		if (got < wait) {
			freeReplyObject(rep);
			ik_errf(err, IK_TEMPFAIL, "%s: %s: WAIT: %lld of %d replicas acknowledged "
			    "the write within 1s (it is done on the primary)", r->u.label,
			    s->name, got, wait);
			return NULL;
		}
	}
	return rep;
}
