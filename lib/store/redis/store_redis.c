/* store_redis.c: the idempotency store on a durable Redis
 * (redis://[USER:PASSWORD@]HOST:PORT[/DB][?durability=unsafe&wait=N]).
 *
 * Rules: claim, finish, renotified, release, forget and each page of list
 * are ONE Lua script, so every check and its write are atomic on the
 * server; nothing is ever read first and written after.  The lease is set
 * and compared on the server's clock (TIME inside the script); a refused
 * claim returns the record and the server's time, and ik_claim_decide
 * says what it means.  finish is fenced by the owner token.  Retention is
 * the key's PEXPIREAT, never before the lease's end on the server's clock
 * (expiresAt is on the claiming worker's): a key gone while its lease is
 * live would let a second worker claim the charge afresh.  Recovery lists never SCAN the keyspace: the
 * scripts keep every record's key in one sorted set per state (by lease
 * end for IN_PROGRESS, by update time for the others); a list page drops
 * the members whose record expired or moved on, and each finish drops the
 * oldest such members of the set it adds to, so the sets stay the size of
 * the live records.
 *
 * Durability is checked, not assumed: on every connect the server must
 * say appendonly yes and appendfsync always (CONFIG GET), else the store
 * refuses (IK_CONFIG) unless the URL says durability=unsafe.  ?wait=N
 * sends WAIT N after every script in the same round trip.
 *
 * Outbox (store.h): with $IDEMKIT_OUTBOX set, the finish and
 * re-notification scripts XADD the transition's event to the stream
 * idemkit:outbox in the same script (store_redis.h), and only when
 * the transition happens; the relay's ops are store_redis_outbox.c.
 *
 * Layout: idemkit:rec:CHARGEID is a hash of the record's fields (state,
 * owner, leaseUntil, attempts, fingerprint, event, debitRef, lastError,
 * createdAt, updatedAt, expiresAt); idemkit:idx:STATE the sorted sets.
 * One Redis primary (with replicas), not Redis Cluster: the scripts touch
 * a record and an index that need not share a slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn/redis.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/redis/store_redis.h"
#include "store/store.h"

#define REC_PREFIX "idemkit:rec:"
#define IDX_PREFIX "idemkit:idx:"
#define LIVE_PREFIX "idemkit:live:"
#define LIST_PAGE "200"
#define XSTR(x) STR(x)
#define STR(x) #x

/* Shared by every script: the server's clock in ms, numbers written as
 * integers (Lua's tostring would print 1.7644608e+12), and hpush: the
 * record KEYS[1]'s history (store.h) with entry e appended, the last
 * IK_HISTORY_MAX kept, in the script of the transition. */
#define LUA_PRELUDE \
	"local t = redis.call('TIME')\n" \
	"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
	"local function s(n) return string.format('%.0f', n) end\n" \
	"local function hpush(e)\n" \
	"  local h = redis.call('HGET', KEYS[1], 'history')\n" \
	"  local a = {}\n" \
	"  if h then a = cjson.decode(h) end\n" \
	"  a[#a + 1] = e\n" \
	"  while #a > " XSTR(IK_HISTORY_MAX) " do table.remove(a, 1) end\n" \
	"  redis.call('HSET', KEYS[1], 'history', cjson.encode(a))\n" \
	"end\n"

/* Drops up to two members at the head of index KEYS[n] whose record is
 * gone (expired) or in another state: a finish adds one, so the index
 * keeps pace with the records' expiry. */
#define LUA_PRUNE \
	"local function prune(idx, st)\n" \
	"  for _, m in ipairs(redis.call('ZRANGE', idx, 0, 1)) do\n" \
	"    if redis.call('HGET', '" REC_PREFIX "' .. m, 'state') == st then break end\n" \
	"    redis.call('ZREM', idx, m)\n" \
	"  end\n" \
	"end\n"

enum { S_CLAIM, S_FINISH, S_RENOTIFIED, S_RELEASE, S_FORGET, S_LIST, S_STATS, S_BACKFILL,
       S_RENEW, S_NOTE, S_N };

/* KEYS: record, IN_PROGRESS index.  ARGV: chargeId, token, lease ms,
 * fingerprint, event, expiresAt (epoch s).  {1, attempts, leaseUntil,
 * now} when claimed, else {0, now, the record's fields}. */
static const char claim_lua[] = LUA_PRELUDE
	"local lease = now + tonumber(ARGV[3])\n"
	"local st = redis.call('HGET', KEYS[1], 'state')\n"
	"local function take(a)\n"
	"  redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'leaseUntil', s(lease),\n"
	"    'updatedAt', s(now), 'expiresAt', ARGV[6])\n"
	"  redis.call('PEXPIREAT', KEYS[1], s(math.max(tonumber(ARGV[6]) * 1000, lease)))\n"
	"  redis.call('ZADD', KEYS[2], s(lease), ARGV[1])\n"
	"  hpush({at = now, op = 'claim', attempt = a, leaseUntil = lease, owner = ARGV[2]})\n"
	"  return {1, a, lease, now}\n"
	"end\n"
	"if not st then\n"
	"  redis.call('HSET', KEYS[1], 'state', 'IN_PROGRESS', 'attempts', '1',\n"
	"    'fingerprint', ARGV[4], 'event', ARGV[5], 'createdAt', s(now))\n"
	"  return take(1)\n"
	"end\n"
	"if st == 'IN_PROGRESS' then\n"
	"  local r = redis.call('HMGET', KEYS[1], 'leaseUntil', 'fingerprint')\n"
	"  local lu = tonumber(r[1])\n"
	"  if lu and lu < now and r[2] == ARGV[4] then\n"
	"    redis.call('HDEL', KEYS[1], 'lastError')\n"
	"    return take(redis.call('HINCRBY', KEYS[1], 'attempts', 1))\n"
	"  end\n"
	"end\n"
	"return {0, now, redis.call('HGETALL', KEYS[1])}\n";

