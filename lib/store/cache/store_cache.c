/* store_cache.c: the Redis fast path (IDEMKIT_CACHE=redis://...) in front
 * of any store, as a decorator of the store port: ik_store_open wraps it
 * around the real store, and commands never know it is there.
 *
 * Rules:
 *  - the cache answers a claim only from a TERMINAL record it holds with
 *    its fingerprint (DONE, DEBITED_NOTIFICATION_FAILED, FAILED), through
 *    ik_claim_decide: DUP_DONE, DUP_FAILED or PAYLOAD_MISMATCH.  Anything
 *    else goes to the store, which alone decides claims;
 *  - the cache is written only after the store said so: a finish after the
 *    store's finish returned IK_OK (inside a group: after its commit), a
 *    terminal record the store refused a claim with, a pending entry
 *    (IN_PROGRESS + fingerprint, never an answer) after an acquired
 *    claim, so the finish has the fingerprint and the record's retention
 *    (the entry's PEXPIREAT) to keep.  One small script per write, so a
 *    late pending write never overwrites a terminal entry;
 *  - renotified updates the entry, forget empties it after the store's
 *    delete; renew (idemp-run's heartbeat) is the store's alone;
 *  - the cache never outlives a change the store made, however late a
 *    write lands (a slow network, a paused process: the writer's 50 ms
 *    timeout does not stop the server from running it later).  Each entry
 *    keeps a generation, which forget bumps (the entry becomes a tombstone:
 *    the generation alone, kept for the retention); a claim reads it with
 *    the cache's answer, and the writes that claim makes (pending,
 *    terminal) land only while the generation is still the one it read, so
 *    a FAILED record read from the store before a forget can never be put
 *    back after it.  A finish lands only on the pending entry of its own
 *    claim token (as the store fences it), so a late finish of an old
 *    claim cannot overwrite a newer claim's entry.  A claim that could not
 *    read the generation writes nothing;
 *  - stats are the store's (idemp-stats, the metrics);
 *  - the outbox is the store's (the store of record writes each event in
 *    its finish's own write; the relay's ops go to it): the cache has the
 *    outbox ops when that store has them.  With $IDEMKIT_OUTBOX set, a
 *    store that cannot be opened now fails the open (it may pass: the
 *    steps open again), since whether it keeps an outbox is not known;
 *  - get and list are the store's, so a record's history is the one the
 *    store keeps (store.h); the cache holds none.  A claim it answers is a
 *    refused claim, which adds no history on any store, so nothing is lost;
 *  - a cache that is down, slow (50 ms connect and command timeouts by
 *    default) or holds a wrong-typed key changes no outcome and fails no
 *    step: the trouble is logged once per process and the cache bypassed
 *    (after a connection error, for RETRY_MS).  It needs no durability:
 *    it decides nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "conn/redis.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/cache/store_cache.h"
#include "store/store.h"

#define CACHE_PREFIX "idemkit:cache:"
#define CACHE_TIMEOUT_MS 50
#define RETRY_MS 5000

/* KEYS: the entry.  ARGV: mode (pending, terminal, finish, renotified,
 * forget), state, fingerprint, attempts, has ref, ref, has error, error,
 * PEXPIREAT ms (0: keep), the generation the claim read (pending,
 * terminal), the claim token (pending, finish). */
