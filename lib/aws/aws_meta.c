/* aws_meta.c: credentials from the metadata services of the place the
 * worker runs in: the ECS/EKS container endpoint and EC2 IMDSv2.
 *
 * Rules: plain http only, and only to the addresses AWS documents (the
 * container endpoint's FULL_URI host is checked before any connection;
 * IMDS is asked with an IMDSv2 session token, never without); never
 * through a proxy; token files are read again at each fetch, since the
 * orchestrator rotates them; every buffer that held a token or a secret
 * is wiped.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "aws/aws_int.h"
#include "core/outcome.h"
#include "core/util.h"
#include "dl/curl_dl.h"

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
	rc = ik_aws_creds_set(c, ak->valuestring, sk->valuestring,
	               cJSON_IsString(tok) ? tok->valuestring : NULL, err);
	c->expires_ms = cJSON_IsString(exp) ? ik_aws_parse_time_ms(exp->valuestring) : 0;
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

int
ik_aws_from_container(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err)
{
	const char *rel = ik_aws_env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
	const char *full = ik_aws_env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
	const char *tokfile = ik_aws_env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
	const char *tokenv = ik_aws_env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
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
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	if (tokfile) {
		/* read at every fetch: EKS rotates the file */
		if ((rc = ik_read_file(tokfile, IK_AWS_SECRET_FILE_MAX, &tok, err)) != IK_OK) {
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
	for (i = 0; i < 3; i++) {
		rc = ik_http_do(a->http, &req, &res, err);
		if (rc == IK_OK && (res.status >= 500 || res.status == 429))
			rc = ik_errf(err, IK_TEMPFAIL, "HTTP %ld", res.status);
		if (rc != IK_TEMPFAIL)
			break;
		ik_sleep_ms(ik_backoff_jitter(IK_AWS_BACKOFF_BASE_MS, a->backoff_cap_ms, i));
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
	ik_buf_wipe_free(&tok);
	ik_buf_wipe_free(&hdr);
	ik_buf_free(&url);
	return rc;
}

/* EC2 IMDSv2: PUT a session token (with its TTL header), GET the role
 * name, GET its credentials, each GET with the token.  No metadata
 * service at the default address (not on EC2) is IK_EMPTY; at an
 * address set in AWS_EC2_METADATA_SERVICE_ENDPOINT it is IK_TEMPFAIL. */
int
ik_aws_from_imds(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err)
{
	const char *base = ik_aws_env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
	const char *mode = ik_aws_env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
	const char *tmo = ik_aws_env("AWS_METADATA_SERVICE_TIMEOUT");
	struct ik_http_req req = { 0 };
	struct ik_http_res res = { 0 };
	struct ik_buf url = { 0 }, hdr = { 0 };
	const char *hdrs[2] = { NULL, NULL };
	long long secs = 1;
	char role[256];
	size_t blen;
	const char *v;
	int rc, explicit = base != NULL;

	if ((v = ik_aws_env("AWS_EC2_METADATA_DISABLED")) && strcasecmp(v, "true") == 0)
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
	ik_buf_wipe_free(&hdr);
	ik_buf_free(&url);
	ik_http_res_free(&res);
	return rc;
}