/* KEYS: record, IN_PROGRESS index, the new state's index, its live set
 * (FAILED and DNF: by expiry, for stats), the outbox stream.  ARGV:
 * chargeId, token, state, has ref, ref, has error, error, the event's
 * eventId ('': the outbox is off), bank replayed ("1": the history entry
 * says so).  1 or 0. */
static const char finish_lua[] = LUA_PRELUDE LUA_PRUNE LUA_OUTBOX
	"local r = redis.call('HMGET', KEYS[1], 'state', 'owner')\n"
	"if r[1] ~= 'IN_PROGRESS' or r[2] ~= ARGV[2] then return 0 end\n"
	"redis.call('HSET', KEYS[1], 'state', ARGV[3], 'updatedAt', s(now))\n"
	"if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'debitRef', ARGV[5]) end\n"
	"if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'lastError', ARGV[7])\n"
	"else redis.call('HDEL', KEYS[1], 'lastError') end\n"
	"redis.call('ZREM', KEYS[2], ARGV[1])\n"
	"redis.call('ZADD', KEYS[3], s(now), ARGV[1])\n"
	"prune(KEYS[3], ARGV[3])\n"
	"if ARGV[3] ~= 'DONE' then\n"
	"  local exp = tonumber(redis.call('HGET', KEYS[1], 'expiresAt')) or 0\n"
	"  redis.call('ZADD', KEYS[4], s(exp * 1000), ARGV[1])\n"
	"  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. s(now))\n"
	"end\n"
	"local function opt(has, v) if has == '1' then return v end return cjson.null end\n"
	"hpush({at = now, op = 'finish', state = ARGV[3], owner = ARGV[2],\n"
	"  debitRef = opt(ARGV[4], ARGV[5]), error = opt(ARGV[6], ARGV[7]),\n"
	"  bankReplayed = ARGV[9] == '1' or nil})\n"
	"if ARGV[8] ~= '' then outbox(KEYS[5], ARGV[8], 'charge.finished') end\n"
	"return 1\n";

/* KEYS: record, DNF index, DONE index, DNF live set, the outbox stream.
 * ARGV: chargeId, the event's eventId ('': the outbox is off), the owner
 * it was computed for.  1, 0, or 2 when the record's owner is not that
 * one (the eventId is then another's: compute it again). */
static const char renotified_lua[] = LUA_PRELUDE LUA_PRUNE LUA_OUTBOX
	"local r = redis.call('HMGET', KEYS[1], 'state', 'owner')\n"
	"if r[1] ~= 'DEBITED_NOTIFICATION_FAILED' then return 0 end\n"
	"if ARGV[2] ~= '' and r[2] ~= ARGV[3] then return 2 end\n"
	"redis.call('HSET', KEYS[1], 'state', 'DONE', 'updatedAt', s(now))\n"
	"redis.call('HDEL', KEYS[1], 'lastError')\n"
	"redis.call('ZREM', KEYS[2], ARGV[1])\n"
	"redis.call('ZADD', KEYS[3], s(now), ARGV[1])\n"
	"prune(KEYS[3], 'DONE')\n"
	"redis.call('ZREM', KEYS[4], ARGV[1])\n"
	"hpush({at = now, op = 'renotified', state = 'DONE'})\n"
	"if ARGV[2] ~= '' then outbox(KEYS[5], ARGV[2], 'charge.renotified') end\n"
	"return 1\n";

/* KEYS: record, IN_PROGRESS index.  ARGV: chargeId, token.  1 or 0. */
static const char release_lua[] = LUA_PRELUDE
	"local r = redis.call('HMGET', KEYS[1], 'state', 'owner')\n"
	"if r[1] ~= 'IN_PROGRESS' or r[2] ~= ARGV[2] then return 0 end\n"
	"redis.call('HSET', KEYS[1], 'leaseUntil', '0', 'updatedAt', s(now))\n"
	"redis.call('ZADD', KEYS[2], '0', ARGV[1])\n"
	"hpush({at = now, op = 'release', owner = ARGV[2]})\n"
	"return 1\n";

/* KEYS: record.  ARGV: token, reason.  1 or 0.  The reason a claim is
 * left (store.h's note), fenced as the finish is; nothing else changes, no
 * history. */
static const char note_lua[] =
	"local r = redis.call('HMGET', KEYS[1], 'state', 'owner')\n"
	"if r[1] ~= 'IN_PROGRESS' or r[2] ~= ARGV[1] then return 0 end\n"
	"redis.call('HSET', KEYS[1], 'lastError', ARGV[2])\n"
	"return 1\n";

