/* charge-notify: tell the customer about a debit through the notification
 * gateway, with "<chargeId>:notify" as the idempotency key.
 *
 * Only an envelope whose debit is OK is notified; any other passes through
 * untouched.  A failed notification never touches the debit: it is
 * recorded as NOTIFY_FAILED (the charge becomes DEBITED_NOTIFICATION_FAILED
 * and is re-driven separately).  The statuses are classed as the debit's
 * (lib/bankapi.c): the retry list (408 409 425 429 5xx), timeouts and
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

#include "bankapi.h"
#include "cli.h"
#include "envelope.h"
#include "event.h"
#include "log.h"
#include "outcome.h"
#include "step.h"
#include "util.h"

static const char usage[] =
	"usage: charge-notify [--check] [--stream] [--url URL] [--key-header NAME]\n"
	"                     [--cacert FILE] [--connect-timeout DUR] [--timeout DUR]\n"
	"                     [--retries N] [--backoff DUR] [--declined-status LIST]\n"
	"                     [--retry-status LIST] [--lease-margin DUR]\n"
	"                     [--request FILTER] [--reason FILTER]\n"
	"                     [--client-cert FILE --client-key FILE] < envelope\n";
static const char options[] =
	"  --check                  check the configuration (URL, files, status lists,\n"
	"                           jq programs) with no network call: 0, or 78 and why\n"
	"  -s, --stream             many envelopes in, one out per line\n"
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
static const int codes[] = { IK_OK, IK_DUP_DONE, IK_DUP_IN_PROGRESS, IK_DUP_FAILED,
	IK_PAYLOAD_MISMATCH, IK_LEASE_SHORT, IK_DECLINED, IK_NOTIFY_FAILED, IK_USAGE,
	IK_DATAERR, IK_SOFTWARE, IK_TEMPFAIL, IK_CONFIG, -1 };

#define BACKOFF_CAP_MS 10000

struct ctx {
	struct ik_bankapi api;
	struct ik_bankapi_opts opts;
	int opened;
	ik_err open_err;
	long retries;
	int64_t backoff_ms;
	int64_t lease_margin_ms;
};

/* The most the attempts from attempt (1-based) on can take: each one's
 * timeout and every backoff between them. */
static int64_t
budget(const struct ctx *c, int attempt)
{
	int64_t ms = 0;
	int k;

	for (k = attempt; k <= c->retries + 1; k++) {
		ms += c->opts.timeout_ms;
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

static int
notify(cJSON *env, void *arg)
{
	struct ctx *c = arg;
	struct ik_http_res res = {0};
	struct ik_event ev;
	char reason[IK_BANKAPI_REASON_MAX + 1], msg[sizeof(ik_err){0}.msg + 64];
	char key[IK_CHARGE_ID_MAX + sizeof ":notify"];
	const char *body = ik_env_body(env), *ref;
	char *req = NULL;
	ik_err err = {0};
	int rc = IK_OK, attempt;

	if (ik_env_step_code(env, "debit") != IK_OK)
		return ik_env_outcome(env);
	ref = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
		ik_env_result(env, "debit"), "ref"));
	if ((rc = ik_event_parse(body, strlen(body), &ev, &err)) != IK_OK)
		return record(env, NULL, rc, err.msg, 0);
	if (!c->opened) {
		c->opened = 1;
		if (ik_bankapi_open(&c->api, &c->opts, &c->open_err) != IK_OK)
			ik_warnx("%s", c->open_err.msg);
	}
	if (c->open_err.code)
		return record(env, ev.charge_id, c->open_err.code, c->open_err.msg, 0);

	snprintf(key, sizeof key, "%s:notify", ev.charge_id);
	rc = ik_bankapi_body(&c->api, body, &ev, key,
	                     cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "attempt"),
	                     ref, &req, &err);
	if (rc != IK_OK)
		return record(env, ev.charge_id, rc, err.msg, 0);

	for (attempt = 1;; attempt++) {
		int again;

		/* Right before each call: this attempt and all it may still
		 * retry must fit in the lease. */
		if ((rc = ik_bankapi_lease_check(env, budget(c, attempt), c->lease_margin_ms,
		                                 &err)) != IK_OK) {
			rc = record(env, ev.charge_id, rc, err.msg, attempt - 1);
			break;
		}
		rc = ik_bankapi_post(&c->api, key, req, &res, &err);
		if (rc == IK_OK && res.status >= 200 && res.status < 300) {
			rc = record(env, ev.charge_id, IK_OK, NULL, attempt);
			break;
		}
		if (rc == IK_OK) {
			int cls = ik_bankapi_classify(&c->api, res.status);
			ik_bankapi_reason(&c->api, &res, reason);
			if (reason[0])
				snprintf(msg, sizeof msg, "HTTP %ld: %s", res.status, reason);
			else
				snprintf(msg, sizeof msg, "HTTP %ld", res.status);
			if (cls == IK_CONFIG) {   /* not the gateway's word on this message */
				rc = record(env, ev.charge_id, IK_CONFIG, msg, attempt);
				break;
			}
			again = cls == IK_TEMPFAIL;
		} else {
			snprintf(msg, sizeof msg, "%s", err.msg);
			again = rc == IK_TEMPFAIL;
			if (rc != IK_TEMPFAIL) {   /* CONFIG, SOFTWARE: not a notification failure */
				rc = record(env, ev.charge_id, rc, msg, attempt);
				break;
			}
		}
		if (!again || attempt > c->retries || ik_stop_signal) {
			size_t n = strlen(msg);
			if (again && attempt > 1)
				snprintf(msg + n, sizeof msg - n, " after %d attempts", attempt);
			rc = record(env, ev.charge_id, IK_NOTIFY_FAILED, msg, attempt);
			break;
		}
		ik_log(IK_LOG_DEBUG, "notify retry", "chargeId", ev.charge_id,
		       "error", msg, NULL);
		/* full jitter; a stop signal cuts it short: fine */
		ik_sleep_ms(ik_backoff_jitter(c->backoff_ms, BACKOFF_CAP_MS, attempt - 1));
	}
	ik_http_res_free(&res);
	free(req);
	return rc;
}

