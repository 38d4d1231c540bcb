/* banksim_server.c: bank-sim's HTTP side on libmicrohttpd; see banksim.h
 * and man/bank-sim.1 for the endpoints.
 *
 * Rules: libmicrohttpd parses HTTP, we only route; one thread per
 * connection, so injected latency and hangs stall only their own request
 * (a pool thread would stall every connection it serves); bodies are
 * bounded (413 beyond); secrets (token, HMAC key, TLS key) are compared in
 * constant time and wiped at stop; nothing secret is logged.
 */
#define _GNU_SOURCE   /* POLLRDHUP: notice a client that gave up on a hang */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <sodium.h>

#include "bank/bankapi.h"
#include "banksim.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

#define MAX_BODY      (64u << 10)
#define MAX_SECRET    4096
#define HMAC_SKEW_S   300
#define DEBIT_PATH    "/debits/"   /* GET /debits/KEY: one debit of the ledger */
#define DEBIT_PATH_LEN (sizeof DEBIT_PATH - 1)

struct ik_banksim {
	struct MHD_Daemon *d;
	struct ik_ledger *ledger;
	pthread_mutex_t mu;            /* guards f and rng */
	struct ik_banksim_faults f;
	uint64_t rng;
	struct ik_buf token, hmac, cert, key, client_ca;
	char *oauth_id;                /* NULL: no OAuth2 */
	struct ik_buf oauth_secret;
	int64_t oauth_ttl_s;
	struct issued { char v[65]; int64_t until; } *toks;   /* guarded by mu */
	size_t ntoks;
	atomic_int stopping;
	atomic_int busy, busy_max;     /* POSTs being answered now; the most at once */
	/* Per idempotency key (guarded by mu): the next fail requests under it
	 * are answered the error status, every one waits slow_ms more. */
	struct keyfault { char key[256]; int fail; int64_t slow_ms; } *kf;
	size_t nkf;
	int port;
	char url[96];
};

struct req {
	struct ik_buf body;
	int too_big;
};

/* ---- faults ---- */

void
ik_banksim_faults_free(struct ik_banksim_faults *f)
{
	size_t i;
	for (i = 0; i < f->ndecline; i++)
		free(f->decline[i]);
	free(f->decline);
	f->decline = NULL;
	f->ndecline = 0;
}

static int
add_decline(char ***v, size_t *n, const char *s, size_t len)
{
	char **nv;
	if (len == 0)
		return 0;
	if (!(nv = realloc(*v, (*n + 1) * sizeof *nv)))
		return -1;
	*v = nv;
	if (!(nv[*n] = strndup(s, len)))
		return -1;
	(*n)++;
	return 0;
}

int
ik_banksim_set_decline(struct ik_banksim_faults *f, const char *csv)
{
	char **v = NULL;
	size_t n = 0;
	const char *p = csv, *c;

	for (;;) {
		c = strchr(p, ',');
		if (add_decline(&v, &n, p, c ? (size_t)(c - p) : strlen(p)) < 0) {
			struct ik_banksim_faults tmp = { .decline = v, .ndecline = n };
			ik_banksim_faults_free(&tmp);
			return -1;
		}
		if (!c)
			break;
		p = c + 1;
	}
	ik_banksim_faults_free(f);
	f->decline = v;
	f->ndecline = n;
	return 0;
}

static uint64_t
splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* True with probability rate; call with b->mu held. */
static int
draw(struct ik_banksim *b, double rate)
{
	if (rate <= 0)
		return 0;
	return (double)(splitmix(&b->rng) >> 11) * 0x1.0p-53 < rate;
}

static void
seed_rng(struct ik_banksim *b, uint64_t seed)
{
	if (seed == 0)
		randombytes_buf(&seed, sizeof seed);
	b->rng = seed;
}

static int
declined(const struct ik_banksim_faults *f, const char *account)
{
	size_t i;
	for (i = 0; i < f->ndecline; i++)
		if (strcmp(f->decline[i], account) == 0)
			return 1;
	return 0;
}

static cJSON *
faults_json(struct ik_banksim *b)
{
	cJSON *o = cJSON_CreateObject(), *a;
	size_t i;

	if (!o)
		return NULL;
	pthread_mutex_lock(&b->mu);
	a = cJSON_AddArrayToObject(o, "decline");
	for (i = 0; a && i < b->f.ndecline; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(b->f.decline[i]));
	cJSON_AddNumberToObject(o, "latencyMs", (double)b->f.latency_ms);
	cJSON_AddNumberToObject(o, "errorRate", b->f.error_rate);
	cJSON_AddNumberToObject(o, "errorStatus", b->f.error_status);
	cJSON_AddBoolToObject(o, "hang", b->f.hang);
	cJSON_AddNumberToObject(o, "notifyFailRate", b->f.notify_fail_rate);
	cJSON_AddNumberToObject(o, "notifyFailStatus", b->f.notify_fail_status);
	cJSON_AddBoolToObject(o, "notifyHang", b->f.notify_hang);
	cJSON_AddBoolToObject(o, "oauthReject", b->f.oauth_reject);
	pthread_mutex_unlock(&b->mu);
	return o;
}

/* ---- replies ---- */