/* KEYS: record, IN_PROGRESS index (by lease end).  ARGV: chargeId, token,
 * lease ms.  1 or 0.  No history (store.h). */
static const char renew_lua[] = LUA_PRELUDE
	"local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'leaseUntil')\n"
	"if r[1] ~= 'IN_PROGRESS' or r[2] ~= ARGV[2] or r[3] == '0' then return 0 end\n"
	"local lease = now + tonumber(ARGV[3])\n"
	"redis.call('HSET', KEYS[1], 'leaseUntil', s(lease))\n"
	"redis.call('ZADD', KEYS[2], s(lease), ARGV[1])\n"
	"return 1\n";

/* KEYS: record, FAILED index, FAILED live set.  ARGV: chargeId.  1 or 0. */
static const char forget_lua[] =
	"if redis.call('HGET', KEYS[1], 'state') ~= 'FAILED' then return 0 end\n"
	"redis.call('DEL', KEYS[1])\n"
	"redis.call('ZREM', KEYS[2], ARGV[1])\n"
	"redis.call('ZREM', KEYS[3], ARGV[1])\n"
	"return 1\n";

/* The stats op (store.h), never a walk of the DONE records.  KEYS: the
 * IN_PROGRESS index, the DNF index, the FAILED and DNF live sets, the DONE
 * index.  FAILED and DNF are counted from their live sets (scored by the
 * record's expiry, so an expired record drops out of the count the moment
 * Redis forgets it); IN_PROGRESS is its index's size less the dead members
 * of its ended-lease part, which is walked for stuck and its oldest (a dead
 * member -- expired, or moved on -- always has an ended lease); the oldest
 * DNF is the first live member from the head of its index; DONE is its
 * index's size, an estimate (members of expired records stay until a
 * finish or a list prunes them).  Dead members met are dropped.  Returns
 * {now, in_progress, stuck, oldest stuck updatedAt, dnf, oldest dnf
 * updatedAt, failed, done}. */
static const char stats_lua[] = LUA_PRELUDE
	"local ip, stuck, ost, odnf = redis.call('ZCARD', KEYS[1]), 0, 0, 0\n"
	"local function rec(m)\n"
	"  return redis.call('HMGET', '" REC_PREFIX "' .. m, 'state', 'updatedAt', 'leaseUntil')\n"
	"end\n"
	"for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. s(now))) do\n"
	"  local r = rec(m)\n"
	"  if r[1] ~= 'IN_PROGRESS' then\n"
	"    redis.call('ZREM', KEYS[1], m)\n"
	"    ip = ip - 1\n"
	"  elseif (tonumber(r[3]) or 0) < now then\n"
	"    stuck = stuck + 1\n"
	"    local u = tonumber(r[2]) or 0\n"
	"    if ost == 0 or u < ost then ost = u end\n"
	"  end\n"
	"end\n"
	"while true do\n"
	"  local ids = redis.call('ZRANGE', KEYS[2], 0, 49)\n"
	"  if #ids == 0 then break end\n"
	"  for _, m in ipairs(ids) do\n"
	"    local r = rec(m)\n"
	"    if r[1] == 'DEBITED_NOTIFICATION_FAILED' then odnf = tonumber(r[2]) or 0 break end\n"
	"    redis.call('ZREM', KEYS[2], m)\n"
	"  end\n"
	"  if odnf > 0 then break end\n"
	"end\n"
	"return {now, ip, stuck, ost, redis.call('ZCOUNT', KEYS[4], s(now), '+inf'), odnf,\n"
	"  redis.call('ZCOUNT', KEYS[3], s(now), '+inf'), redis.call('ZCARD', KEYS[5])}\n";

/* One page of an index.  KEYS: the index.  ARGV: state, cursor score
 * ('-inf' to start), cursor member, 'expired' or '', older-than ms, page
 * size.  Members at the cursor's score up to the cursor member (bytewise,
 * as the sorted set orders them) were seen already.  Returns {now,
 * next score, next member, done, member, fields, member, fields...}. */
