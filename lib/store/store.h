/* store.h: the idempotency store port (DESIGN.md "The idempotency record").
 *
 * Commands talk to this port only.  Each adapter (store_sqlite.c,
 * store_dynamodb.c) fills a struct ik_store_ops and knows nothing of the
 * others; ik_store_open (open_store.h) picks one from the URL.
 *
 * Rules every adapter keeps:
 *  - claim is ONE atomic conditional write: it succeeds iff the key is
 *    absent, or state = IN_PROGRESS AND leaseUntil < now AND the
 *    fingerprint matches; it sets owner = req->token, leaseUntil,
 *    attempts + 1, and keeps createdAt.  When it fails, the outcome comes
 *    from the current record, decided by ik_claim_decide below -- one rule
 *    for every adapter, never a copy of it in one.  Never get-then-act.
 *  - finish is ONE conditional write on state = IN_PROGRESS AND owner =
 *    token; no match is IK_LEASE_LOST and changes nothing -- except our
 *    own finish found again: an adapter whose transport re-sends a write
 *    whose answer was lost (DynamoDB) decides a refused finish from the
 *    record with ik_finish_decide, as a refused claim with ik_claim_decide.
 *  - renew (idemp-run's heartbeat) is fenced exactly as finish is: ONE
 *    conditional write on state = IN_PROGRESS AND owner = token AND
 *    leaseUntil <> 0 (a claim released is no longer ours: renewing it
 *    would take back the lease its release gave away) that sets
 *    leaseUntil = now + lease_ms on the clock the claim used (the
 *    caller's now_ms, or the server's on postgres and redis), and nothing
 *    else; no match is IK_LEASE_LOST.  It adds no history entry: a run of
 *    hours renews hundreds of times and would push its claim out of the
 *    last IK_HISTORY_MAX; idemp-run counts them in its finish instead.
 *  - the write is durable before the call returns IK_OK -- except inside
 *    a group (begin ... commit, optional ops): there the claims and
 *    finishes are still each their own conditional statement, but they
 *    share one durable commit, and nothing of the group may be acted on
 *    until commit returned IK_OK.  A failed op in a group fails the group:
 *    the ops after it do nothing and return IK_TEMPFAIL, and commit rolls
 *    everything back and returns the error (the caller redoes each item
 *    alone).  An adapter without begin/commit (NULL) is one item at a time.
 *  - transient trouble (busy, unreachable, throttled) is IK_TEMPFAIL;
 *    bad configuration IK_CONFIG.
 *  - in flight (optional ops claim_start, finish_start, run, active; for
 *    adapters whose writes cross a network, DynamoDB and PostgreSQL's
 *    pipeline mode, whose batch of writes is one commit): many claims and
 *    finishes outstanding at once, from one thread.  Each is still the ONE
 *    conditional write above (a claim refused without the old item in the
 *    answer adds the one consistent read that decides it, and an expired
 *    lease found there writes again, as boundedly as the blocking claim),
 *    its refusal decided by ik_claim_decide; none waits for another, so
 *    they take effect, and answer, in any order.  A start that returns
 *    IK_OK calls its callback exactly once, later, from run, with what the
 *    blocking op would have returned (res filled for a claim); any other
 *    code started nothing and the callback is never called.  req, its
 *    strings and res must stay valid until the callback.  A blocking call
 *    on the same store while ops are in flight (a rare path, from a
 *    callback or between starts: release, a stale refusal's finish) moves
 *    them on but calls none of their callbacks; run does.  The blocking
 *    claim and finish of such an adapter ARE start + run until the
 *    callback: one implementation (PostgreSQL's blocking ops are its group
 *    path's, the same statements decided by the same rule; its in-flight
 *    ops add only the pipeline).  Groups and in-flight ops do not mix.
 */
#ifndef IK_STORE_H
#define IK_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

enum ik_state {
	IK_ST_NONE = 0,
	IK_ST_IN_PROGRESS,
	IK_ST_DONE,
	IK_ST_FAILED,
	IK_ST_DNF,          /* DEBITED_NOTIFICATION_FAILED */
};
const char *ik_state_name(enum ik_state s);     /* "IN_PROGRESS", ... */
enum ik_state ik_state_parse(const char *s);    /* IK_ST_NONE if unknown */

