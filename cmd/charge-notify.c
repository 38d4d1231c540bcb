/* charge-notify: tell the customer about a debit through the notification
 * gateway, with "<chargeId>:notify" as the idempotency key.
 *
 * Only an envelope whose debit is OK is notified; any other passes through
 * untouched.  A failed notification never touches the debit: it is
 * recorded as NOTIFY_FAILED (the charge becomes DEBITED_NOTIFICATION_FAILED
 * and is re-driven separately).  The statuses are classed as the debit's
 * (lib/bank/bankapi.c): the retry list (408 409 425 429 5xx), timeouts and
 * connection errors are retried in process, a bounded number of times with
 * exponential backoff and full jitter, then NOTIFY_FAILED; the declined
 * list (402 422) is NOTIFY_FAILED at once; any other status (401, 403,
 * 404, ...) and configuration errors (no URL, unreadable token, TLS
 * verification) are CONFIG: the gateway is misconfigured, an operator is
 * alarmed, and idemp-done still records the money moved.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	"usage: charge-notify [--check | --dry-run] [--stream] [--url URL] [--key-header NAME]\n"
	"                     [--cacert FILE] [--connect-timeout DUR] [--timeout DUR]\n"
	"                     [--retries N] [--backoff DUR] [--declined-status LIST]\n"
	"                     [--retry-status LIST] [--lease-margin DUR]\n"
	"                     [--request FILTER] [--reason FILTER] [--inflight N]\n"
	"                     [--client-cert FILE --client-key FILE] < envelope\n";
static const char options[] =
	"  --check                  check the configuration (URL, files, status lists,\n"
	"                           jq programs) with no network call: 0, or 78 and why\n"
	"  --dry-run                print the request for the envelope or event on stdin\n"
	"                           (method, URL, headers with secrets as ***, body)\n"
	"                           without sending it: 0, or 65/78 and why\n"
	"  -s, --stream             many envelopes in, one out per line\n"
	"  --inflight N             with --stream: up to N notifications in flight,\n"
	"                           retries included (1-1024, default 64,\n"
	"                           $IDEMKIT_NOTIFY_INFLIGHT); envelopes are written as\n"
	"                           they finish, in any order\n"
	"  -u, --url URL            the notification endpoint (default $IDEMKIT_NOTIFY_URL)\n"
	"  -k, --key-header NAME    idempotency-key header (default Idempotency-Key,\n"
	"                           $IDEMKIT_NOTIFY_KEY_HEADER)\n"
	"  -c, --cacert FILE        CA bundle (default the system's, $IDEMKIT_NOTIFY_CACERT)\n"
	"  --connect-timeout DUR    default 3s\n"
	"  --timeout DUR            each attempt, default 10s\n"
	"  -r, --retries N          retries after the first attempt, default 3\n"
	"  -b, --backoff DUR        first backoff, doubled each retry (jittered, at\n"
	"                           most 10s), default 200ms\n"
	"  --declined-status LIST   statuses that refuse the notification for good\n"
	"                           (default 402,422, $IDEMKIT_NOTIFY_DECLINED)\n"
	"  --retry-status LIST      statuses retried (default 408,409,425,429,5xx,\n"
	"                           $IDEMKIT_NOTIFY_RETRY); any other non-2xx is CONFIG\n"
	"  --lease-margin DUR       send nothing (LEASE_SHORT) when the claim's lease has\n"
	"                           less than the attempts' timeouts and backoffs plus\n"
	"                           this left; default 2s\n"
	"  --request FILTER         jq program building the request body from the event\n"
	"                           ($key, $amountMajor, $attempt, $ref; default the\n"
	"                           built-in body, $IDEMKIT_NOTIFY_REQUEST)\n"
	"  --reason FILTER          jq program taking the reason out of a refusal\n"
	"                           (default .reason/.message/.error, $IDEMKIT_NOTIFY_REASON)\n"
	"  --client-cert FILE       mutual TLS: PEM certificate ($IDEMKIT_NOTIFY_CLIENT_CERT)\n"
	"  --client-key FILE        its PEM key, mode 0600 or stricter\n"
	"                           ($IDEMKIT_NOTIFY_CLIENT_KEY)\n"
	"  -h, --help, -V, --version\n"
	"Credentials: $IDEMKIT_NOTIFY_TOKEN or $IDEMKIT_NOTIFY_TOKEN_FILE (bearer), or\n"
	"OAuth2 client credentials ($IDEMKIT_NOTIFY_OAUTH_TOKEN_URL, _CLIENT_ID,\n"
	"_CLIENT_SECRET_FILE, _SCOPE); $IDEMKIT_NOTIFY_HMAC_KEY_FILE (X-Idemkit-Timestamp\n"
	"and X-Idemkit-Signature); never on the command line.\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the gateway accepted the notification; --check:\n"
	    "the configuration is usable" },
	{ IK_EMPTY, "no envelope or event on stdin: nothing to do" },
	{ IK_DUP_DONE, "passed through (the claim's outcome)" },
	{ IK_DUP_IN_PROGRESS, "passed through (the claim's outcome)" },
	{ IK_DUP_FAILED, "passed through (the claim's outcome)" },
	{ IK_PAYLOAD_MISMATCH, "passed through (the claim's outcome)" },
	{ IK_LEASE_SHORT, "the lease left is shorter than the attempts need;\n"
	    "nothing was sent" },
	{ IK_DECLINED, "passed through (the debit's outcome)" },
	{ IK_NOTIFY_FAILED, "the notification failed after its retries; the\n"
	    "debit stands" },
	{ IK_USAGE, "bad command line, or two envelopes without --stream" },
	{ IK_DATAERR, "malformed envelope, or a body that is not an event" },
	{ IK_SOFTWARE, "internal error; or passed through (the debit's)" },
	{ IK_TEMPFAIL, "passed through (the debit's outcome)" },
	{ IK_CONFIG, "bad URL, token, secret file or TLS; or passed\n"
	    "through (the debit's outcome)" },
	{ -1, NULL },
};

#define BACKOFF_CAP_MS 10000

struct ctx {
	struct ik_bankapi api;
	struct ik_bankapi_cli cli;
	long retries;
	int64_t backoff_ms;
	struct job *waiting;       /* answered TEMPFAIL, the next attempt due later */
	struct job *finished, *last;   /* done, not yet reaped (FIFO) */
	struct ik_store_lazy db;       /* opened only to settle (step.h) */
};

