/* idemp-claim: claim a chargeId in the idempotency store, once.
 *
 * The claim is one conditional write (store.h); whatever it answers is
 * written into the envelope as "claim" and, in one-shot mode, is the exit
 * code.  A body that is not a valid ChargeDueEvent is DATAERR and still
 * goes out, intact, so sqs-ack can move it to the DLQ.
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
static const int codes[] = { 0, 10, 11, 12, 14, 64, 65, 70, 75, 78, -1 };

struct ctx {
	struct ik_store_lazy db;
	int64_t lease_ms, retention_ms;
};

static void
note(cJSON *r, const char *k, const char *v)
{
	if (v)
		cJSON_AddStringToObject(r, k, v);
}

static int
claim(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct ik_event ev;
	struct ik_claim_req req;
	struct ik_claim_res res;
	struct ik_store *store;
	char token[IK_TOKEN_HEX];
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
	r = ik_env_set_result(env, "claim", rc);
	cJSON_AddStringToObject(r, "chargeId", ev.charge_id);
	if (rc == IK_OK) {
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
	if (lease && (ik_parse_duration(lease, &c.lease_ms) < 0 || c.lease_ms < 1000)) {
		ik_warnx("--lease: \"%s\" is not a duration of at least 1s (e.g. 90s, 5m)", lease);
		return IK_USAGE;
	}
	c.retention_ms = ik_store_retention_ms();
	rc = ik_step_run(&st);
	ik_store_close(c.db.store);
	return rc;
}
