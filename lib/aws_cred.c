/* aws_cred.c: the AWS credential chain and its providers.
 *
 * The order is the AWS CLI's ("Configuration and credential file
 * settings", precedence), and the first source that applies is the only
 * one tried:
 *   1. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY [/ AWS_SESSION_TOKEN];
 *   2. the profile's role_arn with source_profile or credential_source:
 *      STS AssumeRole signed with the source's credentials (chains of
 *      source profiles are followed, up to MAX_DEPTH);
 *   3. web identity: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, else the
 *      profile's web_identity_token_file + role_arn: STS
 *      AssumeRoleWithWebIdentity, unsigned;
 *   4. the profile's static keys in the credentials file;
 *   5. the profile's credential_process (JSON, Version 1);
 *   6. the profile's static keys in the config file;
 *   7. container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, or
 *      _FULL_URI to a loopback or the documented ECS/EKS address, with
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]);
 *   8. EC2 IMDSv2, unless AWS_EC2_METADATA_DISABLED=true.
 *
 * Rules:
 *  - never a different principal silently: a profile that names a method
 *    idemkit does not follow (IAM Identity Center sso_*, login_session,
 *    mfa_serial, an unknown credential_source, a role_arn with no source)
 *    is IK_CONFIG naming the setting, never a fall-through to container
 *    or instance credentials; so is AWS_PROFILE naming no profile, a
 *    source that applies but fails, and a half-set pair of variables;
 *  - credentials are refreshed from the same source they came from;
 *  - they live only in struct ik_aws_creds and never reach a message or
 *    a log line; plain http only to the metadata addresses.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "aws_int.h"
#include "curl_dl.h"
#include "log.h"
#include "outcome.h"
#include "util.h"

#define CRED_REFRESH_MS  (10 * 60 * 1000)  /* refresh this long before expiry */
#define SECRET_FILE_MAX  16384
#define MAX_DEPTH        5                 /* source_profile hops */
#define PROCESS_TIMEOUT_MS 30000
#define PROCESS_OUT_MAX  65536

extern char **environ;

enum src {
	SRC_ENV, SRC_ASSUME_ROLE, SRC_WEB_IDENTITY, SRC_SHARED, SRC_PROCESS,
	SRC_CONFIG, SRC_CONTAINER, SRC_IMDS,
};

static const char *const src_names[] = {
	"env", "assume-role", "web-identity", "shared-credentials-file",
	"credential-process", "config-file", "container", "imds",
};

/* What it takes to fetch the credentials again: the kind, and for the
 * profile-based kinds the profile (re-read at each refresh). */
