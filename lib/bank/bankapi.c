/* bankapi.c: the HTTP side shared by charge-debit and charge-notify; see
 * bankapi.h (the OAuth2 token: bankapi_oauth.c).
 *
 * Rules: secrets only from the environment or from files only their owner
 * can read, copied once into buffers that are wiped on close; the header
 * lines carrying them are built per request and wiped right after; errors
 * name the setting, never its value; a 2xx is the endpoint's yes even when
 * its body is lost.
 */
#include <ctype.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "bank/bankapi_int.h"
#include "core/envelope.h"
#include "core/json.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/utf8.h"

#define SECRET_MAX IK_BANKAPI_SECRET_MAX
#define BEARER IK_BANKAPI_BEARER
#define BEARER_LEN IK_BANKAPI_BEARER_LEN
#define token_ok ik_bankapi_token_ok

void
ik_bankapi_take_env(struct ik_bankapi *a, const char *prefix)
{
	char name[64];
	char *v;

	a->prefix = prefix;
	snprintf(name, sizeof name, "IDEMKIT_%s_TOKEN", prefix);
	if (!(v = getenv(name)))
		return;
	ik_buf_reset(&a->auth);
	if (*v && (ik_buf_addstr(&a->auth, BEARER) < 0 ||
	           ik_buf_addstr(&a->auth, v) < 0))
		ik_buf_wipe_free(&a->auth);  /* ENOMEM: open reports the missing token */
	sodium_memzero(v, strlen(v));
	unsetenv(name);
}

static int
header_name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_')
			return 0;
	return 1;
}