int
main(int argc, char **argv)
{
	enum { O_CONNECT = 256, O_TIMEOUT, O_DECLINED, O_RETRY, O_MARGIN, O_CHECK, O_REQUEST, O_REF, O_REASON, O_CCERT, O_CKEY };
	static const struct option longopts[] = {
		{ "stream", no_argument, NULL, 's' },
		{ "url", required_argument, NULL, 'u' },
		{ "key-header", required_argument, NULL, 'k' },
		{ "cacert", required_argument, NULL, 'c' },
		{ "connect-timeout", required_argument, NULL, O_CONNECT },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "retries", required_argument, NULL, 'r' },
		{ "backoff", required_argument, NULL, 'b' },
		{ "declined-status", required_argument, NULL, O_DECLINED },
		{ "retry-status", required_argument, NULL, O_RETRY },
		{ "lease-margin", required_argument, NULL, O_MARGIN },
		{ "check", no_argument, NULL, O_CHECK },
		{ "request", required_argument, NULL, O_REQUEST },
		{ "reason", required_argument, NULL, O_REASON },
		{ "client-cert", required_argument, NULL, O_CCERT },
		{ "client-key", required_argument, NULL, O_CKEY },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { .opts = { .connect_timeout_ms = 3000, .timeout_ms = 10000 },
	                 .retries = 3, .backoff_ms = 200,
	                 .lease_margin_ms = IK_BANKAPI_LEASE_MARGIN_MS };
	struct ik_step st = { .name = "notify", .fn = notify, .ctx = &c };
	long long n;
	int64_t ms;
	int ch, check = 0, rc = IK_USAGE;
	ik_err err;

	ik_cli_init(argv[0]);
	ik_bankapi_take_env(&c.api, "NOTIFY");
	while ((ch = getopt_long(argc, argv, "su:k:c:r:b:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': st.stream = 1; break;
		case 'u': c.opts.url = optarg; break;
		case 'k': c.opts.key_header = optarg; break;
		case 'c': c.opts.cacert = optarg; break;
		case O_CONNECT:
			if (ik_opt_duration("--connect-timeout", optarg, 1, 3600000, &ms) < 0)
				goto out;
			c.opts.connect_timeout_ms = (long)ms;
			break;
		case O_TIMEOUT:
			if (ik_opt_duration("--timeout", optarg, 1, 3600000, &ms) < 0)
				goto out;
			c.opts.timeout_ms = (long)ms;
			break;
		case 'r':
			if (ik_opt_int("--retries", optarg, 0, 20, &n) < 0)
				goto out;
			c.retries = (long)n;
			break;
		case 'b':
			if (ik_opt_duration("--backoff", optarg, 0, 3600000, &c.backoff_ms) < 0)
				goto out;
			break;
		case O_DECLINED:
			if (ik_bankapi_opt_status("--declined-status", optarg) < 0)
				goto out;
			c.opts.declined = optarg;
			break;
		case O_RETRY:
			if (ik_bankapi_opt_status("--retry-status", optarg) < 0)
				goto out;
			c.opts.retry = optarg;
			break;
		case O_CHECK: check = 1; break;
		case O_REQUEST: c.opts.request = optarg; break;
		case O_REASON: c.opts.reason = optarg; break;
		case O_CCERT: c.opts.client_cert = optarg; break;
		case O_CKEY: c.opts.client_key = optarg; break;
		case O_MARGIN:
			if (ik_opt_duration("--lease-margin", optarg, 0, 3600000, &c.lease_margin_ms) < 0)
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
	if (check) {   /* what charge-worker asks before it receives anything */
		rc = ik_bankapi_open(&c.api, &c.opts, &err) == IK_OK ? IK_OK : ik_fail(&err);
		goto out;
	}
	rc = ik_step_run(&st);
out:
	ik_bankapi_close(&c.api);
	return rc;
}
