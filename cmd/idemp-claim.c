/* idemp-claim: claim a chargeId in the idempotency store, once.
 *
 * The claim is one conditional write (store.h); whatever it answers is
 * written into the envelope as "claim" and, in one-shot mode, is the exit
 * code.  A body that is not a valid ChargeDueEvent is DATAERR and still
 * goes out, intact, so sqs-ack can move it to the DLQ.
 *
 * A record must outlive every copy of its message.  A copy whose first
 * delivery is older than the records' retention (less a margin) may be
 * a charge whose record has already expired: claimed afresh, it would be
 * debited again.  Such a copy that finds NO record is refused
 * (STALE_EVENT, to the DLQ); one that finds its record is decided by it
 * as always.  See stale_refusal for why that stays one conditional write.
 *
 * In --stream, on a store that offers claims in flight (DynamoDB,
 * PostgreSQL), up to
 * --inflight claims are outstanding at once (step.h's start, wait, reap),
 * each still its own conditional write, and each envelope is written as
 * soon as its answer is in: out of order.  The one-shot and group paths run
 * the same prepare and claimed around the blocking claim; a stale
 * refusal's finish, rare, is a blocking call from the answer.
 *
 * A copy that meets its original in flight in this same run (the
 * record's owner is a token this process issued, or one of a sibling
 * pipeline of the same charge-worker: the same holder) is held here
 * rather than passed on as DUP_IN_PROGRESS to wait on the queue: it is
 * claimed again, with a short backoff, until the original's finish is
 * recorded (then DUP_DONE, deleted at once) -- never past its original's
 * lease less a margin, so a held copy never takes over a lease (it is then
 * DUP_IN_PROGRESS, as before).  Each try is an ordinary claim: whatever
 * order the two come in, the store decides.  A stop signal passes the held
 * copies on as DUP_IN_PROGRESS at once.  Across runs and hosts the
 * queue's visibility still does this job.  On the group path (SQLite,
 * Redis) the step loop holds such a copy's line (step.h's hold) and runs
 * it again in a later group, with the same bounds.
 */
#include <getopt.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/event.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/step.h"
#include "core/util.h"
#include "flow/settle.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-claim [--check | --check-store] [--stream] [--inflight N] [--lease DUR]\n"
	"                   [--store URL] < envelope|event\n";
static const char options[] =
	"  --check            check the lease, the retention and --inflight, open nothing:\n"
	"                     0, or 64/78 and why\n"
	"  --check-store      --check, then open the store and read it as a claim does\n"
	"                     (the embedded default is created): 0, or 75/78 and why\n"
	"  -s, --stream       many envelopes in, one out per line; outcome in the envelope\n"
	"  -l, --lease DUR    how long the claim is held (1s to 24h, default 120s;\n"
	"                     $IDEMKIT_LEASE); $IDEMKIT_RETENTION must be longer\n"
	"  -n, --inflight N   with --stream on DynamoDB or PostgreSQL: up to N claims in\n"
	"                     flight (1-1024, default 32, $IDEMKIT_STORE_INFLIGHT);\n"
	"                     envelopes then leave in the order the answers come\n"
	"  -S, --store URL    the store (default $IDEMKIT_STORE, else\n"
	"                     sqlite:$IDEMKIT_STATE_DIR/idempotency.db), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the claim was ACQUIRED (--check, --check-store: usable)" },
	{ IK_EMPTY, "no envelope or event on stdin: nothing to do" },
	{ IK_DUP_DONE, "already DONE or DEBITED_NOTIFICATION_FAILED" },
	{ IK_DUP_IN_PROGRESS, "another holder's lease is live" },
	{ IK_DUP_FAILED, "the charge was declined before (FAILED)" },
	{ IK_PAYLOAD_MISMATCH, "same chargeId, another account, amount,\n"
	    "currency or chargeType" },
	{ IK_STALE_EVENT, "no record, and first sent longer ago than the\n"
	    "retention: its record may have expired" },
	{ IK_USAGE, "bad command line, or two envelopes without --stream" },
	{ IK_DATAERR, "malformed envelope or event" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the store is busy or unreachable" },
	{ IK_CONFIG, "the store cannot be used as configured, or a bad\n"
	    "lease, retention or inflight setting" },
	{ -1, NULL },
};

struct job;

