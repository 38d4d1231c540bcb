/* idemp-done: record the outcome of a claimed charge, fenced by its token.
 *
 * One conditional write on state = IN_PROGRESS AND owner = token: a worker
 * whose lease was taken over gets LEASE_LOST and changes nothing.  Without
 * --state the final state comes from the envelope; an envelope with nothing
 * to record (not acquired, debit transient) passes through untouched.  A
 * debit left for lack of lease (LEASE_SHORT) has its claim released.
 * In --stream on a store that offers finishes in flight (DynamoDB,
 * PostgreSQL), up to
 * --inflight finishes are outstanding at once (step.h's start, wait, reap)
 * and envelopes leave as their answers come; a release, rare, is made on
 * its own meanwhile, and re-notify mode keeps the group path.
 * --fail is the operator's per-charge escape (idemp-fail below).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/step.h"
#include "core/utf8.h"
#include "core/util.h"
#include "flow/settle.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-done [--stream] [--inflight N]\n"
	"                  [--state DONE|FAILED|DEBITED_NOTIFICATION_FAILED]\n"
	"                  [--store URL] < envelope\n"
	"       idemp-done --renotified [--stream] [--store URL] < envelope\n"
	"       idemp-done --fail CHARGEID --reason TEXT [--store URL]\n";
static const char options[] =
	"  -s, --stream       many envelopes in, one out per line; outcome in the envelope\n"
	"  -n, --inflight N   with --stream on DynamoDB or PostgreSQL: up to N finishes in\n"
	"                     flight (1-1024, default 32, $IDEMKIT_STORE_INFLIGHT);\n"
	"                     envelopes then leave in the order the answers come\n"
	"  -t, --state STATE  record this state instead of deriving it from the envelope\n"
	"  -r, --renotified   re-notify mode: a DEBITED_NOTIFICATION_FAILED record whose\n"
	"                     notification now succeeded becomes DONE\n"
	"  -F, --fail CHARGEID  an operator's escape for a charge the bank refuses for\n"
	"                     good: record its IN_PROGRESS claim, lease ended, FAILED with\n"
	"                     --reason; its next delivery goes to the DLQ (DUP_FAILED)\n"
	"  -R, --reason TEXT  why, recorded as the record's last error\n"
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the state was recorded (or the claim released)" },
	{ IK_EMPTY, "no envelope on stdin: nothing to do; --fail: no\n"
	    "record of that chargeId" },
	{ IK_DUP_DONE, "--fail: the bank debited the charge; nothing\n"
	    "was written" },
	{ IK_DUP_IN_PROGRESS, "--fail: a live lease holds the charge" },
	{ IK_LEASE_LOST, "the token no longer owns the record; nothing\n"
	    "was written" },
	{ IK_USAGE, "bad command line" },
	{ IK_DATAERR, "malformed envelope, or no claim in it" },
	{ IK_SOFTWARE, "internal error, or the store refused what was\n"
	    "written" },
	{ IK_TEMPFAIL, "the store is busy or unreachable" },
	{ IK_CONFIG, "the store cannot be used as configured" },
	{ -1, NULL },
};

struct ctx {
	struct ik_store_lazy db;
	enum ik_state state;
	int renotified;
};

/* Re-notify: the envelope came from idemp-list --format envelope through
 * charge-notify.  Only DNF -> DONE, conditioned on the state. */
static int
renotified(cJSON *env, struct ctx *c)
{
	const char *key = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
	    ik_env_result(env, "recovery"), "chargeId"));
	struct ik_store *store;
	ik_err err = { 0 };
	cJSON *r;
	int rc;

	if (!key) {
		r = ik_env_set_result(env, "done", IK_DATAERR);
		cJSON_AddStringToObject(r, "error", "no recovery.chargeId: not from idemp-list --format envelope");
		ik_warnx("no recovery.chargeId: not from idemp-list --format envelope");
		return IK_DATAERR;
	}
	if (ik_env_step_code(env, "notify") != IK_OK)
		return ik_env_outcome(env);
	if ((store = ik_store_lazy_get(&c->db, &err)))
		rc = store->ops->renotified(store, key, ik_now_ms(), &err);
	else
		rc = err.code;
	r = ik_env_set_result(env, "done", rc);
	cJSON_AddStringToObject(r, "state", rc == IK_OK ? "DONE" : "DEBITED_NOTIFICATION_FAILED");
	if (rc == IK_LEASE_LOST)
		cJSON_AddStringToObject(r, "error", "record is no longer DEBITED_NOTIFICATION_FAILED");
	else if (rc != IK_OK) {
		cJSON_AddStringToObject(r, "error", err.msg);
		ik_warnx("%s", err.msg);
	}
	ik_log(rc == IK_OK ? IK_LOG_INFO : IK_LOG_WARN, "renotified", "step", "done",
	    "chargeId", key, "outcome", ik_code_name(rc), NULL);
	return rc;
}