static const char list_lua[] = LUA_PRELUDE
	"local function le(a, b)\n"
	"  for i = 1, math.min(#a, #b) do\n"
	"    local x, y = a:byte(i), b:byte(i)\n"
	"    if x ~= y then return x < y end\n"
	"  end\n"
	"  return #a <= #b\n"
	"end\n"
	"local min, last, limit = ARGV[2], ARGV[3], tonumber(ARGV[6])\n"
	"local max, cut = '+inf', nil\n"
	"if ARGV[4] == 'expired' then max = '(' .. s(now) end\n"
	"if tonumber(ARGV[5]) > 0 then\n"
	"  cut = now - tonumber(ARGV[5])\n"
	"  if ARGV[1] ~= 'IN_PROGRESS' then max = '(' .. s(cut) end\n"
	"end\n"
	"local out, dead, off, n, done = {now, min, last, 1}, {}, 0, 0, true\n"
	"while done do\n"
	"  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], min, max, 'WITHSCORES', 'LIMIT', off, 50)\n"
	"  if #ids == 0 then break end\n"
	"  off = off + #ids / 2\n"
	"  for i = 1, #ids, 2 do\n"
	"    local m, sc = ids[i], ids[i + 1]\n"
	"    if not (last ~= '' and tonumber(sc) == tonumber(min) and le(m, last)) then\n"
	"      if n >= limit then done = false break end\n"
	"      n = n + 1\n"
	"      out[2], out[3] = sc, m\n"
	"      local h = redis.call('HGETALL', '" REC_PREFIX "' .. m)\n"
	"      local st, up\n"
	"      for j = 1, #h, 2 do\n"
	"        if h[j] == 'state' then st = h[j + 1] elseif h[j] == 'updatedAt' then up = tonumber(h[j + 1]) end\n"
	"      end\n"
	"      if st ~= ARGV[1] then dead[#dead + 1] = m\n"
	"      elseif not cut or (up and up < cut) then\n"
	"        out[#out + 1] = m\n"
	"        out[#out + 1] = h\n"
	"      end\n"
	"    end\n"
	"  end\n"
	"end\n"
	"if not done then out[4] = 0 end\n"
	"for _, m in ipairs(dead) do redis.call('ZREM', KEYS[1], m) end\n"
	"return out\n";

/* For idemp-init: one page of a FAILED or DNF index into its live set, for
 * records written before the live sets were.  KEYS: the index, the live
 * set.  ARGV: state, first rank, page size.  The members read. */
static const char backfill_lua[] =
	"local ids = redis.call('ZRANGE', KEYS[1], tonumber(ARGV[2]),\n"
	"  tonumber(ARGV[2]) + tonumber(ARGV[3]) - 1)\n"
	"for _, m in ipairs(ids) do\n"
	"  local r = redis.call('HMGET', '" REC_PREFIX "' .. m, 'state', 'expiresAt')\n"
	"  if r[1] == ARGV[1] then\n"
	"    redis.call('ZADD', KEYS[2], string.format('%.0f', (tonumber(r[2]) or 0) * 1000), m)\n"
	"  end\n"
	"end\n"
	"return #ids\n";

struct rs {
	struct ik_redis r;
	struct ik_redis_script sc[S_N];
	int outbox;                  /* $IDEMKIT_OUTBOX set at open */
	struct ik_rs_outbox ob;
};

static const struct ik_redis_script scripts[S_N] = {
	[S_CLAIM] = { "claim", claim_lua, "" },
	[S_FINISH] = { "finish", finish_lua, "" },
	[S_RENOTIFIED] = { "renotified", renotified_lua, "" },
	[S_RELEASE] = { "release", release_lua, "" },
	[S_FORGET] = { "forget", forget_lua, "" },
	[S_LIST] = { "list", list_lua, "" },
	[S_STATS] = { "stats", stats_lua, "" },
	[S_BACKFILL] = { "backfill", backfill_lua, "" },
	[S_RENEW] = { "renew", renew_lua, "" },
	[S_NOTE] = { "note", note_lua, "" },
};

/* ---- records ----------------------------------------------------------- */

static char *
rec_key(const char *id)
{
	struct ik_buf b = { 0 };

	ik_buf_addstr(&b, REC_PREFIX);
	ik_buf_addstr(&b, id);
	return b.p;
}

static char *
idx_key(enum ik_state st, char *buf, size_t n)
{
	snprintf(buf, n, IDX_PREFIX "%s", ik_state_name(st));
	return buf;
}

static char *
live_key(enum ik_state st, char *buf, size_t n)
{
	snprintf(buf, n, LIVE_PREFIX "%s", ik_state_name(st));
	return buf;
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

/* A record from HGETALL's flat field/value array; IK_EMPTY when empty. */
static int
read_fields(const char *id, const redisReply *a, struct ik_record *r)
{
	memset(r, 0, sizeof *r);
	if (!a || a->type != REDIS_REPLY_ARRAY || a->elements < 2)
		return IK_EMPTY;
	r->key = ik_strdup(id);
	for (size_t i = 0; i + 1 < a->elements; i += 2) {
		const char *f = a->element[i]->str ? a->element[i]->str : "";
		const redisReply *v = a->element[i + 1];
		if (strcmp(f, "state") == 0) {
			char *st = ik_redis_str(v);
			r->state = ik_state_parse(st);
			free(st);
		} else if (strcmp(f, "owner") == 0)
			r->owner = ik_redis_str(v);
		else if (strcmp(f, "leaseUntil") == 0)
			r->lease_until = num(v);
		else if (strcmp(f, "attempts") == 0)
			r->attempts = num(v);
		else if (strcmp(f, "fingerprint") == 0)
			r->fingerprint = ik_redis_str(v);
		else if (strcmp(f, "event") == 0)
			r->event = ik_redis_str(v);
		else if (strcmp(f, "debitRef") == 0)
			r->debit_ref = ik_redis_str(v);
		else if (strcmp(f, "lastError") == 0)
			r->last_error = ik_redis_str(v);
		else if (strcmp(f, "createdAt") == 0)
			r->created_at = num(v);
		else if (strcmp(f, "updatedAt") == 0)
			r->updated_at = num(v);
		else if (strcmp(f, "expiresAt") == 0)
			r->expires_at = num(v);
		else if (strcmp(f, "history") == 0)
			r->history = ik_redis_str(v);
	}
	return IK_OK;
}

static int
bad_reply(struct rs *q, const char *what, redisReply *rep, ik_err *err)
{
	freeReplyObject(rep);
	return ik_errf(err, IK_SOFTWARE, "%s: %s: unexpected reply from the script",
	    q->r.u.label, what);
}

/* Runs a script that answers 1 (done) or 0 (condition false). */
static int
run01(struct rs *q, int which, int nkeys, int argc, const char **argv, ik_err *err)
{
	redisReply *rep = ik_redis_eval(&q->r, &q->sc[which], nkeys, argc, argv, NULL,
	    q->r.u.wait, err);
	int rc;

	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_INTEGER)
		return bad_reply(q, q->sc[which].name, rep, err);
	rc = rep->integer == 1 ? IK_OK : IK_LEASE_LOST;
	freeReplyObject(rep);
	return rc;
}