struct ik_aws_src {
	enum src kind;
	char *profile;    /* NULL: from the environment */
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

static void
buf_wipe_free(struct ik_buf *b)
{
	if (b->p)
		sodium_memzero(b->p, b->cap);
	ik_buf_free(b);
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

static int
oom(ik_err *err)
{
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

/* "2026-12-01T10:00:00Z", fractions ignored; -1 when malformed. */
static int64_t
parse_iso8601_ms(const char *s)
{
	struct tm tm;
	int y, mo, d, h, mi, se;
	time_t t;

	if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &se) != 6)
		return -1;
	memset(&tm, 0, sizeof tm);
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = se;
	t = timegm(&tm);
	return t == (time_t)-1 ? -1 : (int64_t)t * 1000;
}

static int
set_creds(struct ik_aws_creds *c, const char *ak, const char *sk, const char *tok,
          ik_err *err)
{
	c->ak = strdup(ak);
	c->sk = strdup(sk);
	c->tok = tok && *tok ? strdup(tok) : NULL;
	if (!c->ak || !c->sk || (tok && *tok && !c->tok))
		return oom(err);
	return IK_OK;
}

/* ---- static keys -------------------------------------------------------
 * Each provider returns IK_OK with *c filled, IK_EMPTY when it does not
 * apply, or an error code that ends the chain. */

static int
from_env(struct ik_aws_creds *c, ik_err *err)
{
	const char *ak = env("AWS_ACCESS_KEY_ID"), *sk = env("AWS_SECRET_ACCESS_KEY");

	if (!ak && !sk)
		return IK_EMPTY;
	if (!ak || !sk)
		return ik_errf(err, IK_CONFIG, "%s is set but %s is not",
		               ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
		               ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
	return set_creds(c, ak, sk, env("AWS_SESSION_TOKEN"), err);
}

/* The profile's static keys, from the credentials file (creds = 1) or
 * the config file (creds = 0). */
static int
from_profile_keys(const struct ik_aws_profile *p, int creds, struct ik_aws_creds *c,
                  ik_err *err)
{
	const char *ak = p->v[IK_AWS_P_AK], *sk = p->v[IK_AWS_P_SK];

	if (!(ak && p->in_creds[IK_AWS_P_AK] == creds) &&
	    !(sk && p->in_creds[IK_AWS_P_SK] == creds))
		return IK_EMPTY;
	if (!ak || !sk)
		return ik_errf(err, IK_CONFIG, "AWS profile %s has %s but not %s", p->name,
		               ak ? "aws_access_key_id" : "aws_secret_access_key",
		               ak ? "aws_secret_access_key" : "aws_access_key_id");
	return set_creds(c, ak, sk, p->v[IK_AWS_P_TOK], err);
}

/* ---- container credentials and IMDSv2 ------------------------------- */

/* Credentials JSON as the container endpoint and IMDS serve it. */
static int
parse_cred_json(const char *what, const struct ik_buf *body, struct ik_aws_creds *c,
                ik_err *err)
{
	cJSON *j = cJSON_ParseWithLength(body->p, body->len);
	cJSON *ak, *sk, *tok, *exp;
	int rc;

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
	rc = set_creds(c, ak->valuestring, sk->valuestring,
	               cJSON_IsString(tok) ? tok->valuestring : NULL, err);
	c->expires_ms = cJSON_IsString(exp) ? parse_iso8601_ms(exp->valuestring) : 0;
	if (c->expires_ms < 0) {
		/* unknown expiry: treat as short-lived, fetched again soon */
		c->expires_ms = ik_now_ms() + 5 * 60 * 1000;
	}
out:
	if (j) {
		if (cJSON_IsString(sk))
			sodium_memzero(sk->valuestring, strlen(sk->valuestring));
		if (cJSON_IsString(tok))
			sodium_memzero(tok->valuestring, strlen(tok->valuestring));
	}
	cJSON_Delete(j);
	return rc;
}

/* The hosts AWS documents for container credentials over plain http (and
 * botocore allows): loopback, ECS 169.254.170.2, EKS Pod Identity
 * 169.254.170.23 and fd00:ec2::23.  Nothing else, https included: the
 * answer is a set of credentials, and the token goes with the request. */
static int
container_host_ok(const char *host)
{
	unsigned char a4[4], a6[16], eks6[16];
	char h[64];
	size_t n = strlen(host);

	if (strcasecmp(host, "localhost") == 0)     /* curl resolves it to loopback only */
		return 1;
	if (inet_pton(AF_INET, host, a4) == 1)
		return a4[0] == 127 || strcmp(host, "169.254.170.2") == 0 ||
		       strcmp(host, "169.254.170.23") == 0;
	if (n < 3 || n - 2 >= sizeof h || host[0] != '[' || host[n - 1] != ']')
		return 0;
	memcpy(h, host + 1, n - 2);
	h[n - 2] = '\0';
	if (inet_pton(AF_INET6, h, a6) != 1 || inet_pton(AF_INET6, "fd00:ec2::23", eks6) != 1)
		return 0;
	return memcmp(a6, in6addr_loopback.s6_addr, 16) == 0 || memcmp(a6, eks6, 16) == 0;
}

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
	    curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK)
		ok = (strcasecmp(scheme, "http") == 0 || strcasecmp(scheme, "https") == 0) &&
		     container_host_ok(host);
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
			rc = ik_errf(err, IK_CONFIG, "AWS_CONTAINER_CREDENTIALS_FULL_URI: the host "
			             "must be a loopback address, 169.254.170.2, 169.254.170.23 "
			             "or fd00:ec2::23");
			goto out;
		}
	}
	if (!url.p) {
		rc = oom(err);
		goto out;
	}
	if (tokfile) {
		/* read at every fetch: EKS rotates the file */
		if ((rc = ik_read_file(tokfile, SECRET_FILE_MAX, &tok, err)) != IK_OK) {
			ik_errwrap(err, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
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
			rc = oom(err);
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
		if (rc == IK_OK && (res.status >= 500 || res.status == 429))
			rc = ik_errf(err, IK_TEMPFAIL, "HTTP %ld", res.status);
		if (rc != IK_TEMPFAIL)
			break;
		ik_aws_sleep_ms(ik_aws_backoff_ms(a->backoff_cap_ms, i + 1));
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
	buf_wipe_free(&tok);
	buf_wipe_free(&hdr);
	ik_buf_free(&url);
	return rc;
}

/* EC2 IMDSv2: PUT a session token (with its TTL header), GET the role
 * name, GET its credentials, each GET with the token.  No metadata
 * service at the default address (not on EC2) is IK_EMPTY; at an
 * address set in AWS_EC2_METADATA_SERVICE_ENDPOINT it is IK_TEMPFAIL. */
static int
from_imds(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err)
{
	const char *base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
	const char *mode = env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
	const char *tmo = env("AWS_METADATA_SERVICE_TIMEOUT");
	struct ik_http_req req = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_buf url = { 0 }, hdr = { 0 };
	const char *hdrs[2] = { NULL, NULL };
	long long secs = 1;
	char role[256];
	size_t blen;
	int rc, explicit = base != NULL;

	if (env_true("AWS_EC2_METADATA_DISABLED"))
		return IK_EMPTY;
	if (mode && strcasecmp(mode, "IPv4") != 0 && strcasecmp(mode, "IPv6") != 0)
		return ik_errf(err, IK_CONFIG, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE: want IPv4 or IPv6");
	if (!base)
		base = mode && strcasecmp(mode, "IPv6") == 0 ? "http://[fd00:ec2::254]"
		                                             : "http://169.254.169.254";
	blen = strlen(base);
	while (blen && base[blen - 1] == '/')
		blen--;
	if (tmo && ik_parse_int(tmo, 1, 60, &secs) < 0)
		return ik_errf(err, IK_CONFIG, "AWS_METADATA_SERVICE_TIMEOUT: not a number of seconds");
	req.connect_timeout_ms = req.timeout_ms = (long)secs * 1000;
	req.no_proxy = 1;
	req.max_body = 65536;

	ik_buf_add(&url, base, blen);
	ik_buf_addstr(&url, "/latest/api/token");
	hdrs[0] = "X-aws-ec2-metadata-token-ttl-seconds: 21600";
	req.method = "PUT";
	req.url = url.p;
	req.headers = hdrs;
	rc = ik_http_do(a->http, &req, &res, err);
	if (!explicit && (rc == IK_TEMPFAIL || (rc == IK_OK && res.status != 200))) {
		rc = IK_EMPTY;       /* no metadata service here */
		goto out;
	}
	if (rc == IK_OK && res.status != 200)
		rc = ik_errf(err, res.status >= 500 ? IK_TEMPFAIL : IK_CONFIG,
		             "token: HTTP %ld", res.status);
	if (rc != IK_OK)
		goto wrap;
	ik_buf_addstr(&hdr, "X-aws-ec2-metadata-token: ");
	ik_buf_add(&hdr, res.body.p, strcspn(res.body.p, "\r\n"));
	hdrs[0] = hdr.p;
	req.method = "GET";
	ik_buf_reset(&url);
	ik_buf_add(&url, base, blen);
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
	if (!role[0] || strchr(role, '/') || strstr(role, "..")) {
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
	buf_wipe_free(&hdr);
	ik_buf_free(&url);
	ik_http_res_free(&res);
	return rc;
}

/* ---- STS ------------------------------------------------------------ */

static void
form_add(struct ik_buf *b, const char *name, const char *val)
{
	static const char hex[] = "0123456789ABCDEF";
	char e[3];

	if (b->len)
		ik_buf_addstr(b, "&");
	ik_buf_addstr(b, name);
	ik_buf_addstr(b, "=");
	for (; *val; val++) {
		unsigned char ch = (unsigned char)*val;
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
			ik_buf_add(b, val, 1);
		} else {
			e[0] = '%';
			e[1] = hex[ch >> 4];
			e[2] = hex[ch & 15];
			ik_buf_add(b, e, 3);
		}
	}
}

/* A copy of <tag>'s text inside the XML in s[0..n), the five predefined
 * entities decoded; NULL when absent. */
static char *
xml_value(const char *s, size_t n, const char *tag)
{
	static const struct { const char *ent; char ch; } ents[] = {
		{ "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' },
		{ "&quot;", '"' }, { "&apos;", '\'' },
	};
	const char *v = ik_aws_xml_text(s, n, tag, &n);
	char *out, *w;
	size_t i, k;

	if (!v || !(out = malloc(n + 1)))
		return NULL;
	for (i = 0, w = out; i < n; ) {
		for (k = 0; k < sizeof ents / sizeof ents[0]; k++)
			if (n - i >= strlen(ents[k].ent) &&
			    memcmp(v + i, ents[k].ent, strlen(ents[k].ent)) == 0)
				break;
		if (k < sizeof ents / sizeof ents[0]) {
			*w++ = ents[k].ch;
			i += strlen(ents[k].ent);
		} else {
			*w++ = v[i++];
		}
	}
	*w = '\0';
	return out;
}

/* POST the query-protocol form to STS (AWS_ENDPOINT_URL_STS,
 * AWS_ENDPOINT_URL, else the regional endpoint; the global one when no
 * region is known), signed with signer's credentials or unsigned (NULL),
 * under the standard retry mode; the <Credentials> of the answer into c. */
static int
sts_call(const struct ik_aws_cfg *a, const char *action, const struct ik_buf *form,
         const struct ik_aws_creds *signer, struct ik_aws_creds *c, ik_err *err)
{
	const char *region = a->region ? a->region : "us-east-1", *ep, *blk;
	struct ik_buf url = { 0 }, sig = { 0 }, tok = { 0 }, what = { 0 };
	struct ik_http_req req = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_aws_error e;
	const char *hdrs[3] = { "Content-Type: application/x-www-form-urlencoded; charset=utf-8",
	                        NULL, NULL };
	char *ak = NULL, *sk = NULL, *st = NULL, *exp = NULL;
	size_t blen;
	int rc, tries;

	if ((ep = env("AWS_ENDPOINT_URL_STS")) || (ep = env("AWS_ENDPOINT_URL"))) {
		ik_buf_addstr(&url, ep);
	} else if (a->region) {
		ik_buf_addstr(&url, "https://sts.");
		ik_buf_addstr(&url, a->region);
		ik_buf_addstr(&url, ".amazonaws.com");
	} else {
		ik_buf_addstr(&url, "https://sts.amazonaws.com");
	}
	ik_buf_addstr(&what, "sts ");
	ik_buf_addstr(&what, action);
	if (signer) {
		ik_buf_addstr(&sig, "aws:amz:");
		ik_buf_addstr(&sig, region);
		ik_buf_addstr(&sig, ":sts");
		req.sigv4 = sig.p;
		req.access_key = signer->ak;
		req.secret_key = signer->sk;
		if (signer->tok) {
			ik_buf_addstr(&tok, "X-Amz-Security-Token: ");
			ik_buf_addstr(&tok, signer->tok);
			hdrs[1] = tok.p;
		}
		if (!sig.p || (signer->tok && !tok.p)) {
			rc = oom(err);
			goto out;
		}
	}
	if (!url.p || !what.p || !form->p) {
		rc = oom(err);
		goto out;
	}
	req.method = "POST";
	req.url = url.p;
	req.headers = hdrs;
	req.body = form->p;
	req.body_len = form->len;
	req.cacert = a->cacert;
	req.connect_timeout_ms = a->timeout_ms < 3000 ? a->timeout_ms : 3000;
	req.timeout_ms = a->timeout_ms;
	req.max_body = 65536;
	rc = ik_aws_send(a, what.p, &req, &res, &e, &tries, err);
	if (rc != IK_OK && rc != IK_TEMPFAIL)
		goto wrap;
	if (rc == IK_TEMPFAIL || e.kind != IK_AWS_OK) {
		rc = ik_aws_kind_code(e.kind);
		if (rc == IK_AWS_ERROR)
			rc = IK_CONFIG;     /* a request STS refuses: our configuration */
		if (e.type[0])
			ik_errf(err, rc, "%s: %s%s", e.type, e.message,
			        e.retryable && tries > 1 ? " (retried)" : "");
		else
			ik_errf(err, rc, "%s", e.message);
		goto wrap;
	}
	if (!(blk = ik_aws_xml_text(res.body.p, res.body.len, "Credentials", &blen)) ||
	    !(ak = xml_value(blk, blen, "AccessKeyId")) ||
	    !(sk = xml_value(blk, blen, "SecretAccessKey")) ||
	    !(st = xml_value(blk, blen, "SessionToken")) || !*ak || !*sk) {
		rc = ik_errf(err, IK_TEMPFAIL, "answer without Credentials");
		goto wrap;
	}
	exp = xml_value(blk, blen, "Expiration");
	if ((rc = set_creds(c, ak, sk, st, err)) != IK_OK)
		goto out;
	c->expires_ms = exp ? parse_iso8601_ms(exp) : -1;
	if (c->expires_ms < 0)
		c->expires_ms = ik_now_ms() + 5 * 60 * 1000;
	goto out;
wrap:
	ik_errwrap(err, "sts %s", action);
out:
	wipe_free(ak);
	wipe_free(sk);
	wipe_free(st);
	free(exp);
	ik_http_res_free(&res);
	buf_wipe_free(&tok);
	ik_buf_free(&sig);
	ik_buf_free(&url);
	ik_buf_free(&what);
	return rc;
}

/* RoleSessionName: the configured one, else "idemkit-<epoch seconds>"
 * (the AWS CLI uses botocore-session-<epoch seconds>). */
static void
session_name(char *out, size_t n, const char *configured)
{
	if (configured)
		snprintf(out, n, "%s", configured);
	else
		snprintf(out, n, "idemkit-%lld", (long long)(ik_now_ms() / 1000));
}

static int
web_identity(const struct ik_aws_cfg *a, const char *tokfile, const char *role,
             const char *sess, struct ik_aws_creds *c, ik_err *err)
{
	struct ik_buf tok = { 0 }, form = { 0 };
	char name[128];
	int rc;

	/* read at every fetch: the orchestrator rotates the token */
	if ((rc = ik_read_file(tokfile, SECRET_FILE_MAX, &tok, err)) != IK_OK)
		return ik_errwrap(err, "web identity token file");
	if (!tok.len) {
		rc = ik_errf(err, IK_CONFIG, "web identity token file %s is empty", tokfile);
		goto out;
	}
	session_name(name, sizeof name, sess);
	form_add(&form, "Action", "AssumeRoleWithWebIdentity");
	form_add(&form, "Version", "2011-06-15");
	form_add(&form, "RoleArn", role);
	form_add(&form, "RoleSessionName", name);
	form_add(&form, "WebIdentityToken", tok.p);
	rc = sts_call(a, "AssumeRoleWithWebIdentity", &form, NULL, c, err);
out:
	buf_wipe_free(&tok);
	buf_wipe_free(&form);
	return rc;
}

/* ---- credential_process ------------------------------------------------ */

/* Run the command (by /bin/sh -c, stdin from /dev/null, stderr ours) and
 * read its JSON: {"Version": 1, "AccessKeyId", "SecretAccessKey",
 * "SessionToken"?, "Expiration"?}.  Exit status 75 is IK_TEMPFAIL, any
 * other failure IK_CONFIG; it gets PROCESS_TIMEOUT_MS, then SIGKILL. */
static int
from_process(const char *cmd, struct ik_aws_creds *c, ik_err *err)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, dflt;
	char *argv[] = { "sh", "-c", (char *)cmd, NULL };
	struct ik_buf out = { 0 };
	char chunk[4096];
	int fds[2], rc = IK_OK, status, version_ok, e;
	int64_t deadline = ik_mono_ms() + PROCESS_TIMEOUT_MS, left;
	struct pollfd pf;
	ssize_t n;
	pid_t pid;
	cJSON *j = NULL, *v, *ak, *sk, *tok, *exp;

	if (pipe(fds) < 0)
		return ik_errf(err, IK_SOFTWARE, "credential_process: pipe: %s", strerror(errno));
	fcntl(fds[0], F_SETFD, FD_CLOEXEC);
	fcntl(fds[1], F_SETFD, FD_CLOEXEC);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigemptyset(&dflt);
	sigaddset(&dflt, SIGPIPE);
	sigaddset(&dflt, SIGINT);
	sigaddset(&dflt, SIGTERM);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &dflt);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	e = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(fds[1]);
	if (e) {
		close(fds[0]);
		return ik_errf(err, IK_CONFIG, "credential_process: cannot run /bin/sh: %s",
		               strerror(e));
	}
	pf.fd = fds[0];
	pf.events = POLLIN;
	for (;;) {
		if ((left = deadline - ik_mono_ms()) <= 0) {
			rc = ik_errf(err, IK_TEMPFAIL, "credential_process: no answer in %d s",
			             PROCESS_TIMEOUT_MS / 1000);
			kill(pid, SIGKILL);
			break;
		}
		if (poll(&pf, 1, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			rc = ik_errf(err, IK_SOFTWARE, "credential_process: poll: %s", strerror(errno));
			kill(pid, SIGKILL);
			break;
		}
		if ((n = read(fds[0], chunk, sizeof chunk)) < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			rc = ik_errf(err, IK_SOFTWARE, "credential_process: read: %s", strerror(errno));
			kill(pid, SIGKILL);
			break;
		}
		if (n == 0)
			break;
		if (out.len + (size_t)n > PROCESS_OUT_MAX || ik_buf_add(&out, chunk, (size_t)n) < 0) {
			rc = ik_errf(err, IK_CONFIG, "credential_process: output larger than %d bytes",
			             PROCESS_OUT_MAX);
			kill(pid, SIGKILL);
			break;
		}
	}
	sodium_memzero(chunk, sizeof chunk);
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (rc != IK_OK)
		goto out;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		if (WIFEXITED(status))
			rc = ik_errf(err, WEXITSTATUS(status) == IK_TEMPFAIL ? IK_TEMPFAIL : IK_CONFIG,
			             "credential_process exited %d", WEXITSTATUS(status));
		else
			rc = ik_errf(err, IK_CONFIG, "credential_process killed by signal %d",
			             WTERMSIG(status));
		goto out;
	}
	j = out.p ? cJSON_ParseWithLength(out.p, out.len) : NULL;
	v = cJSON_GetObjectItemCaseSensitive(j, "Version");
	ak = cJSON_GetObjectItemCaseSensitive(j, "AccessKeyId");
	sk = cJSON_GetObjectItemCaseSensitive(j, "SecretAccessKey");
	tok = cJSON_GetObjectItemCaseSensitive(j, "SessionToken");
	exp = cJSON_GetObjectItemCaseSensitive(j, "Expiration");
	version_ok = cJSON_IsNumber(v) && v->valuedouble == 1;
	if (!cJSON_IsObject(j) || !version_ok) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: output is not JSON with \"Version\": 1");
		goto out;
	}
	if (!cJSON_IsString(ak) || !cJSON_IsString(sk) || !*ak->valuestring || !*sk->valuestring) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: output without "
		             "AccessKeyId/SecretAccessKey");
		goto out;
	}
	if (exp && (!cJSON_IsString(exp) || parse_iso8601_ms(exp->valuestring) < 0)) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: Expiration is not an ISO 8601 time");
		goto out;
	}
	if ((rc = set_creds(c, ak->valuestring, sk->valuestring,
	                    cJSON_IsString(tok) ? tok->valuestring : NULL, err)) != IK_OK)
		goto out;
	c->expires_ms = exp ? parse_iso8601_ms(exp->valuestring) : 0;
