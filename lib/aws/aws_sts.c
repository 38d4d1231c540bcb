/* aws_sts.c: the two STS calls the credential chain makes, in STS's query
 * protocol (a form POST, an XML answer): AssumeRole, signed with the
 * source's credentials, and AssumeRoleWithWebIdentity, unsigned.
 *
 * Rules: the endpoint is AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, else the
 * region's (the global one without a region); the standard retry mode of
 * every other call (aws_retry.c); an error STS answers is judged by the
 * one classifier; the issued credentials are copied out of the answer and
 * every copy wiped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "aws/aws_int.h"
#include "core/outcome.h"
#include "core/util.h"

/* name=value, percent-encoded, appended to the form.  A failed append
 * clears ok, so a half-built request is never signed and sent. */
struct form {
	struct ik_buf b;
	int ok;
};

static void
form_add(struct form *f, const char *name, const char *val)
{
	static const char hex[] = "0123456789ABCDEF";
	unsigned char ch;
	char e[3];

	if (f->b.len && ik_buf_addstr(&f->b, "&") < 0)
		f->ok = 0;
	if (ik_buf_addstr(&f->b, name) < 0 || ik_buf_addstr(&f->b, "=") < 0)
		f->ok = 0;
	for (; *val; val++) {
		ch = (unsigned char)*val;
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
			if (ik_buf_add(&f->b, val, 1) < 0)
				f->ok = 0;
		} else {
			e[0] = '%';
			e[1] = hex[ch >> 4];
			e[2] = hex[ch & 15];
			if (ik_buf_add(&f->b, e, 3) < 0)
				f->ok = 0;
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
sts_call(const struct ik_aws_cfg *a, const char *action, const struct form *form,
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

	if ((ep = ik_aws_env("AWS_ENDPOINT_URL_STS")) || (ep = ik_aws_env("AWS_ENDPOINT_URL"))) {
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
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			goto out;
		}
	}
	if (!url.p || !what.p || !form->ok || !form->b.p) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	req.method = "POST";
	req.url = url.p;
	req.headers = hdrs;
	req.body = form->b.p;
	req.body_len = form->b.len;
	req.cacert = a->cacert;
	req.env_proxy = 1;   /* https:// only, as the AWS CLI (http.h) */
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
	if ((rc = ik_aws_creds_set(c, ak, sk, st, err)) != IK_OK)
		goto out;
	c->expires_ms = exp ? ik_aws_parse_time_ms(exp) : -1;
	if (c->expires_ms < 0)
		c->expires_ms = ik_now_ms() + 5 * 60 * 1000;
	goto out;
wrap:
	ik_errwrap(err, "sts %s", action);
out:
	ik_str_wipe_free(ak);
	ik_str_wipe_free(sk);
	ik_str_wipe_free(st);
	free(exp);
	ik_http_res_free(&res);
	ik_buf_wipe_free(&tok);
	ik_buf_free(&sig);
	ik_buf_free(&url);
	ik_buf_free(&what);
	return rc;
}

/* RoleSessionName: the configured one (STS wants 2 to 64 characters of
 * [A-Za-z0-9+=,.@_-]; refused here rather than cut), else
 * "idemkit-<epoch seconds>" (the AWS CLI uses botocore-session-<...>). */
static int
session_name(char *out, size_t n, const char *configured, ik_err *err)
{
	static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	                         "0123456789+=,.@_-";
	size_t len;

	if (!configured) {
		snprintf(out, n, "idemkit-%lld", (long long)(ik_now_ms() / 1000));
		return IK_OK;
	}
	len = strlen(configured);
	if (len < 2 || len > 64 || len >= n || strspn(configured, ok) != len)
		return ik_errf(err, IK_CONFIG, "role session name: want 2 to 64 characters "
		               "of A-Z a-z 0-9 + = , . @ _ -");
	memcpy(out, configured, len + 1);
	return IK_OK;
}

int
ik_aws_sts_web_identity(const struct ik_aws_cfg *a, const char *tokfile, const char *role,
                        const char *sess, struct ik_aws_creds *c, ik_err *err)
{
	struct ik_buf tok = { 0 };
	struct form form = { { 0 }, 1 };
	char name[128];
	int rc;

	/* read at every fetch: the orchestrator rotates the token */
	if ((rc = ik_read_file(tokfile, IK_AWS_SECRET_FILE_MAX, &tok, err)) != IK_OK)
		return ik_errwrap(err, "web identity token file");
	if (!tok.len) {
		rc = ik_errf(err, IK_CONFIG, "web identity token file %s is empty", tokfile);
		goto out;
	}
	if ((rc = session_name(name, sizeof name, sess, err)) != IK_OK)
		goto out;
	form_add(&form, "Action", "AssumeRoleWithWebIdentity");
	form_add(&form, "Version", "2011-06-15");
	form_add(&form, "RoleArn", role);
	form_add(&form, "RoleSessionName", name);
	form_add(&form, "WebIdentityToken", tok.p);
	rc = sts_call(a, "AssumeRoleWithWebIdentity", &form, NULL, c, err);
out:
	ik_buf_wipe_free(&tok);
	ik_buf_wipe_free(&form.b);
	return rc;
}

int
ik_aws_sts_assume_role(const struct ik_aws_cfg *a, const char *role, const char *sess,
                       const char *external_id, const char *duration,
                       const struct ik_aws_creds *signer, struct ik_aws_creds *c, ik_err *err)
{
	struct form form = { { 0 }, 1 };
	char name[128];
	int rc;

	if ((rc = session_name(name, sizeof name, sess, err)) != IK_OK)
		return rc;
	form_add(&form, "Action", "AssumeRole");
	form_add(&form, "Version", "2011-06-15");
	form_add(&form, "RoleArn", role);
	form_add(&form, "RoleSessionName", name);
	if (external_id)
		form_add(&form, "ExternalId", external_id);
	if (duration)
		form_add(&form, "DurationSeconds", duration);
	rc = sts_call(a, "AssumeRole", &form, signer, c, err);
	ik_buf_wipe_free(&form.b);
	return rc;
}