struct ctx {
	struct ik_store_lazy db;
	int64_t lease_ms, retention_ms;
	char holder[IK_TOKEN_HEX];      /* our tokens' "@host:pid" (mine); empty:
	                                 * copies are not held (one-shot) */
	int group_hold;                 /* --stream's group path: claim() marks them */
	struct job *held;               /* copies held for their original, and claims
	                                 * waiting for a slot (not yet sent) */
	size_t store_max;               /* claims at the store at once (--inflight) */
};

/* Envelopes the step loop may hold beyond --inflight: the held copies,
 * which wait for their originals, not for the store, must not take the
 * claims' slots (sqs-recv's window bounds what a pipeline holds). */
#define HOLD_EXTRA IK_STORE_INFLIGHT_MAX

/* How much sooner than the retention a copy counts as stale: a tenth of
 * it, at most a day (3 days of the default 30 would refuse copies whose
 * record is surely alive).  It covers the clocks: sentAt is the queue's,
 * expiresAt the claiming worker's, and TTL deletion times vary.  The
 * first record was written when the first copy was claimed, after it was
 * sent, so it lives at least until firstSentAt + retention. */
static int64_t
stale_margin_ms(int64_t retention_ms)
{
	int64_t m = retention_ms / 10;
	return m > 86400000 ? 86400000 : m;
}

static void
note(cJSON *r, const char *k, const char *v)
{
	if (v)
		cJSON_AddStringToObject(r, k, v);
}

/* The claim just ACQUIRED a stale copy (first sent at first, ms).  Whether
 * it found no record is the claim's own answer, never a read before it
 * (a get that saw nothing could race a record being written; a get that
 * saw one, a record expiring): attempt 1 means the conditional write
 * inserted the key, so there was none.  attempt > 1 took over an expired
 * lease on a live record, which says what happened to the charge: go on.
 * The fresh record is then finished FAILED with the reason, fenced on our
 * token, so that every later copy is DUP_FAILED (DLQ) instead of a fresh
 * claim once our lease ended; in a stream group both writes share one
 * commit.  Returns IK_OK to go on, else IK_STALE_EVENT with the reason in
 * why (and, when recording it failed, that too: the copy still goes to
 * the DLQ, where only an operator can re-drive it). */
static int
stale_refusal(struct ctx *c, struct ik_store *store, const struct ik_claim_req *req,
    const struct ik_claim_res *res, int64_t first, char *why, size_t whysz)
{
	struct ik_finish_req fin;
	ik_err err = { 0 };
	int n;

	if (res->attempt != 1 || first <= 0 ||
	    req->now_ms - first < c->retention_ms - stale_margin_ms(c->retention_ms))
		return IK_OK;
	n = snprintf(why, whysz, "no record, and the message was first sent %lld s ago "
	    "(records are kept %lld s, less a margin of %lld s): its record may have "
	    "expired, so it is not claimed afresh", (long long)((req->now_ms - first) / 1000),
	    (long long)(c->retention_ms / 1000),
	    (long long)(stale_margin_ms(c->retention_ms) / 1000));
	fin = (struct ik_finish_req){ .key = req->key, .token = req->token,
	    .state = IK_ST_FAILED, .last_error = why, .now_ms = req->now_ms };
	if (ik_store_finish(store, &fin, &err) != IK_OK && n >= 0 && (size_t)n < whysz)
		snprintf(why + n, whysz - (size_t)n, "; the refusal was not recorded: %s", err.msg);
	return IK_STALE_EVENT;
}

/* One claim from its envelope to its result: on the stack for a claim
 * made alone, on the heap while in flight (--stream on a store that offers
 * it) until the store answered.  req's strings point into it and into env,
 * so they live until the answer. */
struct job {
	struct ctx *c;
	struct job *next;         /* in ctx.held */
	int64_t retry_at, hold_until, backoff_ms;   /* monotonic ms, while held */
	int unsent;               /* in held only waiting for a slot: no answer yet */
	cJSON *env;
	struct ik_event ev;
	char token[IK_TOKEN_HEX];
	int64_t sent_boot_ms;     /* the boot clock before the claim was sent */
	struct ik_claim_req req;
	struct ik_claim_res res;
};

/* The claim could not be made (rc, err): no store, or the store failed. */
static int
failed(struct job *j, int rc, const ik_err *err)
{
	cJSON *r = ik_env_set_result(j->env, "claim", rc);

	cJSON_AddStringToObject(r, "chargeId", j->ev.charge_id);
	note(r, "error", err->msg);
	ik_warnx("%s", err->msg);
	return rc;
}

