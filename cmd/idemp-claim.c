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
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "envelope.h"
#include "event.h"
#include "log.h"
#include "outcome.h"
#include "step.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"usage: idemp-claim [--stream] [--lease DUR] [--store URL] < envelope|event\n";
static const char options[] =
	"  -s, --stream       many envelopes in, one out per line; outcome in the envelope\n"
	"  -l, --lease DUR    how long the claim is held (default 120s; $IDEMKIT_LEASE)\n"
	"  -S, --store URL    sqlite:PATH or dynamodb:TABLE (default $IDEMKIT_STORE,\n"
	"                     else sqlite:$IDEMKIT_STATE_DIR/idempotency.db)\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const int codes[] = { IK_OK, IK_DUP_DONE, IK_DUP_IN_PROGRESS,
	IK_DUP_FAILED, IK_PAYLOAD_MISMATCH, IK_STALE_EVENT, IK_USAGE,
	IK_DATAERR, IK_SOFTWARE, IK_TEMPFAIL, IK_CONFIG, -1 };

struct ctx {
	struct ik_store_lazy db;
	int64_t lease_ms, retention_ms;
};

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
	if (store->ops->finish(store, &fin, &err) != IK_OK && n >= 0 && (size_t)n < whysz)
		snprintf(why + n, whysz - (size_t)n, "; the refusal was not recorded: %s", err.msg);
	return IK_STALE_EVENT;
}

static int
claim(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct ik_event ev;
	struct ik_claim_req req;
	struct ik_claim_res res;
	struct ik_store *store;
	char token[IK_TOKEN_HEX], why[1536];
	const char *body = ik_env_body(env);
	ik_err err = { 0 };
	cJSON *r;
	int rc;

	if (ik_env_result(env, "claim"))
		return ik_env_outcome(env);   /* already claimed upstream */
	if ((rc = ik_event_parse(body, strlen(body), &ev, &err)) != IK_OK) {
		char id[IK_CHARGE_ID_MAX + 1];
		ik_event_peek_id(body, id);
		r = ik_env_set_result(env, "claim", rc);
		note(r, "error", err.msg);
		ik_log(IK_LOG_WARN, "invalid event", "step", "claim", "chargeId", id[0] ? id : NULL,
		    "messageId", ik_env_str(env, "messageId"), "outcome", ik_code_name(rc),
		    "error", err.msg, NULL);
		return rc;
	}
	if (!(store = ik_store_lazy_get(&c->db, &err))) {
		rc = err.code;
		goto failed;
	}
	ik_store_token(token);
	req = (struct ik_claim_req){
		.key = ev.charge_id, .fingerprint = ev.fingerprint, .event = body,
		.token = token, .now_ms = ik_now_ms(), .lease_ms = c->lease_ms,
	};
	req.expires_at = (req.now_ms + c->retention_ms) / 1000;
	if ((rc = store->ops->claim(store, &req, &res, &err)) != IK_OK)
		goto failed;

	rc = res.code;
	if (rc == IK_OK)
		rc = stale_refusal(c, store, &req, &res, ik_env_first_sent_at(env), why, sizeof why);
	r = ik_env_set_result(env, "claim", rc);
	cJSON_AddStringToObject(r, "chargeId", ev.charge_id);
	if (rc == IK_STALE_EVENT) {
		cJSON_AddNumberToObject(r, "firstSentAt", (double)ik_env_first_sent_at(env));
		cJSON_AddStringToObject(r, "error", why);
	} else if (rc == IK_OK) {
		cJSON_AddStringToObject(r, "token", token);
		cJSON_AddNumberToObject(r, "attempt", (double)res.attempt);
		cJSON_AddNumberToObject(r, "leaseUntil", (double)res.lease_until);
	} else {
		cJSON_AddStringToObject(r, "state", ik_state_name(res.cur.state));
		cJSON_AddNumberToObject(r, "attempts", (double)res.cur.attempts);
		if (rc == IK_DUP_IN_PROGRESS)
			cJSON_AddNumberToObject(r, "leaseUntil", (double)res.lease_until);
		note(r, "debitRef", res.cur.debit_ref);
		if (rc == IK_PAYLOAD_MISMATCH)
			cJSON_AddStringToObject(r, "error", "the same chargeId was first claimed "
			    "with different accountId, amount, currency or chargeType");
		else
			note(r, "error", res.cur.last_error);
	}
	ik_record_free(&res.cur);   /* also set on our own claim found again */
	if (rc == IK_STALE_EVENT)
		ik_log(IK_LOG_WARN, "stale event refused", "step", "claim", "chargeId",
		    ev.charge_id, "messageId", ik_env_str(env, "messageId"), "outcome",
		    ik_code_name(rc), "error", why, NULL);
	ik_log(rc == IK_OK ? IK_LOG_DEBUG : IK_LOG_INFO, "claim", "step", "claim",
	    "chargeId", ev.charge_id, "messageId", ik_env_str(env, "messageId"),
	    "outcome", rc == IK_OK ? "ACQUIRED" : ik_code_name(rc), NULL);
	return rc;

failed:
	r = ik_env_set_result(env, "claim", rc);
	cJSON_AddStringToObject(r, "chargeId", ev.charge_id);
	note(r, "error", err.msg);
	ik_warnx("%s", err.msg);
	return rc;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "stream", no_argument, NULL, 's' },
		{ "lease", required_argument, NULL, 'l' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { .lease_ms = 120000 };
	struct ik_step st = { .name = "claim", .fn = claim, .ctx = &c,
	    .begin = ik_store_group_begin, .commit = ik_store_group_commit,
	    .group_ctx = &c.db };
	const char *lease = getenv("IDEMKIT_LEASE");
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "sl:S:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': st.stream = 1; break;
		case 'l': lease = optarg; break;
		case 'S': c.db.url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if (lease && ik_opt_duration("--lease", lease, 1000, INT64_MAX, &c.lease_ms) < 0)
		return IK_USAGE;
	c.retention_ms = ik_store_retention_ms();
	rc = ik_step_run(&st);
	ik_store_close(c.db.store);
	return rc;
}