static const char put_lua[] =
	"local mode = ARGV[1]\n"
	"local st, fp, gen, owner = unpack(redis.call('HMGET', KEYS[1], 'state', "
	"'fingerprint', 'gen', 'owner'))\n"
	"if mode == 'forget' then\n"
	"  redis.call('HDEL', KEYS[1], 'state', 'fingerprint', 'attempts', 'debitRef', "
	"'lastError', 'owner')\n"
	"  redis.call('HINCRBY', KEYS[1], 'gen', 1)\n"
	"  redis.call('PEXPIREAT', KEYS[1], ARGV[9])\n"
	"  return 1\n"
	"end\n"
	"if (mode == 'pending' or mode == 'terminal') and "
	"(tonumber(gen) or 0) ~= tonumber(ARGV[10]) then return 0 end\n"
	"if mode == 'pending' then\n"
	"  if st and st ~= 'IN_PROGRESS' then return 0 end\n"
	"  redis.call('HSET', KEYS[1], 'owner', ARGV[11])\n"
	"elseif mode == 'finish' then\n"
	"  if st ~= 'IN_PROGRESS' or not fp or owner ~= ARGV[11] then return 0 end\n"
	"elseif mode == 'renotified' then\n"
	"  if st ~= 'DEBITED_NOTIFICATION_FAILED' then return 0 end\n"
	"  redis.call('HDEL', KEYS[1], 'lastError')\n"
	"end\n"
	"redis.call('HSET', KEYS[1], 'state', ARGV[2])\n"
	"if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'fingerprint', ARGV[3]) end\n"
	"if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'attempts', ARGV[4]) end\n"
	"if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'debitRef', ARGV[6]) end\n"
	"if ARGV[7] == '1' then redis.call('HSET', KEYS[1], 'lastError', ARGV[8])\n"
	"elseif mode == 'finish' then redis.call('HDEL', KEYS[1], 'lastError') end\n"
	"if ARGV[9] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[9]) end\n"
	"return 1\n";

enum put_mode { P_PENDING, P_TERMINAL, P_FINISH, P_RENOTIFIED, P_FORGET };
static const char *const mode_names[] = { "pending", "terminal", "finish", "renotified",
    "forget" };

/* One cache write, run at once or after the group's commit. */
struct put {
	enum put_mode mode;
	enum ik_state state;
	char *key, *fingerprint, *debit_ref, *last_error;
	char *owner;              /* pending, finish: the claim's token */
	int has_ref, has_err;
	int64_t attempts;
	int64_t expire_ms;
	int64_t gen;              /* pending, terminal: the generation read */
};

struct cache {
	struct ik_store *inner;   /* NULL while the store could not be opened */
	int (*open)(const char *rest, struct ik_store *s, ik_err *err);
	char *rest;               /* the store's URL after its scheme */
	struct ik_store_ops ops;
	struct ik_redis r;
	struct ik_redis_script put;
	int64_t down_until;     /* monotonic ms: bypass until then */
	int logged;
	int group;
	struct put *pending;
	size_t npending, cap;
};

/* Logs the first trouble of this process, then stays quiet. */
static void
trouble(struct cache *c, const ik_err *e)
{
	if (c->logged)
		return;
	c->logged = 1;
	ik_log(IK_LOG_WARN, "cache unavailable: bypassed, every answer comes from the store "
	    "(logged once per process)", "cache", c->r.u.label, "error", e->msg, NULL);
}

/* Connected, or in a back-off after a connection error. */
static int
usable(struct cache *c)
{
	ik_err e = { 0 };

	if (c->r.c)
		return 1;
	if (c->down_until && ik_mono_ms() < c->down_until)
		return 0;
	if (ik_redis_ensure(&c->r, &e) == IK_OK)
		return 1;
	c->down_until = ik_mono_ms() + RETRY_MS;
	trouble(c, &e);
	return 0;
}

/* After a failed command: a dropped connection backs off. */
static void
failed(struct cache *c, const ik_err *e)
{
	if (!c->r.c)
		c->down_until = ik_mono_ms() + RETRY_MS;
	trouble(c, e);
}

/* The store, opened now if it could not be before (a locked SQLite file,
 * an unreachable server): the cache answers what it can meanwhile. */
static struct ik_store *
store(struct cache *c, ik_err *err)
{
	struct ik_store *s;

	if (c->inner)
		return c->inner;
	if (!(s = calloc(1, sizeof *s))) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	if (c->open(c->rest, s, err) != IK_OK) {
		free(s);
		return NULL;
	}
	return c->inner = s;
}

static char *
entry_key(const char *id)
{
	struct ik_buf b = { 0 };

	ik_buf_addstr(&b, CACHE_PREFIX);
	ik_buf_addstr(&b, id);
	return b.p;
}

static void
put_free(struct put *p)
{
	free(p->key);
	free(p->fingerprint);
	free(p->debit_ref);
	free(p->last_error);
	free(p->owner);
}