static const char *
field(const cJSON *env, const char *step, const char *name)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
	    ik_env_result(env, step), name));
}

/* charge-debit left the envelope (LEASE_SHORT: nothing was sent): end our
 * lease now, fenced by the token, so a retry can claim the charge at once
 * instead of after the lease.  The record stays IN_PROGRESS. */
static int
release(cJSON *env, struct ctx *c, const char *key, const char *token)
{
	struct ik_store *store;
	ik_err err = { 0 };
	cJSON *r;
	int rc;

	if ((store = ik_store_lazy_get(&c->db, &err)))
		rc = store->ops->release(store, key, token, ik_now_ms(), &err);
	else
		rc = err.code;
	r = ik_env_set_result(env, "done", rc);
	cJSON_AddStringToObject(r, "state", "IN_PROGRESS");
	cJSON_AddBoolToObject(r, "released", rc == IK_OK);
	if (rc == IK_LEASE_LOST)
		cJSON_AddStringToObject(r, "error", "lease lost: another claim holds this "
		    "chargeId now; nothing was released");
	else if (rc != IK_OK) {
		cJSON_AddStringToObject(r, "error", err.msg);
		ik_warnx("%s", err.msg);
	}
	ik_log(rc == IK_OK ? IK_LOG_DEBUG : IK_LOG_WARN, "released", "step", "done",
	    "chargeId", key, "messageId", ik_env_str(env, "messageId"),
	    "outcome", ik_code_name(rc), NULL);
	return rc;
}

/* charge-debit answered TEMPFAIL or CONFIG: the record stays IN_PROGRESS
 * and the lease decides the retry, but the reason goes into the record
 * (fenced by the token) so idemp-show says why the charge is stuck behind
 * a bank outage instead of "last error -".  A store without the op, or a
 * note that fails, changes nothing else: the envelope passes untouched. */
static void
note(cJSON *env, struct ctx *c, const char *key, const char *token, int debit)
{
	struct ik_store *store;
	ik_err err = { 0 };
	const char *why = field(env, "debit", "error");
	struct ik_buf reason = { 0 };
	const char *text;
	char *copy = NULL;
	int rc;

	if (!(store = ik_store_lazy_get(&c->db, &err)) || !store->ops->note)
		return;
	ik_buf_addstr(&reason, ik_code_name(debit));
	ik_buf_addstr(&reason, " from the bank: ");
	ik_buf_addstr(&reason, why ? why : "no reason given");
	if (ik_buf_addstr(&reason, " (the lease decides the retry)") < 0 || !reason.p) {
		ik_buf_free(&reason);
		return;
	}
	/* The bank's text, valid UTF-8 as a finish's is (store.c): PostgreSQL
	 * and DynamoDB refuse other text, and the reason would be lost. */
	if (ik_utf8_clean(reason.p, &text, &copy) < 0) {
		ik_buf_free(&reason);
		return;
	}
	rc = store->ops->note(store, key, token, text, &err);
	free(copy);
	ik_log(rc == IK_OK ? IK_LOG_DEBUG : IK_LOG_WARN, "reason noted", "step", "done",
	    "chargeId", key, "messageId", ik_env_str(env, "messageId"),
	    "outcome", ik_code_name(rc), "error", rc == IK_OK || rc == IK_LEASE_LOST ? NULL :
	    err.msg, NULL);
	ik_buf_free(&reason);
}

/* One finish from its envelope to its result: on the stack for a finish
 * made alone, on the heap while in flight (--stream on a store that offers
 * it) until the store answered.  req's strings point into env (or are
 * literals), so they live until the answer. */
struct job {
	struct ctx *c;
	cJSON *env;
	struct ik_finish_req req;
};

/* Reads the envelope into j->req: 1 when the finish is to be made, else 0
 * with the outcome in *out, already recorded (nothing to record, a bad
 * envelope, a release, re-notify mode). */
