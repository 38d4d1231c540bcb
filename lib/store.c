/* store.c: the store port: picking an adapter from a URL, and what all
 * adapters share (tokens, states, records as JSON).  See store.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli.h"
#include "log.h"
#include "outbox.h"
#include "outcome.h"
#include "redis.h"
#include "store.h"
#include "utf8.h"
#include "util.h"

static const char *const state_names[] = {
	[IK_ST_NONE] = "NONE",
	[IK_ST_IN_PROGRESS] = "IN_PROGRESS",
	[IK_ST_DONE] = "DONE",
	[IK_ST_FAILED] = "FAILED",
	[IK_ST_DNF] = "DEBITED_NOTIFICATION_FAILED",
};

const char *
ik_state_name(enum ik_state s)
{
	return (unsigned)s < sizeof state_names / sizeof state_names[0] ?
	    state_names[s] : "NONE";
}

enum ik_state
ik_state_parse(const char *s)
{
	for (size_t i = 1; s && i < sizeof state_names / sizeof state_names[0]; i++)
		if (strcmp(s, state_names[i]) == 0)
			return (enum ik_state)i;
	return IK_ST_NONE;
}

void
ik_record_free(struct ik_record *r)
{
	free(r->key);
	free(r->owner);
	free(r->fingerprint);
	free(r->event);
	free(r->debit_ref);
	free(r->last_error);
	free(r->history);
	memset(r, 0, sizeof *r);
}

static void
add_str(cJSON *o, const char *k, const char *v)
{
	if (v)
		cJSON_AddStringToObject(o, k, v);
	else
		cJSON_AddNullToObject(o, k);
}

cJSON *
ik_record_json(const struct ik_record *r, int64_t now_ms)
{
	cJSON *o = cJSON_CreateObject();
	/* leaseUntil comes from the store (any number a DynamoDB item holds):
	 * subtract only when it cannot overflow. */
	int64_t left = r->lease_until > now_ms ? r->lease_until - now_ms : 0;

	if (!o)
		return NULL;
	add_str(o, "chargeId", r->key);
	cJSON_AddStringToObject(o, "state", ik_state_name(r->state));
	add_str(o, "owner", r->owner);
	cJSON_AddNumberToObject(o, "leaseUntil", (double)r->lease_until);
	cJSON_AddNumberToObject(o, "leaseRemainingMs",
	    r->state == IK_ST_IN_PROGRESS && left > 0 ? (double)left : 0);
	cJSON_AddNumberToObject(o, "attempts", (double)r->attempts);
	add_str(o, "fingerprint", r->fingerprint);
	add_str(o, "debitRef", r->debit_ref);
	add_str(o, "lastError", r->last_error);
	cJSON_AddNumberToObject(o, "createdAt", (double)r->created_at);
	cJSON_AddNumberToObject(o, "updatedAt", (double)r->updated_at);
	/* expiresAt stays epoch seconds, the unit of DynamoDB's TTL attribute
	 * and of every reader so far (codes and fields are API); expiresAtMs
	 * is the same instant in the milliseconds of every other time here.
	 * In double: no overflow for any number a store holds. */
	cJSON_AddNumberToObject(o, "expiresAt", (double)r->expires_at);
	cJSON_AddNumberToObject(o, "expiresAtMs", (double)r->expires_at * 1000.0);
	add_str(o, "event", r->event);
	cJSON *h = r->history ? cJSON_Parse(r->history) : NULL;
	if (!cJSON_IsArray(h)) {
		cJSON_Delete(h);
		h = cJSON_CreateArray();
	}
	cJSON_AddItemToObject(o, "history", h);
	return o;
}

char *
ik_history_entry(const struct ik_hist *h)
{
	cJSON *o = cJSON_CreateObject();
	char *s;

	if (!o)
		return NULL;
	cJSON_AddNumberToObject(o, "at", (double)h->at);
	cJSON_AddStringToObject(o, "op", h->op);
	if (strcmp(h->op, "claim") == 0) {
		cJSON_AddNumberToObject(o, "attempt", (double)h->attempt);
		cJSON_AddNumberToObject(o, "leaseUntil", (double)h->lease_until);
	}
	if (strcmp(h->op, "finish") == 0 || strcmp(h->op, "renotified") == 0)
		cJSON_AddStringToObject(o, "state", ik_state_name(h->state));
	if (strcmp(h->op, "renotified") != 0)
		add_str(o, "owner", h->owner);
	if (strcmp(h->op, "finish") == 0) {
		add_str(o, "debitRef", h->debit_ref);
		add_str(o, "error", h->error);
		if (h->bank_replayed)
			cJSON_AddTrueToObject(o, "bankReplayed");
	}
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return s;
}