static enum MHD_Result
reply(struct MHD_Connection *c, unsigned status, const char *ctype,
      const char *body, int replayed)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(strlen(body), (void *)body,
	                                    MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", ctype);
	MHD_add_response_header(r, "Cache-Control", "no-store");
	if (replayed)
		MHD_add_response_header(r, "Idempotent-Replayed", "true");
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* Takes o (may be NULL: 500). */
static enum MHD_Result
reply_json(struct MHD_Connection *c, unsigned status, cJSON *o, int replayed)
{
	char *s = o ? cJSON_PrintUnformatted(o) : NULL;
	enum MHD_Result ret;

	cJSON_Delete(o);
	if (!s)
		return reply(c, 500, "application/json",
		             "{\"reason\":\"out of memory\"}", 0);
	ret = reply(c, status, "application/json", s, replayed);
	free(s);
	return ret;
}

static enum MHD_Result
reply_reason(struct MHD_Connection *c, unsigned status, const char *status_name,
             const char *reason)
{
	cJSON *o = cJSON_CreateObject();
	if (o) {
		if (status_name)
			cJSON_AddStringToObject(o, "status", status_name);
		cJSON_AddStringToObject(o, "reason", reason);
	}
	return reply_json(c, status, o, 0);
}

static void
log_req(const char *method, const char *url, unsigned status, const char *key)
{
	ik_log(IK_LOG_INFO, "request", "method", method, "path", url,
	       IK_LOG_NUM("status", status), "key", key, NULL);
}

static int
count(struct ik_banksim *b, const char *counter)
{
	ik_err e;
	if (ik_ledger_bump(b->ledger, counter, &e) != IK_OK) {
		ik_log(IK_LOG_ERROR, "ledger", "error", e.msg, NULL);
		return -1;
	}
	return 0;
}

/* Sleeps ms in slices, waking early when the server stops. */
static void
nap(struct ik_banksim *b, int64_t ms)
{
	while (ms > 0 && !atomic_load(&b->stopping)) {
		int64_t s = ms < 50 ? ms : 50;
		struct timespec ts = { 0, (long)s * 1000000L };
		nanosleep(&ts, NULL);
		ms -= s;
	}
}

/* Never answers: waits until the client hangs up or the server stops,
 * then drops the connection. */
static enum MHD_Result
hang(struct ik_banksim *b, struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	int fd = ci ? ci->connect_fd : -1;

	while (!atomic_load(&b->stopping)) {
		struct pollfd p = { fd, POLLRDHUP, 0 };
		if (fd < 0) {
			nap(b, 100);
			continue;
		}
		if (poll(&p, 1, 100) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
			break;
	}
	return MHD_NO;
}

/* ---- auth ---- */

/* With --tls-client-ca, libmicrohttpd asks for a client certificate in
 * the handshake and GnuTLS checks it against that CA here; a request
 * without a valid one is answered 403 and nothing else is looked at. */
static int
check_client_cert(struct ik_banksim *b, struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci;
	unsigned status = 1;

	if (!b->client_ca.p)
		return 1;
	ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
	if (!ci || !ci->tls_session)
		return 0;
	if (gnutls_certificate_verify_peers2((gnutls_session_t)ci->tls_session, &status) !=
	    GNUTLS_E_SUCCESS)
		return 0;
	return status == 0;
}

/* An issued, unexpired token (and not all refused by /control). */
static int
oauth_token_ok(struct ik_banksim *b, const char *t)
{
	int64_t now = ik_now_ms();
	size_t i;
	int ok = 0;

	if (strlen(t) != 64)
		return 0;
	pthread_mutex_lock(&b->mu);
	for (i = 0; !b->f.oauth_reject && i < b->ntoks && !ok; i++)
		ok = b->toks[i].until > now && sodium_memcmp(b->toks[i].v, t, 64) == 0;
	pthread_mutex_unlock(&b->mu);
	return ok;
}

/* POST /oauth/token: RFC 6749 4.4, the client authenticated with HTTP
 * Basic (id and secret form-encoded, then base64). */
static unsigned
oauth_token(struct ik_banksim *b, struct MHD_Connection *c, const struct req *r,
            enum MHD_Result *ret)
{
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	unsigned char raw[1024];
	unsigned char rnd[32];
	size_t n = 0, idl = strlen(b->oauth_id);
	struct issued t, *nt;
	cJSON *o;
	int ok;

	if (!h || strncasecmp(h, "Basic ", 6) != 0 ||
	    sodium_base642bin(raw, sizeof raw - 1, h + 6, strlen(h + 6), NULL, &n, NULL,
	                      sodium_base64_VARIANT_ORIGINAL) != 0)
		n = 0;
	raw[n] = '\0';
	ok = n == idl + 1 + b->oauth_secret.len && memcmp(raw, b->oauth_id, idl) == 0 &&
	     raw[idl] == ':' &&
	     sodium_memcmp(raw + idl + 1, b->oauth_secret.p, b->oauth_secret.len) == 0;
	sodium_memzero(raw, sizeof raw);
	if (!ok) {
		count(b, "tokenRefusals");
		*ret = reply_json(c, 401, cJSON_Parse("{\"error\":\"invalid_client\"}"), 0);
		return 401;
	}
	if (!r->body.p || !strstr(r->body.p, "grant_type=client_credentials")) {
		*ret = reply_json(c, 400, cJSON_Parse("{\"error\":\"unsupported_grant_type\"}"), 0);
		return 400;
	}
	randombytes_buf(rnd, sizeof rnd);
	ik_hex(rnd, sizeof rnd, t.v);
	t.until = ik_now_ms() + b->oauth_ttl_s * 1000;
	pthread_mutex_lock(&b->mu);
	if ((nt = realloc(b->toks, (b->ntoks + 1) * sizeof *nt))) {
		b->toks = nt;
		b->toks[b->ntoks++] = t;
	}
	pthread_mutex_unlock(&b->mu);
	if (!nt) {
		*ret = reply_reason(c, 500, NULL, "out of memory");
		return 500;
	}
	count(b, "tokensIssued");
	if ((o = cJSON_CreateObject())) {
		cJSON_AddStringToObject(o, "access_token", t.v);
		cJSON_AddStringToObject(o, "token_type", "Bearer");
		cJSON_AddNumberToObject(o, "expires_in", (double)b->oauth_ttl_s);
	}
	sodium_memzero(&t, sizeof t);
	*ret = reply_json(c, 200, o, 0);
	return 200;
}

static int
check_token(struct ik_banksim *b, struct MHD_Connection *c)
{
	const char *h;
	size_t n;

	if (!b->token.p && !b->oauth_id)
		return 1;
	h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return 0;
	h += 7;
	while (*h == ' ')
		h++;
	n = strlen(h);
	if (b->oauth_id)
		return oauth_token_ok(b, h);
	return n == b->token.len && sodium_memcmp(h, b->token.p, n) == 0;
}

/* X-Idemkit-Timestamp: <unix> and X-Idemkit-Signature: v2=<hex>, the
 * scheme of charge-debit(1) (ik_bankapi_sign over method, path, the
 * idempotency key, the timestamp and the body's SHA-256).  A timestamp more
 * than HMAC_SKEW_S away is refused, so is a signature made for another key,
 * path or body. */
static int
check_sig(struct ik_banksim *b, struct MHD_Connection *c, const char *method,
          const char *path, const char *key, const struct ik_buf *body)
{
	char want[IK_BANKAPI_SIG_HEX];
	const char *h, *ts;
	long long t;
	int ok;

	if (!b->hmac.p)
		return 1;
	ts = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idemkit-Timestamp");
	h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idemkit-Signature");
	if (!ts || !h || strncmp(h, "v2=", 3) != 0 || strlen(h + 3) != sizeof want - 1)
		return 0;
	if (ik_parse_int(ts, 0, 99999999999LL, &t) < 0 ||
	    llabs(t - (long long)(ik_now_ms() / 1000)) > HMAC_SKEW_S)
		return 0;
	ik_bankapi_sign((const unsigned char *)b->hmac.p, b->hmac.len, method, path,
	                key ? key : "", t, body->p ? body->p : "", body->len, want);
	ok = sodium_memcmp(want, h + 3, sizeof want - 1) == 0;
	sodium_memzero(want, sizeof want);
	return ok;
}

/* An idempotency key: 1..255 printable ASCII characters, no spaces. */
static const char *
idem_key(struct MHD_Connection *c)
{
	const char *k = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
	size_t i, n;

	if (!k)
		return NULL;
	n = strlen(k);
	if (n == 0 || n > 255)
		return NULL;
	for (i = 0; i < n; i++)
		if (k[i] <= ' ' || k[i] > '~')
			return NULL;
	return k;
}

/* The faults set for key by /control's failKeys and slowKeys: *fail when
 * this request is one of the next ones to fail (counted down), *slow_ms
 * added to the latency.  Call with mu held. */
static void
key_faults(struct ik_banksim *b, const char *key, int *fail, int64_t *slow_ms)
{
	size_t i;

	for (i = 0; key && i < b->nkf; i++)
		if (strcmp(b->kf[i].key, key) == 0) {
			if (b->kf[i].fail > 0) {
				b->kf[i].fail--;
				*fail = 1;
			}
			*slow_ms += b->kf[i].slow_ms;
			return;
		}
}

/* Sets one key's fault (fail count or extra latency); 0, or -1 ENOMEM.
 * Call with mu held. */
static int
key_fault_set(struct ik_banksim *b, const char *key, int is_slow, int64_t v)
{
	struct keyfault *n;
	size_t i;

	for (i = 0; i < b->nkf && strcmp(b->kf[i].key, key) != 0; i++)
		;
	if (i == b->nkf) {
		if (!(n = realloc(b->kf, (b->nkf + 1) * sizeof *n)))
			return -1;
		b->kf = n;
		memset(&b->kf[i], 0, sizeof b->kf[i]);
		snprintf(b->kf[i].key, sizeof b->kf[i].key, "%s", key);
		b->nkf++;
	}
	if (is_slow)
		b->kf[i].slow_ms = v;
	else
		b->kf[i].fail = (int)v;
	return 0;
}

/* ---- endpoints ---- */

static unsigned
debit(struct ik_banksim *b, struct MHD_Connection *c, const struct req *r,
      const char *key, enum MHD_Result *ret)
{
	struct ik_event ev;
	struct ik_ledger_debit d;
	int64_t latency;
	int do_hang, fail, status, dec;
	ik_err e;
	cJSON *o;

	count(b, "attempts");
	if (!key) {
		count(b, "badRequests");
		*ret = reply_reason(c, 400, "REJECTED", "missing or invalid Idempotency-Key header");
		return 400;
	}
	if (ik_event_parse(r->body.p ? r->body.p : "", r->body.len, &ev, &e) != IK_OK) {
		count(b, "badRequests");
		*ret = reply_reason(c, 400, "REJECTED", e.msg);
		return 400;
	}

	pthread_mutex_lock(&b->mu);
	latency = b->f.latency_ms;
	do_hang = b->f.hang;
	fail = draw(b, b->f.error_rate);
	status = b->f.error_status;
	dec = declined(&b->f, ev.account_id);
	key_faults(b, key, &fail, &latency);
	pthread_mutex_unlock(&b->mu);

	nap(b, latency);
	if (do_hang) {
		count(b, "hangs");
		*ret = hang(b, c);
		return 0;
	}
	if (fail) {
		count(b, "errors");
		*ret = reply_reason(c, (unsigned)status, NULL, "injected failure");
		return (unsigned)status;
	}
	if (ik_ledger_debit(b->ledger, key, &ev, dec, &d, &e) != IK_OK) {
		ik_log(IK_LOG_ERROR, "ledger", "error", e.msg, NULL);
		*ret = reply_reason(c, 503, NULL, "ledger unavailable");
		return 503;
	}
	switch (d.res) {
	case IK_LEDGER_DECLINED:
		*ret = reply_reason(c, 402, "DECLINED", "insufficient funds");
		return 402;
	case IK_LEDGER_MISMATCH:
		*ret = reply_reason(c, 422, "REJECTED",
		                    "idempotency key reused with a different request");
		return 422;
	}
	if (!(o = cJSON_CreateObject())) {
		*ret = reply(c, 500, "application/json", "{\"reason\":\"out of memory\"}", 0);
		return 500;
	}
	cJSON_AddStringToObject(o, "ref", d.ref);
	cJSON_AddStringToObject(o, "status", "DEBITED");
	cJSON_AddStringToObject(o, "chargeId", ev.charge_id);
	cJSON_AddNumberToObject(o, "amount", (double)ev.amount);
	cJSON_AddStringToObject(o, "currency", ev.currency);
	cJSON_AddNumberToObject(o, "createdAt", (double)d.created_at);
	if (d.res == IK_LEDGER_REPLAY) {
		cJSON_AddBoolToObject(o, "replayed", 1);
		*ret = reply_json(c, 200, o, 1);
		return 200;
	}
	*ret = reply_json(c, 201, o, 0);
	return 201;
}

/* ---- the second API shape: an open-banking style payment ---- */

#define OB_PATH "/open-banking/v3.1/pisp/domestic-payments"

static enum MHD_Result
ob_error(struct MHD_Connection *c, unsigned status, const char *code, const char *msg)
{
	cJSON *o = cJSON_CreateObject(), *a, *e;

	if (o && (a = cJSON_AddArrayToObject(o, "Errors")) && (e = cJSON_CreateObject())) {
		cJSON_AddStringToObject(e, "ErrorCode", code);
		cJSON_AddStringToObject(e, "Message", msg);
		cJSON_AddItemToArray(a, e);
	}
	return reply_json(c, status, o, 0);
}

/* "25.00" in INR -> 2500: exactly the currency's ISO 4217 exponent of
 * decimals (what ik_bankapi_amount_major writes), digits only. */
static int
ob_amount(const char *s, const char *currency, long long *out)
{
	char one[32];
	const char *dot = strchr(s, '.'), *p;
	size_t want, got = dot ? strlen(dot + 1) : 0;
	long long v = 0;

	ik_bankapi_amount_major(1, currency, one);
	want = strchr(one, '.') ? strlen(strchr(one, '.') + 1) : 0;
	if (got != want || !*s || s[0] == '.' || (dot && !dot[1]))
		return -1;
	for (p = s; *p; p++) {
		if (*p == '.')
			continue;
		if (*p < '0' || *p > '9' || v > 100000000000000LL)
			return -1;
		v = v * 10 + (*p - '0');
	}
	*out = v;
	return 0;
}

/* POST OB_PATH with x-idempotency-key: the payment's fields map onto the
 * same ledger as /debits, so a charge is one debit whichever shape sent it. */
static unsigned
ob_payment(struct ik_banksim *b, struct MHD_Connection *c, const struct req *r,
           const char *key, enum MHD_Result *ret)
{
	cJSON *o = r->body.p ? cJSON_ParseWithLength(r->body.p, r->body.len) : NULL;
	cJSON *ini = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "Data"),
	                                              "Initiation");
	cJSON *amt = cJSON_GetObjectItemCaseSensitive(ini, "InstructedAmount");
	const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ini, "InstructionIdentification"));
	const char *acc = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(ini, "DebtorAccount"), "Identification"));
	const char *typ = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(ini, "RemittanceInformation"), "Reference"));
	const char *a = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(amt, "Amount"));
	const char *cur = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(amt, "Currency"));
	struct ik_ledger_debit d;
	struct ik_event ev;
	long long minor;
	char *txt;
	int fail, status, dec, n;
	int64_t latency;
	cJSON *out, *data, *evo;
	ik_err e;

	count(b, "attempts");
	if (!key) {
		cJSON_Delete(o);
		count(b, "badRequests");
		*ret = ob_error(c, 400, "UK.OBIE.Header.Missing", "x-idempotency-key is missing or invalid");
		return 400;
	}
	evo = NULL;
	txt = NULL;
	n = -1;
	if (id && acc && typ && a && cur && strlen(cur) == 3 && ob_amount(a, cur, &minor) == 0 &&
	    (evo = cJSON_CreateObject()) &&
	    cJSON_AddStringToObject(evo, "chargeId", id) &&
	    cJSON_AddStringToObject(evo, "accountId", acc) &&
	    cJSON_AddNumberToObject(evo, "amount", (double)minor) &&
	    cJSON_AddStringToObject(evo, "currency", cur) &&
	    cJSON_AddStringToObject(evo, "chargeType", typ) &&
	    (txt = cJSON_PrintUnformatted(evo)))
		n = (int)strlen(txt);
	cJSON_Delete(evo);
	cJSON_Delete(o);
	if (n < 0 || ik_event_parse(txt, (size_t)n, &ev, &e) != IK_OK) {
		free(txt);
		count(b, "badRequests");
		*ret = ob_error(c, 400, "UK.OBIE.Field.Invalid",
		                n < 0 ? "Data.Initiation: a field is missing, or the amount is not "
		                "a decimal string with the currency's minor-unit digits" : e.msg);
		return 400;
	}
	free(txt);
	pthread_mutex_lock(&b->mu);
	latency = b->f.latency_ms;
	fail = draw(b, b->f.error_rate);
	status = b->f.error_status;
	dec = declined(&b->f, ev.account_id);
	pthread_mutex_unlock(&b->mu);
	nap(b, latency);
	if (fail) {
		count(b, "errors");
		*ret = ob_error(c, (unsigned)status, "UK.OBIE.UnexpectedError", "injected failure");
		return (unsigned)status;
	}
	if (ik_ledger_debit(b->ledger, key, &ev, dec, &d, &e) != IK_OK) {
		*ret = ob_error(c, 503, "UK.OBIE.UnexpectedError", "ledger unavailable");
		return 503;
	}
	if (d.res == IK_LEDGER_DECLINED) {
		*ret = ob_error(c, 422, "UK.OBIE.Rules.InsufficientFunds", "insufficient funds");
		return 422;
	}
	if (d.res == IK_LEDGER_MISMATCH) {
		*ret = ob_error(c, 422, "UK.OBIE.Resource.ConsentMismatch",
		                "x-idempotency-key reused with a different payment");
		return 422;
	}
	if (!(out = cJSON_CreateObject()) || !(data = cJSON_AddObjectToObject(out, "Data"))) {
		cJSON_Delete(out);
		*ret = reply(c, 500, "application/json", "{}", 0);
		return 500;
	}
	cJSON_AddStringToObject(data, "DomesticPaymentId", d.ref);
	cJSON_AddStringToObject(data, "Status", "AcceptedSettlementCompleted");
	cJSON_AddNumberToObject(data, "CreationDateTime", (double)d.created_at);
	*ret = reply_json(c, d.res == IK_LEDGER_REPLAY ? 200 : 201, out, d.res == IK_LEDGER_REPLAY);
	return d.res == IK_LEDGER_REPLAY ? 200 : 201;
}

