/* aws.c: the AWS JSON-protocol client; see aws.h.
 *
 * Rules: credentials live only in struct creds, are wiped when replaced or
 * closed, and never reach a message or a log line (messages from the
 * service are cut to their first line and scrubbed of our key, secret and
 * token, since an InvalidSignatureException can quote the canonical
 * request).  Only loopback addresses or the documented link-local
 * metadata addresses are contacted for credentials.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sodium.h>

#include "aws.h"
#include "curl_dl.h"
#include "http.h"
#include "log.h"
#include "outcome.h"
#include "util.h"

#define CRED_REFRESH_MS  (10 * 60 * 1000)  /* refresh this long before expiry */
#define BACKOFF_BASE_MS  50
#define BACKOFF_CAP_MS   20000
#define SECRET_FILE_MAX  16384

enum cred_src { SRC_ENV, SRC_SHARED, SRC_CONFIG, SRC_CONTAINER, SRC_IMDS };

static const char *const src_names[] = {
	"env", "shared-credentials-file", "config-file", "container", "imds",
};

struct creds {
	char *ak, *sk, *tok;
	int64_t expires_ms;     /* 0: does not expire */
};

struct ik_aws {
	char service[16];
	char *region, *endpoint, *sigv4, *cacert;
	char *profile;
	int profile_explicit;
	enum cred_src src;
	struct creds cr;
	struct ik_http *http;
	int max_attempts;
	int64_t backoff_cap_ms;
	long timeout_ms;
};

/* ---- the classifier ---------------------------------------------------- */

static const char *const throttle_codes[] = {
	"Throttling", "ThrottlingException", "ThrottledException",
	"RequestThrottledException", "TooManyRequestsException",
	"ProvisionedThroughputExceededException", "TransactionInProgressException",
	"RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException",
	"RequestThrottled", "SlowDown", "PriorRequestNotComplete",
	"EC2ThrottledException", NULL,
};
static const char *const transient_codes[] = {
	"RequestTimeout", "RequestTimeoutException", "InternalError",
	"InternalServerError", "InternalFailure", "InternalService",
	"ServiceUnavailable", "ServiceUnavailableException", NULL,
};
static const char *const auth_codes[] = {
	"UnrecognizedClientException", "InvalidSignatureException",
	"AccessDeniedException", "AccessDenied", "MissingAuthenticationToken",
	"MissingAuthenticationTokenException", "ExpiredToken",
	"ExpiredTokenException", "InvalidClientTokenId", "IncompleteSignature",
	"IncompleteSignatureException", "SignatureDoesNotMatch", "AuthFailure",
	"InvalidAccessKeyId", "InvalidToken", "RequestExpired",
	"UnauthorizedOperation", "NotAuthorized", "InvalidSecurity", NULL,
};

static int
in_list(const char *const *l, const char *s)
{
	if (!s || !*s)
		return 0;
	for (; *l; l++)
		if (strcmp(*l, s) == 0)
			return 1;
	return 0;
}

/* Copy at most the first line of s (n bytes) into out, control characters
 * as spaces, bounded. */
static void
copy_line(char *out, size_t outsz, const char *s, size_t n)
{
	size_t i, o = 0;

	for (i = 0; i < n && s[i] && s[i] != '\n' && s[i] != '\r' && o + 1 < outsz; i++)
		out[o++] = iscntrl((unsigned char)s[i]) ? ' ' : s[i];
	out[o] = '\0';
}

/* "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException" ->
 * "ConditionalCheckFailedException"; "ValidationException:http://..." ->
 * "ValidationException". */
static void
short_type(char *out, size_t outsz, const char *t)
{
	const char *h = strrchr(t, '#');
	size_t n;

	if (h)
		t = h + 1;
	n = strcspn(t, ":");
	copy_line(out, outsz, t, n);
}

void
ik_aws_classify(long status, const char *body, size_t len,
                const char *query_error_hdr, const char *error_type_hdr,
                struct ik_aws_error *e)
{
	cJSON *j = NULL, *t, *m;
	const char *q, *last;
	char *cut;

