/* aws.c: the AWS JSON-protocol client (aws.h): resolves the settings once
 * (attempts, timeouts, CA bundle, profile, region, endpoint), asks the
 * chain for credentials (aws_cred.c) and makes signed calls under the
 * standard retry mode (aws_retry.c).
 *
 * Rules: every setting is resolved here and only here (the adapters ask,
 * e.g. ik_aws_timeout_ms); a bad setting is IK_CONFIG at open, before
 * any request; messages from the service are cut to their first line and
 * scrubbed of our key, secret and token, since an
 * InvalidSignatureException can quote the canonical request.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "aws.h"
#include "aws_int.h"
#include "http.h"
#include "log.h"
#include "outcome.h"
#include "util.h"

#define BACKOFF_CAP_MS   20000

struct ik_aws {
	char service[16];
	char *region, *endpoint, *sigv4, *cacert, *profile;
	struct ik_aws_cfg cfg;
	struct ik_aws_profile prof;
	struct ik_aws_src *src;
	struct ik_aws_creds cr;
};

/* Replace each occurrence of secret in msg by "***". */
static void
scrub(char *msg, const char *secret)
{
	size_t n;
	char *p;

	if (!secret || (n = strlen(secret)) < 8)
		return;
	while ((p = strstr(msg, secret))) {
		memmove(p + 3, p + n, strlen(p + n) + 1);
		memcpy(p, "***", 3);
	}
}

static void
scrub_creds(const struct ik_aws *a, char *msg)
{
	scrub(msg, a->cr.sk);
	scrub(msg, a->cr.tok);
	scrub(msg, a->cr.ak);
}

