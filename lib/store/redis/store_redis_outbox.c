/* store_redis_outbox.c: the Redis store's outbox relay ops (store.h,
 * outbox.h), on the adapter's connection (store_redis.c calls in).
 *
 * Rules: the events are entries of one stream, XADDed by the finish's (or
 * the re-notification's) own script (store_redis.h: LUA_OUTBOX), so
 * the event and the transition are one atomic write, one AOF fsync.  The
 * relay reads them through the consumer group RS_OUTBOX_GROUP as consumer
 * = its lease holder token: first every pending entry (delivered and not
 * acknowledged: a dead relay's, or its own after a lost checkpoint), taken
 * over with XAUTOCLAIM, then new ones (XREADGROUP >); pending entries are
 * always older than new ones, so the store's order holds.  The checkpoint
 * is XACK, in the script that checks the lease is still the caller's (the
 * fence), which also takes the acknowledged ones off the count of those
 * waiting (RS_OUTBOX_WAITING: the lag gauge).  The lease is one key, SET PX by a compare-and-set script on the
 * server's clock.  Acknowledged entries stay in the stream for the
 * retention, counted from their writing (the entry id's time: Redis keeps
 * no acknowledgement time), and are trimmed by MINID in batches, never
 * past the oldest entry still waiting.  Every step is one script: nothing
 * is read first and written after.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn/redis.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/redis/store_redis.h"
#include "store/store.h"

#define LUA_NOW \
	"local t = redis.call('TIME')\n" \
	"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

/* KEYS: the lease.  ARGV: holder, lease ms (0: end ours).  {1, end} when
 * taken (or ended), {0, the holder's end} when another holds it; the
 * key's expiry (PX) is the lease's end, so a lease that ended is gone. */
static const char lease_lua[] = LUA_NOW
	"local cur = redis.call('GET', KEYS[1])\n"
	"if cur and cur ~= ARGV[1] then\n"
	"  return {0, now + math.max(redis.call('PTTL', KEYS[1]), 0)}\n"
	"end\n"
	"local ms = tonumber(ARGV[2])\n"
	"if ms == 0 then\n"
	"  if cur then redis.call('DEL', KEYS[1]) end\n"
	"  return {1, now}\n"
	"end\n"
	"redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)\n"
	"return {1, now + ms}\n";

/* KEYS: the stream.  ARGV: holder (the consumer), max.  Up to max entries
 * ({id, {field, value...}}), oldest first: the pending ones of any
 * consumer, claimed for this one, then new ones.  The group is made on
 * first use from the stream's start, so no event written before any relay
 * ran is skipped; consumers left with nothing pending (relays that
 * stopped or died) are dropped, so they do not pile up. */
static const char read_lua[] =
	"local max = tonumber(ARGV[2])\n"
	"redis.pcall('XGROUP', 'CREATE', KEYS[1], '" RS_OUTBOX_GROUP "', '0', 'MKSTREAM',\n"
	"  'ENTRIESREAD', '0')\n"
	"local out, cur = {}, '0-0'\n"
	"for _ = 1, 1000 do\n"
	"  local r = redis.call('XAUTOCLAIM', KEYS[1], '" RS_OUTBOX_GROUP "', ARGV[1], 0, cur,\n"
	"    'COUNT', max - #out)\n"
	"  for _, e in ipairs(r[2]) do out[#out + 1] = e end\n"
	"  cur = r[1]\n"
	"  if cur == '0-0' or #out >= max then break end\n"
	"end\n"
	"if cur == '0-0' and #out < max then\n"
	"  local r = redis.call('XREADGROUP', 'GROUP', '" RS_OUTBOX_GROUP "', ARGV[1],\n"
	"    'COUNT', max - #out, 'STREAMS', KEYS[1], '>')\n"
	"  if r then for _, e in ipairs(r[1][2]) do out[#out + 1] = e end end\n"
	"end\n"
	"local c = redis.call('XINFO', 'CONSUMERS', KEYS[1], '" RS_OUTBOX_GROUP "')\n"
	"for i = 1, math.min(#c, 200) do\n"
	"  local name, pending\n"
	"  for j = 1, #c[i], 2 do\n"
	"    if c[i][j] == 'name' then name = c[i][j + 1]\n"
	"    elseif c[i][j] == 'pending' then pending = c[i][j + 1] end\n"
	"  end\n"
	"  if name ~= ARGV[1] and pending == 0 then\n"
	"    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], '" RS_OUTBOX_GROUP "', name)\n"
	"  end\n"
	"end\n"
	"return out\n";