	memset(e, 0, sizeof *e);
	e->status = status;
	if (status >= 200 && status < 300) {
		e->kind = IK_AWS_OK;
		return;
	}
	if (body && len)
		j = cJSON_ParseWithLength(body, len);
	if (cJSON_IsObject(j)) {
		t = cJSON_GetObjectItemCaseSensitive(j, "__type");
		if (!cJSON_IsString(t))
			t = cJSON_GetObjectItemCaseSensitive(j, "code");
		if (cJSON_IsString(t))
			short_type(e->type, sizeof e->type, t->valuestring);
		m = cJSON_GetObjectItemCaseSensitive(j, "message");
		if (!cJSON_IsString(m))
			m = cJSON_GetObjectItemCaseSensitive(j, "Message");
		if (cJSON_IsString(m))
			copy_line(e->message, sizeof e->message, m->valuestring,
			          strlen(m->valuestring));
	}
	cJSON_Delete(j);
	if (!e->type[0] && error_type_hdr && *error_type_hdr)
		short_type(e->type, sizeof e->type, error_type_hdr);
	if (query_error_hdr && *query_error_hdr)
		copy_line(e->query, sizeof e->query, query_error_hdr,
		          strcspn(query_error_hdr, ";"));
	/* A signature error may quote the canonical request: keep the sentence
	 * before it only. */
	if ((cut = strstr(e->message, "The Canonical String")))
		*cut = '\0';
	if (!e->message[0])
		snprintf(e->message, sizeof e->message, "HTTP %ld", status);

	/* "AWS.SimpleQueueService.NonExistentQueue" is matched as its last part. */
	q = e->query;
	last = strrchr(q, '.');
	last = last ? last + 1 : q;

	if (in_list(auth_codes, e->type) || in_list(auth_codes, last))
		e->kind = IK_AWS_AUTH;
	else if (in_list(throttle_codes, e->type) || in_list(throttle_codes, last))
		e->kind = IK_AWS_THROTTLE;
	else if (in_list(transient_codes, e->type) || in_list(transient_codes, last))
		e->kind = IK_AWS_TRANSIENT;
	else if (status == 429)
		e->kind = IK_AWS_THROTTLE;
	else if (status == 408 || (status >= 500 && status != 501))
		e->kind = IK_AWS_TRANSIENT;
	else if ((status == 401 || status == 403) && !e->type[0])
		e->kind = IK_AWS_AUTH;
	else
		e->kind = IK_AWS_CLIENT;
	e->retryable = e->kind == IK_AWS_THROTTLE || e->kind == IK_AWS_TRANSIENT;
}

int
ik_aws_kind_code(enum ik_aws_kind k)
{
	switch (k) {
	case IK_AWS_OK:        return IK_OK;
	case IK_AWS_THROTTLE:
	case IK_AWS_TRANSIENT: return IK_TEMPFAIL;
	case IK_AWS_AUTH:      return IK_CONFIG;
	case IK_AWS_CLIENT:    break;
	}
	return IK_AWS_ERROR;
}

/* ---- small helpers ----------------------------------------------------- */

static void
wipe_free(char *s)
{
	if (s) {
		sodium_memzero(s, strlen(s));
		free(s);
	}
}

static void
creds_free(struct creds *c)
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

/* "~/x" -> "$HOME/x"; malloc'd. */
static char *
expand_home(const char *p)
{
	const char *home;
	struct ik_buf b = { 0 };

	if (p[0] == '~' && p[1] == '/' && (home = getenv("HOME"))) {
		ik_buf_addstr(&b, home);
		ik_buf_addstr(&b, p + 1);
		return b.p;
	}
	return ik_strdup(p);
}

static char *
default_file(const char *envname, const char *leaf)
{
	const char *v = env(envname), *home;
	struct ik_buf b = { 0 };

	if (v)
		return expand_home(v);
	if (!(home = getenv("HOME")) || !*home)
		return NULL;
	ik_buf_addstr(&b, home);
	ik_buf_addstr(&b, "/.aws/");
	ik_buf_addstr(&b, leaf);
	return b.p;
}

static char *
trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* Read keys from section sect (or alt) of the INI file at path: vals[i] is
 * a malloc'd copy of keys[i]'s value or left NULL.  Returns 1 when the
 * section exists, 0 when it (or the file) does not, -1 on a read error. */