static int
run_put(struct cache *c, const struct put *p)
{
	char *k = entry_key(p->key);
	char att[32] = "", exp[32], gen[32];
	redisReply *rep;
	ik_err e = { 0 };
	int ok = 0;

	if (!k || !usable(c)) {
		free(k);
		return 0;
	}
	if (p->attempts > 0)
		snprintf(att, sizeof att, "%lld", (long long)p->attempts);
	snprintf(exp, sizeof exp, "%lld", (long long)p->expire_ms);
	snprintf(gen, sizeof gen, "%lld", (long long)p->gen);
	rep = ik_redis_eval(&c->r, &c->put, 1, 12, (const char *[]){ k,
	    mode_names[p->mode], ik_state_name(p->state),
	    p->fingerprint ? p->fingerprint : "", att, p->has_ref ? "1" : "0",
	    p->debit_ref ? p->debit_ref : "", p->has_err ? "1" : "0",
	    p->last_error ? p->last_error : "", exp, gen, p->owner ? p->owner : "" },
	    NULL, 0, &e);
	free(k);
	if (rep) {
		ok = 1;
		freeReplyObject(rep);
	} else
		failed(c, &e);
	return ok;
}

/* Runs p now, or keeps it for after the group's commit; takes p's strings. */
static int
put(struct cache *c, struct put *p)
{
	int ok;

	if (c->group) {
		if (c->npending == c->cap) {
			size_t n = c->cap ? c->cap * 2 : 16;
			struct put *np = realloc(c->pending, n * sizeof *np);
			if (!np) {
				put_free(p);
				return 0;
			}
			c->pending = np;
			c->cap = n;
		}
		c->pending[c->npending++] = *p;
		return 1;
	}
	ok = run_put(c, p);
	put_free(p);
	return ok;
}

static void
drop_pending(struct cache *c, int run)
{
	for (size_t i = 0; i < c->npending; i++) {
		if (run)
			run_put(c, &c->pending[i]);
		put_free(&c->pending[i]);
	}
	c->npending = 0;
}

/* A terminal record in the cache that answers req: IK_OK with res set.
 * *gen gets the entry's generation (0: none yet), -1 when it could not be
 * read (then the claim writes nothing to the cache). */
static int
answer(struct cache *c, const struct ik_claim_req *req, struct ik_claim_res *res,
    int64_t *gen)
{
	static const char *const fields[] = { "state", "fingerprint", "attempts", "debitRef",
	    "lastError", "gen" };
	const char *av[2 + 6] = { "HMGET" };
	char *k = entry_key(req->key);
	struct ik_record *r = &res->cur;
	redisReply *rep;
	ik_err e = { 0 };
	char *st = NULL;
	int rc = IK_EMPTY;

	*gen = -1;
	if (!k || !usable(c)) {
		free(k);
		return IK_EMPTY;
	}
	av[1] = k;
	memcpy(av + 2, fields, sizeof fields);
	rep = ik_redis_cmd(&c->r, "HMGET", 8, av, NULL, &e);
	free(k);
	if (!rep) {
		failed(c, &e);
		return IK_EMPTY;
	}
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 6)
		goto out;
	*gen = rep->element[5]->type == REDIS_REPLY_STRING ?
	    strtoll(rep->element[5]->str, NULL, 10) : 0;
	if (rep->element[0]->type != REDIS_REPLY_STRING ||
	    rep->element[1]->type != REDIS_REPLY_STRING)
		goto out;
	memset(r, 0, sizeof *r);
	st = strndup(rep->element[0]->str, rep->element[0]->len);
	r->state = ik_state_parse(st);
	if (r->state != IK_ST_DONE && r->state != IK_ST_DNF && r->state != IK_ST_FAILED)
		goto out;
	r->key = ik_strdup(req->key);
	r->fingerprint = strndup(rep->element[1]->str, rep->element[1]->len);
	if (rep->element[2]->type == REDIS_REPLY_STRING)
		r->attempts = strtoll(rep->element[2]->str, NULL, 10);
	if (rep->element[3]->type == REDIS_REPLY_STRING)
		r->debit_ref = strndup(rep->element[3]->str, rep->element[3]->len);
	if (rep->element[4]->type == REDIS_REPLY_STRING)
		r->last_error = strndup(rep->element[4]->str, rep->element[4]->len);
	if (ik_claim_decide(req, res, &e) == IK_OK && (res->code == IK_DUP_DONE ||
	    res->code == IK_DUP_FAILED || res->code == IK_PAYLOAD_MISMATCH)) {
		ik_log(IK_LOG_DEBUG, "claim answered by the cache", "chargeId", req->key,
		    "outcome", ik_code_name(res->code), NULL);
		rc = IK_OK;
	}