/* An owner token: 128 random bits as 32 hex digits, then "@HOST:PID" of
 * the process that claimed (ik_store_token), + NUL.  The random part
 * fences; the rest tells an operator who holds a charge. */
#define IK_TOKEN_HEX 128

/* A record as read back; strings are malloc'd (ik_record_free), NULL when
 * the attribute is absent. */
struct ik_record {
	char *key;
	enum ik_state state;
	char *owner;
	int64_t lease_until;    /* epoch ms */
	int64_t attempts;
	char *fingerprint;
	char *event;
	char *debit_ref;
	char *last_error;
	int64_t created_at, updated_at;  /* epoch ms */
	int64_t expires_at;              /* epoch s (DynamoDB TTL) */
	char *history;    /* JSON array text, oldest first (see below), or NULL */
};

/* A record's history: every transition is appended to the record by the
 * same atomic write that makes it, keeping the last IK_HISTORY_MAX.  Each
 * entry is a JSON object; "at" is epoch ms on the clock the lease uses
 * (the caller's now_ms, or the server's on postgres and redis):
 *   {"at":ms,"op":"claim","attempt":n,"leaseUntil":ms,"owner":token}
 *   {"at":ms,"op":"release","owner":token}
 *   {"at":ms,"op":"finish","state":"DONE","owner":token,
 *    "debitRef":ref|null,"error":text|null[,"bankReplayed":true]}
 *   {"at":ms,"op":"renotified","state":"DONE"}
 * bankReplayed is there only when the bank answered the debit as a replay
 * of one it had already made (ik_bankapi_replayed): the first answer was
 * lost, a crash window was hit, and the record is where an operator looks
 * for it afterwards.  A refused claim, a LEASE_LOST finish or release
 * change nothing and add nothing. */
#define IK_HISTORY_MAX 20
struct ik_hist {
	const char *op;           /* "claim", "release", "finish", "renotified" */
	int64_t at;
	int64_t attempt, lease_until;   /* claim */
	const char *owner;              /* claim, release, finish */
	enum ik_state state;            /* finish, renotified */
	const char *debit_ref, *error;  /* finish; NULL = null */
	int bank_replayed;              /* finish: "bankReplayed":true */
};
/* The entry as JSON object text; NULL when out of memory.  Caller frees. */
char *ik_history_entry(const struct ik_hist *h);
/* old (a JSON array text, or NULL/"" for none) with entry (an object's
 * text) appended, only the last IK_HISTORY_MAX kept; NULL when out of
 * memory or old is not an array.  For adapters that rewrite the record
 * whole inside their atomic write.  Caller frees. */
char *ik_history_append(const char *old, const char *entry);
void ik_record_free(struct ik_record *r);
/* The record as a JSON object (for --json, idemp-list); caller frees. */
struct cJSON *ik_record_json(const struct ik_record *r, int64_t now_ms);

struct ik_claim_req {
	const char *key;          /* chargeId */
	const char *fingerprint;
	const char *event;        /* raw body */
	const char *token;        /* fresh random owner token (ik_store_token) */
	int64_t now_ms;
	int64_t lease_ms;
	int64_t expires_at;       /* epoch s */
};

struct ik_claim_res {
	int code;                 /* IK_OK (ACQUIRED), IK_DUP_*, IK_PAYLOAD_MISMATCH */
	int64_t attempt;          /* on IK_OK: the new attempts value */
	int64_t lease_until;      /* on IK_OK: ours; on DUP_IN_PROGRESS: the holder's */
	struct ik_record cur;     /* when not IK_OK: the record that decided it */
	/* On a store whose lease begins when the server runs the claim
	 * (PostgreSQL, Redis): the boot clock (util.h ik_boot_ms) read just
	 * before the claim actually went out, later than the caller's reading
	 * when it waited behind a batch in flight or a reconnect; 0: not
	 * known, the caller's stands.  Never set where the lease is counted
	 * from the caller's now_ms (SQLite, DynamoDB). */
	int64_t sent_boot_ms;
};

struct ik_finish_req {
	const char *key;
	const char *token;
	enum ik_state state;      /* DONE, FAILED or DNF */
	const char *debit_ref;    /* may be NULL */
	const char *last_error;   /* may be NULL */
	int bank_replayed;        /* the bank answered the debit as a replay: the
	                           * history entry says so (above) */
	int64_t now_ms;
};