/* ---- the port ---------------------------------------------------------- */

/* Nothing to create: keys appear with the first claim, and connecting
 * (done at open) already checked the server.  The FAILED and DNF records
 * of a store written before the live sets existed are added to them, a
 * page per script so the server is never held long (idempotent; a member
 * removed meanwhile can make the walk skip one, counted again by the next
 * idemp-init). */
static int
rs_init(struct ik_store *st, ik_err *err)
{
	static const enum ik_state states[] = { IK_ST_FAILED, IK_ST_DNF };
	struct rs *q = st->impl;

	for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
		char idx[64], live[64], start[24];
		int64_t n = 0, got;

		do {
			redisReply *rep;
			snprintf(start, sizeof start, "%lld", (long long)n);
			rep = ik_redis_eval(&q->r, &q->sc[S_BACKFILL], 2, 5, (const char *[]){
			    idx_key(states[i], idx, sizeof idx), live_key(states[i], live, sizeof live),
			    ik_state_name(states[i]), start, LIST_PAGE }, NULL, 0, err);
			if (!rep)
				return err->code;
			if (rep->type != REDIS_REPLY_INTEGER)
				return bad_reply(q, "backfill", rep, err);
			got = rep->integer;
			n += got;
			freeReplyObject(rep);
		} while (got == atoi(LIST_PAGE));
	}
	return IK_OK;
}

static int
rs_claim(struct ik_store *st, const struct ik_claim_req *req, struct ik_claim_res *res,
    ik_err *err)
{
	struct rs *q = st->impl;
	char lease[32], exp[32], ip[64];
	char *rk = rec_key(req->key);
	redisReply *rep;
	struct ik_claim_req at;
	int rc;

	memset(res, 0, sizeof *res);
	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(lease, sizeof lease, "%lld", (long long)req->lease_ms);
	snprintf(exp, sizeof exp, "%lld", (long long)req->expires_at);
	rep = ik_redis_eval(&q->r, &q->sc[S_CLAIM], 2, 8, (const char *[]){ rk,
	    idx_key(IK_ST_IN_PROGRESS, ip, sizeof ip), req->key, req->token, lease,
	    req->fingerprint, req->event, exp }, NULL, q->r.u.wait, err);
	free(rk);
	if (!rep)
		return err->code;
	/* read once connected, just before the script went (a reconnect may
	 * have waited): its TIME starts the lease, proven from this (store.h) */
	res->sent_boot_ms = q->r.sent_boot_ms;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 3)
		return bad_reply(q, "claim", rep, err);
	if (num(rep->element[0]) == 1 && rep->elements == 4) {
		res->code = IK_OK;
		res->attempt = num(rep->element[1]);
		res->lease_until = num(rep->element[2]);
		freeReplyObject(rep);
		return IK_OK;
	}
	/* Refused: the record and the server's clock decide. */
	at = *req;
	at.now_ms = num(rep->element[1]);
	rc = read_fields(req->key, rep->element[2], &res->cur);
	freeReplyObject(rep);
	if (rc == IK_EMPTY)
		return ik_errf(err, IK_SOFTWARE, "%s: claim refused but no record", q->r.u.label);
	if ((rc = ik_claim_decide(&at, res, err)) == IK_EMPTY)
		rc = ik_errf(err, IK_SOFTWARE, "%s: claim refused by a claimable record",
		    q->r.u.label);
	if (rc != IK_OK)
		ik_record_free(&res->cur);
	return rc;
}

static int rs_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err);