out:
	if (j) {
		if (cJSON_IsString(sk = cJSON_GetObjectItemCaseSensitive(j, "SecretAccessKey")))
			sodium_memzero(sk->valuestring, strlen(sk->valuestring));
		if (cJSON_IsString(tok = cJSON_GetObjectItemCaseSensitive(j, "SessionToken")))
			sodium_memzero(tok->valuestring, strlen(tok->valuestring));
	}
	cJSON_Delete(j);
	buf_wipe_free(&out);
	return rc;
}

/* ---- profiles --------------------------------------------------------- */

/* The settings that name a method idemkit does not follow. */
static int
refused(const struct ik_aws_profile *p, ik_err *err)
{
	static const enum ik_aws_pkey sso[] = {
		IK_AWS_P_SSO_SESSION, IK_AWS_P_SSO_START_URL, IK_AWS_P_SSO_ACCOUNT,
		IK_AWS_P_SSO_ROLE, IK_AWS_P_SSO_REGION,
	};
	const char *cs = p->v[IK_AWS_P_CRED_SOURCE];
	size_t i;

	for (i = 0; i < sizeof sso / sizeof sso[0]; i++)
		if (p->v[sso[i]])
			return ik_errf(err, IK_CONFIG, "AWS profile %s uses IAM Identity Center "
			               "(%s), which idemkit does not support; give the worker "
			               "a role (container, instance, web identity) or keys",
			               p->name, ik_aws_pkey_name(sso[i]));
	if (p->v[IK_AWS_P_LOGIN_SESSION])
		return ik_errf(err, IK_CONFIG, "AWS profile %s uses login_session, which "
		               "idemkit does not support", p->name);
	if (p->v[IK_AWS_P_MFA_SERIAL] && p->v[IK_AWS_P_ROLE_ARN])
		return ik_errf(err, IK_CONFIG, "AWS profile %s needs an MFA code (mfa_serial), "
		               "which a worker cannot type", p->name);
	if (cs && strcmp(cs, "Environment") != 0 && strcmp(cs, "Ec2InstanceMetadata") != 0 &&
	    strcmp(cs, "EcsContainer") != 0)
		return ik_errf(err, IK_CONFIG, "AWS profile %s: credential_source %.64s is not "
		               "one of Environment, Ec2InstanceMetadata, EcsContainer", p->name, cs);
	if (p->v[IK_AWS_P_ROLE_ARN] && p->v[IK_AWS_P_SOURCE_PROFILE] && cs)
		return ik_errf(err, IK_CONFIG, "AWS profile %s has both source_profile and "
		               "credential_source", p->name);
	if (p->v[IK_AWS_P_ROLE_ARN] && !p->v[IK_AWS_P_SOURCE_PROFILE] && !cs &&
	    !p->v[IK_AWS_P_WEB_TOKEN_FILE])
		return ik_errf(err, IK_CONFIG, "AWS profile %s has role_arn but no "
		               "source_profile, credential_source or web_identity_token_file",
		               p->name);
	if (!p->v[IK_AWS_P_ROLE_ARN] && (cs || p->v[IK_AWS_P_SOURCE_PROFILE]))
		return ik_errf(err, IK_CONFIG, "AWS profile %s has %s but no role_arn", p->name,
		               cs ? "credential_source" : "source_profile");
	return IK_OK;
}