/* KEYS: the lease, the stream, the waiting count.  ARGV: holder, entry
 * ids.  1 when acknowledged, 0 (nothing acknowledged) when the lease is
 * not the holder's or has ended. */
static const char ack_lua[] =
	"if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n"
	"local n = redis.call('XACK', KEYS[2], '" RS_OUTBOX_GROUP "', unpack(ARGV, 2))\n"
	"if n > 0 then redis.call('DECRBY', KEYS[3], n) end\n"
	"return 1\n";

/* Shared by purge and stats: the group's fields (nil when there is none
 * yet), an entry id's order, and the oldest entry still waiting (the
 * first pending one, else the first not yet delivered; nil when none). */
#define LUA_GROUP \
	"local function group()\n" \
	"  if redis.call('EXISTS', KEYS[1]) == 0 then return nil end\n" \
	"  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do\n" \
	"    local f = {}\n" \
	"    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end\n" \
	"    if f.name == '" RS_OUTBOX_GROUP "' then return f end\n" \
	"  end\n" \
	"  return nil\n" \
	"end\n" \
	"local function split(id)\n" \
	"  local ms, sq = string.match(id, '^(%d+)-(%d+)$')\n" \
	"  return tonumber(ms), tonumber(sq)\n" \
	"end\n" \
	"local function before(a, b)\n" \
	"  local am, as = split(a)\n" \
	"  local bm, bs = split(b)\n" \
	"  return am < bm or (am == bm and as < bs)\n" \
	"end\n" \
	"local function oldest(g)\n" \
	"  if g and g.pending > 0 then\n" \
	"    return redis.call('XPENDING', KEYS[1], '" RS_OUTBOX_GROUP "')[2]\n" \
	"  end\n" \
	"  local from = '-'\n" \
	"  if g then from = '(' .. g['last-delivered-id'] end\n" \
	"  local e = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', 1)\n" \
	"  if #e > 0 then return e[1][1] end\n" \
	"  return nil\n" \
	"end\n"

/* KEYS: the stream.  ARGV: before ms, batch.  How many entries were
 * trimmed: up to batch of those written before `before` and already
 * acknowledged, oldest first (MINID: the stream's head only, never an
 * entry still waiting). */
static const char purge_lua[] = LUA_GROUP
	"local g = group()\n"
	"if not g then return 0 end\n"
	"local bound = string.format('%.0f-0', tonumber(ARGV[1]))\n"
	"local w = oldest(g)\n"
	"if w and before(w, bound) then bound = w end\n"
	"local batch = tonumber(ARGV[2])\n"
	"local ids = redis.call('XRANGE', KEYS[1], '-', '(' .. bound, 'COUNT', batch)\n"
	"if #ids == 0 then return 0 end\n"
	"if #ids == batch then\n"
	"  local ms, sq = split(ids[#ids][1])\n"
	"  bound = string.format('%.0f-%.0f', ms, sq + 1)\n"
	"end\n"
	"return redis.call('XTRIM', KEYS[1], 'MINID', bound)\n";

/* KEYS: the stream, the waiting count.  {now, waiting, the oldest waiting
 * entry's time (0: none), in the stream}, without a walk of the stream. */
static const char stats_lua[] = LUA_NOW LUA_GROUP
	"if redis.call('EXISTS', KEYS[1]) == 0 then return {now, 0, 0, 0} end\n"
	"local len = redis.call('XLEN', KEYS[1])\n"
	"local waiting = tonumber(redis.call('GET', KEYS[2])) or 0\n"
	"waiting = math.max(0, math.min(waiting, len))\n"
	"local w = oldest(group())\n"
	"local at = 0\n"
	"if w and waiting > 0 then at = split(w) end\n"
	"return {now, waiting, at, len}\n";

