/* bankapi_oauth.c: OAuth2 client credentials (RFC 6749 4.4) for the bank
 * API: the settings, and the access token fetched, reused and refreshed;
 * see bankapi.h.
 *
 * Rules: the client secret only from a file only its owner can read,
 * wiped on close, sent only inside the Basic credentials; a token
 * endpoint's plain http:// only to loopback; one fetch at a time (the
 * process is single-threaded), and a failed fetch is answered again from
 * memory, without a request, for a backoff that doubles with each
 * failure in a row (1 s to 30 s): with many requests in flight, a token
 * endpoint that is down costs one timeout per backoff, not one per request.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "bank/bankapi_int.h"
#include "core/log.h"
#include "core/outcome.h"

#define RETRY_BASE_MS 1000
#define RETRY_CAP_MS 30000

int
ik_bankapi_oauth_open(struct ik_bankapi *a, ik_err *err)
{
	char n1[64], n2[64];
	const char *url = ik_bankapi_env(a->prefix, "OAUTH_TOKEN_URL", n1, sizeof n1), *v;
	struct ik_http_url u;
	int rc;

	if (!url)
		return IK_OK;
	if (a->auth.len)
		return ik_errf(err, IK_CONFIG, "%s and a static bearer token (IDEMKIT_%s_TOKEN"
		               "[_FILE]) are both set: choose one", n1, a->prefix);
	if ((rc = ik_http_url_parse(url, &u, err)) != IK_OK)
		return ik_errwrap(err, "%s", n1);
	ik_http_url_free(&u);
	if (!u.https && !u.loopback)
		return ik_errf(err, IK_CONFIG, "%s: plain http:// only to loopback; use https:// "
		               "for %s (nothing was sent)", n1, u.host);
	if (!(v = ik_bankapi_env(a->prefix, "OAUTH_CLIENT_ID", n2, sizeof n2)))
		return ik_errf(err, IK_CONFIG, "%s needs %s", n1, n2);
	if (!(a->oauth_url = strdup(url)) || !(a->oauth_id = strdup(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((v = ik_bankapi_env(a->prefix, "OAUTH_SCOPE", n2, sizeof n2)) &&
	    !(a->oauth_scope = strdup(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (!(v = ik_bankapi_env(a->prefix, "OAUTH_CLIENT_SECRET_FILE", n2, sizeof n2)))
		return ik_errf(err, IK_CONFIG, "%s needs %s", n1, n2);
	if (ik_read_secret(v, IK_BANKAPI_SECRET_MAX, &a->oauth_secret, err) != IK_OK)
		return ik_errwrap(err, "%s", n2);
	if (!a->oauth_secret.len)
		return ik_errf(err, IK_CONFIG, "%s %s: empty", n2, v);
	return IK_OK;
}

/* application/x-www-form-urlencoded, as RFC 6749 2.3.1 wants the client
 * id and secret before they are put in the Basic credentials. */
static int
form_encode(struct ik_buf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	char e[3];
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
			if (ik_buf_add(b, &s[i], 1) < 0)
				return -1;
		} else {
			e[0] = '%';
			e[1] = hex[ch >> 4];
			e[2] = hex[ch & 15];
			if (ik_buf_add(b, e, 3) < 0)
				return -1;
		}
	}
	return 0;
}

/* expires_in in seconds: a positive number, or a string of digits (some
 * servers send "3599"); -1 when absent or unusable (the token is then
 * reused until the bank answers 401). */