/* The most the attempts from attempt (1-based) on can take: each one's
 * timeout and every backoff between them. */
static int64_t
budget(const struct ctx *c, int attempt)
{
	int64_t ms = 0;
	int k;

	for (k = attempt; k <= c->retries + 1; k++) {
		ms += c->cli.opts.timeout_ms;
		if (k <= c->retries)
			ms += ik_backoff_ceil(c->backoff_ms, BACKOFF_CAP_MS, k - 1);
	}
	return ms;
}

static int
record(cJSON *env, const char *id, int rc, const char *error, int attempts)
{
	cJSON *r = ik_env_set_result(env, "notify", rc);

	if (!r)
		return IK_SOFTWARE;
	cJSON_AddNumberToObject(r, "attempts", attempts);
	if (error)
		cJSON_AddStringToObject(r, "error", error);
	ik_log(rc == IK_OK ? IK_LOG_INFO : IK_LOG_WARN, "notify", "step", "notify",
	       "chargeId", id, "messageId", ik_env_str(env, "messageId"),
	       "outcome", ik_code_name(rc), IK_LOG_NUM("attempts", attempts),
	       "error", error, NULL);
	return rc;
}

/* One envelope from start to its result: in flight, or waiting for its
 * next attempt (due), then on c->finished until reaped. */
struct job {
	struct ctx *c;
	cJSON *env;
	struct ik_event ev;
	char key[IK_CHARGE_ID_MAX + sizeof ":notify"];
	char *req;
	struct ik_http_res res;
	struct ik_bankapi_call call;
	int attempt;               /* of the request in flight, or the last one */
	int64_t due;               /* epoch ms of the next attempt; 0: none waiting */
	int rc;
	int finished;
	struct job *next;          /* on c->waiting or c->finished */
};

static void
job_free(struct job *j)
{
	ik_http_res_free(&j->res);
	free(j->req);
	free(j);
}

static void
job_finish(struct job *j, int rc, const char *msg, int attempts)
{
	struct ctx *c = j->c;

	j->rc = record(j->env, j->ev.charge_id, rc, msg, attempts);
	j->finished = 1;
	j->next = NULL;            /* reaped in the order finished */
	*(c->finished ? &c->last->next : &c->finished) = j;
	c->last = j;
}

/* Takes j, the last one finished, off c->finished. */
static void
unfinish(struct ctx *c, struct job *j)
{
	struct job **pp = &c->finished;

	c->last = NULL;
	while (*pp != j) {
		c->last = *pp;
		pp = &(*pp)->next;
	}
	*pp = NULL;
}

/* Sends the next attempt: 0 when it is in flight, else the job is
 * finished (the lease too short for this attempt and all it may still
 * retry: nothing sent). */