/* A fresh token and clock readings for j's claim (again for each try of
 * a held copy). */
static void
stamp(struct job *j, const char *body)
{
	struct ctx *c = j->c;

	ik_store_token(j->token);
	/* Read before the wall clock and the send, so the lease, on whatever
	 * clock runs it, began after this reading (envelope.h). */
	j->sent_boot_ms = ik_boot_ms();
	j->req = (struct ik_claim_req){
		.key = j->ev.charge_id, .fingerprint = j->ev.fingerprint, .event = body,
		.token = j->token, .now_ms = ik_now_ms(), .lease_ms = c->lease_ms,
	};
	j->req.expires_at = (j->req.now_ms + c->retention_ms) / 1000;
}

/* Reads the envelope into j: 1 when the claim is to be made (on *store),
 * else 0 with its outcome in *out, already recorded (claimed upstream, a
 * bad event, no store). */
static int
prepare(struct job *j, struct ik_store **store, int *out)
{
	struct ctx *c = j->c;
	cJSON *env = j->env, *r;
	const char *body = ik_env_body(env);
	ik_err err = { 0 };
	int rc;

	if (ik_env_result(env, "claim")) {
		*out = ik_env_outcome(env);   /* already claimed upstream */
		return 0;
	}
	if ((rc = ik_event_parse(body, strlen(body), &j->ev, &err)) != IK_OK) {
		char id[IK_CHARGE_ID_MAX + 1];
		ik_event_peek_id(body, id);
		r = ik_env_set_result(env, "claim", rc);
		note(r, "error", err.msg);
		ik_log(IK_LOG_WARN, "invalid event", "step", "claim", "chargeId", id[0] ? id : NULL,
		    "messageId", ik_env_str(env, "messageId"), "outcome", ik_code_name(rc),
		    "error", err.msg, NULL);
		*out = rc;
		return 0;
	}
	if (!(*store = ik_store_lazy_get(&c->db, &err))) {
		*out = failed(j, err.code, &err);
		return 0;
	}
	stamp(j, body);
	return 1;
}

/* The store's answer (rc, err as store.h's claim returns them) into the
 * envelope; the outcome. */
static int
claimed(struct job *j, struct ik_store *store, int rc, const ik_err *err)
{
	const struct ik_claim_res *res = &j->res;
	cJSON *env = j->env, *r;
	char why[1536], tok[9];

	if (rc != IK_OK)
		return failed(j, rc, err);
	rc = res->code;
	if (rc == IK_OK)
		rc = stale_refusal(j->c, store, &j->req, res, ik_env_first_sent_at(env), why,
		    sizeof why);
	r = ik_env_set_result(env, "claim", rc);
	cJSON_AddStringToObject(r, "chargeId", j->ev.charge_id);
	if (rc == IK_STALE_EVENT) {
		cJSON_AddNumberToObject(r, "firstSentAt", (double)ik_env_first_sent_at(env));
		cJSON_AddStringToObject(r, "error", why);
	} else if (rc == IK_OK) {
		cJSON_AddStringToObject(r, "token", j->token);
		cJSON_AddNumberToObject(r, "attempt", (double)res->attempt);
		cJSON_AddNumberToObject(r, "leaseUntil", (double)res->lease_until);
		/* Ours on a fresh token: the lease granted is the one asked for,
		 * also when the store found our own earlier write again.  It
		 * began after the later of our reading and the store's (a claim
		 * that waited in flight before it went out: store.h). */
		ik_env_add_lease(r, j->req.lease_ms, res->sent_boot_ms > j->sent_boot_ms ?
		    res->sent_boot_ms : j->sent_boot_ms);
	} else {
		cJSON_AddStringToObject(r, "state", ik_state_name(res->cur.state));
		cJSON_AddNumberToObject(r, "attempts", (double)res->cur.attempts);
		if (rc == IK_DUP_IN_PROGRESS) {
			cJSON_AddNumberToObject(r, "leaseUntil", (double)res->lease_until);
			/* The holder's whole lease, from two times one clock
			 * wrote (its claim or renewal and leaseUntil: the
			 * store's on PostgreSQL and Redis, the holder's
			 * elsewhere), so the acker can bound what our clock
			 * makes of leaseUntil. */
			if (res->cur.updated_at > 0 && res->lease_until > res->cur.updated_at)
				cJSON_AddNumberToObject(r, "holderLeaseMs",
				    (double)(res->lease_until - res->cur.updated_at));
		}
		note(r, "debitRef", res->cur.debit_ref);
		if (rc == IK_PAYLOAD_MISMATCH)
			cJSON_AddStringToObject(r, "error", "the same chargeId was first claimed "
			    "with different accountId, amount, currency or chargeType");
		else
			note(r, "error", res->cur.last_error);
	}
	/* The log names the claim's token (ours, or the live holder's), as
	 * idemp-show cuts it, so a stuck record leads to its run's lines. */
	snprintf(tok, sizeof tok, "%.8s", rc == IK_OK ? j->token :
	    rc == IK_DUP_IN_PROGRESS && res->cur.owner ? res->cur.owner : "");
	ik_record_free(&j->res.cur);   /* also set on our own claim found again */
	if (rc == IK_STALE_EVENT)
		ik_log(IK_LOG_WARN, "stale event refused", "step", "claim", "chargeId",
		    j->ev.charge_id, "messageId", ik_env_str(env, "messageId"), "outcome",
		    ik_code_name(rc), "error", why, NULL);
	ik_log(rc == IK_OK ? IK_LOG_DEBUG : IK_LOG_INFO, "claim", "step", "claim",
	    "chargeId", j->ev.charge_id, "messageId", ik_env_str(env, "messageId"),
	    "outcome", rc == IK_OK ? "ACQUIRED" : ik_code_name(rc),
	    rc == IK_OK ? "token" : "holder", tok[0] ? tok : NULL, NULL);
	return rc;
}