out:
	free(st);
	freeReplyObject(rep);
	if (rc != IK_OK) {
		ik_record_free(r);
		memset(res, 0, sizeof *res);
	}
	return rc;
}

static int
ca_claim(struct ik_store *s, const struct ik_claim_req *req, struct ik_claim_res *res,
    ik_err *err)
{
	struct cache *c = s->impl;
	const struct ik_record *r = &res->cur;
	struct ik_store *in;
	struct put p = { 0 };
	int64_t gen;
	int rc;

	memset(res, 0, sizeof *res);
	if (answer(c, req, res, &gen) == IK_OK)
		return IK_OK;
	if (!(in = store(c, err)))
		return err->code;
	if ((rc = in->ops->claim(in, req, res, err)) != IK_OK)
		return rc;
	if (gen < 0)
		return IK_OK;   /* no generation read: a write could outlive a forget */
	if (res->code == IK_OK) {
		p = (struct put){ .mode = P_PENDING, .state = IK_ST_IN_PROGRESS,
		    .key = ik_strdup(req->key), .fingerprint = ik_strdup(req->fingerprint),
		    .owner = ik_strdup(req->token), .gen = gen,
		    .attempts = res->attempt, .expire_ms = req->expires_at * 1000 };
	} else if ((r->state == IK_ST_DONE || r->state == IK_ST_DNF || r->state == IK_ST_FAILED)
	    && r->fingerprint && r->expires_at > 0) {
		p = (struct put){ .mode = P_TERMINAL, .state = r->state,
		    .key = ik_strdup(req->key), .fingerprint = ik_strdup(r->fingerprint),
		    .debit_ref = ik_strdup(r->debit_ref), .has_ref = r->debit_ref != NULL,
		    .last_error = ik_strdup(r->last_error), .has_err = r->last_error != NULL,
		    .attempts = r->attempts, .expire_ms = r->expires_at * 1000, .gen = gen };
	} else
		return IK_OK;
	if (p.key)
		put(c, &p);
	else
		put_free(&p);
	return IK_OK;
}

static int
ca_finish(struct ik_store *s, const struct ik_finish_req *req, ik_err *err)
{
	struct cache *c = s->impl;
	struct put p;
	struct ik_store *in = store(c, err);
	int rc = in ? in->ops->finish(in, req, err) : err->code;

	if (rc != IK_OK)
		return rc;
	p = (struct put){ .mode = P_FINISH, .state = req->state, .key = ik_strdup(req->key),
	    .owner = ik_strdup(req->token),
	    .debit_ref = ik_strdup(req->debit_ref), .has_ref = req->debit_ref != NULL,
	    .last_error = ik_strdup(req->last_error), .has_err = req->last_error != NULL };
	put(c, &p);
	return IK_OK;
}

/* The store's alone: the cache holds nothing of a live lease. */
static int
ca_renew(struct ik_store *s, const char *key, const char *token, int64_t now_ms,
    int64_t lease_ms, ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	return in ? in->ops->renew(in, key, token, now_ms, lease_ms, err) : err->code;
}

static int
ca_renotified(struct ik_store *s, const char *key, int64_t now_ms, ik_err *err)
{
	struct cache *c = s->impl;
	struct put p;
	struct ik_store *in = store(c, err);
	int rc = in ? in->ops->renotified(in, key, now_ms, err) : err->code;

	if (rc != IK_OK)
		return rc;
	p = (struct put){ .mode = P_RENOTIFIED, .state = IK_ST_DONE, .key = ik_strdup(key) };
	put(c, &p);
	return IK_OK;
}