static int
job_send(struct job *j)
{
	struct ctx *c = j->c;
	ik_err err = {0};
	int rc;

	j->attempt++;
	j->due = 0;
	j->call.need_ms = budget(c, j->attempt);
	if ((rc = ik_bankapi_submit(&j->call, &err)) == IK_OK)
		return 0;
	job_finish(j, rc, err.msg, rc == IK_LEASE_SHORT ? j->attempt - 1 : j->attempt);
	return -1;
}

static void
answered(void *arg, int rc, struct ik_http_res *res, const ik_err *err)
{
	struct job *j = arg;
	struct ctx *c = j->c;
	char reason[IK_BANKAPI_REASON_MAX + 1], msg[sizeof(ik_err){0}.msg + 64];
	int again, cls;
	size_t n;

	if (rc == IK_OK && res->status >= 200 && res->status < 300) {
		ik_http_res_free(res);
		job_finish(j, IK_OK, NULL, j->attempt);
		return;
	}
	if (rc == IK_OK) {
		cls = ik_bankapi_classify(&c->api, res->status);
		ik_bankapi_reason(&c->api, res, reason);
		if (reason[0])
			snprintf(msg, sizeof msg, "HTTP %ld: %s", res->status, reason);
		else
			snprintf(msg, sizeof msg, "HTTP %ld", res->status);
		ik_http_res_free(res);
		if (cls == IK_CONFIG) {   /* not the gateway's word on this message */
			job_finish(j, IK_CONFIG, msg, j->attempt);
			return;
		}
		again = cls == IK_TEMPFAIL;
	} else {
		snprintf(msg, sizeof msg, "%s", err->msg);
		again = rc == IK_TEMPFAIL;
		if (rc != IK_TEMPFAIL) {   /* CONFIG, SOFTWARE: not a notification failure */
			job_finish(j, rc, msg, j->attempt);
			return;
		}
	}
	if (!again || j->attempt > c->retries || ik_stop_signal) {
		n = strlen(msg);
		if (again && j->attempt > 1)
			snprintf(msg + n, sizeof msg - n, " after %d attempts", j->attempt);
		job_finish(j, IK_NOTIFY_FAILED, msg, j->attempt);
		return;
	}
	ik_log(IK_LOG_DEBUG, "notify retry", "chargeId", j->ev.charge_id, "error", msg, NULL);
	/* The retry is a timer, full jitter: the others go on meanwhile. */
	j->due = ik_now_ms() + ik_backoff_jitter(c->backoff_ms, BACKOFF_CAP_MS, j->attempt - 1);
	j->next = c->waiting;
	c->waiting = j;
}

/* An envelope from idemp-list --format envelope (it has "recovery") is
 * notified only when the record it was listed from proves the money moved
 * (DONE or DEBITED_NOTIFICATION_FAILED), whatever its debit says: a
 * FAILED record's envelope saying "debit OK" (a bug, an older idemp-list,
 * a hand-made line) must not tell a declined customer they were charged.
 * In the pipeline (no "recovery") the debit's own OK is the proof. */
static int
debited_record(const cJSON *env)
{
	const cJSON *rec = ik_env_result(env, "recovery");
	const char *st;

	if (!rec)
		return 1;
	st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "state"));
	return st && (ik_state_parse(st) == IK_ST_DONE || ik_state_parse(st) == IK_ST_DNF);
}

/* Starts the notification of env: NULL with *rc when it finished at once
 * (nothing to notify, a bad event, a configuration error, the lease too
 * short), else the job in flight. */
static struct job *
job_start(struct ctx *c, cJSON *env, int *rc)
{
	const char *body = ik_env_body(env), *ref;
	const ik_err *why;
	struct job *j;
	ik_err err = {0};

	if (ik_env_step_code(env, "debit") != IK_OK) {
		*rc = ik_env_outcome(env);
		return NULL;
	}
	if (!debited_record(env)) {
		*rc = record(env, NULL, IK_DATAERR, "the record this envelope was listed from "
		    "is not DONE or DEBITED_NOTIFICATION_FAILED: no debit to notify", 0);
		return NULL;
	}
	ref = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
		ik_env_result(env, "debit"), "ref"));
	if (!(j = calloc(1, sizeof *j))) {
		*rc = record(env, NULL, IK_SOFTWARE, "out of memory", 0);
		return NULL;
	}
	j->c = c;
	j->env = env;
	if ((*rc = ik_event_parse(body, strlen(body), &j->ev, &err)) != IK_OK) {
		*rc = record(env, NULL, *rc, err.msg, 0);
		goto done;
	}
	if ((*rc = ik_bankapi_cli_open(&c->api, &c->cli, &why)) != IK_OK) {
		*rc = record(env, j->ev.charge_id, *rc, why->msg, 0);
		goto done;
	}
	snprintf(j->key, sizeof j->key, "%s:notify", j->ev.charge_id);
	*rc = ik_bankapi_body(&c->api, body, &j->ev, j->key,
	                      cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "attempt"),
	                      ref, &j->req, &err);
	if (*rc != IK_OK) {
		*rc = record(env, j->ev.charge_id, *rc, err.msg, 0);
		goto done;
	}
	/* Each attempt checks the lease when it is sent (ik_bankapi_call):
	 * that attempt and all it may still retry must fit in it. */
	j->call = (struct ik_bankapi_call){ .api = &c->api, .key = j->key, .body = j->req,
		.res = &j->res, .env = env, .margin_ms = c->cli.lease_margin_ms,
		.done = answered, .arg = j };
	if (job_send(j) == 0)
		return j;
	unfinish(c, j);            /* job_send finished it: ours to hand back */
	*rc = j->rc;
