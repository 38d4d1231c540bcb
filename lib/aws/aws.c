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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "aws/aws.h"
#include "aws/aws_int.h"
#include "conn/http.h"
#include "core/json.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

#define BACKOFF_CAP_MS   20000

struct ik_aws {
	char service[16];
	char *region, *endpoint, *sigv4, *cacert, *profile;
	struct ik_aws_cfg cfg;
	struct ik_aws_profile prof;
	struct ik_aws_src *src;
	struct ik_aws_creds cr;
	struct ik_aws_job *backoff;     /* calls waiting to be sent again */
	struct ik_aws_job *jobs;        /* every call submitted, not yet reported */
	size_t active;                  /* how many */
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

/* The services a client speaks: the name messages use (ik_aws_open's
 * argument), the AWS_ENDPOINT_URL_<ENV> suffix, the regional host's first
 * labels and the SigV4 service name.  DynamoDB Streams is its own
 * endpoint (streams.dynamodb.REGION) signed as dynamodb; an endpoint set
 * for DynamoDB alone also serves its streams (DynamoDB Local serves both
 * on one port), so it is the streams' too when theirs is not set. */
static const struct svc {
	const char *name, *env, *host, *sign, *also;
} services[] = {
	{ "dynamodb", "DYNAMODB", "dynamodb", "dynamodb", NULL },
	{ "sqs", "SQS", "sqs", "sqs", NULL },
	{ "dynamodbstreams", "DYNAMODB_STREAMS", "streams.dynamodb", "dynamodb",
	  "AWS_ENDPOINT_URL_DYNAMODB" },
};

static const struct svc *
svc_find(const char *name)
{
	for (size_t i = 0; i < sizeof services / sizeof services[0]; i++)
		if (strcmp(services[i].name, name) == 0)
			return &services[i];
	return NULL;
}

/* AWS_ENDPOINT_URL_<SERVICE>, AWS_ENDPOINT_URL, else the regional one;
 * and libcurl's SigV4 parameter. */
static int
resolve_endpoint(struct ik_aws *a, ik_err *err)
{
	const struct svc *sv = svc_find(a->service);
	char envname[64];
	struct ik_buf b = { 0 };
	const char *ep;

	snprintf(envname, sizeof envname, "AWS_ENDPOINT_URL_%s", sv->env);
	if ((ep = ik_aws_env(envname)) || (ep = ik_aws_env("AWS_ENDPOINT_URL")) ||
	    (sv->also && (ep = ik_aws_env(sv->also)))) {
		ik_buf_addstr(&b, ep);
	} else {
		ik_buf_addstr(&b, "https://");
		ik_buf_addstr(&b, sv->host);
		ik_buf_addstr(&b, ".");
		ik_buf_addstr(&b, a->region);
		ik_buf_addstr(&b, ".amazonaws.com");
	}
	a->endpoint = b.p;
	memset(&b, 0, sizeof b);
	ik_buf_addstr(&b, "aws:amz:");
	ik_buf_addstr(&b, a->region);
	ik_buf_addstr(&b, ":");
	ik_buf_addstr(&b, sv->sign);
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
	if (!svc_find(service) || strlen(service) >= sizeof a->service)
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

static void job_free(struct ik_aws_job *j);

void
ik_aws_close(struct ik_aws *a)
{
	if (!a)
		return;
	/* Calls still in flight are abandoned, never reported: the HTTP
	 * handle drops their transfers, and they go with it. */
	ik_http_close(a->cfg.http);
	a->cfg.http = NULL;
	while (a->jobs)
		job_free(a->jobs);
	ik_aws_creds_free(&a->cr);
	ik_aws_src_free(a->src);
	ik_aws_profile_free(&a->prof);
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

/* One call's request, built once and sent on every try. */
struct call {
	struct ik_http_req hr;
	struct ik_buf th, tok, what;
	const char *hdrs[4];
	const char *op;           /* "PutItem": the target's last part, in what */
	char *body;
};

static void
call_free(struct call *c)
{
	ik_buf_wipe_free(&c->tok);
	ik_buf_free(&c->th);
	ik_buf_free(&c->what);
	free(c->body);
	memset(c, 0, sizeof *c);
}

/* Points c at the client's credentials as they are now (a call in flight
 * may outlive a refresh made for another): the keys, and the session
 * token's header.  -1 out of memory. */
static int
sign(const struct ik_aws *a, struct call *c)
{
	int h = 0;

	ik_buf_wipe_free(&c->tok);
	c->hdrs[h++] = "Content-Type: application/x-amz-json-1.0";
	c->hdrs[h++] = c->th.p;
	if (a->cr.tok) {
		ik_buf_addstr(&c->tok, "X-Amz-Security-Token: ");
		ik_buf_addstr(&c->tok, a->cr.tok);
		if (!c->tok.p)
			return -1;
		c->hdrs[h++] = c->tok.p;
	}
	c->hdrs[h] = NULL;
	c->hr.headers = c->hdrs;
	c->hr.access_key = a->cr.ak;
	c->hr.secret_key = a->cr.sk;
	return 0;
}

/* Refreshes the credentials when due and builds c from them. */
static int
prepare(struct ik_aws *a, const char *target, const cJSON *req, struct call *c, ik_err *err)
{
	int rc;

	memset(c, 0, sizeof *c);
	c->op = strrchr(target, '.');
	c->op = c->op ? c->op + 1 : target;
	if (!(c->body = ik_json_print(req)))
		return ik_errf(err, IK_SOFTWARE, "%s %s: out of memory", a->service, c->op);
	/* a retry loop lasts seconds; the refresh margin is minutes (or half
	 * the lifetime), so one check per call is enough */
	if ((rc = ik_aws_creds_refresh(&a->cfg, a->src, &a->cr, err)) != IK_OK) {
		ik_errwrap(err, "%s %s", a->service, c->op);
		return rc;
	}
	ik_buf_addstr(&c->th, "X-Amz-Target: ");
	ik_buf_addstr(&c->th, target);
	ik_buf_addstr(&c->what, a->service);
	ik_buf_addstr(&c->what, " ");
	ik_buf_addstr(&c->what, c->op);
	if (!c->th.p || !c->what.p || sign(a, c) < 0)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	/* target need not outlive the call's start: the name from our copy */
	c->op = c->what.p + strlen(a->service) + 1;
	c->hr.method = "POST";
	c->hr.url = a->endpoint;
	c->hr.body = c->body;
	c->hr.body_len = strlen(c->body);
	c->hr.cacert = a->cacert;
	/* https:// only (http.h): the AWS CLI's HTTPS_PROXY, never for plain http */
	c->hr.env_proxy = 1;
	c->hr.connect_timeout_ms = a->cfg.timeout_ms < 3000 ? a->cfg.timeout_ms : 3000;
	c->hr.timeout_ms = a->cfg.timeout_ms;
	c->hr.sigv4 = a->sigv4;
	return IK_OK;
}

/* What the last try (rc from ik_aws_send's rules, res, e, herr) means for
 * the caller, as ik_aws_call documents it. */
static int
conclude(struct ik_aws *a, const struct call *c, int rc, const ik_err *herr,
         const struct ik_http_res *res, struct ik_aws_error *e, int tries,
         cJSON **resp, ik_err *err)
{
	char tries_s[32];

	*resp = NULL;
	if (rc != IK_OK && rc != IK_TEMPFAIL)
		return ik_errf(err, rc, "%s %s: %s", a->service, c->op, herr->msg);
	if (rc == IK_OK && e->kind == IK_AWS_OK) {
		*resp = res->body.len ? cJSON_ParseWithLength(res->body.p, res->body.len)
		                      : cJSON_CreateObject();
		if (cJSON_IsObject(*resp))
			return IK_OK;
		cJSON_Delete(*resp);
		*resp = NULL;
		return ik_errf(err, IK_TEMPFAIL, "%s %s: unreadable response (HTTP %ld)",
		               a->service, c->op, res->status);
	}
	scrub_creds(a, e->message);
	rc = ik_aws_kind_code(e->kind);
	if (rc == IK_AWS_ERROR && res->body.len) {
		*resp = cJSON_ParseWithLength(res->body.p, res->body.len);
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
		        a->service, c->op, e->type[0] ? e->type : e->query, e->message, tries_s);
	else
		ik_errf(err, rc == IK_AWS_ERROR ? IK_SOFTWARE : rc, "%s %s: %s%s",
		        a->service, c->op, e->message, tries_s);
	if (err)
		scrub_creds(a, err->msg);
	return rc;
}

int
ik_aws_call(struct ik_aws *a, const char *target, const cJSON *req,
            cJSON **resp, struct ik_aws_error *aerr, ik_err *err)
{
	struct ik_aws_error e_local, *e = aerr ? aerr : &e_local;
	struct ik_http_res res = { 0 };
	struct call c;
	ik_err herr = { 0 };
	int rc, tries = 0;

	*resp = NULL;
	memset(e, 0, sizeof *e);
	if ((rc = prepare(a, target, req, &c, err)) == IK_OK) {
		rc = ik_aws_send(&a->cfg, c.what.p, &c.hr, &res, e, &tries, &herr);
		rc = conclude(a, &c, rc, &herr, &res, e, tries, resp, err);
	}
	ik_http_res_free(&res);
	call_free(&c);
	return rc;
}

/* ---- calls in flight ------------------------------------------------- */

struct ik_aws_job {
	struct ik_aws *a;
	struct call c;
	struct ik_http_res res;
	struct ik_aws_error e;
	int tries;
	int64_t due_ms;                 /* a backoff's end (monotonic) */
	ik_aws_cb cb;
	void *arg;
	struct ik_aws_job *next;        /* in a->backoff */
	struct ik_aws_job *prev_job, *next_job;   /* in a->jobs */
};

/* Frees j, taking it off a->jobs when it is there. */
static void
job_free(struct ik_aws_job *j)
{
	struct ik_aws *a = j->a;

	if (j->prev_job)
		j->prev_job->next_job = j->next_job;
	else if (a->jobs == j)
		a->jobs = j->next_job;
	if (j->next_job)
		j->next_job->prev_job = j->prev_job;
	ik_http_res_free(&j->res);
	call_free(&j->c);
	free(j);
}

/* The call is over: its callback, then it is gone. */
static void
job_report(struct ik_aws_job *j, int rc, const ik_err *herr)
{
	struct ik_aws *a = j->a;
	ik_err err = { 0 };
	cJSON *resp = NULL;

	rc = conclude(a, &j->c, rc, herr, &j->res, &j->e, j->tries, &resp, &err);
	a->active--;
	j->cb(j->arg, rc, resp, &j->e, &err);
	job_free(j);
}

static void on_http(void *arg, int rc, struct ik_http_res *res, const ik_err *herr);

/* Sends the next try; a failure to start it ends the call. */
static void
job_try(struct ik_aws_job *j)
{
	ik_err herr = { 0 };
	int rc;

	j->tries++;
	if (sign(j->a, &j->c) < 0)
		rc = ik_errf(&herr, IK_SOFTWARE, "out of memory");
	else if ((rc = ik_http_submit(j->a->cfg.http, &j->c.hr, &j->res, on_http, j, &herr)) != IK_OK)
		job_report(j, rc, &herr);
}

static void
on_http(void *arg, int rc, struct ik_http_res *res, const ik_err *herr)
{
	struct ik_aws_job *j = arg;
	struct ik_aws *a = j->a;
	int64_t wait;

	(void)res;   /* j->res */
	rc = ik_aws_judge(rc, &j->res, herr, &j->e);
	if ((rc == IK_OK || rc == IK_TEMPFAIL) &&
	    (wait = ik_aws_retry_wait_ms(&a->cfg, j->c.what.p, &j->e, j->tries)) >= 0) {
		j->due_ms = ik_mono_ms() + wait;
		j->next = a->backoff;
		a->backoff = j;
		return;
	}
	job_report(j, rc, herr);
}

int
ik_aws_submit(struct ik_aws *a, const char *target, const cJSON *req,
              ik_aws_cb cb, void *arg, ik_err *err)
{
	struct ik_aws_job *j;
	int rc;

	if (!(j = calloc(1, sizeof *j)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	j->a = a;
	j->cb = cb;
	j->arg = arg;
	if ((rc = prepare(a, target, req, &j->c, err)) != IK_OK) {
		job_free(j);
		return rc;
	}
	j->tries = 1;
	if ((rc = ik_http_submit(a->cfg.http, &j->c.hr, &j->res, on_http, j, err)) != IK_OK) {
		ik_errwrap(err, "%s %s", a->service, j->c.op);
		job_free(j);
		return rc;
	}
	a->active++;
	j->next_job = a->jobs;
	if (a->jobs)
		a->jobs->prev_job = j;
	a->jobs = j;
	return IK_OK;
}

size_t
ik_aws_active(const struct ik_aws *a)
{
	return a ? a->active : 0;
}

/* Sends again every call whose backoff is over (all of them after a stop
 * signal); returns the ms until the next one is due, or -1 for none. */
static int64_t
resend_due(struct ik_aws *a)
{
	struct ik_aws_job **pp = &a->backoff, *j, *due = NULL;
	int64_t now = ik_mono_ms(), next = -1;

	while ((j = *pp)) {
		if (j->due_ms <= now || ik_stop_signal) {
			*pp = j->next;
			j->next = due;
			due = j;
		} else {
			if (next < 0 || j->due_ms - now < next)
				next = j->due_ms - now;
			pp = &j->next;
		}
	}
	while ((j = due)) {         /* after the walk: a try may report at once */
		due = j->next;
		j->next = NULL;
		job_try(j);
	}
	return next;
}

int
ik_aws_run(struct ik_aws *a, struct pollfd *fds, unsigned nfds, int timeout_ms, ik_err *err)
{
	int64_t next = resend_due(a);
	int rc;

	if (next >= 0 && (timeout_ms < 0 || next < timeout_ms))
		timeout_ms = (int)next;
	if ((rc = ik_http_run(a->cfg.http, fds, nfds, timeout_ms, err)) != IK_OK)
		return rc;
	resend_due(a);
	return IK_OK;
}