static int
rs_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err)
{
	struct rs *q = st->impl;
	char ip[64], to[64], live[64], id[IK_EVENT_ID_HEX] = "";
	char *rk = rec_key(req->key);
	int rc;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	/* the owner after a finish is its token (the fence) */
	if (q->outbox)
		ik_outbox_event_id("finish", req->key, req->token, id);
	const char *argv[] = { rk,
	    idx_key(IK_ST_IN_PROGRESS, ip, sizeof ip), idx_key(req->state, to, sizeof to),
	    live_key(req->state, live, sizeof live), RS_OUTBOX_STREAM,
	    req->key, req->token, ik_state_name(req->state),
	    req->debit_ref ? "1" : "0", req->debit_ref ? req->debit_ref : "",
	    req->last_error ? "1" : "0", req->last_error ? req->last_error : "", id,
	    req->bank_replayed ? "1" : "0" };
	rc = run01(q, S_FINISH, 5, 14, argv, err);
	if (rc == IK_TEMPFAIL && q->r.unsure) {
		/* The connection went with the finish sent (a reset, the server's
		 * end of file): whether the server ran it cannot be known, and a
		 * finish left undone after the bank's yes sends the charge to the
		 * bank again.  The finish is fenced by our token, so it is sent
		 * once more on a new connection: if the first ran, this one
		 * matches nothing, and the record read back says whether it is
		 * our finish (ik_finish_decide), as DynamoDB decides a write its
		 * transport re-sent.  Anything else is LEASE_LOST, as always. */
		struct ik_record cur;
		ik_log(IK_LOG_WARN, "finish: the connection was lost before the answer; sending it "
		    "again (fenced by the token)", "chargeId", req->key, "error", err->msg, NULL);
		rc = run01(q, S_FINISH, 5, 14, argv, err);
		if (rc == IK_LEASE_LOST) {
			if ((rc = rs_get(st, req->key, &cur, err)) == IK_OK || rc == IK_EMPTY)
				rc = ik_finish_decide(req, rc == IK_OK ? &cur : NULL);
			ik_record_free(&cur);
		}
	}
	free(rk);
	return rc;
}

static int
rs_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    int64_t lease_ms, ik_err *err)
{
	struct rs *q = st->impl;
	char ip[64], lease[32];
	char *rk = rec_key(key);
	int rc;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
	rc = run01(q, S_RENEW, 2, 5, (const char *[]){ rk,
	    idx_key(IK_ST_IN_PROGRESS, ip, sizeof ip), key, token, lease }, err);
	free(rk);
	return rc;
}

static int
rs_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err)
{
	struct rs *q = st->impl;
	char dnf[64], done[64], live[64], id[IK_EVENT_ID_HEX] = "";
	char *rk = rec_key(key), *owner = NULL;
	redisReply *rep;
	int rc = IK_OK;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	/* The eventId hashes the record's owner, which only the server has: read
	 * it, then the script re-notifies only if it is still that one (a DNF
	 * record's owner never changes; a record claimed and finished again in
	 * between is met again, bounded). */
	for (int attempt = 0; attempt < 5; attempt++) {
		if (q->outbox) {
			rep = ik_redis_cmd(&q->r, "HGET", 3, (const char *[]){ "HGET", rk, "owner" },
			    NULL, err);
			if (!rep) {
				rc = err->code;
				break;
			}
			free(owner);
			owner = ik_redis_str(rep);
			freeReplyObject(rep);
			ik_outbox_event_id("renotified", key, owner, id);
		}
		rep = ik_redis_eval(&q->r, &q->sc[S_RENOTIFIED], 5, 8, (const char *[]){ rk,
		    idx_key(IK_ST_DNF, dnf, sizeof dnf), idx_key(IK_ST_DONE, done, sizeof done),
		    live_key(IK_ST_DNF, live, sizeof live), RS_OUTBOX_STREAM, key, id,
		    owner ? owner : "" }, NULL, q->r.u.wait, err);
		if (!rep) {
			rc = err->code;
			break;
		}
		if (rep->type != REDIS_REPLY_INTEGER) {
			rc = bad_reply(q, "renotified", rep, err);
			break;
		}
		rc = rep->integer == 1 ? IK_OK : rep->integer == 0 ? IK_LEASE_LOST : -1;
		freeReplyObject(rep);
		if (rc != -1)
			break;
	}
	if (rc == -1)
		rc = ik_errf(err, IK_TEMPFAIL, "%s: renotified: the record's owner kept changing",
		    q->r.u.label);
	free(owner);
	free(rk);
	return rc;
}

static int
rs_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    ik_err *err)
{
	struct rs *q = st->impl;
	char ip[64];
	char *rk = rec_key(key);
	int rc;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = run01(q, S_RELEASE, 2, 4, (const char *[]){ rk,
	    idx_key(IK_ST_IN_PROGRESS, ip, sizeof ip), key, token }, err);
	free(rk);
	return rc;
}

static int
rs_note(struct ik_store *st, const char *key, const char *token, const char *reason,
    ik_err *err)
{
	struct rs *q = st->impl;
	char *rk = rec_key(key);
	int rc;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = run01(q, S_NOTE, 1, 3, (const char *[]){ rk, token, reason }, err);
	free(rk);
	return rc;
}

static int
rs_forget_failed(struct ik_store *st, const char *key, ik_err *err)
{
	struct rs *q = st->impl;
	char fi[64], live[64];
	char *rk = rec_key(key);
	int rc;

	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = run01(q, S_FORGET, 3, 4, (const char *[]){ rk,
	    idx_key(IK_ST_FAILED, fi, sizeof fi), live_key(IK_ST_FAILED, live, sizeof live), key },
	    err);
	free(rk);
	return rc == IK_LEASE_LOST ? IK_EMPTY : rc;
}

