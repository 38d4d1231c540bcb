/* charge-debit: debit a claimed charge through the core-banking API, with
 * the chargeId as the bank's own idempotency key.
 *
 * Only an envelope whose claim is ACQUIRED is debited; any other passes
 * through untouched.  The bank's answer is written into the envelope as
 * "debit" and, in one-shot mode, is the exit code:
 *   2xx                    OK, the money moved (replayed: true when the bank
 *                          says so), with the ref --ref finds, or ref null
 *                          and a warning (none found, or a body too large or
 *                          cut short): never a failure after a 2xx
 *   --declined-status (402 422)                DECLINED, with the bank's reason
 *   --retry-status (408 409 425 429 5xx), timeouts, connection errors
 *                                              TEMPFAIL
 *   (nothing sent) the claim's lease shorter than --timeout + --lease-margin
 *                                              LEASE_SHORT
 *   any other status (401, 403, 404, other 4xx, 1xx, 3xx)
 *                                              CONFIG: the message is left,
 *                          the record stays claimable, an operator looks
 * The status classes live in lib/bank/ (made by bankapi.c, read by
 * ik_bankapi_classify in bankapi_conf.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bank/bankapi.h"
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
	"usage: charge-debit [--check | --dry-run] [--stream] [--url URL] [--key-header NAME]\n"
	"                    [--cacert FILE] [--connect-timeout DUR] [--timeout DUR]\n"
	"                    [--declined-status LIST] [--retry-status LIST]\n"
	"                    [--lease-margin DUR] [--request FILTER] [--ref FILTER]\n"
	"                    [--reason FILTER] [--replay-header 'NAME: VALUE']\n"
	"                    [--inflight N]\n"
	"                    [--client-cert FILE --client-key FILE] < envelope\n";
static const char options[] =
	"  --check                  check the configuration (URL, files, status lists,\n"
	"                           jq programs) with no network call: 0, or 78 and why\n"
	"  --dry-run                print the request for the envelope or event on stdin\n"
	"                           (method, URL, headers with secrets as ***, body)\n"
	"                           without sending it: 0, or 65/78 and why\n"
	"  -s, --stream             many envelopes in, one out per line\n"
	"  --inflight N             with --stream: up to N requests in flight (1-1024,\n"
	"                           default 64, $IDEMKIT_BANK_INFLIGHT); envelopes are\n"
	"                           written as their answers come, in any order\n"
	"  -u, --url URL            the debit endpoint (default $IDEMKIT_BANK_URL)\n"
	"  -k, --key-header NAME    idempotency-key header (default Idempotency-Key,\n"
	"                           $IDEMKIT_BANK_KEY_HEADER)\n"
	"  --replay-header 'NAME: VALUE'\n"
	"                           what a 2xx carries when it answers a key the bank\n"
	"                           had seen (default 'Idempotent-Replayed: true',\n"
	"                           $IDEMKIT_BANK_REPLAY_HEADER): debit.replayed\n"
	"  -c, --cacert FILE        CA bundle to verify the bank (default the system's,\n"
	"                           $IDEMKIT_BANK_CACERT)\n"
	"  --connect-timeout DUR    default 3s\n"
	"  --timeout DUR            whole request, default 10s\n"
	"  --declined-status LIST   statuses that are the bank's refusal (default\n"
	"                           402,422, $IDEMKIT_BANK_DECLINED)\n"
	"  --retry-status LIST      transient statuses (default 408,409,425,429,5xx,\n"
	"                           $IDEMKIT_BANK_RETRY); any other non-2xx is CONFIG\n"
	"  --lease-margin DUR       send nothing (LEASE_SHORT) when the claim's lease has\n"
	"                           less than --timeout plus this left; default 2s\n"
	"  --request FILTER         jq program building the request body from the event\n"
	"                           ($key, $amountMajor, $attempt, $ref; default the\n"
	"                           built-in body, $IDEMKIT_BANK_REQUEST)\n"
	"  --ref FILTER             jq program taking the bank's reference out of a 2xx\n"
	"                           body (default .ref, $IDEMKIT_BANK_REF)\n"
	"  --reason FILTER          jq program taking the reason out of a refusal\n"
	"                           (default .reason/.message/.error, $IDEMKIT_BANK_REASON)\n"
	"  --client-cert FILE       mutual TLS: PEM certificate ($IDEMKIT_BANK_CLIENT_CERT)\n"
	"  --client-key FILE        its PEM key, mode 0600 or stricter\n"
	"                           ($IDEMKIT_BANK_CLIENT_KEY)\n"
	"  -h, --help, -V, --version\n"
	"Credentials: $IDEMKIT_BANK_TOKEN or $IDEMKIT_BANK_TOKEN_FILE (bearer), or\n"
	"OAuth2 client credentials ($IDEMKIT_BANK_OAUTH_TOKEN_URL, _CLIENT_ID,\n"
	"_CLIENT_SECRET_FILE, _SCOPE); $IDEMKIT_BANK_HMAC_KEY_FILE (X-Idemkit-Timestamp\n"
	"and X-Idemkit-Signature); never on the command line.\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "debited (or replayed); --check: the configuration\n"
	    "is usable" },
	{ IK_EMPTY, "no envelope or event on stdin: nothing to do" },
	{ IK_DUP_DONE, "passed through (the claim's outcome)" },
	{ IK_DUP_IN_PROGRESS, "passed through (the claim's outcome)" },
	{ IK_DUP_FAILED, "passed through (the claim's outcome)" },
	{ IK_PAYLOAD_MISMATCH, "passed through (the claim's outcome)" },
	{ IK_LEASE_SHORT, "the lease left is shorter than the call needs;\n"
	    "nothing was sent" },
	{ IK_DECLINED, "the bank refused the debit (a declined status)" },
	{ IK_USAGE, "bad command line, or two envelopes without --stream" },
	{ IK_DATAERR, "malformed envelope, or a body that is not an event" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the bank is unreachable, timed out, throttled\n"
	    "or failing" },
	{ IK_CONFIG, "bad URL, credentials, secret file, jq program or\n"
	    "TLS; any status neither OK, declined nor retried" },
	{ -1, NULL },
};

struct ctx {
	struct ik_bankapi api;
	struct ik_bankapi_cli cli;
	struct job *finished, *last;   /* answered, not yet reaped (FIFO) */
	struct ik_store_lazy db;       /* opened only to settle (step.h) */
};