struct ik_list_filter {
	enum ik_state state;      /* IK_ST_NONE = any */
	int expired;              /* only IN_PROGRESS with leaseUntil < now */
	int64_t older_than_ms;    /* > 0: only updatedAt < now - older_than_ms */
	int64_t now_ms;
};

/* What idemp-stats and the metrics report (the stats op).  Ages are
 * now - updatedAt of the oldest matching record, 0 when none match. */
struct ik_store_stats {
	int64_t in_progress, done, failed, dnf;   /* records per state */
	int done_approx;          /* done is an estimate (DynamoDB ItemCount) */
	int64_t stuck;            /* IN_PROGRESS with leaseUntil < now */
	int64_t oldest_stuck_ms;
	int64_t oldest_dnf_ms;    /* the backlog is dnf itself */
};

/* Return non-zero to stop the listing early. */
typedef int (*ik_record_cb)(const struct ik_record *r, void *arg);

/* ---- the transactional outbox (issue 27; outbox.h, idemkit(7)) ----
 * With $IDEMKIT_OUTBOX set (ik_outbox_on), an adapter that has the
 * outbox ops writes one event per transition of a record to DONE, FAILED
 * or DEBITED_NOTIFICATION_FAILED, and per re-notification, INSIDE the
 * atomic write that makes the transition (its statement, transaction,
 * script or conditional write; a group's too): never a second write that
 * can fail alone.  A write that does not match writes no event.  The
 * event's eventId comes from the transition itself (ik_outbox_event_id):
 * the same on every re-publish.  The relay (idemp-outbox) reads them in
 * the store's order, publishes, then checkpoints them, fenced by a relay
 * lease kept in the store (one relay at a time). */
struct ik_outbox_ev {
	int64_t seq;          /* the store's order (and the checkpoint) */
	char *pos;            /* the adapter's own position where an int64 is
	                       * not enough (a stream entry id, a shard and
	                       * sequence number); NULL otherwise */
	char *id;             /* eventId */
	char *charge_id;
	char *type;           /* "charge.finished", "charge.renotified" */
	char *body;           /* the event, JSON text (idemkit(7)) */
	int64_t at;           /* written, epoch ms */
};
void ik_outbox_ev_free(struct ik_outbox_ev *e);
/* A deep copy (an adapter's read-ahead hands out copies, keeping its own
 * until they are checkpointed).  0, or -1 when out of memory (to freed). */
int ik_outbox_ev_copy(struct ik_outbox_ev *to, const struct ik_outbox_ev *from);

/* $IDEMKIT_OUTBOX: the queue URL events go to; NULL when unset or empty
 * (the outbox is off: the stores write no events). */
const char *ik_outbox_url(void);

/* The eventId of a transition: the first 128 bits of SHA-256 over
 * "idemkit.outbox.v1", op ("finish", "renotified"), the chargeId and the
 * owner token the record holds, as 32 hex digits (out: IK_EVENT_ID_HEX
 * bytes with the NUL).  The
 * owner token is new for every claim and a finish keeps it, so this is
 * unique per transition and the same whoever computes it again; the hash
 * keeps the token itself out of what goes downstream. */
#define IK_EVENT_ID_HEX 33
void ik_outbox_event_id(const char *op, const char *key, const char *owner,
    char out[IK_EVENT_ID_HEX]);

struct ik_outbox_stats {
	int64_t waiting;      /* written and not yet checkpointed */
	int64_t oldest_ms;    /* now - the oldest waiting one's time; 0 when none */
	int64_t published;    /* checkpointed and not yet purged */
	int waiting_capped;   /* waiting counted no further than a bound (PostgreSQL:
	                       * IDEMKIT_OUTBOX_COUNT_MAX changes): at least that many */
};

struct ik_store;

/* An in-flight op's answer (claim_start, finish_start). */
typedef void (*ik_store_cb)(void *arg, int rc, const ik_err *err);