static unsigned
notify(struct ik_banksim *b, struct MHD_Connection *c, const struct req *r,
       const char *key, enum MHD_Result *ret)
{
	cJSON *body, *o;
	int64_t latency, n = 0;
	int do_hang, fail, status;
	ik_err e;

	count(b, "notificationAttempts");
	if (!key) {
		count(b, "badRequests");
		*ret = reply_reason(c, 400, "REJECTED", "missing or invalid Idempotency-Key header");
		return 400;
	}
	body = r->body.p ? cJSON_ParseWithLength(r->body.p, r->body.len) : NULL;
	if (!cJSON_IsObject(body)) {
		cJSON_Delete(body);
		count(b, "badRequests");
		*ret = reply_reason(c, 400, "REJECTED", "body is not a JSON object");
		return 400;
	}
	cJSON_Delete(body);

	pthread_mutex_lock(&b->mu);
	latency = b->f.latency_ms;
	do_hang = b->f.notify_hang;
	fail = draw(b, b->f.notify_fail_rate);
	status = b->f.notify_fail_status;
	key_faults(b, key, &fail, &latency);
	pthread_mutex_unlock(&b->mu);

	nap(b, latency);
	if (do_hang) {
		count(b, "hangs");
		*ret = hang(b, c);
		return 0;
	}
	if (fail) {
		count(b, "notificationFailures");
		*ret = reply_reason(c, (unsigned)status, NULL, "injected notification failure");
		return (unsigned)status;
	}
	if (ik_ledger_notify(b->ledger, key, r->body.p, &n, &e) != IK_OK) {
		ik_log(IK_LOG_ERROR, "ledger", "error", e.msg, NULL);
		*ret = reply_reason(c, 503, NULL, "ledger unavailable");
		return 503;
	}
	if ((o = cJSON_CreateObject())) {
		cJSON_AddStringToObject(o, "status", "ACCEPTED");
		cJSON_AddNumberToObject(o, "count", (double)n);
	}
	*ret = reply_json(c, 202, o, 0);
	return 202;
}