static int
record(cJSON *env, const struct ik_event *ev, int rc, const char *error,
       const char *ref, int replayed, long status, const char *warning)
{
	cJSON *r = ik_env_set_result(env, "debit", rc);

	if (!r)
		return IK_SOFTWARE;
	if (ref)
		cJSON_AddStringToObject(r, "ref", ref);
	else if (rc == IK_OK)
		cJSON_AddNullToObject(r, "ref");   /* the money moved; the bank gave no ref */
	if (replayed)
		cJSON_AddBoolToObject(r, "replayed", 1);
	if (status)
		cJSON_AddNumberToObject(r, "status", (double)status);
	if (error)
		cJSON_AddStringToObject(r, "error", error);
	if (warning)
		cJSON_AddStringToObject(r, "warning", warning);
	ik_log(rc == IK_OK && !warning ? IK_LOG_INFO : IK_LOG_WARN, "debit", "step", "debit",
	       "chargeId", ev ? ev->charge_id : NULL,
	       "messageId", ik_env_str(env, "messageId"), "outcome", ik_code_name(rc),
	       "ref", ref, "replayed", replayed ? "true" : NULL,
	       IK_LOG_NUM(status ? "status" : NULL, status),
	       "error", error, "warning", warning, NULL);
	return rc;
}

/* What a 2xx says: the money moved, with the bank's ref when it gave one.
 * lost: why the body did not arrive whole, or NULL. */