static int
ini_read(const char *path, const char *sect, const char *alt,
         const char *const *keys, char **vals)
{
	FILE *f;
	char *line = NULL, *s, *eq, *name, *val;
	size_t cap = 0;
	ssize_t n;
	int in = 0, found = 0, i;

	if (!path || !(f = fopen(path, "r")))
		return 0;
	while ((n = getline(&line, &cap, f)) >= 0) {
		if (line[0] == ' ' || line[0] == '\t') {
			continue;            /* a nested block ("s3 =\n  x = y") */
		}
		s = trim(line);
		if (*s == '#' || *s == ';' || !*s)
			continue;
		if (*s == '[') {
			char *e = strchr(s, ']'), norm[256];
			size_t o = 0;
			int sp = 0;
			if (!e)
				continue;
			*e = '\0';
			/* "[profile   x]" -> "profile x" */
			for (s = trim(s + 1); *s && o + 1 < sizeof norm; s++) {
				if (*s == ' ' || *s == '\t') {
					sp = 1;
					continue;
				}
				if (sp && o)
					norm[o++] = ' ';
				sp = 0;
				if (o + 1 < sizeof norm)
					norm[o++] = *s;
			}
			norm[o] = '\0';
			in = strcmp(norm, sect) == 0 || (alt && strcmp(norm, alt) == 0);
			found |= in;
			continue;
		}
		if (!in || !(eq = strchr(s, '=')))
			continue;
		*eq = '\0';
		name = trim(s);
		val = trim(eq + 1);
		for (i = 0; keys[i]; i++)
			if (strcmp(name, keys[i]) == 0 && *val) {
				wipe_free(vals[i]);
				vals[i] = strdup(val);
			}
	}
	i = ferror(f) ? -1 : found;
	if (line) {
		sodium_memzero(line, cap);
		free(line);
	}
	fclose(f);
	return i;
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
from_env(struct creds *c, ik_err *err)
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

static const char *const cred_keys[] = {
	"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region", NULL,
};

/* Shared credentials file ([NAME]) or config file ([profile NAME];
 * [default]).  *found is set when the profile's section exists. */
static int
from_file(struct ik_aws *a, int config, struct creds *c, int *found, ik_err *err)
{
	char *path = default_file(config ? "AWS_CONFIG_FILE" : "AWS_SHARED_CREDENTIALS_FILE",
	                          config ? "config" : "credentials");
	char *vals[5] = { 0 }, sect[300];
	const char *alt = NULL;
	int r, rc = IK_EMPTY;

	if (!path)
		return IK_EMPTY;
	if (config) {
		snprintf(sect, sizeof sect, "profile %s", a->profile);
		if (strcmp(a->profile, "default") == 0)
			alt = "default";
	} else {
		snprintf(sect, sizeof sect, "%s", a->profile);
	}
	r = ini_read(path, sect, alt, cred_keys, vals);
	if (r < 0) {
		rc = ik_errf(err, IK_CONFIG, "%s: cannot read: %s", path, strerror(errno));
		goto out;
	}
	if (r > 0)
		*found = 1;
	if (config && vals[3] && !a->region)
		a->region = strdup(vals[3]);
	if (!vals[0] && !vals[1])
		goto out;
	if (!vals[0] || !vals[1]) {
		rc = ik_errf(err, IK_CONFIG, "%s: profile %s has %s but not %s", path,
		             a->profile, vals[0] ? "aws_access_key_id" : "aws_secret_access_key",
		             vals[0] ? "aws_secret_access_key" : "aws_access_key_id");
		goto out;
	}
	c->ak = vals[0];
	c->sk = vals[1];
	c->tok = vals[2];
	vals[0] = vals[1] = vals[2] = NULL;
	rc = IK_OK;
out:
	for (r = 0; r < 4; r++)
		wipe_free(vals[r]);
	free(path);
	return rc;
}

/* Credentials JSON as the container endpoint and IMDS serve it. */
static int
parse_cred_json(const char *what, const struct ik_buf *body, struct creds *c, ik_err *err)
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
from_container(struct ik_aws *a, struct creds *c, ik_err *err)
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
from_imds(struct ik_aws *a, struct creds *c, ik_err *err)
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
	copy_line(role, sizeof role, res.body.p, res.body.len);
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
load_creds(struct ik_aws *a, struct creds *c, ik_err *err)
{
	int rc, found = 0;

	memset(c, 0, sizeof *c);
	if ((rc = from_env(c, err)) != IK_EMPTY) {
		a->src = SRC_ENV;
		goto done;
	}
	if ((rc = from_file(a, 0, c, &found, err)) != IK_EMPTY) {
		a->src = SRC_SHARED;
		goto done;
	}
	if ((rc = from_file(a, 1, c, &found, err)) != IK_EMPTY) {
		a->src = SRC_CONFIG;
		goto done;
	}
	if (a->profile_explicit && !found)
		return ik_errf(err, IK_CONFIG, "AWS profile %s not found in the "
		               "credentials or config file", a->profile);
	if ((rc = from_container(a, c, err)) != IK_EMPTY) {
		a->src = SRC_CONTAINER;
		goto done;
	}
	if ((rc = from_imds(a, c, err)) != IK_EMPTY) {
		a->src = SRC_IMDS;
		goto done;
	}
	return ik_errf(err, IK_CONFIG, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
	               "AWS_SECRET_ACCESS_KEY, a profile in ~/.aws/credentials, or run "
	               "with container or instance credentials");
done:
	if (rc != IK_OK)
		creds_free(c);
	return rc;
}

/* Temporary credentials are fetched again shortly before they expire; if
 * that fails while the old ones are still valid, they are kept. */
static int
fresh_creds(struct ik_aws *a, ik_err *err)
{
	struct creds n;
	int64_t now = ik_now_ms();
	int rc;

	if (!a->cr.expires_ms || now < a->cr.expires_ms - CRED_REFRESH_MS)
		return IK_OK;
	if (a->src == SRC_CONTAINER)
		rc = from_container(a, &n, err);
	else if (a->src == SRC_IMDS)
		rc = from_imds(a, &n, err);
	else
		return IK_OK;
	if (rc != IK_OK) {
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_TEMPFAIL, "instance metadata: not reachable");
		if (now < a->cr.expires_ms)
			return IK_OK;
		return ik_errwrap(err, "refreshing expired %s credentials", src_names[a->src]);
	}
	creds_free(&a->cr);
	a->cr = n;
	return IK_OK;
}