static int
prepare(struct job *j, int *out)
{
	struct ctx *c = j->c;
	cJSON *env = j->env, *r;
	const cJSON *claim = ik_env_result(env, "claim");
	const char *key = field(env, "claim", "chargeId");
	const char *token = field(env, "claim", "token");
	enum ik_state state;

	*out = ik_env_outcome(env);
	if (c->renotified) {
		*out = renotified(env, c);
		return 0;
	}
	if (!claim) {
		r = ik_env_set_result(env, "done", IK_DATAERR);
		cJSON_AddStringToObject(r, "error", "envelope has no claim; run idemp-claim first");
		ik_warnx("envelope has no claim; run idemp-claim first");
		*out = IK_DATAERR;
		return 0;
	}
	if (ik_env_step_code(env, "claim") != IK_OK)
		return 0;
	if (!key || !token) {
		r = ik_env_set_result(env, "done", IK_DATAERR);
		cJSON_AddStringToObject(r, "error", "claim: chargeId or token missing");
		ik_warnx("claim: chargeId or token missing");
		*out = IK_DATAERR;
		return 0;
	}
	if (c->state == IK_ST_NONE && ik_env_step_code(env, "debit") == IK_LEASE_SHORT) {
		*out = release(env, c, key, token);
		return 0;
	}
	state = c->state != IK_ST_NONE ? c->state : ik_settle_state(env);
	if (state == IK_ST_NONE && (ik_env_step_code(env, "debit") == IK_TEMPFAIL ||
	    ik_env_step_code(env, "debit") == IK_CONFIG))
		note(env, c, key, token, ik_env_step_code(env, "debit"));
	if (state == IK_ST_NONE)
		return 0;
	j->req = (struct ik_finish_req){
		.key = key, .token = token, .state = state,
		.debit_ref = field(env, "debit", "ref"),
		.last_error = ik_settle_last_error(env),
		.bank_replayed = ik_settle_bank_replayed(env),
		.now_ms = ik_now_ms(),
	};
	return 1;
}

/* The store's answer (rc, err as store.h's finish returns them) into the
 * envelope; the outcome. */
static int
recorded(struct job *j, int rc, const ik_err *err)
{
	cJSON *env = j->env;
	cJSON *r = ik_env_set_result(env, "done", rc);

	cJSON_AddStringToObject(r, "state", ik_state_name(j->req.state));
	if (rc == IK_LEASE_LOST)
		cJSON_AddStringToObject(r, "error", "lease lost: another claim holds this "
		    "chargeId now; nothing was recorded");
	else if (rc != IK_OK) {
		cJSON_AddStringToObject(r, "error", err->msg);
		ik_warnx("%s", err->msg);
	}
	ik_log(rc == IK_OK ? IK_LOG_DEBUG : IK_LOG_WARN, "done", "step", "done",
	    "chargeId", j->req.key, "messageId", ik_env_str(env, "messageId"),
	    "state", ik_state_name(j->req.state), "outcome", ik_code_name(rc), NULL);
	return rc;
}

static int
done(cJSON *env, void *arg)
{
	struct job j = { .c = arg, .env = env };
	struct ik_store *store;
	ik_err err = { 0 };
	int rc;

	if (!prepare(&j, &rc))
		return rc;
	if (!(store = ik_store_lazy_get(&j.c->db, &err)))
		return recorded(&j, err.code, &err);
	return recorded(&j, ik_store_finish(store, &j.req, &err), &err);
}

/* --stream on a store with in-flight finishes: step.h's start, wait, reap. */
static void
answered(void *arg, int rc, const ik_err *err)
{
	struct job *j = arg;
	struct ctx *c = j->c;

	recorded(j, rc, err);
	ik_store_lazy_done(&c->db, j->env);
	free(j);
}

static int
done_start(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct job *j = calloc(1, sizeof *j);
	ik_err err = { 0 };
	int rc;

	if (!j) {
		recorded(&(struct job){ .c = c, .env = env }, IK_SOFTWARE,
		    &(ik_err){ .code = IK_SOFTWARE, .msg = "out of memory" });
		return 1;
	}
	*j = (struct job){ .c = c, .env = env };
	if (prepare(j, &rc)) {
		if ((rc = ik_store_finish_start(c->db.store, &j->req, answered, j, &err)) ==
		    IK_OK)
			return 0;
		recorded(j, rc, &err);
	}
	free(j);
	return 1;
}

static int
done_wait(void *arg, int fd, int *readable, int timeout_ms)
{
	return ik_store_lazy_wait(&((struct ctx *)arg)->db, fd, readable, timeout_ms);
}

static cJSON *
done_reap(void *arg)
{
	return ik_store_lazy_reap(&((struct ctx *)arg)->db);
}

/* --fail: a charge the bank refuses for good (CONFIG on every try: an
 * account closed, a product the bank no longer books) comes back on every
 * delivery until the queue's redrive gives up.  The operator ends it now:
 * its record becomes FAILED with the reason, so its next delivery is
 * DUP_FAILED and goes to the DLQ with its body.  Only an IN_PROGRESS claim
 * whose lease ended (nobody is calling the bank for it), finished on the
 * owner token read from the record: the write stays the fenced finish, so
 * a claim taken meanwhile makes it LEASE_LOST and changes nothing.  Never
 * a record the bank debited (DONE, DNF): FAILED says no money moved. */
