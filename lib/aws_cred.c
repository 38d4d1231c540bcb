/* aws_cred.c: the AWS credential chain and its providers.
 *
 * Order: the environment, the profile's static keys (credentials file,
 * then config file), container credentials, EC2 IMDSv2.
 *
 * Rules: credentials live only in struct ik_aws_creds and never reach a
 * message or a log line; only loopback addresses or the documented
 * link-local metadata addresses are contacted over plain http.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sodium.h>

#include "aws_int.h"
#include "curl_dl.h"
#include "outcome.h"
#include "util.h"

#define CRED_REFRESH_MS  (10 * 60 * 1000)  /* refresh this long before expiry */
#define SECRET_FILE_MAX  16384

enum src { SRC_ENV, SRC_SHARED, SRC_CONFIG, SRC_CONTAINER, SRC_IMDS };

static const char *const src_names[] = {
	"env", "shared-credentials-file", "config-file", "container", "imds",
};

struct ik_aws_src {
	enum src kind;
};

static void
wipe_free(char *s)
{
	if (s) {
		sodium_memzero(s, strlen(s));
		free(s);
	}
}

void
ik_aws_creds_free(struct ik_aws_creds *c)
{
	wipe_free(c->ak);
	wipe_free(c->sk);
	wipe_free(c->tok);
	memset(c, 0, sizeof *c);
}

static const char *
env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

static int
env_true(const char *name)
{
	const char *v = env(name);

	return v && strcasecmp(v, "true") == 0;
}

static int64_t
parse_iso8601_ms(const char *s)
{
	struct tm tm;
	int y, mo, d, h, mi, se;
	time_t t;

	if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &se) != 6)
		return 0;
	memset(&tm, 0, sizeof tm);
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = se;
	t = timegm(&tm);
	return t == (time_t)-1 ? 0 : (int64_t)t * 1000;
}

/* ---- credential providers ----------------------------------------------
 * Each returns IK_OK with *c filled, IK_EMPTY when it does not apply (try
 * the next one), or an error code. */

