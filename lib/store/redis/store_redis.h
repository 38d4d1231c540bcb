/* store_redis.h: the Redis store's outbox (store.h, outbox.h),
 * between store_redis.c (the finish and re-notification scripts that
 * write the events, the ops table) and store_redis_outbox.c (the relay's
 * ops), and its constructors.  Events are entries of one stream,
 * RS_OUTBOX_STREAM, read by the consumer group RS_OUTBOX_GROUP, one
 * consumer per relay process (its lease holder token); the relay lease is
 * the key RS_OUTBOX_LEASE. */
#ifndef IK_STORE_REDIS_H
#define IK_STORE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "conn/redis.h"
#include "core/err.h"

struct ik_outbox_ev;
struct ik_outbox_stats;
struct ik_store;

/* The adapter's constructors (redis://, rediss://), for the factory
 * (open_store.c). */
int ik_store_redis_open(const char *rest, struct ik_store *s, ik_err *err);
int ik_store_rediss_open(const char *rest, struct ik_store *s, ik_err *err);

#define RS_OUTBOX_STREAM "idemkit:outbox"
#define RS_OUTBOX_LEASE "idemkit:outbox:relay"
/* The count of events written and not yet acknowledged: the finish's
 * script adds one with each event, the checkpoint takes off what XACK
 * acknowledged.  Redis's own count (the group's lag) is lost when the
 * server replays its append-only file or a replica takes over (7.0
 * propagates the group's position without its entries-read). */
#define RS_OUTBOX_WAITING "idemkit:outbox:waiting"
#define RS_OUTBOX_GROUP "relay"

/* For the finish and re-notification scripts (after LUA_PRELUDE: now, s):
 * outbox(stream, eventId, type) XADDs the event of record KEYS[1]'s
 * transition, just made, from the record as it now is, ARGV[1] being the
 * chargeId; nothing for idemp-run's records (no charge).  The caller's
 * script runs it only with the outbox on (an eventId given), so the event
 * is in the script's own atomic write.  A record's event that is not JSON
 * (never one idemp-claim accepted) gives null fields, never a failed
 * finish: the money moved. */
#define LUA_OUTBOX \
	"local function outbox(stream, id, typ)\n" \
	"  local ev = {}\n" \
	"  local raw = redis.call('HGET', KEYS[1], 'event')\n" \
	"  if raw then\n" \
	"    local ok, d = pcall(cjson.decode, raw)\n" \
	"    if ok and type(d) == 'table' then ev = d end\n" \
	"  end\n" \
	"  if ev.idempRun ~= nil then return end\n" \
	"  local r = redis.call('HMGET', KEYS[1], 'state', 'debitRef', 'lastError', 'attempts')\n" \
	"  local function v(x) if x == nil or x == false then return cjson.null end return x end\n" \
	"  local body = cjson.encode({v = 1, type = typ, eventId = id, chargeId = ARGV[1],\n" \
	"    accountId = v(ev.accountId), amount = v(ev.amount), currency = v(ev.currency),\n" \
	"    chargeType = v(ev.chargeType), bankRef = v(r[2]), state = r[1],\n" \
	"    reason = v(r[3]), attempts = tonumber(r[4]) or 0, at = now})\n" \
	"  redis.call('XADD', stream, '*', 'id', id, 'chargeId', ARGV[1], 'type', typ,\n" \
	"    'body', body)\n" \
	"  redis.call('INCR', '" RS_OUTBOX_WAITING "')\n" \
	"end\n"

/* The relay ops' scripts (their SHAs), kept per connection. */
enum { RS_OB_LEASE, RS_OB_READ, RS_OB_ACK, RS_OB_PURGE, RS_OB_STATS, RS_OB_N };
struct ik_rs_outbox {
	struct ik_redis_script sc[RS_OB_N];
	char *holder;   /* the last lease taken: the port's read has no holder,
	                 * and the relay takes its lease before every read */
};

void ik_rs_outbox_init(struct ik_rs_outbox *o);
void ik_rs_outbox_free(struct ik_rs_outbox *o);
int ik_rs_outbox_lease(struct ik_redis *r, struct ik_rs_outbox *o, const char *holder,
    int64_t lease_ms, int64_t *until, ik_err *err);
int ik_rs_outbox_read(struct ik_redis *r, struct ik_rs_outbox *o, size_t max, struct ik_outbox_ev *ev, size_t *n, ik_err *err);
int ik_rs_outbox_ack(struct ik_redis *r, struct ik_rs_outbox *o, const char *holder,
    const struct ik_outbox_ev *ev, size_t n, ik_err *err);
int ik_rs_outbox_purge(struct ik_redis *r, struct ik_rs_outbox *o, int64_t before_ms,
    size_t batch, int64_t *n, ik_err *err);
int ik_rs_outbox_stats(struct ik_redis *r, struct ik_rs_outbox *o,
    struct ik_outbox_stats *st, ik_err *err);

#endif