struct ik_store_ops {
	const char *name;   /* "sqlite", "dynamodb" */
	/* Create or migrate the schema/table; idempotent. */
	int (*init)(struct ik_store *s, ik_err *err);
	/* Return value: IK_OK when res->code is meaningful, else an error code
	 * (IK_TEMPFAIL, IK_CONFIG, IK_SOFTWARE) with err. */
	int (*claim)(struct ik_store *s, const struct ik_claim_req *req,
	             struct ik_claim_res *res, ik_err *err);
	/* IK_OK, IK_LEASE_LOST, or an error code.  Commands call it through
	 * ik_store_finish (and finish_start through ik_store_finish_start),
	 * which hand it valid UTF-8. */
	int (*finish)(struct ik_store *s, const struct ik_finish_req *req, ik_err *err);
	/* Extend our lease to now_ms + lease_ms (see the rules above).  IK_OK,
	 * IK_LEASE_LOST, or an error. */
	int (*renew)(struct ik_store *s, const char *key, const char *token,
	             int64_t now_ms, int64_t lease_ms, ik_err *err);
	/* DNF -> DONE for the notification re-drive, conditioned on state = DNF.
	 * IK_OK, IK_LEASE_LOST when the record is not DNF, or an error. */
	int (*renotified)(struct ik_store *s, const char *key, int64_t now_ms, ik_err *err);
	/* End our lease now (leaseUntil = 0) on owner = token AND IN_PROGRESS,
	 * so a stopped worker's charge can be retried at once.  IK_OK,
	 * IK_LEASE_LOST, or an error. */
	int (*release)(struct ik_store *s, const char *key, const char *token,
	               int64_t now_ms, ik_err *err);
	/* Optional (NULL: not kept on this store): record reason as the
	 * record's last error on owner = token AND IN_PROGRESS, and nothing
	 * else (lease, updatedAt and history untouched), so idemp-show says
	 * why a claim left by a TEMPFAIL or CONFIG debit is stuck.  IK_OK,
	 * IK_LEASE_LOST, or an error. */
	int (*note)(struct ik_store *s, const char *key, const char *token,
	            const char *reason, ik_err *err);
	/* Optional (NULL: the open and a read say all): whether a claim would
	 * be refused now for the store's own set-up (PostgreSQL: the outbox on
	 * and its replication slot missing), asked by ik_store_check (idemp-claim
	 * --check-store) after its read, before a worker receives anything.
	 * IK_OK, or the error a claim would give. */
	int (*claim_check)(struct ik_store *s, ik_err *err);
	/* Delete a FAILED record (conditioned on state = FAILED) so a declined
	 * charge can be claimed again after a fix.  Only FAILED: no money moved
	 * for it.  IK_OK, IK_EMPTY when there is no FAILED record, or an error. */
	int (*forget_failed)(struct ik_store *s, const char *key, ik_err *err);
	/* IK_OK with *r filled, IK_EMPTY when absent, or an error. */
	int (*get)(struct ik_store *s, const char *key, struct ik_record *r, ik_err *err);
	/* IK_OK when at least one matched, IK_EMPTY when none, or an error. */
	int (*list)(struct ik_store *s, const struct ik_list_filter *f,
	            ik_record_cb cb, void *arg, ik_err *err);
	void (*close)(struct ik_store *s);
	/* Optional group commit (see the rules above); NULL when the adapter
	 * has none.  begin: IK_OK or an error (then no group is open).
	 * commit: IK_OK when the group is durable, else rolled back + error. */
	int (*begin)(struct ik_store *s, ik_err *err);
	int (*commit)(struct ik_store *s, ik_err *err);
	/* Optional: the counts of struct ik_store_stats at now_ms.  It must
	 * NOT read every record: the unfinished states (IN_PROGRESS, FAILED,
	 * DNF) come from an index or counters the writes keep (SQLite: the
	 * records_state index; DynamoDB: the sparse index of unfinished
	 * records), and the cost grows with those, not with the DONE records
	 * a 30-day retention piles up.  DONE may come from the same index
	 * walked in the store (SQLite) or from an estimate the store keeps
	 * (done_approx = 1).  NULL: this store cannot count without a full
	 * read, and idemp-stats says so (exit 78).  IK_OK or an error. */
	int (*stats)(struct ik_store *s, int64_t now_ms, struct ik_store_stats *st,
	             ik_err *err);
	/* Optional in-flight ops (see the rules above); all four or none.
	 * rc is what claim (res filled) or finish would have returned; err is
	 * set when rc != IK_OK. */
	int (*claim_start)(struct ik_store *s, const struct ik_claim_req *req,
	                   struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err);
	int (*finish_start)(struct ik_store *s, const struct ik_finish_req *req,
	                    ik_store_cb cb, void *arg, ik_err *err);
	/* Moves the ops on and calls the callbacks of those finished.  When
	 * none has finished, first waits up to timeout_ms (-1: as long as it
	 * takes) for one, or for fd (>= 0; *readable set when it is readable,
	 * so a stream reads its next lines meanwhile).  IK_OK, or IK_SOFTWARE
	 * with err when the ops in flight are lost (their callbacks never
	 * come). */
	int (*run)(struct ik_store *s, int fd, int *readable, int timeout_ms, ik_err *err);
	/* Ops started whose callback has not yet been called. */
	size_t (*active)(struct ik_store *s);
	/* Optional: make the in-flight ops ready now (PostgreSQL: connect and
	 * prepare), so that a stream's first envelope does not wait for it.
	 * Nothing is reported: what failed is tried again by the first op,
	 * which says why, exactly as without this call. */
	void (*warm)(struct ik_store *s);
	/* Optional outbox ops (see above); all five or none.
	 * outbox_lease: take or renew the relay lease for holder (a random
	 * token per relay process) until now_ms + lease_ms: one conditional
	 * write that succeeds iff no lease, ours, or one that ended (its end
	 * <= now); IK_OK, or IK_DUP_IN_PROGRESS (*until: the holder's end)
	 * when another's is live.  lease_ms 0 ends ours (a relay that stops).
	 * A lease is live while now < its end, for the checkpoint too.
	 * outbox_read: up to max of the oldest events not yet checkpointed, in
	 * the store's order, into ev (*n of them); IK_OK, also with *n == 0.
	 * outbox_ack: the checkpoint, only after the queue accepted them:
	 * marks ev seqs published iff holder still holds a live lease, in one
	 * transaction; IK_OK, IK_LEASE_LOST (nothing marked), or an error.
	 * outbox_purge: deletes up to batch events published before
	 * before_ms; *n how many.  outbox_stats: the lag gauge. */
	int (*outbox_lease)(struct ik_store *s, const char *holder, int64_t now_ms,
	                    int64_t lease_ms, int64_t *until, ik_err *err);
	int (*outbox_read)(struct ik_store *s, size_t max, struct ik_outbox_ev *ev,
	                   size_t *n, ik_err *err);
	int (*outbox_ack)(struct ik_store *s, const char *holder,
	                  const struct ik_outbox_ev *ev, size_t n, int64_t now_ms, ik_err *err);
	int (*outbox_purge)(struct ik_store *s, int64_t before_ms, size_t batch,
	                    int64_t *n, ik_err *err);
	int (*outbox_stats)(struct ik_store *s, int64_t now_ms, struct ik_outbox_stats *st,
	                    ik_err *err);
	/* The events a relay round takes by default (outbox.h; 0: one queue
	 * call's, IK_QUEUE_BATCH): more where each store call is a round trip. */
	size_t outbox_batch;
};