static int
rate_ok(const cJSON *v)
{
	return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1;
}

/* POST /control: only the fields given change; all are checked first. */
static unsigned
control(struct ik_banksim *b, struct MHD_Connection *c, const struct req *r,
        enum MHD_Result *ret)
{
	static const char *const known[] = { "decline", "latencyMs", "errorRate",
		"errorStatus", "hang", "notifyFailRate", "notifyFail", "notifyHang",
		"notifyFailStatus", "oauthReject", "revokeTokens", "seed", "failKeys",
		"slowKeys", NULL };
	struct ik_banksim_faults nf = {0};
	cJSON *o = r->body.p ? cJSON_ParseWithLength(r->body.p, r->body.len) : NULL;
	cJSON *it, *v;
	const char *bad = NULL;
	size_t i;

	if (!cJSON_IsObject(o)) {
		cJSON_Delete(o);
		*ret = reply_reason(c, 400, "REJECTED", "body is not a JSON object");
		return 400;
	}
	cJSON_ArrayForEach(it, o) {
		for (i = 0; known[i] && strcmp(known[i], it->string) != 0; i++)
			;
		if (!known[i]) {
			bad = "unknown field";
			break;
		}
	}
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "decline"))) {
		if (cJSON_IsString(v)) {
			if (ik_banksim_set_decline(&nf, v->valuestring) < 0)
				bad = "out of memory";
		} else if (cJSON_IsArray(v)) {
			cJSON_ArrayForEach(it, v) {
				if (!cJSON_IsString(it)) {
					bad = "decline: strings only";
					break;
				}
				if (add_decline(&nf.decline, &nf.ndecline, it->valuestring,
				                strlen(it->valuestring)) < 0) {
					bad = "out of memory";
					break;
				}
			}
		} else {
			bad = "decline: an array or a comma-separated string";
		}
	}
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "latencyMs")) &&
	    (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 3600000))
		bad = "latencyMs: 0..3600000";
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "errorRate")) && !rate_ok(v))
		bad = "errorRate: a fraction 0..1";
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "notifyFailRate")) && !rate_ok(v))
		bad = "notifyFailRate: a fraction 0..1";
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "errorStatus")) &&
	    (!cJSON_IsNumber(v) || v->valueint < 100 || v->valueint > 599))
		bad = "errorStatus: 100..599";
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "notifyFailStatus")) &&
	    (!cJSON_IsNumber(v) || v->valueint < 100 || v->valueint > 599))
		bad = "notifyFailStatus: 100..599";
	if (!bad && (v = cJSON_GetObjectItemCaseSensitive(o, "seed")) &&
	    (!cJSON_IsNumber(v) || v->valuedouble < 0))
		bad = "seed: a non-negative number";
	for (i = 0; !bad && i < 2; i++) {
		v = cJSON_GetObjectItemCaseSensitive(o, i ? "slowKeys" : "failKeys");
		if (!v)
			continue;
		if (!cJSON_IsObject(v)) {
			bad = "failKeys, slowKeys: an object of key: number";
			break;
		}
		cJSON_ArrayForEach(it, v)
			if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
			    it->valuedouble > (i ? 3600000 : 1000000) || strlen(it->string) > 255) {
				bad = "failKeys: key: 0..1000000 requests; slowKeys: key: 0..3600000 ms";
				break;
			}
	}
	for (i = 0; !bad && i < 5; i++) {
		static const char *const bools[] = { "hang", "notifyFail", "notifyHang",
			"oauthReject", "revokeTokens" };
		v = cJSON_GetObjectItemCaseSensitive(o, bools[i]);
		if (v && !cJSON_IsBool(v))
			bad = "hang, notifyFail, notifyHang: true or false";
	}
	if (bad) {
		ik_banksim_faults_free(&nf);
		cJSON_Delete(o);
		*ret = reply_reason(c, 400, "REJECTED", bad);
		return 400;
	}

	pthread_mutex_lock(&b->mu);
	if (cJSON_GetObjectItemCaseSensitive(o, "decline")) {
		ik_banksim_faults_free(&b->f);
		b->f.decline = nf.decline;
		b->f.ndecline = nf.ndecline;
		nf.decline = NULL;
		nf.ndecline = 0;
	}
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "latencyMs")))
		b->f.latency_ms = (int64_t)v->valuedouble;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "errorRate")))
		b->f.error_rate = v->valuedouble;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "errorStatus")))
		b->f.error_status = v->valueint;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "hang")))
		b->f.hang = cJSON_IsTrue(v);
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "notifyFailRate")))
		b->f.notify_fail_rate = v->valuedouble;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "notifyFailStatus")))
		b->f.notify_fail_status = v->valueint;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "notifyFail")))
		b->f.notify_fail_rate = cJSON_IsTrue(v) ? 1 : 0;
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "notifyHang")))
		b->f.notify_hang = cJSON_IsTrue(v);
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "oauthReject")))
		b->f.oauth_reject = cJSON_IsTrue(v);
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "revokeTokens"))) {
		sodium_memzero(b->toks, b->ntoks * sizeof *b->toks);
		b->ntoks = 0;
	}
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "seed")))
		seed_rng(b, (uint64_t)v->valuedouble);
	for (i = 0; i < 2; i++)
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, i ? "slowKeys" : "failKeys"))
			if (key_fault_set(b, it->string, (int)i, (int64_t)it->valuedouble) < 0)
				bad = "out of memory";
	pthread_mutex_unlock(&b->mu);
	if (bad) {
		ik_banksim_faults_free(&nf);
		cJSON_Delete(o);
		*ret = reply_reason(c, 503, NULL, bad);
		return 503;
	}
	ik_banksim_faults_free(&nf);
	cJSON_Delete(o);
	*ret = reply_json(c, 200, faults_json(b), 0);
	return 200;
}