static const struct ik_redis_script scripts[RS_OB_N] = {
	[RS_OB_LEASE] = { "outbox lease", lease_lua, "" },
	[RS_OB_READ] = { "outbox read", read_lua, "" },
	[RS_OB_ACK] = { "outbox checkpoint", ack_lua, "" },
	[RS_OB_PURGE] = { "outbox purge", purge_lua, "" },
	[RS_OB_STATS] = { "outbox stats", stats_lua, "" },
};

void
ik_rs_outbox_init(struct ik_rs_outbox *o)
{
	memcpy(o->sc, scripts, sizeof o->sc);
	o->holder = NULL;
}

void
ik_rs_outbox_free(struct ik_rs_outbox *o)
{
	free(o->holder);
	o->holder = NULL;
}

static int64_t
num(const redisReply *v)
{
	if (v && v->type == REDIS_REPLY_INTEGER)
		return v->integer;
	if (v && v->type == REDIS_REPLY_STRING && v->str)
		return strtoll(v->str, NULL, 10);
	return 0;
}

static int
bad(struct ik_redis *r, const char *what, redisReply *rep, ik_err *err)
{
	freeReplyObject(rep);
	return ik_errf(err, IK_SOFTWARE, "%s: %s: unexpected reply from the script",
	    r->u.label, what);
}

int
ik_rs_outbox_lease(struct ik_redis *r, struct ik_rs_outbox *o, const char *holder,
    int64_t lease_ms, int64_t *until, ik_err *err)
{
	char ms[32];
	redisReply *rep;
	int rc;

	snprintf(ms, sizeof ms, "%lld", (long long)lease_ms);
	rep = ik_redis_eval(r, &o->sc[RS_OB_LEASE], 1, 3,
	    (const char *[]){ RS_OUTBOX_LEASE, holder, ms }, NULL, r->u.wait, err);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
		return bad(r, "outbox lease", rep, err);
	rc = num(rep->element[0]) == 1 ? IK_OK : IK_DUP_IN_PROGRESS;
	*until = num(rep->element[1]);
	freeReplyObject(rep);
	if (rc == IK_OK && lease_ms > 0 && (!o->holder || strcmp(o->holder, holder) != 0)) {
		free(o->holder);
		if (!(o->holder = strdup(holder)))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	return rc;
}

/* One stream entry {id, {field, value...}} as an event; IK_OK, or
 * IK_SOFTWARE for an entry this adapter did not write. */
static int
entry(const redisReply *e, struct ik_outbox_ev *ev)
{
	const redisReply *f;

	memset(ev, 0, sizeof *ev);
	if (!e || e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
	    (f = e->element[1])->type != REDIS_REPLY_ARRAY)
		return IK_SOFTWARE;
	ev->pos = ik_redis_str(e->element[0]);
	ev->seq = ev->pos ? strtoll(ev->pos, NULL, 10) : 0;   /* the ms part */
	ev->at = ev->seq;
	for (size_t i = 0; i + 1 < f->elements; i += 2) {
		const char *k = f->element[i]->str ? f->element[i]->str : "";
		char **to = strcmp(k, "id") == 0 ? &ev->id : strcmp(k, "chargeId") == 0 ?
		    &ev->charge_id : strcmp(k, "type") == 0 ? &ev->type :
		    strcmp(k, "body") == 0 ? &ev->body : NULL;
		if (to && !*to)
			*to = ik_redis_str(f->element[i + 1]);
	}
	return ev->pos && ev->id && ev->charge_id && ev->type && ev->body ? IK_OK : IK_SOFTWARE;
}

int
ik_rs_outbox_read(struct ik_redis *r, struct ik_rs_outbox *o, size_t max,
    struct ik_outbox_ev *ev, size_t *n, ik_err *err)
{
	char m[32];
	redisReply *rep;

	*n = 0;
	if (!o->holder)
		return ik_errf(err, IK_SOFTWARE, "%s: outbox read before the relay lease",
		    r->u.label);
	snprintf(m, sizeof m, "%zu", max);
	rep = ik_redis_eval(r, &o->sc[RS_OB_READ], 1, 3,
	    (const char *[]){ RS_OUTBOX_STREAM, o->holder, m }, NULL, 0, err);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements > max)
		return bad(r, "outbox read", rep, err);
	for (size_t i = 0; i < rep->elements; i++) {
		if (entry(rep->element[i], &ev[i]) != IK_OK) {
			char at[64];
			snprintf(at, sizeof at, "%s", ev[i].pos ? ev[i].pos : "?");
			for (size_t j = 0; j <= i; j++)
				ik_outbox_ev_free(&ev[j]);
			freeReplyObject(rep);
			return ik_errf(err, IK_SOFTWARE, "%s: outbox entry %s of %s is not an "
			    "event (out of memory, or written by something else)", r->u.label,
			    at, RS_OUTBOX_STREAM);
		}
		(*n)++;
	}
	freeReplyObject(rep);
	return IK_OK;
}