struct ik_store {
	const struct ik_store_ops *ops;
	void *impl;
	char *url;
};

void ik_store_close(struct ik_store *s);
/* What a claim needs of the store, asked by idemp-claim --check-store
 * before a worker receives anything.  Opening a store connects on some
 * adapters (SQLite, Redis) and not on others (PostgreSQL and DynamoDB
 * connect on first use), so an open alone proves nothing: one read of a
 * record through the port connects, authenticates and reads the table
 * as a claim would (TLS, credentials, the table and its columns), then
 * the adapter's own set-up check (claim_check).  The key read holds a
 * '/', which no chargeId can.  IK_OK, or the error a claim would give. */
#define IK_STORE_CHECK_KEY "idemkit/check"
int ik_store_check(struct ik_store *s, ik_err *err);
/* --inflight for the store steps in --stream: opt when set, else
 * $IDEMKIT_STORE_INFLIGHT, else IK_STORE_INFLIGHT_DEFAULT (idemp-claim(1)
 * says why), 1 to IK_STORE_INFLIGHT_MAX.  IK_OK, or IK_USAGE (a bad
 * option) or IK_CONFIG (a bad variable) after a one-line complaint. */
#define IK_STORE_INFLIGHT_DEFAULT 32
#define IK_STORE_INFLIGHT_MAX 1024
int ik_store_inflight(const char *opt, size_t *out);