/* ---- the client -------------------------------------------------------- */

static int
valid_region(const char *r)
{
	size_t n = strlen(r);

	return n > 0 && n <= 40 && strspn(r, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

int
ik_aws_open(const char *service, struct ik_aws **out, ik_err *err)
{
	struct ik_aws *a;
	char envname[64], svc_up[16];
	const char *v, *ep;
	struct ik_buf b = { 0 };
	long long n;
	int64_t ms;
	size_t i;
	int rc;

	*out = NULL;
	if (strlen(service) >= sizeof a->service)
		return ik_errf(err, IK_SOFTWARE, "aws: bad service name");
	if (!(a = calloc(1, sizeof *a)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(a->service, sizeof a->service, "%s", service);
	for (i = 0; service[i] && i + 1 < sizeof svc_up; i++)
		svc_up[i] = (char)toupper((unsigned char)service[i]);
	svc_up[i] = '\0';

	a->max_attempts = 3;
	if ((v = env("AWS_MAX_ATTEMPTS"))) {
		if (ik_parse_int(v, 1, 100, &n) < 0) {
			rc = ik_errf(err, IK_CONFIG, "AWS_MAX_ATTEMPTS: want a number from 1 to 100");
			goto fail;
		}
		a->max_attempts = (int)n;
	}
	a->backoff_cap_ms = BACKOFF_CAP_MS;
	if ((v = env("IDEMKIT_AWS_MAX_BACKOFF"))) {
		if (ik_parse_duration(v, &ms) < 0) {
			rc = ik_errf(err, IK_CONFIG, "IDEMKIT_AWS_MAX_BACKOFF: not a duration");
			goto fail;
		}
		if (ms < a->backoff_cap_ms)
			a->backoff_cap_ms = ms;
	}
	a->timeout_ms = 10000;
	if ((v = env("IDEMKIT_AWS_TIMEOUT"))) {
		if (ik_parse_duration(v, &ms) < 0 || ms < 1 || ms > 600000) {
			rc = ik_errf(err, IK_CONFIG, "IDEMKIT_AWS_TIMEOUT: want a duration up to 10m");
			goto fail;
		}
		a->timeout_ms = (long)ms;
	}
	if ((v = env("AWS_CA_BUNDLE")) && !(a->cacert = expand_home(v))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto fail;
	}

	v = env("AWS_PROFILE");
	a->profile_explicit = v != NULL;
	if (!v)
		v = env("AWS_DEFAULT_PROFILE");
	if (!(a->profile = strdup(v ? v : "default"))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto fail;
	}
	if ((v = env("AWS_REGION")) || (v = env("AWS_DEFAULT_REGION")))
		a->region = strdup(v);

	if ((rc = ik_http_open(&a->http, err)) != IK_OK)
		goto fail;
	if ((rc = load_creds(a, &a->cr, err)) != IK_OK)
		goto fail;
	if (!a->region) {
		/* the config file's region, when the credentials came from elsewhere */
		struct creds tmp = { 0 };
		int found = 0;
		if (from_file(a, 1, &tmp, &found, NULL) == IK_OK)
			creds_free(&tmp);
	}
	if (!a->region) {
		rc = ik_errf(err, IK_CONFIG, "no AWS region: set AWS_REGION (or "
		             "AWS_DEFAULT_REGION, or region in the profile)");
		goto fail;
	}
	if (!valid_region(a->region)) {
		rc = ik_errf(err, IK_CONFIG, "AWS region %.64s is not a region name", a->region);
		goto fail;
	}

	snprintf(envname, sizeof envname, "AWS_ENDPOINT_URL_%s", svc_up);
	if ((ep = env(envname)) || (ep = env("AWS_ENDPOINT_URL"))) {
		ik_buf_addstr(&b, ep);
	} else {
		ik_buf_addstr(&b, "https://");
		ik_buf_addstr(&b, service);
		ik_buf_addstr(&b, ".");
		ik_buf_addstr(&b, a->region);
		ik_buf_addstr(&b, ".amazonaws.com");
	}
	a->endpoint = b.p;
	memset(&b, 0, sizeof b);
	ik_buf_addstr(&b, "aws:amz:");
	ik_buf_addstr(&b, a->region);
	ik_buf_addstr(&b, ":");
	ik_buf_addstr(&b, service);
	a->sigv4 = b.p;
	if (!a->endpoint || !a->sigv4) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto fail;
	}
	ik_log(IK_LOG_DEBUG, "aws client", "service", service, "region", a->region,
	       "endpoint", a->endpoint, "credentials", src_names[a->src], NULL);
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
	creds_free(&a->cr);
	ik_http_close(a->http);
	free(a->region);
	free(a->endpoint);
	free(a->sigv4);
	free(a->cacert);
	free(a->profile);
	free(a);
}

const char *ik_aws_region(const struct ik_aws *a) { return a->region; }
const char *ik_aws_endpoint(const struct ik_aws *a) { return a->endpoint; }
const char *ik_aws_cred_source(const struct ik_aws *a) { return src_names[a->src]; }
const char *ik_aws_access_key_id(const struct ik_aws *a) { return a->cr.ak; }

static void
sleep_ms(int64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))]. */
static int64_t
backoff_ms(const struct ik_aws *a, int attempt)
{
	int64_t ceil = BACKOFF_BASE_MS;
	int i;

	for (i = 1; i < attempt && ceil < a->backoff_cap_ms; i++)
		ceil *= 2;
	if (ceil > a->backoff_cap_ms)
		ceil = a->backoff_cap_ms;
	if (ceil <= 0)
		return 0;
	return (int64_t)randombytes_uniform((uint32_t)ceil + 1);
}

int
ik_aws_call(struct ik_aws *a, const char *target, const cJSON *req,
            cJSON **resp, struct ik_aws_error *aerr, ik_err *err)
{
	struct ik_aws_error e_local, *e = aerr ? aerr : &e_local;
	struct ik_http_req hr = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_buf th = { 0 }, tok = { 0 };
	const char *hdrs[5];
	const char *op = strrchr(target, '.');
	char *body = NULL, attempt_s[32];
	ik_err herr = { 0 };
	int attempt, rc = IK_SOFTWARE, h;

	op = op ? op + 1 : target;
	*resp = NULL;
	memset(e, 0, sizeof *e);
	if (!(body = cJSON_PrintUnformatted(req)))
		return ik_errf(err, IK_SOFTWARE, "%s %s: out of memory", a->service, op);
	ik_buf_addstr(&th, "X-Amz-Target: ");
	ik_buf_addstr(&th, target);
	if (!th.p) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}

	hr.method = "POST";
	hr.url = a->endpoint;
	hr.body = body;
	hr.body_len = strlen(body);
	hr.cacert = a->cacert;
	hr.connect_timeout_ms = a->timeout_ms < 3000 ? a->timeout_ms : 3000;
	hr.timeout_ms = a->timeout_ms;
	hr.sigv4 = a->sigv4;

	for (attempt = 1; ; attempt++) {
		if ((rc = fresh_creds(a, err)) != IK_OK) {
			ik_errwrap(err, "%s %s", a->service, op);
			goto out;
		}
		h = 0;
		hdrs[h++] = "Content-Type: application/x-amz-json-1.0";
		hdrs[h++] = th.p;
		if (a->cr.tok) {
			if (tok.p)
				sodium_memzero(tok.p, tok.cap);
			ik_buf_reset(&tok);
			ik_buf_addstr(&tok, "X-Amz-Security-Token: ");
			ik_buf_addstr(&tok, a->cr.tok);
			if (!tok.p) {
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
				goto out;
			}
			hdrs[h++] = tok.p;
		}
		hdrs[h] = NULL;
		hr.headers = hdrs;
		hr.access_key = a->cr.ak;
		hr.secret_key = a->cr.sk;

		rc = ik_http_do(a->http, &hr, &res, &herr);
		if (rc == IK_OK) {
			ik_aws_classify(res.status, res.body.p, res.body.len,
			                ik_http_header(&res, "x-amzn-query-error"),
			                ik_http_header(&res, "x-amzn-ErrorType"), e);
			if (e->kind == IK_AWS_OK) {
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
		} else if (rc == IK_TEMPFAIL) {
			memset(e, 0, sizeof *e);
			e->kind = IK_AWS_TRANSIENT;
			e->retryable = 1;
			copy_line(e->message, sizeof e->message, herr.msg, strlen(herr.msg));
		} else {
			rc = ik_errf(err, rc, "%s %s: %s", a->service, op, herr.msg);
			goto out;
		}
		scrub_creds(a, e->message);
		if (!e->retryable || attempt >= a->max_attempts)
			break;
		snprintf(attempt_s, sizeof attempt_s, "%d", attempt);
		ik_log(IK_LOG_DEBUG, "aws retry", "service", a->service, "op", op,
		       "attempt#", attempt_s, "error", e->type[0] ? e->type : e->message, NULL);
		sleep_ms(backoff_ms(a, attempt));
	}

	rc = ik_aws_kind_code(e->kind);
	if (rc == IK_AWS_ERROR && res.body.len) {
		*resp = cJSON_ParseWithLength(res.body.p, res.body.len);
		if (!cJSON_IsObject(*resp)) {
			cJSON_Delete(*resp);
			*resp = NULL;
		}
	}
	if (e->retryable && attempt > 1)
		snprintf(attempt_s, sizeof attempt_s, " (%d tries)", attempt);
	else
		attempt_s[0] = '\0';
	if (e->type[0] || e->query[0])
		ik_errf(err, rc == IK_AWS_ERROR ? IK_SOFTWARE : rc, "%s %s: %s: %s%s",
		        a->service, op, e->type[0] ? e->type : e->query, e->message, attempt_s);
	else
		ik_errf(err, rc == IK_AWS_ERROR ? IK_SOFTWARE : rc, "%s %s: %s%s",
		        a->service, op, e->message, attempt_s);
	if (err)
		scrub_creds(a, err->msg);
out:
	ik_http_res_free(&res);
	if (tok.p)
		sodium_memzero(tok.p, tok.cap);
	ik_buf_free(&tok);
	ik_buf_free(&th);
	free(body);
	return rc;
}
