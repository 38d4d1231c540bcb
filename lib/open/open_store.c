/* open_store.c: the store port's factory: picking an adapter from a URL
 * (the only place that names the adapters), the Redis fast path in front
 * of it, and the store the envelope steps open on first use.  See
 * open_store.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "conn/redis.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/cache/store_cache.h"
#include "store/dynamodb/store_dynamodb.h"
#include "store/postgres/pg_store.h"
#include "store/redis/store_redis.h"
#include "store/sqlite/store_sqlite.h"
#include "store/store.h"

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