int
ik_rs_outbox_ack(struct ik_redis *r, struct ik_rs_outbox *o, const char *holder,
    const struct ik_outbox_ev *ev, size_t n, ik_err *err)
{
	const char **av = calloc(n + 4, sizeof *av);
	redisReply *rep;
	int rc;

	if (!av)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (n == 0) {
		free(av);
		return IK_OK;
	}
	av[0] = RS_OUTBOX_LEASE;
	av[1] = RS_OUTBOX_STREAM;
	av[2] = RS_OUTBOX_WAITING;
	av[3] = holder;
	for (size_t i = 0; i < n; i++)
		av[4 + i] = ev[i].pos ? ev[i].pos : "0-0";
	rep = ik_redis_eval(r, &o->sc[RS_OB_ACK], 3, (int)n + 4, av, NULL, r->u.wait, err);
	free(av);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_INTEGER)
		return bad(r, "outbox checkpoint", rep, err);
	rc = rep->integer == 1 ? IK_OK : IK_LEASE_LOST;
	freeReplyObject(rep);
	return rc;
}

int
ik_rs_outbox_purge(struct ik_redis *r, struct ik_rs_outbox *o, int64_t before_ms,
    size_t batch, int64_t *n, ik_err *err)
{
	char b[32], k[32];
	redisReply *rep;

	*n = 0;
	snprintf(b, sizeof b, "%lld", (long long)before_ms);
	snprintf(k, sizeof k, "%zu", batch);
	rep = ik_redis_eval(r, &o->sc[RS_OB_PURGE], 1, 3,
	    (const char *[]){ RS_OUTBOX_STREAM, b, k }, NULL, 0, err);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_INTEGER)
		return bad(r, "outbox purge", rep, err);
	*n = rep->integer;
	freeReplyObject(rep);
	return IK_OK;
}

int
ik_rs_outbox_stats(struct ik_redis *r, struct ik_rs_outbox *o, struct ik_outbox_stats *st,
    ik_err *err)
{
	redisReply *rep;
	int64_t now, at;

	memset(st, 0, sizeof *st);
	rep = ik_redis_eval(r, &o->sc[RS_OB_STATS], 2, 2,
	    (const char *[]){ RS_OUTBOX_STREAM, RS_OUTBOX_WAITING }, NULL, 0, err);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 4)
		return bad(r, "outbox stats", rep, err);
	/* the age on the server's clock: the entry ids are its times */
	now = num(rep->element[0]);
	st->waiting = num(rep->element[1]);
	at = num(rep->element[2]);
	st->oldest_ms = st->waiting && at && now > at ? now - at : 0;
	st->published = num(rep->element[3]) - st->waiting;
	if (st->published < 0)
		st->published = 0;
	freeReplyObject(rep);
	return IK_OK;
}