/* finish and finish_start (the ops above) as commands call them: the
 * record's reason (last_error) and debit_ref are what a bank or a gateway
 * said, cut anywhere or copied raw from a body in any encoding, and a
 * store refuses text that is not UTF-8 (PostgreSQL 22021, DynamoDB a
 * SerializationException) -- after the money moved.  So every adapter
 * gets them valid (utf8.h: invalid bytes become U+FFFD), whatever the
 * caller passes; valid text passes untouched, without a copy.  Same
 * returns as the ops. */
int ik_store_finish(struct ik_store *s, const struct ik_finish_req *req, ik_err *err);
int ik_store_finish_start(struct ik_store *s, const struct ik_finish_req *req,
    ik_store_cb cb, void *arg, ik_err *err);

/* The claim-refusal rule, kept here once so no adapter can drift from it.
 * res->cur holds the record that refused req (from the conditional write's
 * own answer, or read right after it).  In order:
 *   - a fingerprint that differs (or none) is PAYLOAD_MISMATCH, whatever
 *     the state;
 *   - DONE and DEBITED_NOTIFICATION_FAILED are DUP_DONE, FAILED DUP_FAILED;
 *   - IN_PROGRESS held by req->token is our own claim whose answer was lost
 *     and retried: ACQUIRED again, with the attempt and lease it recorded;
 *   - IN_PROGRESS with leaseUntil >= now is DUP_IN_PROGRESS (the holder's
 *     lease in res->lease_until); leaseUntil < now would have let the claim
 *     through: IK_EMPTY, and the adapter writes again;
 *   - any other state is no state this version knows: never claimable,
 *     IK_SOFTWARE with err.
 * IK_OK when res->code (and res->attempt, res->lease_until) are set. */
int ik_claim_decide(const struct ik_claim_req *req, struct ik_claim_res *res, ik_err *err);

/* A fresh owner token: 128 random bits as hex, "@HOST:PID".  PID is
 * $IDEMKIT_RUN_PID when it is a number (charge-worker sets its own, so the
 * holder named is the run, not a step that lives as long as one envelope),
 * else this process's; HOST is the host name cut to 63 characters of
 * [A-Za-z0-9._-]. */
void ik_store_token(char out[IK_TOKEN_HEX]);
/* What an owner token says of its holder: 1 with short (the first 8 hex
 * digits), host, *pid and *local (HOST is this host) filled when it has
 * the "@HOST:PID" tail, else 0 with short only (a token from before, or
 * from elsewhere). */
int ik_owner_holder(const char *owner, char short_tok[9], char host[64], long *pid,
    int *local);

/* A refused finish (its conditional write failed), decided from the
 * record cur read after it -- the finish's counterpart of
 * ik_claim_decide, kept here once: our own finish whose answer was lost
 * and retried finds the record in req->state still owned by req->token
 * (a finish keeps the owner; no one else holds that token): IK_OK.  Any
 * other record (another owner, another state, none: cur NULL) is
 * IK_LEASE_LOST. */
int ik_finish_decide(const struct ik_finish_req *req, const struct ik_record *cur);

/* The claim's lease: opt (--lease) when set, else $IDEMKIT_LEASE, else
 * IK_LEASE_DEFAULT_MS, from IK_LEASE_MIN_MS to IK_LEASE_MAX_MS (a day: a
 * lease outlives a crashed worker, so a longer one only delays the retry,
 * and the bound keeps now + lease far from overflow).  IK_OK, or IK_USAGE
 * (a bad --lease) or IK_CONFIG (a bad variable) after a one-line complaint
 * naming the one given. */
#define IK_LEASE_DEFAULT_MS 120000
#define IK_LEASE_MIN_MS 1000
#define IK_LEASE_MAX_MS (24LL * 3600000)
int ik_store_lease(const char *opt, int64_t *ms);

/* Retention for expiresAt: $IDEMKIT_RETENTION (a duration), default 30
 * days, at most IK_RETENTION_MAX_MS; a warning is logged under 14 days.
 * IK_CONFIG with err when it is not a duration, too long, or not longer
 * than lease_ms: a record that expires while its lease is live (Redis
 * deletes the key, DynamoDB's TTL the item, the purge the row) lets a
 * second worker claim the charge afresh and debit it while the first
 * holds it.  IK_OK with *ms. */
#define IK_RETENTION_DEFAULT_MS (30LL * 86400000)
#define IK_RETENTION_MAX_MS (3650LL * 86400000)
int ik_store_retention(int64_t lease_ms, int64_t *ms, ik_err *err);

#endif