static double
expires_in(const cJSON *exp)
{
	const char *s = cJSON_GetStringValue(exp);
	char *end;
	double v;

	if (cJSON_IsNumber(exp))
		return exp->valuedouble > 0 ? exp->valuedouble : -1;
	if (!s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtod(s, &end);
	return *end || errno || !(v > 0) ? -1 : v;
}

/* POST grant_type=client_credentials to the token endpoint; on success
 * a->auth holds the new bearer line. */
static int
fetch(struct ik_bankapi *a, ik_err *err)
{
	struct ik_buf cred = {0}, basic = {0}, form = {0};
	struct ik_http_res res = {0};
	const char *hdrs[4], *e;
	cJSON *o = NULL;
	const cJSON *tok = NULL, *exp;
	char *b64 = NULL;
	size_t b64len;
	double ttl;
	int rc = IK_OK;
	struct ik_http_req req = {
		.method = "POST", .url = a->oauth_url, .headers = hdrs,
		.connect_timeout_ms = a->connect_timeout_ms, .timeout_ms = a->timeout_ms,
		.max_body = 1u << 16, .cacert = a->cacert,
		.client_cert = a->client_cert, .client_key = a->client_key,
		.proxy = a->proxy,
	};

	ik_buf_wipe_free(&a->auth);
	a->oauth_refresh_at = 0;
	if (form_encode(&cred, a->oauth_id, strlen(a->oauth_id)) < 0 ||
	    ik_buf_add(&cred, ":", 1) < 0 ||
	    form_encode(&cred, a->oauth_secret.p, a->oauth_secret.len) < 0)
		goto nomem;
	b64len = sodium_base64_ENCODED_LEN(cred.len, sodium_base64_VARIANT_ORIGINAL);
	if (!(b64 = malloc(b64len)))
		goto nomem;
	sodium_bin2base64(b64, b64len, (const unsigned char *)cred.p, cred.len,
	                  sodium_base64_VARIANT_ORIGINAL);
	if (ik_buf_addstr(&basic, "Authorization: Basic ") < 0 || ik_buf_addstr(&basic, b64) < 0 ||
	    ik_buf_addstr(&form, "grant_type=client_credentials") < 0 ||
	    (a->oauth_scope && (ik_buf_addstr(&form, "&scope=") < 0 ||
	                        form_encode(&form, a->oauth_scope, strlen(a->oauth_scope)) < 0)) ||
	    ik_buf_add(&form, "", 1) < 0)
		goto nomem;
	hdrs[0] = "Content-Type: application/x-www-form-urlencoded";
	hdrs[1] = "Accept: application/json";
	hdrs[2] = basic.p;
	hdrs[3] = NULL;
	req.body = form.p;
	req.body_len = form.len - 1;
	if ((rc = ik_http_do(a->http, &req, &res, err)) != IK_OK) {
		ik_errwrap(err, "OAuth2 token");
		goto out;
	}
	if (res.status == 400 || res.status == 401 || res.status == 403) {
		/* invalid_client, invalid_scope, unauthorized_client: ours to fix */
		o = cJSON_ParseWithLength(res.body.p, res.body.len);
		e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
		rc = ik_errf(err, IK_CONFIG, "OAuth2 token: HTTP %ld%s%.60s", res.status,
		             e ? ": " : "", e ? e : "");
		goto out;
	}
	if (res.status < 200 || res.status >= 300) {
		rc = ik_errf(err, ik_bankapi_classify(a, res.status) == IK_TEMPFAIL ? IK_TEMPFAIL :
		             IK_CONFIG, "OAuth2 token: HTTP %ld", res.status);
		goto out;
	}
	o = cJSON_ParseWithLength(res.body.p, res.body.len);
	tok = cJSON_GetObjectItemCaseSensitive(o, "access_token");
	exp = cJSON_GetObjectItemCaseSensitive(o, "expires_in");
	if (!cJSON_IsString(tok) || !ik_bankapi_token_ok(tok->valuestring, strlen(tok->valuestring))) {
		rc = ik_errf(err, IK_CONFIG, "OAuth2 token: HTTP %ld without a usable access_token",
		             res.status);
		goto out;
	}
	if (ik_buf_addstr(&a->auth, IK_BANKAPI_BEARER) < 0 ||
	    ik_buf_addstr(&a->auth, tok->valuestring) < 0)
		goto nomem;
	/* Reused until shortly before it expires: a minute early, or at half
	 * its life when that is short; no usable expires_in: until the bank
	 * says 401. */
	if ((ttl = expires_in(exp)) < 0) {
		if (exp && !cJSON_IsNull(exp))
			ik_log(IK_LOG_WARN, "OAuth2 token: expires_in is not a number of seconds; "
			       "the token is reused until the endpoint answers 401",
			       "endpoint", a->prefix, NULL);
		ttl = 1e12;
	}
	ttl = ttl * 1000 < 1e15 ? ttl * 1000 : 1e15;
	a->oauth_refresh_at = ik_now_ms() + (int64_t)(ttl >= 120000 ? ttl - 60000 : ttl / 2);
	a->token_gen++;
	goto out;
nomem:
	rc = ik_errf(err, IK_SOFTWARE, "out of memory");
out:
	if (o && tok && cJSON_IsString(tok))
		sodium_memzero(tok->valuestring, strlen(tok->valuestring));
	cJSON_Delete(o);
	ik_http_res_free(&res);
	ik_buf_wipe_free(&cred);
	ik_buf_wipe_free(&basic);
	if (b64) {
		sodium_memzero(b64, b64len);
		free(b64);
	}
	ik_buf_free(&form);
	return rc;
}

int
ik_bankapi_oauth_token(struct ik_bankapi *a, ik_err *err)
{
	int64_t now = ik_now_ms();
	int rc;

	if (a->auth.len && now < a->oauth_refresh_at)
		return IK_OK;
	if (a->oauth_failures && now < a->oauth_retry_at) {
		*err = a->oauth_err;
		return ik_errf(err, err->code, "%s (the last fetch failed %lldms ago; next "
		               "try in %lldms)", a->oauth_err.msg,
		               (long long)(now - a->oauth_failed_at),
		               (long long)(a->oauth_retry_at - now));
	}
	if ((rc = fetch(a, err)) == IK_OK) {
		a->oauth_failures = 0;
		return IK_OK;
	}
	a->oauth_err = *err;
	a->oauth_failed_at = ik_now_ms();
	a->oauth_retry_at = a->oauth_failed_at +
		ik_backoff_ceil(RETRY_BASE_MS, RETRY_CAP_MS, a->oauth_failures);
	a->oauth_failures++;
	return rc;
}