static int
fail(const char *url, const char *key, const char *reason)
{
	struct ik_store *s;
	struct ik_record r;
	ik_err err = { 0 };
	struct ik_buf why = { 0 };
	int64_t now = ik_now_ms();
	int rc;

	if (ik_store_open_existing(url, &s, &err) != IK_OK)
		return ik_fail(&err);
	if ((rc = s->ops->get(s, key, &r, &err)) == IK_EMPTY) {
		ik_warnk(key, "no record in %s: nothing to fail (its next delivery claims it)",
		    s->url);
		goto out;
	}
	if (rc != IK_OK) {
		ik_fail(&err);
		goto out;
	}
	switch (r.state) {
	case IK_ST_FAILED:
		ik_warnk(key, "already FAILED (%s)", r.last_error ? r.last_error : "-");
		rc = IK_OK;
		break;
	case IK_ST_DONE:
	case IK_ST_DNF:
		ik_warnk(key, "%s: the bank debited it; it cannot be FAILED",
		    ik_state_name(r.state));
		rc = IK_DUP_DONE;
		break;
	case IK_ST_IN_PROGRESS:
		if (r.lease_until >= now) {
			ik_warnk(key, "a live lease holds it (%llds left): wait for it to end",
			    (long long)((r.lease_until - now) / 1000 + 1));
			rc = IK_DUP_IN_PROGRESS;
			break;
		}
		ik_buf_addstr(&why, "FAILED by an operator: ");
		if (ik_buf_addstr(&why, reason) < 0 || !why.p) {
			rc = ik_errf(&err, IK_SOFTWARE, "out of memory");
			ik_fail(&err);
			break;
		}
		rc = ik_store_finish(s, &(struct ik_finish_req){ .key = key, .token = r.owner,
		    .state = IK_ST_FAILED, .last_error = why.p, .now_ms = now }, &err);
		if (rc == IK_LEASE_LOST)
			ik_warnk(key, "claimed again meanwhile; nothing was recorded");
		else if (rc != IK_OK)
			ik_fail(&err);
		else
			ik_log(IK_LOG_AUDIT, "recorded FAILED by an operator", "chargeId", key,
			    "reason", reason, NULL);
		break;
	default:
		rc = ik_errf(&err, IK_SOFTWARE, "%s: a state this version does not know", key);
		ik_fail(&err);
	}
	ik_buf_free(&why);
	ik_record_free(&r);
out:
	ik_store_close(s);
	return ik_finish(rc);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "stream", no_argument, NULL, 's' },
		{ "state", required_argument, NULL, 't' },
		{ "inflight", required_argument, NULL, 'n' },
		{ "renotified", no_argument, NULL, 'r' },
		{ "fail", required_argument, NULL, 'F' },
		{ "reason", required_argument, NULL, 'R' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { 0 };
	struct ik_step st = { .name = "done", .fn = done, .ctx = &c,
	    .begin = ik_store_group_begin, .commit = ik_store_group_commit,
	    .group_ctx = &c.db };
	const char *inflight = NULL, *fail_key = NULL, *reason = NULL;
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "sn:t:rF:R:S:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': st.stream = 1; break;
		case 't':
			c.state = ik_state_parse(optarg);
			if (c.state == IK_ST_NONE || c.state == IK_ST_IN_PROGRESS) {
				ik_warnx("--state: \"%s\" is not DONE, FAILED or "
				    "DEBITED_NOTIFICATION_FAILED", optarg);
				return IK_USAGE;
			}
			break;
		case 'r': c.renotified = 1; break;
		case 'F': fail_key = optarg; break;
		case 'R': reason = optarg; break;
		case 'n': inflight = optarg; break;
		case 'S': c.db.url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || (c.renotified && c.state != IK_ST_NONE))
		return ik_usage(usage);
	if (fail_key || reason) {
		if (!fail_key || !reason || !*reason || st.stream || c.renotified ||
		    c.state != IK_ST_NONE || inflight) {
			ik_warnx("--fail CHARGEID needs --reason TEXT, and goes alone");
			return IK_USAGE;
		}
		if ((rc = ik_keys_check(1, (char **)&fail_key)) != IK_OK)
			return rc;
		return fail(c.db.url, fail_key, reason);
	}
	if ((rc = ik_store_inflight(inflight, &st.inflight)) != IK_OK)
		return rc;
	/* Re-notify is a recovery job's rare write: it keeps the group path. */
	if (st.stream && !c.renotified && ik_store_lazy_inflight(&c.db, st.inflight)) {
		st.start = done_start;
		st.wait = done_wait;
		st.reap = done_reap;
	}
	rc = ik_step_run(&st);
	ik_store_lazy_close(&c.db);
	return rc;
}