static int64_t hold_ms(const struct ctx *c, const char *owner, int64_t lease_until);

/* What claim() leaves in an envelope for claim_hold, never written out
 * (the envelope's own members are camelCase words). */
#define HOLD_KEY "idemp-claim:hold-ms"

static int
claim(cJSON *env, void *arg)
{
	struct job j = { .c = arg, .env = env };
	struct ik_store *store = NULL;
	ik_err err = { 0 };
	int64_t ms = 0;
	int rc;

	if (!prepare(&j, &store, &rc))
		return rc;
	rc = store->ops->claim(store, &j.req, &j.res, &err);
	if (rc == IK_OK && j.res.code == IK_DUP_IN_PROGRESS && j.c->group_hold)
		ms = hold_ms(j.c, j.res.cur.owner, j.res.lease_until);
	rc = claimed(&j, store, rc, &err);
	if (ms > 0)
		cJSON_AddNumberToObject(env, HOLD_KEY, (double)ms);
	return rc;
}

/* step.h's hold, on the group path: how long the copy claim() found
 * meeting its original in this pipeline may wait here (what it left in
 * the envelope, taken out again: it never leaves this process). */
static int64_t
claim_hold(cJSON *env, void *arg)
{
	cJSON *h = cJSON_DetachItemFromObjectCaseSensitive(env, HOLD_KEY);
	int64_t ms = cJSON_IsNumber(h) ? (int64_t)h->valuedouble : 0;

	cJSON_Delete(h);
	return ms;
}

/* --stream on a store with in-flight claims: step.h's start, wait, reap. */

/* Whether owner is a claim of this run: its holder (ik_store_token's
 * "@host:pid", the pid charge-worker's IDEMKIT_RUN_PID, else this
 * process's) is ours -- every token this process issued, and those of a
 * sibling pipeline or loop of the same charge-worker -j N, whose finish
 * comes as soon.  A pid reused after a crash only makes a copy wait, never
 * longer than hold_ms allows. */
static int
mine(const struct ctx *c, const char *owner)
{
	const char *at;

	/* tokens are strings of varying length (random part, then the
	 * holder): compared as strings, never past their end */
	if (!c->holder[0] || !owner || strlen(owner) >= IK_TOKEN_HEX)
		return 0;
	return (at = strchr(owner, '@')) && strcmp(at, c->holder) == 0;
}

/* At most this long: an original not finished by then is slow (a bank
 * timing out, a retry), and a copy held longer would hold up sqs-recv,
 * which receives nothing while a message it handed out is older than its
 * --max-age; the queue's backoff then does the waiting, as before. */
#define HOLD_CAP_MS 5000