static int
from_env(struct ik_aws_creds *c, ik_err *err)
{
	const char *ak = env("AWS_ACCESS_KEY_ID"), *sk = env("AWS_SECRET_ACCESS_KEY");
	const char *tok = env("AWS_SESSION_TOKEN");

	if (!ak && !sk)
		return IK_EMPTY;
	if (!ak || !sk)
		return ik_errf(err, IK_CONFIG, "%s is set but %s is not",
		               ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
		               ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
	c->ak = strdup(ak);
	c->sk = strdup(sk);
	c->tok = tok ? strdup(tok) : NULL;
	if (!c->ak || !c->sk || (tok && !c->tok))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

/* The profile's static keys from the credentials file (config = 0) or
 * the config file (config = 1). */
static int
from_profile_keys(const struct ik_aws_profile *p, int config, struct ik_aws_creds *c,
                  ik_err *err)
{
	int want = !config, has_ak, has_sk;

	has_ak = p->v[IK_AWS_P_AK] && p->in_creds[IK_AWS_P_AK] == want;
	has_sk = p->v[IK_AWS_P_SK] && p->in_creds[IK_AWS_P_SK] == want;
	if (!has_ak && !has_sk)
		return IK_EMPTY;
	if (!p->v[IK_AWS_P_AK] || !p->v[IK_AWS_P_SK])
		return ik_errf(err, IK_CONFIG, "AWS profile %s has %s but not %s", p->name,
		               p->v[IK_AWS_P_AK] ? "aws_access_key_id" : "aws_secret_access_key",
		               p->v[IK_AWS_P_AK] ? "aws_secret_access_key" : "aws_access_key_id");
	c->ak = strdup(p->v[IK_AWS_P_AK]);
	c->sk = strdup(p->v[IK_AWS_P_SK]);
	c->tok = ik_strdup(p->v[IK_AWS_P_TOK]);
	if (!c->ak || !c->sk || (p->v[IK_AWS_P_TOK] && !c->tok))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

/* Credentials JSON as the container endpoint and IMDS serve it. */
static int
parse_cred_json(const char *what, const struct ik_buf *body, struct ik_aws_creds *c, ik_err *err)
{
	cJSON *j = cJSON_ParseWithLength(body->p, body->len);
	cJSON *ak, *sk, *tok, *exp;
	int rc = IK_OK;

	ak = cJSON_GetObjectItemCaseSensitive(j, "AccessKeyId");
	sk = cJSON_GetObjectItemCaseSensitive(j, "SecretAccessKey");
	tok = cJSON_GetObjectItemCaseSensitive(j, "Token");
	exp = cJSON_GetObjectItemCaseSensitive(j, "Expiration");
	if (!cJSON_IsString(ak) || !cJSON_IsString(sk) || !*ak->valuestring ||
	    !*sk->valuestring) {
		rc = ik_errf(err, IK_TEMPFAIL, "%s credentials: response without "
		             "AccessKeyId/SecretAccessKey", what);
		goto out;
	}
	c->ak = strdup(ak->valuestring);
	c->sk = strdup(sk->valuestring);
	c->tok = cJSON_IsString(tok) && *tok->valuestring ? strdup(tok->valuestring) : NULL;
	c->expires_ms = cJSON_IsString(exp) ? parse_iso8601_ms(exp->valuestring) : 0;
	if (!c->ak || !c->sk)
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
out:
	if (j) {
		/* wipe the parsed copies of the secrets */
		if (cJSON_IsString(sk))
			sodium_memzero(sk->valuestring, strlen(sk->valuestring));
		if (cJSON_IsString(tok))
			sodium_memzero(tok->valuestring, strlen(tok->valuestring));
	}
	cJSON_Delete(j);
	return rc;
}

/* http is allowed for loopback and the documented container addresses
 * only; https anywhere. */
static int
container_url_ok(const char *url)
{
	CURLU *u;
	char *scheme = NULL, *host = NULL;
	int ok = 0;

	if (ik_curl_load(NULL) != IK_OK || !(u = curl_url()))
		return 0;
	if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
		if (strcasecmp(scheme, "https") == 0)
			ok = 1;
		else if (strcasecmp(scheme, "http") == 0)
			ok = strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 ||
			     strcmp(host, "[::1]") == 0 || strcmp(host, "169.254.170.2") == 0 ||
			     strcmp(host, "169.254.170.23") == 0 ||
			     strcasecmp(host, "[fd00:ec2::23]") == 0;
	}
	curl_free(scheme);
	curl_free(host);
	curl_url_cleanup(u);
	return ok;
}

static int
from_container(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err)
{
	const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
	const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
	const char *tokfile = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
	const char *tokenv = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
	struct ik_buf url = { 0 }, tok = { 0 }, hdr = { 0 };
	struct ik_http_req req = { 0 };
	struct ik_http_res res = { 0 };
	const char *hdrs[2] = { NULL, NULL };
	int rc, i;

	if (!rel && !full)
		return IK_EMPTY;
	if (rel) {
		ik_buf_addstr(&url, "http://169.254.170.2");
		if (rel[0] != '/')
			ik_buf_addstr(&url, "/");
		ik_buf_addstr(&url, rel);
	} else {
		ik_buf_addstr(&url, full);
		if (!container_url_ok(full)) {
			rc = ik_errf(err, IK_CONFIG, "AWS_CONTAINER_CREDENTIALS_FULL_URI must "
			             "be https, or http to a loopback or container address");
			goto out;
		}
	}
	if (!url.p) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	if (tokfile) {
		if ((rc = ik_read_file(tokfile, SECRET_FILE_MAX, &tok, err)) != IK_OK) {
			ik_errwrap(err, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
			rc = err ? err->code : IK_CONFIG;
			goto out;
		}
	} else if (tokenv) {
		ik_buf_addstr(&tok, tokenv);
	}
	if (tok.p && tok.len) {
		if (strpbrk(tok.p, "\r\n")) {
			rc = ik_errf(err, IK_CONFIG, "container authorization token holds a line break");
			goto out;
		}
		ik_buf_addstr(&hdr, "Authorization: ");
		ik_buf_addstr(&hdr, tok.p);
		if (!hdr.p) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			goto out;
		}
		hdrs[0] = hdr.p;
	}
	req.method = "GET";
	req.url = url.p;
	req.headers = hdrs;
	req.connect_timeout_ms = 1000;
	req.timeout_ms = 2000;
	req.max_body = 65536;
	req.no_proxy = 1;
	for (i = 0; i < 3; i++) {
		rc = ik_http_do(a->http, &req, &res, err);
		if (rc == IK_OK && res.status >= 500)
			rc = ik_errf(err, IK_TEMPFAIL, "HTTP %ld", res.status);
		if (rc != IK_TEMPFAIL)
			break;
	}
	if (rc != IK_OK) {
		ik_errwrap(err, "container credentials");
		goto out;
	}
	if (res.status != 200) {
		rc = ik_errf(err, IK_CONFIG, "container credentials: HTTP %ld", res.status);
		goto out;
	}
	rc = parse_cred_json("container", &res.body, c, err);
out:
	ik_http_res_free(&res);
	if (tok.p)
		sodium_memzero(tok.p, tok.cap);
	if (hdr.p)
		sodium_memzero(hdr.p, hdr.cap);
	ik_buf_free(&tok);
	ik_buf_free(&hdr);
	ik_buf_free(&url);
	return rc;
}

/* EC2 IMDSv2: PUT a session token, GET the role name, GET its credentials.
 * Not reachable (not on EC2) is IK_EMPTY: the chain ends without
 * credentials. */
static int
from_imds(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err)
{
	const char *base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
	const char *tmo = env("AWS_METADATA_SERVICE_TIMEOUT");
	struct ik_http_req req = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_buf url = { 0 }, hdr = { 0 };
	const char *hdrs[2] = { NULL, NULL };
	long long secs = 1;
	char role[256];
	int rc;

	if (env_true("AWS_EC2_METADATA_DISABLED"))
		return IK_EMPTY;
	if (!base)
		base = "http://169.254.169.254";
	if (tmo && ik_parse_int(tmo, 1, 60, &secs) < 0)
		return ik_errf(err, IK_CONFIG, "AWS_METADATA_SERVICE_TIMEOUT: not a number of seconds");
	req.connect_timeout_ms = req.timeout_ms = (long)secs * 1000;
	req.no_proxy = 1;
	req.max_body = 65536;

	ik_buf_addstr(&url, base);
	ik_buf_addstr(&url, "/latest/api/token");
	hdrs[0] = "X-aws-ec2-metadata-token-ttl-seconds: 21600";
	req.method = "PUT";
	req.url = url.p;
	req.headers = hdrs;
	rc = ik_http_do(a->http, &req, &res, err);
	if (rc == IK_TEMPFAIL || (rc == IK_OK && res.status != 200)) {
		rc = IK_EMPTY;       /* no metadata service here */
		goto out;
	}
	if (rc != IK_OK)
		goto out;
	ik_buf_addstr(&hdr, "X-aws-ec2-metadata-token: ");
	ik_buf_add(&hdr, res.body.p, strcspn(res.body.p, "\r\n"));
	hdrs[0] = hdr.p;
	req.method = "GET";
	ik_buf_reset(&url);
	ik_buf_addstr(&url, base);
	ik_buf_addstr(&url, "/latest/meta-data/iam/security-credentials/");
	req.url = url.p;
	if ((rc = ik_http_do(a->http, &req, &res, err)) != IK_OK)
		goto wrap;
	if (res.status != 200) {
		rc = ik_errf(err, res.status >= 500 ? IK_TEMPFAIL : IK_CONFIG,
		             "no IAM role for this instance (HTTP %ld)", res.status);
		goto wrap;
	}
	ik_aws_copy_line(role, sizeof role, res.body.p, res.body.len);
	if (!role[0] || strchr(role, '/')) {
		rc = ik_errf(err, IK_CONFIG, "no IAM role for this instance");
		goto wrap;
	}
	ik_buf_addstr(&url, role);
	req.url = url.p;
	if ((rc = ik_http_do(a->http, &req, &res, err)) != IK_OK)
		goto wrap;
	if (res.status != 200) {
		rc = ik_errf(err, res.status >= 500 ? IK_TEMPFAIL : IK_CONFIG,
		             "HTTP %ld", res.status);
		goto wrap;
	}
	rc = parse_cred_json("instance metadata", &res.body, c, err);
	goto out;
wrap:
	ik_errwrap(err, "instance metadata credentials");
out:
	if (hdr.p)
		sodium_memzero(hdr.p, hdr.cap);
	ik_buf_free(&hdr);
	ik_buf_free(&url);
	ik_http_res_free(&res);
	return rc;
}

/* The chain, in the AWS CLI's order.  Also picks up the profile's region
 * from the config file. */

static int
run_source(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, enum src s,
           struct ik_aws_creds *c, ik_err *err)
{
	switch (s) {
	case SRC_ENV:       return from_env(c, err);
	case SRC_SHARED:    return from_profile_keys(p, 0, c, err);
	case SRC_CONFIG:    return from_profile_keys(p, 1, c, err);
	case SRC_CONTAINER: return from_container(a, c, err);
	case SRC_IMDS:      return from_imds(a, c, err);
	}
	return IK_EMPTY;
}

int
ik_aws_creds_load(const struct ik_aws_cfg *a, const struct ik_aws_profile *p,
                  struct ik_aws_src **srcp, struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_src *src;
	enum src s;
	int rc;

	memset(c, 0, sizeof *c);
	*srcp = NULL;
	for (s = SRC_ENV; s <= SRC_IMDS; s++) {
		if (s == SRC_CONTAINER && a->profile_explicit && !p->found)
			return ik_errf(err, IK_CONFIG, "AWS profile %s not found in the "
			               "credentials or config file", a->profile);
		if ((rc = run_source(a, p, s, c, err)) == IK_EMPTY)
			continue;
		if (rc != IK_OK) {
			ik_aws_creds_free(c);
			return rc;
		}
		if (!(src = calloc(1, sizeof *src))) {
			ik_aws_creds_free(c);
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		src->kind = s;
		c->fetched_ms = ik_now_ms();
		*srcp = src;
		return IK_OK;
	}
	return ik_errf(err, IK_CONFIG, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
	               "AWS_SECRET_ACCESS_KEY, a profile in ~/.aws/credentials, or run "
	               "with container or instance credentials");
}

int
ik_aws_creds_refresh(const struct ik_aws_cfg *a, struct ik_aws_src *src,
                     struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_creds n = { 0 };
	int64_t now = ik_now_ms(), margin;
	int rc;

	if (!c->expires_ms)
		return IK_OK;
	margin = (c->expires_ms - c->fetched_ms) / 2;
	if (margin > CRED_REFRESH_MS || margin < 0)
		margin = CRED_REFRESH_MS;
	if (now < c->expires_ms - margin)
		return IK_OK;
	if (src->kind != SRC_CONTAINER && src->kind != SRC_IMDS)
		return IK_OK;
	rc = run_source(a, NULL, src->kind, &n, err);
	if (rc != IK_OK) {
		ik_aws_creds_free(&n);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_TEMPFAIL, "instance metadata: not reachable");
		if (now < c->expires_ms)
			return IK_OK;
		return ik_errwrap(err, "refreshing expired %s credentials", src_names[src->kind]);
	}
	ik_aws_creds_free(c);
	*c = n;
	c->fetched_ms = now;
	return IK_OK;
}

const char *
ik_aws_src_name(const struct ik_aws_src *src)
{
	return src_names[src->kind];
}

void
ik_aws_src_free(struct ik_aws_src *src)
{
	free(src);
}