int
ik_bankapi_status_list(const char *list, unsigned char cls[600], int code,
                       char *why, size_t whysz)
{
	const char *p = list;
	long long n;
	char tok[8];
	size_t len;
	int lo, hi, i;

	for (;;) {
		len = strcspn(p, ",");
		if (len == 0 || len >= sizeof tok) {
			snprintf(why, whysz, "\"%s\": a comma-separated list of statuses "
			         "(400-599, or 4xx/5xx)", list);
			return -1;
		}
		memcpy(tok, p, len);
		tok[len] = '\0';
		if (len == 3 && (tok[0] == '4' || tok[0] == '5') &&
		    (strcmp(tok + 1, "xx") == 0 || strcmp(tok + 1, "XX") == 0)) {
			lo = (tok[0] - '0') * 100;
			hi = lo + 99;
		} else if (ik_parse_int(tok, 400, 599, &n) == 0) {
			lo = hi = (int)n;
		} else {
			snprintf(why, whysz, "\"%s\": %s is not a status from 400 to 599 "
			         "(or 4xx/5xx)", list, tok);
			return -1;
		}
		for (i = lo; i <= hi; i++)
			cls[i] = (unsigned char)code;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

int
ik_bankapi_lease_check(const cJSON *env, int64_t need_ms, int64_t margin_ms,
                       ik_err *err)
{
	ik_err why = { 0 };
	int64_t left;
	int rc;

	/* On this machine's boot clock, never the wall clock against a
	 * leaseUntil that another clock wrote (envelope.h). */
	if ((rc = ik_env_lease_left(env, &left, &why)) == IK_EMPTY)
		return IK_OK;
	if (rc != IK_OK)
		return ik_errf(err, rc, "%s: nothing was sent", why.msg);
	if (left >= need_ms + margin_ms)
		return IK_OK;
	if (left < 0)
		return ik_errf(err, IK_LEASE_SHORT, "the claim's lease ended %lldms ago; the call "
		               "needs %lldms plus a %lldms margin: nothing was sent",
		               (long long)-left, (long long)need_ms, (long long)margin_ms);
	return ik_errf(err, IK_LEASE_SHORT, "the claim's lease has %lldms left; the call "
	               "needs %lldms plus a %lldms margin: nothing was sent",
	               (long long)left, (long long)need_ms, (long long)margin_ms);
}

int
ik_bankapi_inflight(const char *prefix, const char *opt, size_t *out)
{
	char name[64];
	const char *v = opt ? opt : ik_bankapi_env(prefix, "INFLIGHT", name, sizeof name);
	long long n;

	*out = IK_BANKAPI_INFLIGHT_DEFAULT;
	if (!v)
		return IK_OK;
	if (ik_opt_int(opt ? "--inflight" : name, v, 1, IK_BANKAPI_INFLIGHT_MAX, &n) < 0)
		return opt ? IK_USAGE : IK_CONFIG;
	*out = (size_t)n;
	return IK_OK;
}

int
ik_bankapi_opt_status(const char *opt, const char *list)
{
	unsigned char cls[600];
	char why[160];

	if (ik_bankapi_status_list(list, cls, IK_DECLINED, why, sizeof why) == 0)
		return 0;
	ik_warnx("%s: %s", opt, why);
	return -1;
}

void
ik_bankapi_cli_init(struct ik_bankapi_cli *c)
{
	memset(c, 0, sizeof *c);
	c->opts.connect_timeout_ms = 3000;
	c->opts.timeout_ms = 10000;
	c->lease_margin_ms = IK_BANKAPI_LEASE_MARGIN_MS;
}

int
ik_bankapi_cli_opt(struct ik_bankapi_cli *c, int ch, const char *arg)
{
	int64_t ms;

	switch (ch) {
	case 'u': c->opts.url = arg; break;
	case 'k': c->opts.key_header = arg; break;
	case 'c': c->opts.cacert = arg; break;
	case IK_BANKAPI_O_CONNECT:
		if (ik_opt_duration("--connect-timeout", arg, 1, 3600000, &ms) < 0)
			return -1;
		c->opts.connect_timeout_ms = (long)ms;
		break;
	case IK_BANKAPI_O_TIMEOUT:
		if (ik_opt_duration("--timeout", arg, 1, 3600000, &ms) < 0)
			return -1;
		c->opts.timeout_ms = (long)ms;
		break;
	case IK_BANKAPI_O_DECLINED:
		if (ik_bankapi_opt_status("--declined-status", arg) < 0)
			return -1;
		c->opts.declined = arg;
		break;
	case IK_BANKAPI_O_RETRY:
		if (ik_bankapi_opt_status("--retry-status", arg) < 0)
			return -1;
		c->opts.retry = arg;
		break;
	case IK_BANKAPI_O_MARGIN:
		if (ik_opt_duration("--lease-margin", arg, 0, 3600000, &c->lease_margin_ms) < 0)
			return -1;
		break;
	case IK_BANKAPI_O_CHECK: c->check = 1; break;
	case IK_BANKAPI_O_REQUEST: c->opts.request = arg; break;
	case IK_BANKAPI_O_REF: c->opts.ref = arg; break;
	case IK_BANKAPI_O_REASON: c->opts.reason = arg; break;
	case IK_BANKAPI_O_CCERT: c->opts.client_cert = arg; break;
	case IK_BANKAPI_O_CKEY: c->opts.client_key = arg; break;
	case IK_BANKAPI_O_INFLIGHT: c->inflight = arg; break;
	case IK_BANKAPI_O_DRYRUN: c->dry_run = 1; break;
	case IK_BANKAPI_O_REPLAY: c->opts.replay_header = arg; break;
	default: return 0;
	}
	return 1;
}

int
ik_bankapi_cli_open(struct ik_bankapi *a, struct ik_bankapi_cli *c, const ik_err **why)
{
	if (!c->opened) {
		c->opened = 1;
		if (ik_bankapi_open(a, &c->opts, &c->open_err) != IK_OK)
			ik_warnx("%s", c->open_err.msg);
	}
	*why = &c->open_err;
	return c->open_err.code;
}

/* Mutual TLS: a certificate and its key, both or neither; the key file
 * must not be readable by group or others (an ssh-style rule: a key the
 * whole host can read is no longer the worker's). */
static int
open_client_cert(struct ik_bankapi *a, const struct ik_bankapi_opts *o, ik_err *err)
{
	char cn[64], kn[64];
	const char *cert = o->client_cert ? o->client_cert :
	                   ik_bankapi_env(a->prefix, "CLIENT_CERT", cn, sizeof cn);
	const char *key = o->client_key ? o->client_key :
	                  ik_bankapi_env(a->prefix, "CLIENT_KEY", kn, sizeof kn);
	struct stat st;

	if (o->client_cert)
		snprintf(cn, sizeof cn, "--client-cert");
	else
		snprintf(cn, sizeof cn, "IDEMKIT_%s_CLIENT_CERT", a->prefix);
	if (o->client_key)
		snprintf(kn, sizeof kn, "--client-key");
	else
		snprintf(kn, sizeof kn, "IDEMKIT_%s_CLIENT_KEY", a->prefix);
	if (!cert && !key)
		return IK_OK;
	if (!cert || !key)
		return ik_errf(err, IK_CONFIG, "mutual TLS needs both %s and %s", cn, kn);
	if (access(cert, R_OK) != 0)
		return ik_errf(err, IK_CONFIG, "%s %s: not readable", cn, cert);
	if (stat(key, &st) != 0 || access(key, R_OK) != 0)
		return ik_errf(err, IK_CONFIG, "%s %s: not readable", kn, key);
	if (st.st_mode & (S_IRWXG | S_IRWXO))
		return ik_errf(err, IK_CONFIG, "%s %s: readable by group or others (mode %03o); "
		               "chmod 600 it", kn, key, (unsigned)(st.st_mode & 0777));
	if (!(a->client_cert = strdup(cert)) || !(a->client_key = strdup(key)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

/* One jq program, from its option or IDEMKIT_<P>_<NAME>; none: NULL. */
static int
open_jq(struct ik_bankapi *a, const char *opt, const char *name, const char *optname,
        struct ik_jq **q, ik_err *err)
{
	static const char *const vars[] = { "key", "amountMajor", "attempt", "ref", NULL };
	char var[64];
	const char *v = opt ? opt : ik_bankapi_env(a->prefix, name, var, sizeof var);

	if (!v)
		return IK_OK;
	if (!opt)
		snprintf(var, sizeof var, "IDEMKIT_%s_%s", a->prefix, name);
	return ik_jq_compile(opt ? optname : var, v, vars, q, err);
}

/* The two lists; a status in both is a configuration error, not a guess. */
static int
open_classes(struct ik_bankapi *a, const struct ik_bankapi_opts *o, ik_err *err)
{
	unsigned char dec[600] = {0}, ret[600] = {0};
	char name[64], why[160];
	const char *v;
	int i;

	v = o->declined ? o->declined : ik_bankapi_env(a->prefix, "DECLINED", name, sizeof name);
	if (ik_bankapi_status_list(v ? v : IK_BANKAPI_DECLINED_DEFAULT, dec, IK_DECLINED,
	                           why, sizeof why) < 0)
		return ik_errf(err, IK_CONFIG, "%s: %s", o->declined ? "--declined-status" : name, why);
	v = o->retry ? o->retry : ik_bankapi_env(a->prefix, "RETRY", name, sizeof name);
	if (ik_bankapi_status_list(v ? v : IK_BANKAPI_RETRY_DEFAULT, ret, IK_TEMPFAIL,
	                           why, sizeof why) < 0)
		return ik_errf(err, IK_CONFIG, "%s: %s", o->retry ? "--retry-status" : name, why);
	for (i = 0; i < 600; i++) {
		if (dec[i] && ret[i])
			return ik_errf(err, IK_CONFIG, "status %d is in both the declined and "
			               "the retry list", i);
		a->cls[i] = dec[i] ? dec[i] : ret[i];
	}
	return IK_OK;
}

static int
open_url(struct ik_bankapi *a, const struct ik_bankapi_opts *o, ik_err *err)
{
	struct ik_http_url u;
	char name[64];
	int rc;

	if (o->url)
		snprintf(name, sizeof name, "--url");
	else
		snprintf(name, sizeof name, "IDEMKIT_%s_URL", a->prefix);
	if ((rc = ik_http_url_parse(a->url, &u, err)) != IK_OK)
		return ik_errwrap(err, "%s", name);
	if (!u.https && !u.loopback) {
		rc = ik_errf(err, IK_CONFIG, "%s: plain http:// only to loopback (127.0.0.1, "
		             "::1, localhost); use https:// for %s (nothing was sent)",
		             name, u.host);
		ik_http_url_free(&u);
		return rc;
	}
	a->path = u.path;   /* taken over */
	return IK_OK;
}

/* IDEMKIT_<P>_PROXY: the operator's opt-in to a proxy for this endpoint
 * (and its token URL), for https:// only, where it sees no more than a
 * CONNECT to the host; the environment's http_proxy and the like are
 * never used (http.h).  The proxy URL may hold its own credentials: a
 * message names its host only. */
static int
open_proxy(struct ik_bankapi *a, ik_err *err)
{
	struct ik_http_url u;
	char name[64];
	const char *v = ik_bankapi_env(a->prefix, "PROXY", name, sizeof name);
	int rc;

	if (!v)
		return IK_OK;
	if ((rc = ik_http_url_parse(v, &u, err)) != IK_OK)
		return ik_errf(err, rc, "%s: not an http:// or https:// proxy URL", name);
	ik_http_url_free(&u);
	if (strncasecmp(a->url, "https:", 6) != 0)
		return ik_errf(err, IK_CONFIG, "%s is set but the URL is plain http://: a proxy "
		               "only for https:// (nothing was sent)", name);
	if (!(a->proxy = strdup(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

/* The replay header, "NAME: VALUE" (or "NAME:VALUE"), banks differing in
 * both. */
static int
open_replay(struct ik_bankapi *a, const struct ik_bankapi_opts *o, ik_err *err)
{
	char name[64];
	const char *v = o->replay_header ? o->replay_header :
	    ik_bankapi_env(a->prefix, "REPLAY_HEADER", name, sizeof name);
	const char *colon, *val;

	if (!v)
		v = IK_BANKAPI_REPLAY_DEFAULT;
	colon = strchr(v, ':');
	for (val = colon ? colon + 1 : ""; *val == ' '; val++)
		;
	if (!colon || !*val || !(a->replay_name = strndup(v, (size_t)(colon - v))) ||
	    !header_name_ok(a->replay_name) || !token_ok(val, strlen(val))) {
		if (colon && *val && !a->replay_name)
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		return ik_errf(err, IK_CONFIG, "replay header \"%s\": want NAME: VALUE "
		    "(e.g. \"%s\"), the name letters, digits, '-' or '_'", v,
		    IK_BANKAPI_REPLAY_DEFAULT);
	}
	if (!(a->replay_value = strdup(val)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

int
ik_bankapi_replayed(const struct ik_bankapi *a, const struct ik_http_res *res)
{
	const char *h = a->replay_name ? ik_http_header(res, a->replay_name) : NULL;
	cJSON *ans;
	int r;

	if (h && strcasecmp(h, a->replay_value) == 0)
		return 1;
	ans = cJSON_ParseWithLength(res->body.p, res->body.len);
	r = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ans, "replayed"));
	cJSON_Delete(ans);
	return r;
}

int
ik_bankapi_open(struct ik_bankapi *a, const struct ik_bankapi_opts *o,
                ik_err *err)
{
	char name[64];
	const char *v;
	struct ik_buf tok = {0};
	int rc;

	if (!(v = o->url ? o->url : ik_bankapi_env(a->prefix, "URL", name, sizeof name)))
		return ik_errf(err, IK_CONFIG, "no URL: set IDEMKIT_%s_URL or --url", a->prefix);
	if (!(a->url = strdup(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if ((rc = open_url(a, o, err)) != IK_OK)
		return rc;
	v = o->key_header ? o->key_header : ik_bankapi_env(a->prefix, "KEY_HEADER", name, sizeof name);
	if (!(a->key_header = strdup(v ? v : "Idempotency-Key")))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (!header_name_ok(a->key_header))
		return ik_errf(err, IK_CONFIG, "key header name: letters, digits, '-' or '_' (1-64)");
	if ((rc = open_replay(a, o, err)) != IK_OK)
		return rc;
	v = o->cacert ? o->cacert : ik_bankapi_env(a->prefix, "CACERT", name, sizeof name);
	if (v && !(a->cacert = strdup(v)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (v && access(v, R_OK) != 0)
		return ik_errf(err, IK_CONFIG, "%s %s: not readable",
		               o->cacert ? "--cacert" : name, v);
	a->connect_timeout_ms = o->connect_timeout_ms;
	a->timeout_ms = o->timeout_ms;
	if ((rc = open_classes(a, o, err)) != IK_OK ||
	    (rc = open_client_cert(a, o, err)) != IK_OK ||
	    (rc = open_jq(a, o->request, "REQUEST", "--request", &a->request, err)) != IK_OK ||
	    (rc = open_jq(a, o->ref, "REF", "--ref", &a->ref, err)) != IK_OK ||
	    (rc = open_jq(a, o->reason, "REASON", "--reason", &a->reason, err)) != IK_OK)
		return rc;

	if (!a->auth.len && (v = ik_bankapi_env(a->prefix, "TOKEN_FILE", name, sizeof name))) {
		if ((rc = ik_read_secret(v, SECRET_MAX, &tok, err)) != IK_OK) {
			ik_buf_wipe_free(&tok);
			return ik_errwrap(err, "IDEMKIT_%s_TOKEN_FILE", a->prefix);
		}
		if (!token_ok(tok.p, tok.len)) {
			ik_buf_wipe_free(&tok);
			return ik_errf(err, IK_CONFIG, "IDEMKIT_%s_TOKEN_FILE %s: empty, or not one "
			               "line of printable characters", a->prefix, v);
		}
		if (ik_buf_addstr(&a->auth, BEARER) < 0 ||
		    ik_buf_add(&a->auth, tok.p, tok.len) < 0) {
			ik_buf_wipe_free(&tok);
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		ik_buf_wipe_free(&tok);
	} else if (a->auth.len && !token_ok(a->auth.p + BEARER_LEN, a->auth.len - BEARER_LEN)) {
		return ik_errf(err, IK_CONFIG, "IDEMKIT_%s_TOKEN: not printable characters",
		               a->prefix);
	}
	if ((v = ik_bankapi_env(a->prefix, "HMAC_KEY_FILE", name, sizeof name))) {
		if (ik_read_secret(v, SECRET_MAX, &a->hmac_key, err) != IK_OK)
			return ik_errwrap(err, "IDEMKIT_%s_HMAC_KEY_FILE", a->prefix);
		if (a->hmac_key.len == 0)
			return ik_errf(err, IK_CONFIG, "IDEMKIT_%s_HMAC_KEY_FILE %s: empty",
			               a->prefix, v);
	}
	if ((rc = open_proxy(a, err)) != IK_OK ||
	    (rc = ik_bankapi_oauth_open(a, err)) != IK_OK)
		return rc;
	return ik_http_open(&a->http, err);
}

void
ik_bankapi_close(struct ik_bankapi *a)
{
	ik_http_close(a->http);
	a->http = NULL;
	free(a->url);
	free(a->key_header);
	free(a->replay_name);
	free(a->replay_value);
	a->replay_name = a->replay_value = NULL;
	free(a->cacert);
	free(a->path);
	free(a->client_cert);
	free(a->client_key);
	a->url = a->key_header = a->cacert = a->path = a->client_cert = a->client_key = NULL;
	ik_buf_wipe_free(&a->auth);
	ik_buf_wipe_free(&a->hmac_key);
	ik_jq_free(a->request);
	ik_jq_free(a->ref);
	ik_jq_free(a->reason);
	a->request = a->ref = a->reason = NULL;
	free(a->proxy);
	a->proxy = NULL;
	free(a->oauth_url);
	free(a->oauth_id);
	free(a->oauth_scope);
	a->oauth_url = a->oauth_id = a->oauth_scope = NULL;
	ik_buf_wipe_free(&a->oauth_secret);
}

void
ik_bankapi_sign(const unsigned char *key, size_t keylen, const char *method,
                const char *path, const char *idem_key, long long t,
                const char *body, size_t len, char out[IK_BANKAPI_SIG_HEX])
{
	static const char scheme[] = "IDEMKIT-HMAC-SHA256\n";
	unsigned char mac[crypto_auth_hmacsha256_BYTES];
	unsigned char digest[crypto_hash_sha256_BYTES];
	char bodyhex[2 * crypto_hash_sha256_BYTES + 1], ts[24];
	const char *parts[4];
	crypto_auth_hmacsha256_state st;
	size_t i;

	crypto_hash_sha256(digest, (const unsigned char *)body, len);
	ik_hex(digest, sizeof digest, bodyhex);
	snprintf(ts, sizeof ts, "%lld", t);
	parts[0] = method;
	parts[1] = path;
	parts[2] = idem_key;
	parts[3] = ts;
	crypto_auth_hmacsha256_init(&st, key, keylen);
	crypto_auth_hmacsha256_update(&st, (const unsigned char *)scheme, sizeof scheme - 1);
	for (i = 0; i < 4; i++) {
		crypto_auth_hmacsha256_update(&st, (const unsigned char *)parts[i], strlen(parts[i]));
		crypto_auth_hmacsha256_update(&st, (const unsigned char *)"\n", 1);
	}
	crypto_auth_hmacsha256_update(&st, (const unsigned char *)bodyhex, strlen(bodyhex));
	crypto_auth_hmacsha256_final(&st, mac);
	sodium_memzero(&st, sizeof st);
	ik_hex(mac, sizeof mac, out);
	sodium_memzero(mac, sizeof mac);
}

/* Sends call's request now: the lease checked, a token got when there is
 * none or it is about to expire, the timestamp and signature made.  IK_OK
 * when it is in flight. */
static void on_answer(void *arg, int rc, struct ik_http_res *res, const ik_err *err);

/* The request's headers, built in one place for the request sent and for
 * --dry-run's view of it (masked: the bearer token and the signature as
 * ***, an OAuth2 token not fetched).  hdrs holds up to 6 and a NULL; the
 * buffers hold what they point at (hdrs_free). */
struct hdrs { const char *h[8]; struct ik_buf keyh, tsh, sigh; };

static void
hdrs_free(struct hdrs *b)
{
	ik_buf_free(&b->keyh);
	ik_buf_free(&b->tsh);
	ik_buf_wipe_free(&b->sigh);
}

static int
make_headers(struct ik_bankapi *a, const char *key, const char *body, size_t len,
             int masked, struct hdrs *b, ik_err *err)
{
	char sig[IK_BANKAPI_SIG_HEX], ts[24];
	long long t;
	int n = 0;

	if (ik_buf_addstr(&b->keyh, a->key_header) < 0 || ik_buf_addstr(&b->keyh, ": ") < 0 ||
	    ik_buf_addstr(&b->keyh, key) < 0)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	b->h[n++] = "Content-Type: application/json";
	b->h[n++] = "Accept: application/json";
	b->h[n++] = b->keyh.p;
	if (masked && (a->auth.len || a->oauth_url))
		b->h[n++] = a->oauth_url ? "Authorization: Bearer *** (OAuth2, not fetched)" :
		    "Authorization: Bearer ***";
	else if (a->auth.len)
		b->h[n++] = a->auth.p;
	if (a->hmac_key.len) {
		t = (long long)(ik_now_ms() / 1000);
		snprintf(ts, sizeof ts, "%lld", t);
		if (masked)
			snprintf(sig, sizeof sig, "***");
		else
			ik_bankapi_sign((const unsigned char *)a->hmac_key.p, a->hmac_key.len,
			                "POST", a->path, key, t, body, len, sig);
		if (ik_buf_addstr(&b->tsh, "X-Idemkit-Timestamp: ") < 0 ||
		    ik_buf_addstr(&b->tsh, ts) < 0 ||
		    ik_buf_addstr(&b->sigh, "X-Idemkit-Signature: v2=") < 0 ||
		    ik_buf_addstr(&b->sigh, sig) < 0) {
			sodium_memzero(sig, sizeof sig);
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		sodium_memzero(sig, sizeof sig);
		b->h[n++] = b->tsh.p;
		b->h[n++] = b->sigh.p;
	}
	b->h[n] = NULL;
	return IK_OK;
}

static int
send_call(struct ik_bankapi_call *k, ik_err *err)
{
	struct ik_bankapi *a = k->api;
	struct hdrs b = {0};
	size_t len = strlen(k->body);
	int rc = IK_OK;
	struct ik_http_req req = {
		.method = "POST", .url = a->url, .headers = b.h,
		.body = k->body, .body_len = len,
		.connect_timeout_ms = a->connect_timeout_ms, .timeout_ms = a->timeout_ms,
		.max_body = 1u << 20, .cacert = a->cacert,
		.client_cert = a->client_cert, .client_key = a->client_key,
		.proxy = a->proxy,
	};

	if (a->oauth_url && (rc = ik_bankapi_oauth_token(a, err)) != IK_OK)
		return rc;
	/* Right before the request leaves (each time): nothing goes out on
	 * a dying lease, however long the envelope waited to be sent. */
	if (k->env && (rc = ik_bankapi_lease_check(k->env, k->need_ms, k->margin_ms,
	                                           err)) != IK_OK)
		return rc;
	if ((rc = make_headers(a, k->key, k->body, len, 0, &b, err)) == IK_OK) {
		k->token_gen = a->token_gen;
		rc = ik_http_submit(a->http, &req, k->res, on_answer, k, err);
	}
	hdrs_free(&b);
	return rc;
}

int
ik_bankapi_dry_run(struct ik_bankapi *a, const char *key, const char *body, char **out,
                   ik_err *err)
{
	struct hdrs b = {0};
	struct ik_buf t = {0};
	int rc, nomem = 0;

	*out = NULL;
	if ((rc = make_headers(a, key, body, strlen(body), 1, &b, err)) != IK_OK) {
		hdrs_free(&b);
		return rc;
	}
	nomem |= ik_buf_addstr(&t, "POST ") | ik_buf_addstr(&t, a->url) |
	    ik_buf_addstr(&t, "\n");
	for (const char *const *h = b.h; *h; h++)
		nomem |= ik_buf_addstr(&t, *h) | ik_buf_addstr(&t, "\n");
	nomem |= ik_buf_addstr(&t, "\n") | ik_buf_addstr(&t, body) | ik_buf_addstr(&t, "\n");
	if (nomem) {
		ik_buf_free(&t);
		hdrs_free(&b);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	hdrs_free(&b);
	*out = t.p;
	return IK_OK;
}

/* A 401 with OAuth2: the token was revoked or expired early.  One new
 * token (unless another call already got one since this one was sent),
 * one more try: a 401 was not processed, and the idempotency key covers
 * the rest. */
static void
on_answer(void *arg, int rc, struct ik_http_res *res, const ik_err *herr)
{
	struct ik_bankapi_call *k = arg;
	struct ik_bankapi *a = k->api;
	ik_err err = {0};

	/* A 2xx whose body did not arrive whole (http.h): the bank's yes all
	 * the same (the money moved, the notification went); what was lost is
	 * the body, and herr says why. */
	if (rc != IK_OK && res->status >= 200 && res->status < 300) {
		ik_log(IK_LOG_WARN, "a 2xx whose body did not arrive whole: the status stands",
		       "endpoint", a->prefix, IK_LOG_NUM("status", res->status),
		       "error", herr->msg, NULL);
		k->done(k->arg, IK_OK, res, herr);
		return;
	}
	if (rc == IK_OK && res->status == 401 && a->oauth_url && !k->reauth) {
		k->reauth = 1;
		if (k->token_gen == a->token_gen)
			ik_buf_wipe_free(&a->auth);   /* send_call fetches a new one */
		if ((rc = send_call(k, &err)) == IK_OK)
			return;
		ik_http_res_free(res);
		k->done(k->arg, rc, res, &err);
		return;
	}
	k->done(k->arg, rc, res, rc == IK_OK ? NULL : herr);
}

int
ik_bankapi_submit(struct ik_bankapi_call *k, ik_err *err)
{
	k->reauth = 0;
	return send_call(k, err);
}

int
ik_bankapi_run(struct ik_bankapi *a, int fd, int timeout_ms, int *readable, ik_err *err)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int rc;

	rc = ik_http_run(a->http, &p, fd >= 0, timeout_ms, err);
	if (readable)
		*readable = fd >= 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
	return rc;
}

struct wait1 {
	int done, rc;
	ik_err err;
};

static void
on_wait1(void *arg, int rc, struct ik_http_res *res, const ik_err *err)
{
	struct wait1 *w = arg;

	w->done = 1;
	w->rc = rc;
	if (rc != IK_OK)
		w->err = *err;
}

int
ik_bankapi_post(struct ik_bankapi *a, const char *key, const char *body,
                struct ik_http_res *res, ik_err *err)
{
	struct wait1 w = {0};
	struct ik_bankapi_call k = { .api = a, .key = key, .body = body, .res = res,
	                             .done = on_wait1, .arg = &w };
	int rc;

	if ((rc = ik_bankapi_submit(&k, err)) != IK_OK)
		return rc;
	while (!w.done)
		if ((rc = ik_bankapi_run(a, -1, 1000, NULL, err)) != IK_OK)
			return rc;
	if (w.rc != IK_OK)
		*err = w.err;
	return w.rc;
}

/* ISO 4217 currencies whose minor unit is not 2 (the list of 2024). */
static const struct { char code[4]; int exp; } minor_units[] = {
	{ "BIF", 0 }, { "CLP", 0 }, { "DJF", 0 }, { "GNF", 0 }, { "ISK", 0 },
	{ "JPY", 0 }, { "KMF", 0 }, { "KRW", 0 }, { "PYG", 0 }, { "RWF", 0 },
	{ "UGX", 0 }, { "UYI", 0 }, { "VND", 0 }, { "VUV", 0 }, { "XAF", 0 },
	{ "XOF", 0 }, { "XPF", 0 },
	{ "BHD", 3 }, { "IQD", 3 }, { "JOD", 3 }, { "KWD", 3 }, { "LYD", 3 },
	{ "OMR", 3 }, { "TND", 3 },
	{ "CLF", 4 }, { "UYW", 4 },
};

void
ik_bankapi_amount_major(long long amount, const char *currency, char out[32])
{
	long long scale = 1, a = amount < 0 ? -amount : amount;
	size_t i;
	int exp = 2;

	for (i = 0; i < sizeof minor_units / sizeof minor_units[0]; i++)
		if (strcmp(minor_units[i].code, currency) == 0)
			exp = minor_units[i].exp;
	for (i = 0; i < (size_t)exp; i++)
		scale *= 10;
	if (exp == 0)
		snprintf(out, 32, "%s%lld", amount < 0 ? "-" : "", a);
	else
		snprintf(out, 32, "%s%lld.%0*lld", amount < 0 ? "-" : "", a / scale, exp,
		         a % scale);
}

static cJSON *
default_body(const struct ik_event *ev, const char *ref)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		return NULL;
	if (!cJSON_AddStringToObject(o, "chargeId", ev->charge_id) ||
	    !cJSON_AddStringToObject(o, "accountId", ev->account_id) ||
	    /* amount <= 10^12 < 2^53: exact as a double, printed as an integer */
	    !cJSON_AddNumberToObject(o, "amount", (double)ev->amount) ||
	    !cJSON_AddStringToObject(o, "currency", ev->currency) ||
	    !cJSON_AddStringToObject(o, "chargeType", ev->charge_type) ||
	    (ref && !cJSON_AddStringToObject(o, "debitRef", ref))) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

int
ik_bankapi_body(struct ik_bankapi *a, const char *event, const struct ik_event *ev,
                const char *key, const cJSON *attempt, const char *ref,
                char **body, ik_err *err)
{
	char major[32];
	cJSON *vars, *out;
	char *vtext;
	int rc;

	*body = NULL;
	if (!a->request) {
		if (!(out = default_body(ev, ref)))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		*body = ik_json_print(out);
		cJSON_Delete(out);
		return *body ? IK_OK : ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	ik_bankapi_amount_major(ev->amount, ev->currency, major);
	vtext = NULL;
	if ((vars = cJSON_CreateObject()) &&
	    cJSON_AddStringToObject(vars, "key", key) &&
	    cJSON_AddStringToObject(vars, "amountMajor", major) &&
	    cJSON_AddItemToObject(vars, "attempt", cJSON_IsNumber(attempt) ?
	                          cJSON_CreateNumber(attempt->valuedouble) : cJSON_CreateNull()) &&
	    cJSON_AddItemToObject(vars, "ref", ref ? cJSON_CreateString(ref) : cJSON_CreateNull()))
		vtext = ik_json_print(vars);
	cJSON_Delete(vars);
	if (!vtext)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = ik_jq_run(a->request, event, strlen(event), vtext, body, err);
	free(vtext);
	if (rc != IK_OK)
		return rc;
	if (!*body)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_%s_REQUEST: the program yielded "
		               "nothing for this event", a->prefix);
	return IK_OK;
}

static int
ref_ok(const char *s)
{
	size_t n = strlen(s), i;

	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return 0;
	return n > 0 && n <= 128;
}

int
ik_bankapi_ref(struct ik_bankapi *a, const struct ik_http_res *res, char **ref,
               char *warn, size_t warnsz)
{
	cJSON *ans = cJSON_ParseWithLength(res->body.p, res->body.len), *v = NULL;
	const cJSON *got;
	ik_err e = {0};
	char num[32], *text = NULL;

	*ref = NULL;
	warn[0] = '\0';
	if (a->ref) {
		if (ans && ik_jq_run(a->ref, res->body.p, res->body.len, NULL, &text, &e) != IK_OK)
			snprintf(warn, warnsz, "%s", e.msg);
		v = text ? cJSON_Parse(text) : NULL;
		free(text);
		got = v;
	} else {
		got = cJSON_GetObjectItemCaseSensitive(ans, "ref");
	}
	/* A number is read as a double (by cJSON, and by jq 1.6 before it):
	 * exact for integers below 2^53 only; a larger one may already be
	 * another number, so none is recorded rather than a wrong one. */
	if (cJSON_IsNumber(got) && fabs(got->valuedouble) < 9007199254740992.0 &&
	    got->valuedouble == floor(got->valuedouble)) {
		snprintf(num, sizeof num, "%.0f", got->valuedouble);
		if (!(*ref = strdup(num)))
			goto nomem;
	} else if (cJSON_IsNumber(got) && !warn[0]) {
		snprintf(warn, warnsz, "HTTP %ld with a reference that is not an integer below "
		         "2^53 (a number read as a double would not be the bank's exact text): "
		         "recorded null; a reference the bank sends as a JSON string is kept as "
		         "is", res->status);
	} else if (cJSON_IsString(got) && ref_ok(got->valuestring)) {
		if (!(*ref = strdup(got->valuestring)))
			goto nomem;
	} else if (!warn[0]) {
		snprintf(warn, warnsz, "HTTP %ld without a reference%s", res->status,
		         !ans ? " (the body is not JSON)" : got && !cJSON_IsNull(got) ?
		         " (not 1-128 printable characters)" : "");
	}
	cJSON_Delete(v);
	cJSON_Delete(ans);
	return 0;
nomem:
	cJSON_Delete(v);
	cJSON_Delete(ans);
	return -1;
}

void
ik_bankapi_reason(struct ik_bankapi *a, const struct ik_http_res *res,
                  char out[IK_BANKAPI_REASON_MAX + 1])
{
	static const char *const fields[] = { "reason", "message", "error", NULL };
	const char *s = NULL;
	cJSON *o = NULL, *v = NULL;
	char *text = NULL;
	ik_err e;
	size_t i, n = 0;

	out[0] = '\0';
	if (!res->body.p || !res->body.len)
		return;
	o = cJSON_ParseWithLength(res->body.p, res->body.len);
	if (a->reason && o && ik_jq_run(a->reason, res->body.p, res->body.len, NULL, &text, &e) == IK_OK &&
	    text && (v = cJSON_Parse(text)))
		s = cJSON_GetStringValue(v);
	free(text);
	for (i = 0; o && fields[i] && !s; i++)
		s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, fields[i]));
	if (!s && !o)
		s = res->body.p;
	/* The first line, cut on a character boundary and made valid UTF-8:
	 * the reason ends up in the record, and a store refuses broken text. */
	if (s)
		n = ik_utf8_copy(out, IK_BANKAPI_REASON_MAX + 1, s, strcspn(s, "\r\n"));
	for (i = 0; i < n; i++)
		if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f)
			out[i] = '?';
	cJSON_Delete(v);
	cJSON_Delete(o);
}