/* How long a copy answered DUP_IN_PROGRESS under lease_until may be held
 * for its original (see the top), 0 when not at all.  The margin before
 * the original's lease ends: a tenth of our lease, at least 1 s (a
 * retry's round trip on a loaded machine) and at most 5 s: a held copy is
 * passed on while the original still owns its lease, never left to take
 * it over.  What is left is never taken as more than the lease this
 * process grants: the record's leaseUntil may be on the store's clock
 * (PostgreSQL, Redis). */
static int64_t
hold_ms(const struct ctx *c, const char *owner, int64_t lease_until)
{
	int64_t margin = c->lease_ms / 10, left;

	if (margin < 1000)
		margin = 1000;
	if (margin > 5000)
		margin = 5000;
	if (ik_stop_signal || !mine(c, owner))
		return 0;
	left = lease_until - ik_now_ms();
	if (left > c->lease_ms)
		left = c->lease_ms;
	left -= margin;
	return left <= 0 ? 0 : left < HOLD_CAP_MS ? left : HOLD_CAP_MS;
}

/* Whether j, answered DUP_IN_PROGRESS, is held for its original in flight
 * (the claims in flight; the group path holds through step.h's hold). */
static int
hold(struct job *j)
{
	struct ctx *c = j->c;
	int64_t now = ik_mono_ms();

	if (!j->hold_until) {
		int64_t ms = hold_ms(c, j->res.cur.owner, j->res.lease_until);

		if (!ms)
			return 0;
		j->hold_until = now + ms;
	} else if (ik_stop_signal || !mine(c, j->res.cur.owner)) {
		return 0;
	}
	j->backoff_ms = j->backoff_ms ? j->backoff_ms * 2 : IK_STEP_RETRY_FIRST_MS;
	if (j->backoff_ms > IK_STEP_RETRY_MAX_MS)
		j->backoff_ms = IK_STEP_RETRY_MAX_MS;
	j->retry_at = now + j->backoff_ms;
	if (j->retry_at >= j->hold_until)
		return 0;
	j->next = c->held;
	c->held = j;
	return 1;
}

static void
answered(void *arg, int rc, const ik_err *err)
{
	struct job *j = arg;
	struct ctx *c = j->c;

	if (rc == IK_OK && j->res.code == IK_DUP_IN_PROGRESS && hold(j))
		return;   /* the record (res.cur) is kept for when it is passed on */
	claimed(j, c->db.store, rc, err);
	ik_store_lazy_done(&c->db, j->env);
	free(j);
}

/* Appends j to ctx.held: the claims waiting for a slot keep their order. */
static void
held_append(struct ctx *c, struct job *j)
{
	struct job **pp = &c->held;

	while (*pp)
		pp = &(*pp)->next;
	j->next = NULL;
	*pp = j;
}

/* The held copies whose time came are claimed again (or passed on as
 * DUP_IN_PROGRESS at a stop); returns the ms until the next one is due,
 * -1 when none is held. */
static int
retry_held(struct ctx *c)
{
	struct job **pp = &c->held, *j;
	struct ik_store *store = c->db.store;
	int64_t now = ik_mono_ms(), next = -1;
	ik_err err = { 0 };
	int rc;

	while ((j = *pp)) {
		/* A held copy whose time is up (it waited for a slot past it)
		 * goes as answered, never tried again after it: a try past its
		 * original's lease would take the lease over. */
		int go = !j->unsent && (ik_stop_signal || now >= j->hold_until);

		if (!go && !ik_stop_signal && (j->retry_at > now ||
		    store->ops->active(store) >= c->store_max)) {
			/* not yet due, or no slot: an answer frees one */
			if (j->retry_at > now && (next < 0 || j->retry_at - now < next))
				next = j->retry_at - now;
			pp = &j->next;
			continue;
		}
		*pp = j->next;
		if (go) {
			claimed(j, store, IK_OK, NULL);    /* DUP_IN_PROGRESS, as answered */
			ik_store_lazy_done(&c->db, j->env);
			free(j);
			continue;
		}
		if (!j->unsent) {
			ik_record_free(&j->res.cur);
			stamp(j, ik_env_body(j->env));
		}
		j->unsent = 0;
		if ((rc = store->ops->claim_start(store, &j->req, &j->res, answered, j,
		    &err)) != IK_OK) {
			claimed(j, store, rc, &err);
			ik_store_lazy_done(&c->db, j->env);
			free(j);
		}
	}
	return next > INT32_MAX ? INT32_MAX : (int)next;
}

