/* idemp-done: record the outcome of a claimed charge, fenced by its token.
 *
 * One conditional write on state = IN_PROGRESS AND owner = token: a worker
 * whose lease was taken over gets LEASE_LOST and changes nothing.  Without
 * --state the final state comes from the envelope; an envelope with nothing
 * to record (not acquired, debit transient) passes through untouched.  A
 * debit left for lack of lease (LEASE_SHORT) has its claim released.
 * In --stream on a store that offers finishes in flight (DynamoDB), up to
 * --inflight finishes are outstanding at once (step.h's start, wait, reap)
 * and envelopes leave as their answers come; a release, rare, is made on
 * its own meanwhile, and re-notify mode keeps the group path.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "envelope.h"
#include "log.h"
#include "outcome.h"
#include "settle.h"
#include "step.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"usage: idemp-done [--stream] [--inflight N]\n"
	"                  [--state DONE|FAILED|DEBITED_NOTIFICATION_FAILED]\n"
	"                  [--store URL] < envelope\n"
	"       idemp-done --renotified [--stream] [--store URL] < envelope\n";
static const char options[] =
	"  -s, --stream       many envelopes in, one out per line; outcome in the envelope\n"
	"  -n, --inflight N   with --stream on DynamoDB: up to N finishes in flight (1-1024,\n"
	"                     default 32, $IDEMKIT_STORE_INFLIGHT); envelopes then\n"
	"                     leave in the order the answers come\n"
	"  -t, --state STATE  record this state instead of deriving it from the envelope\n"
	"  -r, --renotified   re-notify mode: a DEBITED_NOTIFICATION_FAILED record whose\n"
	"                     notification now succeeded becomes DONE\n"
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const int codes[] = {
	IK_OK, IK_LEASE_LOST, IK_USAGE, IK_DATAERR, IK_SOFTWARE, IK_TEMPFAIL, IK_CONFIG, -1
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
	if (state == IK_ST_NONE)
		return 0;
	j->req = (struct ik_finish_req){
		.key = key, .token = token, .state = state,
		.debit_ref = field(env, "debit", "ref"),
		.last_error = ik_settle_last_error(env),
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

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "stream", no_argument, NULL, 's' },
		{ "state", required_argument, NULL, 't' },
		{ "inflight", required_argument, NULL, 'n' },
		{ "renotified", no_argument, NULL, 'r' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { 0 };
	struct ik_step st = { .name = "done", .fn = done, .ctx = &c,
	    .begin = ik_store_group_begin, .commit = ik_store_group_commit,
	    .group_ctx = &c.db };
	const char *inflight = NULL;
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "sn:t:rS:hV", longopts, NULL)) != -1) {
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
		case 'n': inflight = optarg; break;
		case 'S': c.db.url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || (c.renotified && c.state != IK_ST_NONE))
		return ik_usage(usage);
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