static int
ca_forget_failed(struct ik_store *s, const char *key, ik_err *err)
{
	struct cache *c = s->impl;
	struct put p;
	struct ik_store *in = store(c, err);
	int rc = in ? in->ops->forget_failed(in, key, err) : err->code;
	int64_t keep;
	ik_err rerr = { 0 };

	/* Also when the store had nothing to forget: a second idemp-forget
	 * is how an entry left behind by a cache outage is removed. */
	if (rc != IK_OK && rc != IK_EMPTY)
		return rc;
	/* the tombstone lives as long as a record would; a bad
	 * IDEMKIT_RETENTION (refused by every command that claims) keeps the
	 * default here, after the store's delete has already happened */
	if (ik_store_retention(0, &keep, &rerr) != IK_OK)
		keep = IK_RETENTION_DEFAULT_MS;
	p = (struct put){ .mode = P_FORGET, .key = ik_strdup(key),
	    .expire_ms = ik_now_ms() + keep };
	if (!put(c, &p) && rc == IK_OK)
		ik_log(IK_LOG_WARN, "cache: the forgotten record's entry could not be removed; "
		    "until it expires or idemp-forget is run again, a redelivery is answered "
		    "DUP_FAILED", "chargeId", key, "cache", c->r.u.label, NULL);
	return rc;
}

static int
ca_init(struct ik_store *s, ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	return in ? in->ops->init(in, err) : err->code;
}

static int
ca_release(struct ik_store *s, const char *key, const char *token, int64_t now_ms,
    ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	return in ? in->ops->release(in, key, token, now_ms, err) : err->code;
}

/* Optional in the store behind: the cache has it when that store has. */
static int
ca_note(struct ik_store *s, const char *key, const char *token, const char *reason,
    ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	if (!in)
		return err->code;
	return in->ops->note ? in->ops->note(in, key, token, reason, err) : IK_OK;
}

static int
ca_get(struct ik_store *s, const char *key, struct ik_record *r, ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	return in ? in->ops->get(in, key, r, err) : err->code;
}

static int
ca_list(struct ik_store *s, const struct ik_list_filter *f, ik_record_cb cb, void *arg,
    ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	return in ? in->ops->list(in, f, cb, arg, err) : err->code;
}

static int
ca_stats(struct ik_store *s, int64_t now_ms, struct ik_store_stats *st, ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);

	if (!in)
		return err->code;
	if (!in->ops->stats)
		return ik_errf(err, IK_CONFIG, "%s: this store cannot count its records "
		    "without reading every one; no stats", in->ops->name);
	return in->ops->stats(in, now_ms, st, err);
}

/* The outbox's ops: the store's (set only when it has them). */
static int
ca_outbox_lease(struct ik_store *s, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err)
{
	struct ik_store *in = store(s->impl, err);

	return in ? in->ops->outbox_lease(in, holder, now_ms, lease_ms, until, err) : err->code;
}

static int
ca_outbox_read(struct ik_store *s, size_t max, struct ik_outbox_ev *ev, size_t *n,
    ik_err *err)
{
	struct ik_store *in = store(s->impl, err);

	*n = 0;
	return in ? in->ops->outbox_read(in, max, ev, n, err) : err->code;
}

static int
ca_outbox_ack(struct ik_store *s, const char *holder, const struct ik_outbox_ev *ev,
    size_t n, int64_t now_ms, ik_err *err)
{
	struct ik_store *in = store(s->impl, err);

	return in ? in->ops->outbox_ack(in, holder, ev, n, now_ms, err) : err->code;
}

static int
ca_outbox_purge(struct ik_store *s, int64_t before_ms, size_t batch, int64_t *n,
    ik_err *err)
{
	struct ik_store *in = store(s->impl, err);

	*n = 0;
	return in ? in->ops->outbox_purge(in, before_ms, batch, n, err) : err->code;
}

static int
ca_outbox_stats(struct ik_store *s, int64_t now_ms, struct ik_outbox_stats *st,
    ik_err *err)
{
	struct ik_store *in = store(s->impl, err);

	return in ? in->ops->outbox_stats(in, now_ms, st, err) : err->code;
}

/* The store's own check; a store only unreachable now passes, as at the
 * open (the cache answers what it can meanwhile). */
static int
ca_claim_check(struct ik_store *s, ik_err *err)
{
	struct ik_store *in = store(s->impl, err);
	int rc;

	if (!in)
		return err->code == IK_TEMPFAIL ? (ik_errclear(err), IK_OK) : err->code;
	rc = in->ops->claim_check ? in->ops->claim_check(in, err) : IK_OK;
	return rc == IK_TEMPFAIL ? (ik_errclear(err), IK_OK) : rc;
}