static int
claim_start(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct ik_store *store = NULL;
	struct job *j = calloc(1, sizeof *j);
	ik_err err = { 0 };
	int rc;

	if (!j) {
		failed(&(struct job){ .c = c, .env = env }, IK_SOFTWARE,
		    &(ik_err){ .code = IK_SOFTWARE, .msg = "out of memory" });
		return 1;
	}
	*j = (struct job){ .c = c, .env = env };
	if (prepare(j, &store, &rc)) {
		if (store->ops->active(store) >= c->store_max) {
			/* no slot (held copies do not take one): sent in turn */
			j->unsent = 1;
			j->retry_at = 0;
			held_append(c, j);
			return 0;
		}
		if ((rc = store->ops->claim_start(store, &j->req, &j->res, answered, j,
		    &err)) == IK_OK)
			return 0;
		claimed(j, store, rc, &err);
	}
	free(j);
	return 1;
}

static int
claim_wait(void *arg, int fd, int *readable, int timeout_ms)
{
	struct ctx *c = arg;
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	int next = retry_held(c), rc;

	if (next >= 0 && (timeout_ms < 0 || next < timeout_ms))
		timeout_ms = next;
	if (c->held && !c->db.store->ops->active(c->db.store)) {
		/* only held copies: wait for their time or for input */
		if (readable)
			*readable = 0;
		if (fd < 0)
			ik_sleep_ms(timeout_ms);
		else if (poll(&pf, 1, timeout_ms) > 0 && readable)
			*readable = 1;
		rc = 0;
	} else {
		rc = ik_store_lazy_wait(&c->db, fd, readable, timeout_ms);
	}
	retry_held(c);
	return rc;
}

static cJSON *
claim_reap(void *arg)
{
	return ik_store_lazy_reap(&((struct ctx *)arg)->db);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "check", no_argument, NULL, 'C' },
		{ "check-store", no_argument, NULL, 'K' },
		{ "stream", no_argument, NULL, 's' },
		{ "lease", required_argument, NULL, 'l' },
		{ "inflight", required_argument, NULL, 'n' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { 0 };
	struct ik_step st = { .name = "claim", .fn = claim, .ctx = &c,
	    .begin = ik_store_group_begin, .commit = ik_store_group_commit,
	    .group_ctx = &c.db, .settle = ik_settle, .settle_ctx = &c.db };
	const char *lease = NULL, *inflight = NULL;
	ik_err err = { 0 };
	int ch, rc, check = 0;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "sl:n:S:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'C': check = 1; break;
		case 'K': check = 2; break;
		case 's': st.stream = 1; break;
		case 'l': lease = optarg; break;
		case 'n': inflight = optarg; break;
		case 'S': c.db.url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if ((rc = ik_store_lease(lease, &c.lease_ms)) != IK_OK ||
	    (rc = ik_store_inflight(inflight, &st.inflight)) != IK_OK)
		return rc;
	if (ik_store_retention(c.lease_ms, &c.retention_ms, &err) != IK_OK)
		return ik_fail(&err);
	/* What charge-worker asks before it receives anything.  The store is
	 * opened here, by the step that creates it, since the read-only
	 * commands (idemp-show) no longer create one, and read as a claim
	 * reads it (ik_store_check). */
	if (check == 2) {
		struct ik_store *s = ik_store_lazy_get(&c.db, &err);

		if (!s || ik_store_check(s, &err) != IK_OK) {
			ik_store_lazy_close(&c.db);
			return ik_fail(&err);
		}
	}
	if (check) {
		ik_store_lazy_close(&c.db);
		return IK_OK;
	}
	if (st.stream) {   /* copies held: the holder our tokens name */
		char tok[IK_TOKEN_HEX], *at;

		ik_store_token(tok);
		if ((at = strchr(tok, '@')))
			snprintf(c.holder, sizeof c.holder, "%s", at);
	}
	if (st.stream && ik_store_lazy_inflight(&c.db, st.inflight + HOLD_EXTRA)) {
		c.store_max = st.inflight;
		st.inflight += HOLD_EXTRA;
		st.start = claim_start;
		st.wait = claim_wait;
		st.reap = claim_reap;
	} else if (st.stream && c.holder[0]) {
		c.group_hold = 1;
		st.hold = claim_hold;
	}
	rc = ik_step_run(&st);
	ik_store_lazy_close(&c.db);
	return rc;
}