static unsigned
route(struct ik_banksim *b, struct MHD_Connection *c, const char *url,
      const char *method, const struct req *r, const char **keyp,
      enum MHD_Result *ret)
{
	int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
	ik_err e;

	if (!check_client_cert(b, c)) {
		count(b, "unauthorized");
		*ret = reply_reason(c, 403, NULL, "client certificate required");
		return 403;
	}
	if (strcmp(url, "/health") == 0 && get) {
		*ret = reply(c, 200, "application/json", "{\"status\":\"UP\"}", 0);
		return 200;
	}
	if (b->oauth_id && post && strcmp(url, "/oauth/token") == 0)
		return oauth_token(b, c, r, ret);
	if (!check_token(b, c)) {
		count(b, "unauthorized");
		*ret = reply_reason(c, 401, NULL, "unauthorized");
		return 401;
	}
	if (r->too_big) {
		*ret = reply_reason(c, 413, NULL, "body too large");
		return 413;
	}
	if (post && (strcmp(url, "/debits") == 0 || strcmp(url, "/notifications") == 0)) {
		*keyp = idem_key(c);
		if (!check_sig(b, c, method, url, *keyp, &r->body)) {
			count(b, "unauthorized");
			*ret = reply_reason(c, 401, NULL, "bad or missing signature");
			return 401;
		}
		return strcmp(url, "/debits") == 0 ? debit(b, c, r, *keyp, ret) :
		    notify(b, c, r, *keyp, ret);
	}
	if (post && strcmp(url, OB_PATH) == 0) {
		*keyp = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-idempotency-key");
		if (*keyp && (!**keyp || strlen(*keyp) > 255 || strpbrk(*keyp, " \t")))
			*keyp = NULL;
		if (!check_sig(b, c, method, url, *keyp, &r->body)) {
			count(b, "unauthorized");
			*ret = ob_error(c, 401, "UK.OBIE.Signature.Invalid", "bad or missing signature");
			return 401;
		}
		return ob_payment(b, c, r, *keyp, ret);
	}
	if (post && strcmp(url, "/control") == 0)
		return control(b, c, r, ret);
	if (get && strcmp(url, "/control") == 0) {
		*ret = reply_json(c, 200, faults_json(b), 0);
		return 200;
	}
	if (get && strcmp(url, "/stats") == 0) {
		cJSON *o = ik_ledger_stats(b->ledger, &e);
		if (o)
			cJSON_AddNumberToObject(o, "maxConcurrent", (double)atomic_load(&b->busy_max));
		*ret = o ? reply_json(c, 200, o, 0) : reply_reason(c, 503, NULL, "ledger unavailable");
		return o ? 200 : 503;
	}
	if (get && (strcmp(url, "/ledger") == 0 || strcmp(url, "/notifications") == 0)) {
		char *s;
		if (ik_ledger_list(b->ledger, strcmp(url, "/notifications") == 0, &s, &e) != IK_OK) {
			*ret = reply_reason(c, 503, NULL, "ledger unavailable");
			return 503;
		}
		*ret = reply(c, 200, "application/x-ndjson", s, 0);
		free(s);
		return 200;
	}
	if (get && strncmp(url, DEBIT_PATH, DEBIT_PATH_LEN) == 0 && url[DEBIT_PATH_LEN]) {
		cJSON *o = NULL;
		int rc = ik_ledger_get(b->ledger, url + DEBIT_PATH_LEN, &o, &e);
		if (rc == IK_OK) {
			*ret = reply_json(c, 200, o, 0);
			return 200;
		}
		*ret = rc == IK_EMPTY ? reply_reason(c, 404, NULL, "no debit under this key")
		                      : reply_reason(c, 503, NULL, "ledger unavailable");
		return rc == IK_EMPTY ? 404 : 503;
	}
	if (strcmp(url, "/debits") == 0 || strcmp(url, "/notifications") == 0 ||
	    strcmp(url, "/control") == 0 || strcmp(url, "/stats") == 0 ||
	    strcmp(url, "/ledger") == 0 || strcmp(url, "/health") == 0) {
		*ret = reply_reason(c, 405, NULL, "method not allowed");
		return 405;
	}
	*ret = reply_reason(c, 404, NULL, "no such endpoint");
	return 404;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct ik_banksim *b = cls;
	struct req *r = *con_cls;
	enum MHD_Result ret = MHD_NO;
	const char *key = NULL;
	unsigned status;