static int
debited(struct ctx *c, cJSON *env, const struct ik_event *ev,
        const struct ik_http_res *res, const ik_err *lost)
{
	char warn[sizeof(ik_err){0}.msg + 64], *ref = NULL;
	int replayed, rc;

	if (lost)
		snprintf(warn, sizeof warn, "HTTP %ld without a reference: the body did not "
		         "arrive whole (%s)", res->status, lost->msg);
	else if (ik_bankapi_ref(&c->api, res, &ref, warn, sizeof warn) < 0)
		return record(env, ev, IK_SOFTWARE, "out of memory", NULL, 0, 0, NULL);
	replayed = ik_bankapi_replayed(&c->api, res);
	rc = record(env, ev, IK_OK, NULL, ref, replayed, ref ? 0 : res->status,
	            warn[0] ? warn : NULL);
	free(ref);
	return rc;
}

/* One envelope from start to its result: made by start(), in flight
 * until the bank answered, then on c->finished until reaped. */
struct job {
	struct ctx *c;
	cJSON *env;
	struct ik_event ev;
	char *req;
	struct ik_http_res res;
	struct ik_bankapi_call call;
	int rc;
	int finished;
	struct job *next;
};

static void
job_free(struct job *j)
{
	ik_http_res_free(&j->res);
	free(j->req);
	free(j);
}

/* The bank's answer (or the transport's failure) into the envelope. */
static void
answered(void *arg, int rc, struct ik_http_res *res, const ik_err *err)
{
	struct job *j = arg;
	struct ctx *c = j->c;
	char reason[IK_BANKAPI_REASON_MAX + 1], msg[IK_BANKAPI_REASON_MAX + 64];

	if (rc != IK_OK) {
		j->rc = record(j->env, &j->ev, rc, err->msg, NULL, 0, 0, NULL);
	} else if ((rc = ik_bankapi_classify(&c->api, res->status)) == IK_OK) {
		j->rc = debited(c, j->env, &j->ev, res, err);
	} else {
		ik_bankapi_reason(&c->api, res, reason);
		if (res->status == 401 && !reason[0])
			snprintf(reason, sizeof reason, "bad credentials");
		if (reason[0])
			snprintf(msg, sizeof msg, "HTTP %ld: %s", res->status, reason);
		else
			snprintf(msg, sizeof msg, "HTTP %ld", res->status);
		j->rc = record(j->env, &j->ev, rc, msg, NULL, 0, res->status, NULL);
	}
	ik_http_res_free(res);
	j->finished = 1;
	j->next = NULL;            /* reaped in the order answered */
	*(c->finished ? &c->last->next : &c->finished) = j;
	c->last = j;
}

/* Starts the debit of env: NULL with *rc when it is finished already (not
 * ours to debit, a bad event, a configuration error, a lease too short:
 * nothing sent), else the job now in flight. */
static struct job *
job_start(struct ctx *c, cJSON *env, int *rc)
{
	const char *body = ik_env_body(env);
	const ik_err *why;
	struct job *j;
	ik_err err = {0};

	if (ik_env_step_code(env, "claim") != IK_OK) {
		if (!ik_env_result(env, "claim"))
			ik_log(IK_LOG_WARN, "not claimed: passed through", "step", "debit",
			       "messageId", ik_env_str(env, "messageId"), NULL);
		*rc = ik_env_outcome(env);
		return NULL;
	}
	if (!(j = calloc(1, sizeof *j))) {
		*rc = record(env, NULL, IK_SOFTWARE, "out of memory", NULL, 0, 0, NULL);
		return NULL;
	}
	j->c = c;
	j->env = env;
	if ((*rc = ik_event_parse(body, strlen(body), &j->ev, &err)) != IK_OK) {
		*rc = record(env, NULL, *rc, err.msg, NULL, 0, 0, NULL);
		goto done;
	}
	if ((*rc = ik_bankapi_cli_open(&c->api, &c->cli, &why)) != IK_OK) {
		*rc = record(env, &j->ev, *rc, why->msg, NULL, 0, 0, NULL);
		goto done;
	}
	*rc = ik_bankapi_body(&c->api, body, &j->ev, j->ev.charge_id,
	                      cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "attempt"),
	                      NULL, &j->req, &err);
	if (*rc != IK_OK) {
		*rc = record(env, &j->ev, *rc, err.msg, NULL, 0, 0, NULL);
		goto done;
	}
	/* The lease is checked when the request is sent, not now: the
	 * envelope may have waited for a free slot. */
	j->call = (struct ik_bankapi_call){ .api = &c->api, .key = j->ev.charge_id,
		.body = j->req, .res = &j->res, .env = env, .need_ms = c->cli.opts.timeout_ms,
		.margin_ms = c->cli.lease_margin_ms, .done = answered, .arg = j };
	if ((*rc = ik_bankapi_submit(&j->call, &err)) != IK_OK) {
		*rc = record(env, &j->ev, *rc, err.msg, NULL, 0, 0, NULL);
		goto done;
	}
	return j;