static int
valid_region(const char *r)
{
	size_t n = strlen(r);

	return n > 0 && n <= 40 && strspn(r, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

/* AWS_MAX_ATTEMPTS, IDEMKIT_AWS_MAX_BACKOFF, IDEMKIT_AWS_TIMEOUT,
 * AWS_CA_BUNDLE. */
static int
read_settings(struct ik_aws *a, ik_err *err)
{
	const char *v;
	long long n;
	int64_t ms;

	a->cfg.max_attempts = 3;
	if ((v = ik_aws_env("AWS_MAX_ATTEMPTS"))) {
		if (ik_parse_int(v, 1, 100, &n) < 0)
			return ik_errf(err, IK_CONFIG, "AWS_MAX_ATTEMPTS: want a number from 1 to 100");
		a->cfg.max_attempts = (int)n;
	}
	a->cfg.backoff_cap_ms = BACKOFF_CAP_MS;
	if ((v = ik_aws_env("IDEMKIT_AWS_MAX_BACKOFF"))) {
		if (ik_parse_duration(v, &ms) < 0)
			return ik_errf(err, IK_CONFIG, "IDEMKIT_AWS_MAX_BACKOFF: not a duration");
		if (ms < a->cfg.backoff_cap_ms)
			a->cfg.backoff_cap_ms = ms;
	}
	a->cfg.timeout_ms = 10000;
	if ((v = ik_aws_env("IDEMKIT_AWS_TIMEOUT"))) {
		if (ik_parse_duration(v, &ms) < 0 || ms < 1 || ms > 600000)
			return ik_errf(err, IK_CONFIG, "IDEMKIT_AWS_TIMEOUT: want a duration up to 10m");
		a->cfg.timeout_ms = (long)ms;
	}
	if ((v = ik_aws_env("AWS_CA_BUNDLE")) && !(a->cacert = ik_aws_expand_home(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	a->cfg.cacert = a->cacert;

	v = ik_aws_env("AWS_PROFILE");
	a->cfg.profile_explicit = v != NULL;
	if (!v)
		v = ik_aws_env("AWS_DEFAULT_PROFILE");
	if (!(a->profile = strdup(v ? v : "default")))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	a->cfg.profile = a->profile;
	return IK_OK;
}

/* AWS_ENDPOINT_URL_<SERVICE>, AWS_ENDPOINT_URL, else the regional one;
 * and libcurl's SigV4 parameter. */
static int
resolve_endpoint(struct ik_aws *a, ik_err *err)
{
	char envname[64], svc_up[16];
	struct ik_buf b = { 0 };
	const char *ep;
	size_t i;

	for (i = 0; a->service[i] && i + 1 < sizeof svc_up; i++)
		svc_up[i] = (char)toupper((unsigned char)a->service[i]);
	svc_up[i] = '\0';
	snprintf(envname, sizeof envname, "AWS_ENDPOINT_URL_%s", svc_up);
	if ((ep = ik_aws_env(envname)) || (ep = ik_aws_env("AWS_ENDPOINT_URL"))) {
		ik_buf_addstr(&b, ep);
	} else {
		ik_buf_addstr(&b, "https://");
		ik_buf_addstr(&b, a->service);
		ik_buf_addstr(&b, ".");
		ik_buf_addstr(&b, a->region);
		ik_buf_addstr(&b, ".amazonaws.com");
	}
	a->endpoint = b.p;
	memset(&b, 0, sizeof b);
	ik_buf_addstr(&b, "aws:amz:");
	ik_buf_addstr(&b, a->region);
	ik_buf_addstr(&b, ":");
	ik_buf_addstr(&b, a->service);
	a->sigv4 = b.p;
	if (!a->endpoint || !a->sigv4)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

int
ik_aws_open(const char *service, struct ik_aws **out, ik_err *err)
{
	struct ik_aws *a;
	const char *v;
	int rc;

	*out = NULL;
	if (strlen(service) >= sizeof a->service)
		return ik_errf(err, IK_SOFTWARE, "aws: bad service name");
	if (!(a = calloc(1, sizeof *a)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(a->service, sizeof a->service, "%s", service);
	if ((rc = read_settings(a, err)) != IK_OK)
		goto fail;
	if ((rc = ik_aws_profile_load(a->profile, &a->prof, err)) != IK_OK)
		goto fail;
	if ((v = ik_aws_env("AWS_REGION")) || (v = ik_aws_env("AWS_DEFAULT_REGION")) ||
	    (v = a->prof.v[IK_AWS_P_REGION]))
		a->region = strdup(v);
	a->cfg.region = a->region;
	if ((rc = ik_http_open(&a->cfg.http, err)) != IK_OK)
		goto fail;
	if ((rc = ik_aws_creds_load(&a->cfg, &a->prof, &a->src, &a->cr, err)) != IK_OK)
		goto fail;
	if (!a->region) {
		rc = ik_errf(err, IK_CONFIG, "no AWS region: set AWS_REGION (or "
		             "AWS_DEFAULT_REGION, or region in the profile)");
		goto fail;
	}
	if (!valid_region(a->region)) {
		rc = ik_errf(err, IK_CONFIG, "AWS region %.64s is not a region name", a->region);
		goto fail;
	}
	if ((rc = resolve_endpoint(a, err)) != IK_OK)
		goto fail;
	ik_log(IK_LOG_DEBUG, "aws client", "service", service, "region", a->region,
	       "endpoint", a->endpoint, "credentials", ik_aws_src_name(a->src), NULL);
	*out = a;
	return IK_OK;
fail:
	ik_aws_close(a);
	return rc;
}

void
ik_aws_close(struct ik_aws *a)
{
	if (!a)
		return;
	ik_aws_creds_free(&a->cr);
	ik_aws_src_free(a->src);
	ik_aws_profile_free(&a->prof);
	ik_http_close(a->cfg.http);
	free(a->region);
	free(a->endpoint);
	free(a->sigv4);
	free(a->cacert);
	free(a->profile);
	free(a);
}

const char *ik_aws_region(const struct ik_aws *a) { return a->region; }
const char *ik_aws_endpoint(const struct ik_aws *a) { return a->endpoint; }
const char *ik_aws_cred_source(const struct ik_aws *a) { return ik_aws_src_name(a->src); }
const char *ik_aws_access_key_id(const struct ik_aws *a) { return a->cr.ak; }
long ik_aws_timeout_ms(const struct ik_aws *a) { return a->cfg.timeout_ms; }

int
ik_aws_call(struct ik_aws *a, const char *target, const cJSON *req,
            cJSON **resp, struct ik_aws_error *aerr, ik_err *err)
{
	struct ik_aws_error e_local, *e = aerr ? aerr : &e_local;
	struct ik_http_req hr = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_buf th = { 0 }, tok = { 0 }, what = { 0 };
	const char *hdrs[4];
	const char *op = strrchr(target, '.');
	char *body = NULL, tries_s[32];
	ik_err herr = { 0 };
	int rc = IK_SOFTWARE, h = 0, tries = 0;

	op = op ? op + 1 : target;
	*resp = NULL;
	memset(e, 0, sizeof *e);
	if (!(body = cJSON_PrintUnformatted(req)))
		return ik_errf(err, IK_SOFTWARE, "%s %s: out of memory", a->service, op);
	/* a retry loop lasts seconds; the refresh margin is minutes (or half
	 * the lifetime), so one check per call is enough */
	if ((rc = ik_aws_creds_refresh(&a->cfg, a->src, &a->cr, err)) != IK_OK) {
		ik_errwrap(err, "%s %s", a->service, op);
		goto out;
	}
	ik_buf_addstr(&th, "X-Amz-Target: ");
	ik_buf_addstr(&th, target);
	ik_buf_addstr(&what, a->service);
	ik_buf_addstr(&what, " ");
	ik_buf_addstr(&what, op);
	hdrs[h++] = "Content-Type: application/x-amz-json-1.0";
	hdrs[h++] = th.p;
	if (a->cr.tok) {
		ik_buf_addstr(&tok, "X-Amz-Security-Token: ");
		ik_buf_addstr(&tok, a->cr.tok);
		hdrs[h++] = tok.p;
	}
	hdrs[h] = NULL;
	if (!th.p || !what.p || (a->cr.tok && !tok.p)) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	hr.method = "POST";
	hr.url = a->endpoint;
	hr.body = body;
	hr.body_len = strlen(body);
	hr.cacert = a->cacert;
	hr.connect_timeout_ms = a->cfg.timeout_ms < 3000 ? a->cfg.timeout_ms : 3000;
	hr.timeout_ms = a->cfg.timeout_ms;
	hr.sigv4 = a->sigv4;
	hr.headers = hdrs;
	hr.access_key = a->cr.ak;
	hr.secret_key = a->cr.sk;

	rc = ik_aws_send(&a->cfg, what.p, &hr, &res, e, &tries, &herr);
	if (rc != IK_OK && rc != IK_TEMPFAIL) {
		rc = ik_errf(err, rc, "%s %s: %s", a->service, op, herr.msg);
		goto out;
	}
	if (rc == IK_OK && e->kind == IK_AWS_OK) {
		*resp = res.body.len ? cJSON_ParseWithLength(res.body.p, res.body.len)
		                     : cJSON_CreateObject();
		if (!cJSON_IsObject(*resp)) {
			cJSON_Delete(*resp);
			*resp = NULL;
			rc = ik_errf(err, IK_TEMPFAIL, "%s %s: unreadable response "
			             "(HTTP %ld)", a->service, op, res.status);
		}
		goto out;
	}
	scrub_creds(a, e->message);
	rc = ik_aws_kind_code(e->kind);
	if (rc == IK_AWS_ERROR && res.body.len) {
		*resp = cJSON_ParseWithLength(res.body.p, res.body.len);
		if (!cJSON_IsObject(*resp)) {
			cJSON_Delete(*resp);
			*resp = NULL;
		}
	}
	if (e->retryable && tries > 1)
		snprintf(tries_s, sizeof tries_s, " (%d tries)", tries);
	else
		tries_s[0] = '\0';
	if (e->type[0] || e->query[0])
		ik_errf(err, rc == IK_AWS_ERROR ? IK_SOFTWARE : rc, "%s %s: %s: %s%s",
		        a->service, op, e->type[0] ? e->type : e->query, e->message, tries_s);
	else
		ik_errf(err, rc == IK_AWS_ERROR ? IK_SOFTWARE : rc, "%s %s: %s%s",
		        a->service, op, e->message, tries_s);
	if (err)
		scrub_creds(a, err->msg);
out:
	ik_http_res_free(&res);
	ik_buf_wipe_free(&tok);
	ik_buf_free(&th);
	ik_buf_free(&what);
	free(body);
	return rc;
}