static int profile_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p,
                         int depth, int top, enum src *kind, struct ik_aws_creds *c,
                         ik_err *err);

/* The credentials a role's source stands for: credential_source, or the
 * source profile followed as a profile of its own (its role_arn too, so
 * role chains work), except that a profile that is its own source uses
 * its static keys. */
static int
source_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
             struct ik_aws_creds *c, ik_err *err)
{
	const char *cs = p->v[IK_AWS_P_CRED_SOURCE], *sp = p->v[IK_AWS_P_SOURCE_PROFILE];
	struct ik_aws_profile src;
	enum src kind;
	int rc;

	if (cs) {
		if (strcmp(cs, "Environment") == 0)
			rc = from_env(c, err);
		else if (strcmp(cs, "EcsContainer") == 0)
			rc = from_container(a, c, err);
		else
			rc = from_imds(a, c, err);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_CONFIG, "credential_source %s: no credentials there", cs);
		return rc;
	}
	if (depth >= MAX_DEPTH)
		return ik_errf(err, IK_CONFIG, "source_profile %s: more than %d roles in a chain "
		               "(or a loop)", sp, MAX_DEPTH);
	if (strcmp(sp, p->name) == 0) {
		rc = from_profile_keys(p, 1, c, err);
		if (rc == IK_EMPTY)
			rc = from_profile_keys(p, 0, c, err);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_CONFIG, "AWS profile %s is its own source_profile but "
			             "has no keys", sp);
		return rc;
	}
	if ((rc = ik_aws_profile_load(sp, &src, err)) != IK_OK)
		return rc;
	if (!src.found)
		rc = ik_errf(err, IK_CONFIG, "source_profile %s not found", sp);
	else if ((rc = profile_creds(a, &src, depth + 1, 0, &kind, c, err)) == IK_EMPTY)
		rc = ik_errf(err, IK_CONFIG, "source_profile %s has no credentials", sp);
	ik_aws_profile_free(&src);
	return rc;
}