done:
	job_free(j);
	return NULL;
}

/* One-shot: start and wait for this one. */
static int
debit(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct job *j;
	ik_err err = {0};
	int rc;

	if (!(j = job_start(c, env, &rc)))
		return rc;
	while (!j->finished)
		if (ik_bankapi_run(&c->api, -1, 1000, NULL, &err) != IK_OK) {
			ik_warnx("%s", err.msg);
			return IK_SOFTWARE;   /* the job dies with the process */
		}
	c->finished = NULL;
	rc = j->rc;
	job_free(j);
	return rc;
}

/* --stream --inflight: step.h's start, wait, reap. */
static int
debit_start(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	int rc;

	return job_start(c, env, &rc) ? 0 : 1;
}

static int
debit_wait(void *arg, int fd, int *readable, int timeout_ms)
{
	struct ctx *c = arg;
	ik_err err = {0};

	if (ik_bankapi_run(&c->api, fd, timeout_ms < 0 || timeout_ms > 1000 ? 1000 : timeout_ms,
	    readable, &err) != IK_OK) {
		ik_warnx("%s", err.msg);
		return -1;
	}
	return 0;
}

static cJSON *
debit_reap(void *arg)
{
	struct ctx *c = arg;
	struct job *j = c->finished;
	cJSON *env;

	if (!j)
		return NULL;
	c->finished = j->next;
	env = j->env;
	job_free(j);
	return env;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "stream", no_argument, NULL, 's' },
		IK_BANKAPI_LONGOPTS,
		IK_BANKAPI_LONGOPT_REF,
		IK_BANKAPI_LONGOPT_REPLAY,
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { 0 };
	struct ik_step st = { .name = "debit", .fn = debit, .ctx = &c,
	                      .start = debit_start, .wait = debit_wait, .reap = debit_reap,
	                      .settle = ik_settle, .settle_ctx = &c.db };
	int ch, k, rc = IK_USAGE;
	ik_err err;

	ik_cli_init(argv[0]);
	ik_bankapi_cli_init(&c.cli);
	/* First thing: the token leaves the environment before anything else. */
	ik_bankapi_take_env(&c.api, "BANK");
	while ((ch = getopt_long(argc, argv, "s" IK_BANKAPI_SHORTOPTS "hV", longopts, NULL)) != -1) {
		if ((k = ik_bankapi_cli_opt(&c.cli, ch, optarg)) < 0)
			goto out;
		if (k)
			continue;
		switch (ch) {
		case 's': st.stream = 1; break;
		case 'h': rc = ik_help(usage, options, codes); goto out;
		case 'V': rc = ik_version(); goto out;
		default: rc = ik_usage(usage); goto out;
		}
	}
	if (optind != argc) {
		rc = ik_usage(usage);
		goto out;
	}
	if (c.cli.check) {   /* what charge-worker asks before it receives anything */
		rc = ik_bankapi_open(&c.api, &c.cli.opts, &err) == IK_OK ? IK_OK : ik_fail(&err);
		goto out;
	}
	if (c.cli.dry_run) {   /* mapping a new bank: what would be sent */
		char *req;
		if ((rc = ik_bankapi_cli_dry_run(&c.api, &c.cli, 0, "", &req, &err)) != IK_OK) {
			rc = ik_fail(&err);
			goto out;
		}
		fputs(req, stdout);
		free(req);
		rc = ik_finish(IK_OK);
		goto out;
	}
	if ((rc = ik_bankapi_inflight("BANK", c.cli.inflight, &st.inflight)) != IK_OK)
		goto out;
	rc = ik_step_run(&st);
out:
	ik_bankapi_close(&c.api);
	ik_store_lazy_close(&c.db);
	return rc;
}