static int
ca_begin(struct ik_store *s, ik_err *err)
{
	struct cache *c = s->impl;
	struct ik_store *in = store(c, err);
	int rc;

	if (!in)
		return err->code;
	if (!in->ops->begin)
		return ik_errf(err, IK_SOFTWARE, "store %s has no group commit", in->ops->name);
	if ((rc = in->ops->begin(in, err)) == IK_OK) {
		c->group = 1;
		drop_pending(c, 0);
	}
	return rc;
}

static int
ca_commit(struct ik_store *s, ik_err *err)
{
	struct cache *c = s->impl;
	int rc = c->inner->ops->commit(c->inner, err);  /* begin opened it */

	c->group = 0;
	drop_pending(c, rc == IK_OK);
	return rc;
}

static void
ca_close(struct ik_store *s)
{
	struct cache *c = s->impl;

	if (!c)
		return;
	drop_pending(c, 0);
	free(c->pending);
	ik_store_close(c->inner);
	if (c->rest) {
		sodium_memzero(c->rest, strlen(c->rest));   /* may hold a password */
		free(c->rest);
	}
	ik_redis_close(&c->r);
	free(c);
	s->impl = NULL;
}

int
ik_store_cache_open(const char *url, int (*open)(const char *, struct ik_store *, ik_err *),
    const char *rest, struct ik_store *s, ik_err *err)
{
	struct cache *c;
	int rc;

	if (strncmp(url, "rediss://", 9) == 0)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_CACHE: rediss:// (TLS) is not supported: "
		    "Debian 12's hiredis 0.14 has no TLS; use a local TLS tunnel (stunnel or "
		    "spiped), see \"TLS to Redis\" in idemkit(7)");
	if (strncmp(url, "redis://", 8) != 0)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_CACHE: want redis://HOST:PORT[/DB]");
	/* Missing hiredis is configuration: refused at once, not bypassed. */
	if ((rc = ik_hiredis_load(err)) != IK_OK)
		return ik_errwrap(err, "IDEMKIT_CACHE");
	if (!(c = calloc(1, sizeof *c)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((rc = ik_redis_url_parse(url + 8, &c->r.u, err)) != IK_OK) {
		free(c);
		return ik_errwrap(err, "IDEMKIT_CACHE");
	}
	if (c->r.u.durability_unsafe || c->r.u.wait) {
		ik_redis_url_free(&c->r.u);
		free(c);
		return ik_errf(err, IK_CONFIG, "IDEMKIT_CACHE: durability and wait are options "
		    "of a Redis store, not of the cache (it decides nothing)");
	}
	c->r.timeout_ms = CACHE_TIMEOUT_MS;
	c->put = (struct ik_redis_script){ "cache put", put_lua, "" };
	c->open = open;
	c->ops = (struct ik_store_ops){
		.name = "cache",
		.init = ca_init, .claim = ca_claim, .finish = ca_finish, .renew = ca_renew,
		.renotified = ca_renotified, .release = ca_release, .note = ca_note,
		.forget_failed = ca_forget_failed, .get = ca_get, .list = ca_list,
		.close = ca_close, .begin = ca_begin, .commit = ca_commit,
		.stats = ca_stats, .claim_check = ca_claim_check,
	};
	s->ops = &c->ops;
	s->impl = c;
	if (!(c->rest = strdup(rest))) {
		ca_close(s);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	/* A store that is only unreachable now is opened again on use; bad
	 * configuration is still refused at once, and so is an unreachable one
	 * when the outbox is asked for (it may keep none). */
	if (!store(c, err) && (err->code != IK_TEMPFAIL || ik_outbox_url())) {
		rc = err->code;
		ca_close(s);
		s->ops = NULL;
		return rc;
	}
	if (c->inner && c->inner->ops->outbox_lease) {
		c->ops.outbox_lease = ca_outbox_lease;
		c->ops.outbox_read = ca_outbox_read;
		c->ops.outbox_ack = ca_outbox_ack;
		c->ops.outbox_purge = ca_outbox_purge;
		c->ops.outbox_stats = ca_outbox_stats;
		c->ops.outbox_batch = c->inner->ops->outbox_batch;
	}
	ik_errclear(err);
	return IK_OK;
}