static int
rs_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err)
{
	struct rs *q = st->impl;
	char *rk = rec_key(key);
	redisReply *rep;
	int rc;

	memset(r, 0, sizeof *r);
	if (!rk)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rep = ik_redis_cmd(&q->r, "HGETALL", 2, (const char *[]){ "HGETALL", rk }, NULL, err);
	free(rk);
	if (!rep)
		return err->code;
	rc = read_fields(key, rep, r);
	freeReplyObject(rep);
	return rc;
}

/* Every page of one state's index through the list script. */
static int
list_index(struct rs *q, enum ik_state state, const struct ik_list_filter *f,
    ik_record_cb cb, void *arg, int *n, ik_err *err)
{
	char idx[64], older[32], *score = strdup("-inf"), *member = strdup("");
	int rc = IK_OK, done = 0, stop = 0;

	snprintf(older, sizeof older, "%lld", (long long)f->older_than_ms);
	while (rc == IK_OK && !done && !stop && score && member) {
		redisReply *rep = ik_redis_eval(&q->r, &q->sc[S_LIST], 1, 7, (const char *[]){
		    idx_key(state, idx, sizeof idx), ik_state_name(state), score, member,
		    f->expired ? "expired" : "", older, LIST_PAGE }, NULL, 0, err);
		if (!rep) {
			rc = err->code;
			break;
		}
		if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 4) {
			rc = bad_reply(q, "list", rep, err);
			break;
		}
		free(score);
		free(member);
		score = ik_redis_str(rep->element[1]);
		member = ik_redis_str(rep->element[2]);
		done = num(rep->element[3]) == 1;
		for (size_t i = 4; i + 1 < rep->elements && !stop; i += 2) {
			struct ik_record r;
			char *id = ik_redis_str(rep->element[i]);
			if (id && read_fields(id, rep->element[i + 1], &r) == IK_OK) {
				stop = cb(&r, arg);
				ik_record_free(&r);
				(*n)++;
			}
			free(id);
		}
		freeReplyObject(rep);
	}
	if (rc == IK_OK && (!score || !member))
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
	free(score);
	free(member);
	return rc == IK_OK && stop ? -1 : rc;
}

static int
rs_list(struct ik_store *st, const struct ik_list_filter *f, ik_record_cb cb, void *arg,
    ik_err *err)
{
	static const enum ik_state order[] = { IK_ST_IN_PROGRESS, IK_ST_DNF, IK_ST_FAILED,
	    IK_ST_DONE };
	int n = 0, rc = IK_OK;

	for (size_t i = 0; i < sizeof order / sizeof order[0] && rc == IK_OK; i++) {
		if (f->state != IK_ST_NONE && f->state != order[i])
			continue;
		if (f->expired && order[i] != IK_ST_IN_PROGRESS)
			continue;
		rc = list_index(st->impl, order[i], f, cb, arg, &n, err);
	}
	if (rc < 0)
		rc = IK_OK;   /* the callback stopped the listing */
	if (rc != IK_OK)
		return rc;
	return n ? IK_OK : IK_EMPTY;
}

static int
rs_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out, ik_err *err)
{
	struct rs *q = st->impl;
	char ip[64], dnf[64], lf[64], ld[64], done[64];
	redisReply *rep;
	int64_t now;

	memset(out, 0, sizeof *out);
	rep = ik_redis_eval(&q->r, &q->sc[S_STATS], 5, 5, (const char *[]){
	    idx_key(IK_ST_IN_PROGRESS, ip, sizeof ip), idx_key(IK_ST_DNF, dnf, sizeof dnf),
	    live_key(IK_ST_FAILED, lf, sizeof lf), live_key(IK_ST_DNF, ld, sizeof ld),
	    idx_key(IK_ST_DONE, done, sizeof done) }, NULL, 0, err);
	if (!rep)
		return err->code;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 8)
		return bad_reply(q, "stats", rep, err);
	now = num(rep->element[0]);
	out->in_progress = num(rep->element[1]);
	out->stuck = num(rep->element[2]);
	out->oldest_stuck_ms = out->stuck ? now - num(rep->element[3]) : 0;
	out->dnf = num(rep->element[4]);
	out->oldest_dnf_ms = out->dnf ? now - num(rep->element[5]) : 0;
	out->failed = num(rep->element[6]);
	out->done = num(rep->element[7]);
	out->done_approx = 1;
	freeReplyObject(rep);
	return IK_OK;
}

/* ---- the outbox's relay ops: store_redis_outbox.c --------------------- */

static int
rs_outbox_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err)
{
	struct rs *q = st->impl;

	return ik_rs_outbox_lease(&q->r, &q->ob, holder, lease_ms, until, err);
}

static int
rs_outbox_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
    ik_err *err)
{
	struct rs *q = st->impl;

	return ik_rs_outbox_read(&q->r, &q->ob, max, ev, n, err);
}

static int
rs_outbox_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev,
    size_t n, int64_t now_ms, ik_err *err)
{
	struct rs *q = st->impl;

	return ik_rs_outbox_ack(&q->r, &q->ob, holder, ev, n, err);
}

static int
rs_outbox_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n,
    ik_err *err)
{
	struct rs *q = st->impl;

	return ik_rs_outbox_purge(&q->r, &q->ob, before_ms, batch, n, err);
}