char *
ik_history_append(const char *old, const char *entry)
{
	cJSON *a = old && *old ? cJSON_Parse(old) : cJSON_CreateArray();
	cJSON *e = cJSON_Parse(entry);
	char *s = NULL;

	if (cJSON_IsArray(a) && cJSON_IsObject(e)) {
		cJSON_AddItemToArray(a, e);
		e = NULL;
		while (cJSON_GetArraySize(a) > IK_HISTORY_MAX)
			cJSON_DeleteItemFromArray(a, 0);
		s = cJSON_PrintUnformatted(a);
	}
	cJSON_Delete(e);
	cJSON_Delete(a);
	return s;
}

/* A finish whose text had to be repaired: the repaired request and its
 * copies live until the adapter answered. */
struct clean_finish {
	struct ik_finish_req req;
	char *copy[2];
	ik_store_cb cb;
	void *arg;
};

static void
clean_finish_free(struct clean_finish *f)
{
	free(f->copy[0]);
	free(f->copy[1]);
	free(f);
}

/* IK_OK with *out NULL when req's text is valid UTF-8 already (the common
 * case: no copy), else with *out the repaired request; or IK_SOFTWARE. */
static int
clean_finish(const struct ik_finish_req *req, struct clean_finish **out, ik_err *err)
{
	struct clean_finish *f;

	*out = NULL;
	if ((!req->last_error || ik_utf8_valid(req->last_error, strlen(req->last_error))) &&
	    (!req->debit_ref || ik_utf8_valid(req->debit_ref, strlen(req->debit_ref))))
		return IK_OK;
	if (!(f = calloc(1, sizeof *f)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	f->req = *req;
	if (ik_utf8_clean(req->last_error, &f->req.last_error, &f->copy[0]) < 0 ||
	    ik_utf8_clean(req->debit_ref, &f->req.debit_ref, &f->copy[1]) < 0) {
		clean_finish_free(f);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	ik_log(IK_LOG_WARN, "the finish's reason or reference is not valid UTF-8: "
	    "invalid bytes recorded as U+FFFD", "chargeId", req->key, NULL);
	*out = f;
	return IK_OK;
}

int
ik_store_finish(struct ik_store *s, const struct ik_finish_req *req, ik_err *err)
{
	struct clean_finish *f;
	int rc;

	if ((rc = clean_finish(req, &f, err)) != IK_OK)
		return rc;
	rc = s->ops->finish(s, f ? &f->req : req, err);
	if (f)
		clean_finish_free(f);
	return rc;
}

static void
clean_finish_done(void *arg, int rc, const ik_err *err)
{
	struct clean_finish *f = arg;
	ik_store_cb cb = f->cb;
	void *cbarg = f->arg;

	clean_finish_free(f);
	cb(cbarg, rc, err);
}

int
ik_store_finish_start(struct ik_store *s, const struct ik_finish_req *req,
    ik_store_cb cb, void *arg, ik_err *err)
{
	struct clean_finish *f;
	int rc;

	if ((rc = clean_finish(req, &f, err)) != IK_OK)
		return rc;
	if (!f)
		return s->ops->finish_start(s, req, cb, arg, err);
	f->cb = cb;
	f->arg = arg;
	if ((rc = s->ops->finish_start(s, &f->req, clean_finish_done, f, err)) != IK_OK)
		clean_finish_free(f);   /* nothing started: no callback comes */
	return rc;
}

int
ik_claim_decide(const struct ik_claim_req *req, struct ik_claim_res *res, ik_err *err)
{
	const struct ik_record *r = &res->cur;

	if (!r->fingerprint || !req->fingerprint || strcmp(r->fingerprint, req->fingerprint) != 0) {
		res->code = IK_PAYLOAD_MISMATCH;
		return IK_OK;
	}
	switch (r->state) {
	case IK_ST_DONE:
	case IK_ST_DNF:
		res->code = IK_DUP_DONE;
		return IK_OK;
	case IK_ST_FAILED:
		res->code = IK_DUP_FAILED;
		return IK_OK;
	case IK_ST_IN_PROGRESS:
		if (r->owner && req->token && strcmp(r->owner, req->token) == 0) {
			res->code = IK_OK;
			res->attempt = r->attempts;
			res->lease_until = r->lease_until;
			return IK_OK;
		}
		if (r->lease_until < req->now_ms)
			return IK_EMPTY;
		res->code = IK_DUP_IN_PROGRESS;
		res->lease_until = r->lease_until;
		return IK_OK;
	case IK_ST_NONE:
		break;
	}
	return ik_errf(err, IK_SOFTWARE, "record %.128s is in a state this version does "
	    "not know; refusing the claim", r->key ? r->key : req->key);
}

/* This host's name as tokens carry it: cut to 63 characters, anything
 * but [A-Za-z0-9._-] as '_', so the tail parses back. */
static void
this_host(char host[64])
{
	host[0] = '\0';
	if (gethostname(host, 63) < 0 || !host[0])
		strcpy(host, "unknown");
	host[63] = '\0';
	for (char *h = host; *h; h++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *h))
			*h = '_';
}

void
ik_store_token(char out[IK_TOKEN_HEX])
{
	unsigned char raw[16];
	char host[64], *end;
	const char *p = getenv("IDEMKIT_RUN_PID");
	long pid = p && *p ? strtol(p, &end, 10) : 0;

	if (sodium_init() < 0)
		abort();  /* no randomness source: nothing safe can follow */
	randombytes_buf(raw, sizeof raw);
	ik_hex(raw, sizeof raw, out);
	if (!p || !*p || *end || pid <= 0)
		pid = (long)getpid();
	this_host(host);
	snprintf(out + 2 * sizeof raw, IK_TOKEN_HEX - 2 * sizeof raw, "@%s:%ld", host, pid);
}

int
ik_owner_holder(const char *owner, char short_tok[9], char host[64], long *pid, int *local)
{
	const char *at, *colon;
	char *end, me[64];
	size_t n;

	*local = 0;
	snprintf(short_tok, 9, "%.8s", owner ? owner : "?");
	host[0] = '\0';
	*pid = 0;
	if (!owner || !(at = strchr(owner, '@')) || !(colon = strrchr(at, ':')) ||
	    (n = (size_t)(colon - at - 1)) == 0 || n > 63)
		return 0;
	*pid = strtol(colon + 1, &end, 10);
	if (*end || *pid <= 0)
		return 0;
	memcpy(host, at + 1, n);
	host[n] = '\0';
	this_host(me);
	*local = strcmp(host, me) == 0;
	return 1;
}

int
ik_finish_decide(const struct ik_finish_req *req, const struct ik_record *cur)
{
	if (cur && cur->state == req->state && cur->owner && req->token &&
	    strcmp(cur->owner, req->token) == 0)
		return IK_OK;
	return IK_LEASE_LOST;
}

int
ik_store_lease(const char *opt, int64_t *ms)
{
	const char *v = opt ? opt : getenv("IDEMKIT_LEASE");

	*ms = IK_LEASE_DEFAULT_MS;
	if (!v || (!opt && !*v))
		return IK_OK;
	if (ik_opt_duration(opt ? "--lease" : "IDEMKIT_LEASE", v, IK_LEASE_MIN_MS,
	    IK_LEASE_MAX_MS, ms) < 0)
		return opt ? IK_USAGE : IK_CONFIG;
	return IK_OK;
}

int
ik_store_retention(int64_t lease_ms, int64_t *ms, ik_err *err)
{
	const char *v = getenv("IDEMKIT_RETENTION");

	*ms = IK_RETENTION_DEFAULT_MS;
	if (v && *v && (ik_parse_duration(v, ms) < 0 || *ms > IK_RETENTION_MAX_MS))
		return ik_errf(err, IK_CONFIG, "IDEMKIT_RETENTION: \"%.64s\" is not a duration "
		    "up to 3650d", v);
	if (*ms <= lease_ms)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_RETENTION (%llds) is not longer than the "
		    "lease (%llds): a record would expire while its claim is live and a second "
		    "worker claim it afresh", (long long)(*ms / 1000), (long long)(lease_ms / 1000));
	if (*ms < 14LL * 86400000)
		ik_log(IK_LOG_WARN, "retention under 14 days: a redelivery or DLQ redrive "
		    "after the record expires would debit again", "retention", v, NULL);
	return IK_OK;
}

struct adapter {
	const char *scheme;   /* "sqlite:" */
	const char *form;     /* as help shows it: "sqlite:PATH"; NULL: an alias */
	int (*open)(const char *rest, struct ik_store *s, ik_err *err);
	int whole;            /* open gets the whole URL, which may end at the scheme */
	/* The URL as messages may show it, and whether it holds a secret,
	 * from the adapter's own parser; NULL: redacted() below. */
	char *(*display)(const char *url, int *secret);
};

static const struct adapter adapters[] = {
	{ "sqlite:", "sqlite:PATH", ik_store_sqlite_open, 0, NULL },
	{ "dynamodb:", "dynamodb:TABLE", ik_store_dynamodb_open, 0, NULL },
	{ "postgres:", "postgres://...", ik_store_postgres_open, 1, ik_store_postgres_display },
	{ "postgresql:", NULL, ik_store_postgres_open, 1, ik_store_postgres_display },
	{ "redis://", "redis://HOST:PORT", ik_store_redis_open, 0, NULL },
	{ "rediss://", "rediss://HOST:PORT", ik_store_rediss_open, 0, NULL },
};

char *
ik_store_forms(void)
{
	struct ik_buf b = { 0 };
	size_t n = sizeof adapters / sizeof adapters[0], last = 0, first = 1;

	for (size_t i = 0; i < n; i++)
		if (adapters[i].form)
			last = i;
	for (size_t i = 0; i < n; i++) {
		if (!adapters[i].form)
			continue;
		if (!first)
			ik_buf_addstr(&b, i == last ? " or " : ", ");
		ik_buf_addstr(&b, adapters[i].form);
		first = 0;
	}
	return b.p;
}

/* The URL as messages and logs may show it: a password in the authority
 * (scheme://user:PASSWORD@host) or in a password= parameter becomes ***.
 * NULL when out of memory. */
static char *
redacted(const char *url)
{
	struct ik_buf b = { 0 };
	const char *auth = strstr(url, "://"), *at, *colon, *p;

	if (auth) {
		auth += 3;
		at = auth + strcspn(auth, "/?#");
		while (at > auth && at[-1] != '@')
			at--;
		colon = at > auth ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
		if (colon) {
			ik_buf_add(&b, url, (size_t)(colon + 1 - url));
			ik_buf_addstr(&b, "***");
			url = at - 1;
		}
	}
	while ((p = strstr(url, "password="))) {
		ik_buf_add(&b, url, (size_t)(p + 9 - url));
		ik_buf_addstr(&b, "***");
		url = p + 9 + strcspn(p + 9, "& ");
	}
	ik_buf_addstr(&b, url);
	return b.p;
}

/* A read-only command (must_exist) must not create the store it looks
 * in: an empty database made by a wrong IDEMKIT_STATE_DIR answers "no
 * record", which reads as "never received".  Only SQLite creates a store
 * by opening it (the other stores' tables come from idemp-init), so only
 * its file is checked, before the adapter opens (creates) it. */
static int
no_store(const char *url, int dflt, ik_err *err)
{
	struct stat st;

	if (strncmp(url, "sqlite:", 7) != 0 || stat(url + 7, &st) == 0)
		return IK_OK;
	if (errno != ENOENT && errno != ENOTDIR)
		return ik_errf(err, IK_CONFIG, "store %s: %s", url, strerror(errno));
	return ik_errf(err, IK_CONFIG, "no store at %s (chosen by %s; set IDEMKIT_STORE, "
	    "or IDEMKIT_STATE_DIR for the default sqlite:$IDEMKIT_STATE_DIR/idempotency.db, "
	    "to where the worker keeps it)", url, dflt ? "the default state directory: "
	    "IDEMKIT_STATE_DIR, XDG_STATE_HOME, HOME" : "IDEMKIT_STORE or --store");
}

static int
open_store(const char *url, int must_exist, struct ik_store **out, ik_err *err)
{
	static const char argv_secret[] = "--store: a password on the command line shows "
	    "in the process list; put the URL in IDEMKIT_STORE instead, or the password in "
	    "a file (PGPASSFILE for PostgreSQL)";
	struct ik_store *s;
	char *def = NULL, *dir;
	const char *cache;
	size_t n;
	int rc, argv = url && *url, secret = 0;

	*out = NULL;
	if (argv && (ik_redis_url_has_password(url) || strstr(url, "password=")))
		return ik_errf(err, IK_CONFIG, argv_secret);
	if (!url || !*url)
		url = getenv("IDEMKIT_STORE");
	if (!url || !*url) {
		struct ik_buf b = { 0 };
		if (!(dir = ik_state_dir(!must_exist, err)))
			return err->code;
		ik_buf_addstr(&b, "sqlite:");
		ik_buf_addstr(&b, dir);
		ik_buf_addstr(&b, "/idempotency.db");
		free(dir);
		if (!b.p)
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		url = def = b.p;
	}
	for (size_t i = 0; i < sizeof adapters / sizeof adapters[0]; i++) {
		n = strlen(adapters[i].scheme);
		if (strncmp(url, adapters[i].scheme, n) != 0)
			continue;
		if (!url[n] && !adapters[i].whole) {
			free(def);
			return ik_errf(err, IK_CONFIG, "store %s: empty after the scheme", url);
		}
		if (!(s = calloc(1, sizeof *s)) || !(s->url = adapters[i].display ?
		    adapters[i].display(url, &secret) : redacted(url))) {
			free(s);
			free(def);
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		if (argv && secret) {
			free(s->url);
			free(s);
			return ik_errf(err, IK_CONFIG, argv_secret);
		}
		if (must_exist && (rc = no_store(url, def != NULL, err)) != IK_OK)
			;
		else if ((cache = getenv("IDEMKIT_CACHE")) && *cache)
			rc = ik_store_cache_open(cache, adapters[i].open,
			    adapters[i].whole ? url : url + n, s, err);
		else
			rc = adapters[i].open(adapters[i].whole ? url : url + n, s, err);
		free(def);
		if (rc != IK_OK) {
			free(s->url);
			free(s);
			return rc;
		}
		/* The outbox asked for on a store that keeps none would finish
		 * charges without their events, silently: refuse instead. */
		if (ik_outbox_url() && !s->ops->outbox_lease) {
			/* behind the fast path the outbox is the store's (store_cache.c) */
			rc = ik_errf(err, IK_CONFIG, "IDEMKIT_OUTBOX is set but the %s%s keeps "
			    "no outbox in this version", cache && *cache ? "store behind " : s->ops->name,
			    cache && *cache ? "IDEMKIT_CACHE" : " store");
			ik_store_close(s);
			return rc;
		}
		*out = s;
		return IK_OK;
	}
	/* Only the scheme: the rest may hold a password, and so may a URL
	 * without one. */
	n = strcspn(url, ":");
	dir = ik_store_forms();
	rc = ik_errf(err, IK_CONFIG, "store: %s%.*s%s (want %s)", url[n] ? "unknown scheme \"" :
	    "no scheme", url[n] && n <= 32 ? (int)n : 0, url, url[n] ? "\"" : "",
	    dir ? dir : "sqlite:PATH");
	free(dir);
	free(def);
	return rc;
}

int
ik_store_open(const char *url, struct ik_store **out, ik_err *err)
{
	return open_store(url, 0, out, err);
}

int
ik_store_open_existing(const char *url, struct ik_store **out, ik_err *err)
{
	return open_store(url, 1, out, err);
}

/* A long-lived step must not stay broken because the store was down for
 * a second when its first envelope came: an open that failed for a reason
 * that may pass (anything but CONFIG: a server unreachable, a busy file)
 * is tried again on a later envelope, after a backoff that grows with each
 * failure (so a store that stays down is not hammered), and the envelopes
 * in between record the kept failure (TEMPFAIL: the queue leaves them).
 * Bad configuration stays kept: it does not mend itself. */
#define IK_STORE_REOPEN_BASE_MS 100
#define IK_STORE_REOPEN_CAP_MS 5000

struct ik_store *
ik_store_lazy_get(struct ik_store_lazy *l, ik_err *err)
{
	if (!l->store && l->open_err.code && l->open_err.code != IK_CONFIG &&
	    ik_mono_ms() >= l->reopen_at)
		ik_errclear(&l->open_err);
	if (!l->store && !l->open_err.code &&
	    ik_store_open(l->url, &l->store, &l->open_err) != IK_OK) {
		l->store = NULL;
		l->reopen_at = ik_mono_ms() + ik_backoff_ceil(IK_STORE_REOPEN_BASE_MS,
		    IK_STORE_REOPEN_CAP_MS, l->open_failures++);
	}
	if (l->store)
		l->open_failures = 0;
	else
		*err = l->open_err;
	return l->store;
}

int
ik_store_lazy_inflight(struct ik_store_lazy *l, size_t n)
{
	ik_err err = { 0 };
	struct ik_store *s = ik_store_lazy_get(l, &err);

	if (!s || !s->ops->claim_start || !s->ops->finish_start || !s->ops->run ||
	    !s->ops->active || !n || !(l->done = calloc(n, sizeof *l->done)))
		return 0;
	l->done_cap = n;
	if (s->ops->warm)
		s->ops->warm(s);
	return 1;
}

void
ik_store_lazy_done(struct ik_store_lazy *l, cJSON *env)
{
	/* The step loop starts at most done_cap envelopes it has not reaped. */
	l->done[(l->done_head + l->done_n++) % l->done_cap] = env;
}

cJSON *
ik_store_lazy_reap(struct ik_store_lazy *l)
{
	cJSON *env;

	if (!l->done_n)
		return NULL;
	env = l->done[l->done_head];
	l->done_head = (l->done_head + 1) % l->done_cap;
	l->done_n--;
	return env;
}

void
ik_store_lazy_close(struct ik_store_lazy *l)
{
	while (l->done_n)
		cJSON_Delete(ik_store_lazy_reap(l));
	free(l->done);
	l->done = NULL;
	ik_store_close(l->store);
	l->store = NULL;
}

int
ik_store_lazy_wait(struct ik_store_lazy *l, int fd, int *readable, int timeout_ms)
{
	ik_err err = { 0 };

	if (l->store->ops->run(l->store, fd, readable,
	    timeout_ms < 0 || timeout_ms > 1000 ? 1000 : timeout_ms, &err) == IK_OK)
		return 0;
	ik_warnx("%s", err.msg);
	return -1;
}

int
ik_store_inflight(const char *opt, size_t *out)
{
	const char *v = opt ? opt : getenv("IDEMKIT_STORE_INFLIGHT");
	long long n;

	*out = IK_STORE_INFLIGHT_DEFAULT;
	if (!v || (!opt && !*v))
		return IK_OK;
	if (ik_opt_int(opt ? "--inflight" : "IDEMKIT_STORE_INFLIGHT", v, 1,
	    IK_STORE_INFLIGHT_MAX, &n) < 0)
		return opt ? IK_USAGE : IK_CONFIG;
	*out = (size_t)n;
	return IK_OK;
}

int
ik_store_group_begin(void *lazy)
{
	ik_err err = { 0 };
	struct ik_store *s = ik_store_lazy_get(lazy, &err);

	if (!s || !s->ops->begin)
		return -1;
	return s->ops->begin(s, &err) == IK_OK ? 0 : -1;
}

int
ik_store_group_commit(void *lazy)
{
	struct ik_store *s = ((struct ik_store_lazy *)lazy)->store;
	ik_err err = { 0 };

	if (s->ops->commit(s, &err) == IK_OK)
		return 0;
	ik_log(IK_LOG_WARN, "group commit failed; redoing each alone", "store", s->ops->name,
	    "error", err.msg, NULL);
	return -1;
}

void
ik_store_close(struct ik_store *s)
{
	if (!s)
		return;
	if (s->ops && s->ops->close)
		s->ops->close(s);
	free(s->url);
	free(s);
}