	if (!r) {
		if (!(r = calloc(1, sizeof *r)))
			return MHD_NO;
		*con_cls = r;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!r->too_big && r->body.len + *upload_size > MAX_BODY)
			r->too_big = 1;
		if (!r->too_big && ik_buf_add(&r->body, upload, *upload_size) < 0)
			return MHD_NO;
		*upload_size = 0;
		return MHD_YES;
	}
	if (strcmp(method, "POST") == 0 && strcmp(url, "/control") != 0) {
		int now = atomic_fetch_add(&b->busy, 1) + 1, m = atomic_load(&b->busy_max);
		while (now > m && !atomic_compare_exchange_weak(&b->busy_max, &m, now))
			;
		status = route(b, c, url, method, r, &key, &ret);
		atomic_fetch_sub(&b->busy, 1);
	} else {
		status = route(b, c, url, method, r, &key, &ret);
	}
	if (status)
		log_req(method, url, status, key);
	else
		log_req(method, url, 0, key);
	return ret;
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
          enum MHD_RequestTerminationCode toe)
{
	struct req *r = *con_cls;
	if (r) {
		ik_buf_free(&r->body);
		free(r);
		*con_cls = NULL;
	}
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	vsnprintf(msg, sizeof msg, fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	ik_log(IK_LOG_WARN, "microhttpd", "error", msg, NULL);
}

/* ---- start/stop ---- */

static int
read_secret(const char *path, const char *what, struct ik_buf *b, ik_err *err)
{
	if (ik_read_file(path, MAX_SECRET * 16, b, err) != IK_OK)
		return ik_errwrap(err, "%s", what);
	if (b->len == 0)
		return ik_errf(err, IK_CONFIG, "%s %s: empty", what, path);
	return IK_OK;
}

int
ik_banksim_start(const struct ik_banksim_cfg *cfg, struct ik_banksim **out,
                 ik_err *err)
{
	struct sockaddr_in6 s6 = {0};
	struct sockaddr_in s4 = {0};
	struct sockaddr *sa;
	struct MHD_OptionItem opts[12];
	const union MHD_DaemonInfo *di;
	const char *addr = cfg->listen ? cfg->listen : "127.0.0.1";
	unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION |
	                 MHD_USE_ERROR_LOG;
	struct ik_banksim *b;
	int v6 = 0, n = 0, rc;
	size_t i;

	*out = NULL;
	if (sodium_init() < 0)
		return ik_errf(err, IK_SOFTWARE, "libsodium init failed");
	if (inet_pton(AF_INET, addr, &s4.sin_addr) == 1) {
		s4.sin_family = AF_INET;
		s4.sin_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&s4;
	} else if (inet_pton(AF_INET6, addr, &s6.sin6_addr) == 1) {
		s6.sin6_family = AF_INET6;
		s6.sin6_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&s6;
		v6 = 1;
		flags |= MHD_USE_IPv6;
	} else {
		return ik_errf(err, IK_CONFIG, "listen address %s: not a numeric IPv4 or IPv6 address", addr);
	}
	if (!!cfg->tls_cert != !!cfg->tls_key)
		return ik_errf(err, IK_CONFIG, "TLS needs both a certificate and a key");
	if (cfg->tls_client_ca && !cfg->tls_cert)
		return ik_errf(err, IK_CONFIG, "--tls-client-ca needs --tls-cert and --tls-key");
	if (cfg->tls_cert && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
		return ik_errf(err, IK_CONFIG, "this libmicrohttpd has no TLS support");

	if (!(b = calloc(1, sizeof *b)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	pthread_mutex_init(&b->mu, NULL);
	b->f = cfg->faults;
	b->f.decline = NULL;
	b->f.ndecline = 0;
	if (!b->f.error_status)
		b->f.error_status = 503;
	if (!b->f.notify_fail_status)
		b->f.notify_fail_status = 503;
	for (i = 0; i < cfg->faults.ndecline; i++)
		if (add_decline(&b->f.decline, &b->f.ndecline, cfg->faults.decline[i],
		                strlen(cfg->faults.decline[i])) < 0) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			goto fail;
		}
	seed_rng(b, cfg->faults.seed);

	if ((cfg->token_file && (rc = read_secret(cfg->token_file, "token file", &b->token, err)) != IK_OK) ||
	    (cfg->hmac_key_file && (rc = read_secret(cfg->hmac_key_file, "HMAC key file", &b->hmac, err)) != IK_OK) ||
	    (cfg->tls_cert && (rc = read_secret(cfg->tls_cert, "TLS certificate", &b->cert, err)) != IK_OK) ||
	    (cfg->tls_key && (rc = read_secret(cfg->tls_key, "TLS key", &b->key, err)) != IK_OK) ||
	    (cfg->tls_client_ca && (rc = read_secret(cfg->tls_client_ca, "TLS client CA", &b->client_ca, err)) != IK_OK))
		goto fail;
	if (cfg->oauth_client_id) {
		if (!cfg->oauth_client_secret_file) {
			rc = ik_errf(err, IK_CONFIG, "--oauth-client-id needs --oauth-client-secret-file");
			goto fail;
		}
		if ((rc = read_secret(cfg->oauth_client_secret_file, "OAuth2 client secret file",
		                      &b->oauth_secret, err)) != IK_OK)
			goto fail;
		if (!(b->oauth_id = strdup(cfg->oauth_client_id))) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			goto fail;
		}
		b->oauth_ttl_s = cfg->oauth_expires_in > 0 ? cfg->oauth_expires_in : 3600;
	}
	if ((rc = ik_ledger_open(cfg->db_path, &b->ledger, err)) != IK_OK)
		goto fail;

	opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_SOCK_ADDR, 0, sa };
	opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_NOTIFY_COMPLETED,
	                                     (intptr_t)completed, b };
	opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_LIMIT,
	                                     cfg->max_conns ? cfg->max_conns : 256, NULL };
	opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_TIMEOUT, 120, NULL };
	if (cfg->tls_cert) {
		flags |= MHD_USE_TLS;
		opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0, b->cert.p };
		opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0, b->key.p };
		if (b->client_ca.p)
			opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_TRUST, 0, b->client_ca.p };
	}
	opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };

	/* The logger must come first, or early messages bypass it. */
	b->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, b,
	                        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, b,
	                        MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
	if (!b->d) {
		rc = ik_errf(err, IK_CONFIG, "cannot listen on %s port %d (in use, or a bad TLS certificate or key)",
		             addr, cfg->port);
		goto fail;
	}
	di = MHD_get_daemon_info(b->d, MHD_DAEMON_INFO_BIND_PORT);
	b->port = di ? di->port : cfg->port;
	snprintf(b->url, sizeof b->url, "%s://%s%s%s:%d", cfg->tls_cert ? "https" : "http",
	         v6 ? "[" : "", addr, v6 ? "]" : "", b->port);
	*out = b;
	return IK_OK;
fail:
	ik_banksim_stop(b);
	return rc;
}

int
ik_banksim_port(const struct ik_banksim *b)
{
	return b->port;
}

const char *
ik_banksim_url(const struct ik_banksim *b)
{
	return b->url;
}

void
ik_banksim_stop(struct ik_banksim *b)
{
	if (!b)
		return;
	atomic_store(&b->stopping, 1);
	if (b->d)
		MHD_stop_daemon(b->d);
	ik_ledger_close(b->ledger);
	ik_banksim_faults_free(&b->f);
	ik_buf_wipe_free(&b->token);
	ik_buf_wipe_free(&b->hmac);
	ik_buf_wipe_free(&b->cert);
	ik_buf_wipe_free(&b->key);
	ik_buf_wipe_free(&b->client_ca);
	ik_buf_wipe_free(&b->oauth_secret);
	free(b->oauth_id);
	if (b->toks)
		sodium_memzero(b->toks, b->ntoks * sizeof *b->toks);
	free(b->toks);
	free(b->kf);
	pthread_mutex_destroy(&b->mu);
	free(b);
}