done:
	job_free(j);
	return NULL;
}

/* Sends the retries that are due (all of them after a stop signal: the
 * last attempt goes now, as an interrupted backoff did); the ms until the
 * next one, or -1 when none waits. */
static int
due_retries(struct ctx *c)
{
	struct job **pp = &c->waiting, *j;
	int64_t now = ik_now_ms(), next = -1;

	while ((j = *pp)) {
		if (j->due <= now || ik_stop_signal) {
			*pp = j->next;
			job_send(j);
			continue;
		}
		if (next < 0 || j->due - now < next)
			next = j->due - now;
		pp = &j->next;
	}
	return next > 1000 ? 1000 : (int)next;
}

static int
run(struct ctx *c, int fd, int *readable, int timeout_ms)
{
	ik_err err = {0};
	int t = due_retries(c);

	if (c->finished)
		t = 0;
	if (timeout_ms >= 0 && (t < 0 || timeout_ms < t))
		t = timeout_ms;
	if (ik_bankapi_run(&c->api, fd, t < 0 ? 1000 : t, readable, &err) != IK_OK) {
		ik_warnx("%s", err.msg);
		return -1;
	}
	due_retries(c);
	return 0;
}

/* One-shot: start and wait for this one. */
static int
notify(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct job *j;
	int rc;

	if (!(j = job_start(c, env, &rc)))
		return rc;
	while (!j->finished)
		if (run(c, -1, NULL, -1) < 0)
			return IK_SOFTWARE;
	c->finished = NULL;
	rc = j->rc;
	job_free(j);
	return rc;
}

/* --stream --inflight: step.h's start, wait, reap. */
static int
notify_start(cJSON *env, void *arg)
{
	int rc;

	return job_start(arg, env, &rc) ? 0 : 1;
}

static int
notify_wait(void *arg, int fd, int *readable, int timeout_ms)
{
	return run(arg, fd, readable, timeout_ms);
}

static cJSON *
notify_reap(void *arg)
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
		{ "retries", required_argument, NULL, 'r' },
		{ "backoff", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { .retries = 3, .backoff_ms = 200 };
	struct ik_step st = { .name = "notify", .fn = notify, .ctx = &c,
	                      .start = notify_start, .wait = notify_wait, .reap = notify_reap,
	                      .settle = ik_settle, .settle_ctx = &c.db };
	long long n;
	int ch, k, rc = IK_USAGE;
	ik_err err;

	ik_cli_init(argv[0]);
	ik_bankapi_cli_init(&c.cli);
	ik_bankapi_take_env(&c.api, "NOTIFY");
	while ((ch = getopt_long(argc, argv, "s" IK_BANKAPI_SHORTOPTS "r:b:hV", longopts, NULL)) != -1) {
		if ((k = ik_bankapi_cli_opt(&c.cli, ch, optarg)) < 0)
			goto out;
		if (k)
			continue;
		switch (ch) {
		case 's': st.stream = 1; break;
		case 'r':
			if (ik_opt_int("--retries", optarg, 0, 20, &n) < 0)
				goto out;
			c.retries = (long)n;
			break;
		case 'b':
			if (ik_opt_duration("--backoff", optarg, 0, 3600000, &c.backoff_ms) < 0)
				goto out;
			break;
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
		if ((rc = ik_bankapi_cli_dry_run(&c.api, &c.cli, 0, ":notify", &req, &err)) != IK_OK) {
			rc = ik_fail(&err);
			goto out;
		}
		fputs(req, stdout);
		free(req);
		rc = ik_finish(IK_OK);
		goto out;
	}
	if ((rc = ik_bankapi_inflight("NOTIFY", c.cli.inflight, &st.inflight)) != IK_OK)
		goto out;
	rc = ik_step_run(&st);
out:
	ik_bankapi_close(&c.api);
	ik_store_lazy_close(&c.db);
	return rc;
}