static int
rs_outbox_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out,
    ik_err *err)
{
	struct rs *q = st->impl;

	return ik_rs_outbox_stats(&q->r, &q->ob, out, err);
}

static void
rs_close(struct ik_store *st)
{
	struct rs *q = st->impl;

	if (!q)
		return;
	ik_rs_outbox_free(&q->ob);
	ik_redis_close(&q->r);
	free(q);
	st->impl = NULL;
}

static const struct ik_store_ops redis_ops = {
	.name = "redis",
	.init = rs_init,
	.claim = rs_claim,
	.finish = rs_finish,
	.renew = rs_renew,
	.renotified = rs_renotified,
	.release = rs_release,
	.note = rs_note,
	.forget_failed = rs_forget_failed,
	.get = rs_get,
	.list = rs_list,
	.close = rs_close,
	.stats = rs_stats,
	.outbox_lease = rs_outbox_lease,
	.outbox_read = rs_outbox_read,
	.outbox_ack = rs_outbox_ack,
	.outbox_purge = rs_outbox_purge,
	.outbox_stats = rs_outbox_stats,
};

/* CONFIG GET NAME's value, or NULL with err. */
static char *
config_get(struct ik_redis *r, const char *name, ik_err *err)
{
	redisReply *rep = ik_redis_cmd(r, "CONFIG GET", 3,
	    (const char *[]){ "CONFIG", "GET", name }, NULL, err);
	char *v = NULL;

	if (!rep) {
		if (err->code == IK_TEMPFAIL)
			return NULL;
		char why[sizeof err->msg];
		snprintf(why, sizeof why, "%s", err->msg + strlen(r->u.label) + 2);
		ik_errf(err, IK_CONFIG, "%s: cannot read the persistence settings (%s): the "
		    "store checks that AOF is on with appendfsync always before it takes a "
		    "claim; allow CONFIG GET for this user, or see durability=unsafe in "
		    "idemkit(7)", r->u.label, why);
		return NULL;
	}
	if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
		v = ik_redis_str(rep->element[1]);
	freeReplyObject(rep);
	if (!v)
		ik_errf(err, IK_CONFIG, "%s: CONFIG GET %s: the server does not report it; "
		    "the store cannot check its durability", r->u.label, name);
	return v;
}

/* on_connect: AOF on, fsync on every write; else the server acknowledges
 * claims that a crash loses, and a redelivery would then be a new claim. */
static int
check_durability(struct ik_redis *r, ik_err *err)
{
	char *aof, *fsync;
	int rc = IK_OK;

	if (r->u.durability_unsafe)
		return IK_OK;
	if (!(aof = config_get(r, "appendonly", err)))
		return err->code;
	if (!(fsync = config_get(r, "appendfsync", err))) {
		free(aof);
		return err->code;
	}
	if (strcmp(aof, "yes") != 0)
		rc = ik_errf(err, IK_CONFIG, "%s: appendonly is %.20s, not yes: without the "
		    "append-only file a restart loses every claim since the last snapshot, "
		    "and a redelivery would debit again; set appendonly yes and appendfsync "
		    "always, or accept the risk with ?durability=unsafe (idemkit(7))",
		    r->u.label, aof);
	else if (strcmp(fsync, "always") != 0)
		rc = ik_errf(err, IK_CONFIG, "%s: appendfsync is %.20s, not always: Redis "
		    "acknowledges a claim before it is on disk, so a crash can lose up to a "
		    "second of claims and a redelivery would debit again; set appendfsync "
		    "always, or accept the risk with ?durability=unsafe (idemkit(7))",
		    r->u.label, fsync);
	free(aof);
	free(fsync);
	return rc;
}

int
ik_store_redis_open(const char *rest, struct ik_store *st, ik_err *err)
{
	struct rs *q = calloc(1, sizeof *q);
	int rc;

	if (!q)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((rc = ik_redis_url_parse(rest, &q->r.u, err)) != IK_OK) {
		free(q);
		return rc;
	}
	memcpy(q->sc, scripts, sizeof q->sc);
	ik_rs_outbox_init(&q->ob);
	q->outbox = ik_outbox_url() != NULL;
	q->r.on_connect = check_durability;
	st->impl = q;
	st->ops = &redis_ops;
	if (q->r.u.durability_unsafe)
		ik_log(IK_LOG_WARN, "redis store with durability=unsafe: its persistence is "
		    "not checked, so a crash or failover can lose acknowledged claims; only "
		    "the bank's idempotency key then stops a second debit",
		    "store", q->r.u.label, NULL);
	if ((rc = ik_redis_ensure(&q->r, err)) != IK_OK) {
		rs_close(st);
		st->ops = NULL;
	}
	return rc;
}

int
ik_store_rediss_open(const char *rest, struct ik_store *st, ik_err *err)
{
	return ik_errf(err, IK_CONFIG, "rediss:// (TLS) is not supported: Debian 12's "
	    "hiredis 0.14 has no TLS; reach the server through a local TLS tunnel "
	    "(stunnel or spiped) and use redis://127.0.0.1:PORT, see \"TLS to Redis\" "
	    "in idemkit(7)");
}