static int
assume_role(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
            struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_creds s = { 0 };
	struct ik_buf form = { 0 };
	long long secs;
	char name[128];
	int rc;

	if (p->v[IK_AWS_P_DURATION] &&
	    ik_parse_int(p->v[IK_AWS_P_DURATION], 900, 43200, &secs) < 0)
		return ik_errf(err, IK_CONFIG, "AWS profile %s: duration_seconds: want 900 to "
		               "43200", p->name);
	if ((rc = source_creds(a, p, depth, &s, err)) != IK_OK)
		goto out;
	session_name(name, sizeof name, p->v[IK_AWS_P_SESSION_NAME]);
	form_add(&form, "Action", "AssumeRole");
	form_add(&form, "Version", "2011-06-15");
	form_add(&form, "RoleArn", p->v[IK_AWS_P_ROLE_ARN]);
	form_add(&form, "RoleSessionName", name);
	if (p->v[IK_AWS_P_EXTERNAL_ID])
		form_add(&form, "ExternalId", p->v[IK_AWS_P_EXTERNAL_ID]);
	if (p->v[IK_AWS_P_DURATION])
		form_add(&form, "DurationSeconds", p->v[IK_AWS_P_DURATION]);
	rc = sts_call(a, "AssumeRole", &form, &s, c, err);
out:
	if (rc != IK_OK && rc != IK_EMPTY)
		ik_errwrap(err, "AWS profile %s", p->name);
	ik_aws_creds_free(&s);
	buf_wipe_free(&form);
	return rc;
}

/* What profile p names, in the CLI's order; IK_EMPTY when it names
 * nothing (the chain goes on).  top: the selected profile, where the
 * environment's web identity sits between role_arn and the rest. */
static int
profile_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
              int top, enum src *kind, struct ik_aws_creds *c, ik_err *err)
{
	const char *wtf = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *wrole = env("AWS_ROLE_ARN");
	int rc;

	if ((rc = refused(p, err)) != IK_OK)
		return rc;
	if (p->v[IK_AWS_P_ROLE_ARN] && (p->v[IK_AWS_P_SOURCE_PROFILE] ||
	                                p->v[IK_AWS_P_CRED_SOURCE])) {
		*kind = SRC_ASSUME_ROLE;
		return assume_role(a, p, depth, c, err);
	}
	if (top && (wtf || wrole)) {
		if (!wtf || !wrole)
			return ik_errf(err, IK_CONFIG, "%s is set but %s is not",
			               wtf ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN",
			               wtf ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE");
		*kind = SRC_WEB_IDENTITY;
		if ((rc = web_identity(a, wtf, wrole, env("AWS_ROLE_SESSION_NAME"), c, err)) != IK_OK)
			ik_errwrap(err, "AWS_ROLE_ARN");
		return rc;
	}
	if (p->v[IK_AWS_P_ROLE_ARN]) {      /* with web_identity_token_file (refused() checked) */
		*kind = SRC_WEB_IDENTITY;
		if ((rc = web_identity(a, p->v[IK_AWS_P_WEB_TOKEN_FILE], p->v[IK_AWS_P_ROLE_ARN],
		                       p->v[IK_AWS_P_SESSION_NAME], c, err)) != IK_OK)
			ik_errwrap(err, "AWS profile %s", p->name);
		return rc;
	}
	*kind = SRC_SHARED;
	if ((rc = from_profile_keys(p, 1, c, err)) != IK_EMPTY)
		return rc;
	if (p->v[IK_AWS_P_PROCESS]) {
		*kind = SRC_PROCESS;
		if ((rc = from_process(p->v[IK_AWS_P_PROCESS], c, err)) != IK_OK)
			ik_errwrap(err, "AWS profile %s", p->name);
		return rc;
	}
	*kind = SRC_CONFIG;
	return from_profile_keys(p, 0, c, err);
}

/* ---- the chain -------------------------------------------------------- */

static int
run(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, enum src *kind,
    struct ik_aws_creds *c, ik_err *err)
{
	int rc, env_is_source;

	memset(c, 0, sizeof *c);
	*kind = SRC_ENV;
	/* a profile chosen by AWS_PROFILE whose role takes the variables as
	 * its source: the role, not the variables' own principal */
	env_is_source = a->profile_explicit && p->v[IK_AWS_P_ROLE_ARN] &&
	                p->v[IK_AWS_P_CRED_SOURCE] &&
	                strcmp(p->v[IK_AWS_P_CRED_SOURCE], "Environment") == 0;
	if (!env_is_source && (rc = from_env(c, err)) != IK_EMPTY) {
		if (rc == IK_OK && a->profile_explicit)
			ik_log(IK_LOG_WARN, "AWS_ACCESS_KEY_ID is set: it wins over AWS_PROFILE, "
			       "as in the AWS CLI", "profile", a->profile, NULL);
		return rc;
	}
	if (a->profile_explicit && !p->found)
		return ik_errf(err, IK_CONFIG, "AWS profile %s not found in the "
		               "credentials or config file", a->profile);
	if ((rc = profile_creds(a, p, 0, 1, kind, c, err)) != IK_EMPTY)
		return rc;
	*kind = SRC_CONTAINER;
	if ((rc = from_container(a, c, err)) != IK_EMPTY)
		return rc;
	*kind = SRC_IMDS;
	if ((rc = from_imds(a, c, err)) != IK_EMPTY)
		return rc;
	return ik_errf(err, IK_CONFIG, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
	               "AWS_SECRET_ACCESS_KEY, a profile in ~/.aws/credentials, or run "
	               "with web identity, container or instance credentials");
}

int
ik_aws_creds_load(const struct ik_aws_cfg *a, const struct ik_aws_profile *p,
                  struct ik_aws_src **srcp, struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_src *src;
	enum src kind;
	int rc;

	*srcp = NULL;
	if ((rc = run(a, p, &kind, c, err)) != IK_OK) {
		ik_aws_creds_free(c);
		return rc;
	}
	if (!(src = calloc(1, sizeof *src)) ||
	    (kind != SRC_ENV && kind != SRC_CONTAINER && kind != SRC_IMDS &&
	     !(src->profile = strdup(p->name)))) {
		free(src);
		ik_aws_creds_free(c);
		return oom(err);
	}
	src->kind = kind;
	c->fetched_ms = ik_now_ms();
	*srcp = src;
	return IK_OK;
}

/* The same source again: its profile re-read (files may have been
 * rotated), never another link of the chain. */
static int
again(const struct ik_aws_cfg *a, const struct ik_aws_src *src, struct ik_aws_creds *c,
      ik_err *err)
{
	struct ik_aws_profile p;
	enum src kind;
	int rc;

	if (src->kind == SRC_CONTAINER)
		return from_container(a, c, err);
	if (src->kind == SRC_IMDS)
		return from_imds(a, c, err);
	if (!src->profile)
		return IK_EMPTY;
	if ((rc = ik_aws_profile_load(src->profile, &p, err)) != IK_OK)
		return rc;
	rc = profile_creds(a, &p, 0, 1, &kind, c, err);
	if (rc == IK_OK && kind != src->kind) {
		ik_aws_creds_free(c);
		rc = ik_errf(err, IK_CONFIG, "AWS profile %s now names %s instead of %s",
		             src->profile, src_names[kind], src_names[src->kind]);
	}
	ik_aws_profile_free(&p);
	return rc;
}

int
ik_aws_creds_refresh(const struct ik_aws_cfg *a, struct ik_aws_src *src,
                     struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_creds n = { 0 };
	int64_t now = ik_now_ms(), margin;
	char left[32];
	int rc;

	if (!c->expires_ms)
		return IK_OK;
	margin = (c->expires_ms - c->fetched_ms) / 2;
	if (margin > CRED_REFRESH_MS || margin < 0)
		margin = CRED_REFRESH_MS;
	if (now < c->expires_ms - margin)
		return IK_OK;
	rc = again(a, src, &n, err);
	if (rc != IK_OK) {
		ik_aws_creds_free(&n);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_TEMPFAIL, "%s: not reachable", src_names[src->kind]);
		if (now < c->expires_ms) {
			snprintf(left, sizeof left, "%lld", (long long)(c->expires_ms - now));
			ik_log(IK_LOG_WARN, "AWS credentials refresh failed; the current ones "
			       "are still valid", "source", src_names[src->kind],
			       "validMs#", left, "error", err ? err->msg : "", NULL);
			ik_errclear(err);
			return IK_OK;
		}
		return ik_errwrap(err, "refreshing expired %s credentials", src_names[src->kind]);
	}
	ik_log(IK_LOG_DEBUG, "AWS credentials refreshed", "source", src_names[src->kind],
	       "key", n.ak, NULL);
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
	if (src) {
		free(src->profile);
		free(src);
	}
}
