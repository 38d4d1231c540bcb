/* bankapi.h: what charge-debit and charge-notify share: one HTTP endpoint
 * with its credentials, the idempotency-key header, the request signature,
 * and reading the bank's answer.
 *
 * Configuration comes from options and from IDEMKIT_<P>_* variables
 * (P = BANK or NOTIFY): _URL, _TOKEN, _TOKEN_FILE, _HMAC_KEY_FILE,
 * _KEY_HEADER, _CACERT, _CLIENT_CERT, _CLIENT_KEY, _PROXY, _DECLINED, _RETRY,
 * _REQUEST, _REF, _REASON, and OAuth2 client credentials (RFC 6749 4.4,
 * client authentication with HTTP Basic): _OAUTH_TOKEN_URL,
 * _OAUTH_CLIENT_ID, _OAUTH_CLIENT_SECRET_FILE, _OAUTH_SCOPE.  The access
 * token is fetched on the first call, reused until shortly before its
 * expires_in, and fetched again once when the bank answers 401.
 *
 * A bank is integrated by configuration: jq programs (jqprog.h) build the
 * request body from the event (with $key, $amountMajor, $attempt, $ref),
 * take the reference out of a 2xx body, and the reason out of a refusal.
 * A 2xx is the bank's word that the money moved: a reference that cannot
 * be found, or a body that did not arrive whole (too large, cut short), is
 * a warning, never a failure.
 *
 * Secret files (_TOKEN_FILE, _HMAC_KEY_FILE, _OAUTH_CLIENT_SECRET_FILE, and
 * the _CLIENT_KEY libcurl reads) are refused when group or others may read
 * them.  A proxy is used only when _PROXY names one, and only for https://
 * (http.h): never the environment's http_proxy, HTTPS_PROXY or ALL_PROXY.
 *
 * The bank decides DECLINED only explicitly: the statuses in the declined
 * list (default 402,422) are its refusals; those in the retry list
 * (default 408,409,425,429,5xx) are transient; every other non-2xx
 * (401, 403, 404, any 4xx not listed, 1xx, 3xx) is CONFIG: the request
 * never reached a debit endpoint that would take it, so the message is
 * left and an operator is alarmed, and nothing is recorded as failed.  Secrets never come from argv; IDEMKIT_<P>_TOKEN
 * is copied, then wiped from the environment (so /proc/PID/environ no
 * longer shows it); every copy is wiped on close.
 */
#ifndef IK_BANKAPI_H
#define IK_BANKAPI_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "bank/jqprog.h"
#include "conn/http.h"
#include "core/err.h"
#include "core/event.h"
#include "core/util.h"

#define IK_BANKAPI_REASON_MAX 200

struct ik_bankapi_opts {
	const char *url;           /* NULL: $IDEMKIT_<P>_URL */
	const char *key_header;    /* NULL: $IDEMKIT_<P>_KEY_HEADER, else Idempotency-Key */
	const char *replay_header; /* "NAME: VALUE" a 2xx carries when it answers a key
	                              seen before; NULL: $IDEMKIT_<P>_REPLAY_HEADER,
	                              else IK_BANKAPI_REPLAY_DEFAULT */
	const char *cacert;        /* NULL: $IDEMKIT_<P>_CACERT, else the system's */
	const char *client_cert;   /* mutual TLS; NULL: $IDEMKIT_<P>_CLIENT_CERT */
	const char *client_key;    /* NULL: $IDEMKIT_<P>_CLIENT_KEY; never readable by
	                              group or others */
	long connect_timeout_ms;   /* 0: 3000 */
	long timeout_ms;           /* 0: 10000 */
	const char *declined;      /* status list; NULL: $IDEMKIT_<P>_DECLINED, else 402,422 */
	const char *retry;         /* NULL: $IDEMKIT_<P>_RETRY, else 408,409,425,429,5xx */
	const char *request;       /* jq; NULL: $IDEMKIT_<P>_REQUEST, else the default body */
	const char *ref;           /* jq; NULL: $IDEMKIT_<P>_REF, else .ref */
	const char *reason;        /* jq; NULL: $IDEMKIT_<P>_REASON, else .reason/.message/.error/text */
};

#define IK_BANKAPI_DECLINED_DEFAULT "402,422"
#define IK_BANKAPI_RETRY_DEFAULT    "408,409,425,429,5xx"

struct ik_bankapi {
	const char *prefix;        /* "BANK", "NOTIFY" */
	char *url, *key_header, *cacert, *client_cert, *client_key;
	char *replay_name, *replay_value;   /* the replay header, split */
	char *path;                /* the URL's path[?query], as signed */
	long connect_timeout_ms, timeout_ms;
	struct ik_buf auth;        /* "Authorization: Bearer …" or empty; secret */
	struct ik_buf hmac_key;    /* empty: no signature; secret */
	struct ik_http *http;
	unsigned char cls[600];    /* status -> IK_DECLINED / IK_TEMPFAIL, else 0 */
	struct ik_jq *request, *ref, *reason;   /* NULL: the defaults */
	char *proxy;               /* IDEMKIT_<P>_PROXY (https only), or NULL */
	char *oauth_url, *oauth_id, *oauth_scope;  /* oauth_url NULL: no OAuth2 */
	struct ik_buf oauth_secret;               /* the client secret; secret */
	int64_t oauth_refresh_at;                 /* epoch ms; 0: no token yet */
	unsigned token_gen;                       /* bumped by each token fetched */
	/* the last token fetch failed: answered from here until retry_at */
	unsigned oauth_failures;                  /* in a row; 0: none */
	int64_t oauth_failed_at, oauth_retry_at;  /* epoch ms */
	ik_err oauth_err;
};

/* One call to the endpoint, many of which may be in flight at once (one
 * thread: ik_bankapi_run drives them).  The caller fills the first part
 * and keeps the struct, key, body and res alive until done is called. */
typedef void (*ik_bankapi_done)(void *arg, int rc, struct ik_http_res *res,
                                const ik_err *err);
struct ik_bankapi_call {
	struct ik_bankapi *api;
	const char *key;             /* the idempotency key's value */
	const char *body;            /* JSON, NUL-terminated */
	struct ik_http_res *res;
	/* With env set, each send (the first, and the one after a 401) is
	 * preceded by ik_bankapi_lease_check(env, need_ms, margin_ms). */
	const cJSON *env;
	int64_t need_ms, margin_ms;
	/* rc, res and err as ik_bankapi_post's; with rc IK_OK, err is NULL,
	 * or, for a 2xx whose body did not arrive whole (res holds the status
	 * and an empty body), says why. */
	ik_bankapi_done done;
	void *arg;
	/* private */
	int reauth;
	unsigned token_gen;
};

/* Takes the secrets out of the environment at once (call early in main,
 * before anything can fail): IDEMKIT_<P>_TOKEN is copied and wiped. */
void ik_bankapi_take_env(struct ik_bankapi *a, const char *prefix);

/* Completes the configuration and opens the HTTP handle, without any
 * network call.  IK_OK, or IK_CONFIG (no URL, a plain http:// URL to a host
 * that is not loopback, unreadable token or key file, bad header name, bad
 * status lists) or IK_SOFTWARE, with err; never a secret in err.
 * A bearer token or an HMAC key never travels in cleartext: http:// is
 * refused here, before any connection, unless the host is loopback. */
int ik_bankapi_open(struct ik_bankapi *a, const struct ik_bankapi_opts *o,
                    ik_err *err);
void ik_bankapi_close(struct ik_bankapi *a);

/* Sends k's request without waiting for the answer: the token (got or
 * refreshed first when needed, blocking), the lease check, the key header,
 * the signature made now.  IK_OK: k->done will be called once, from
 * ik_bankapi_run; otherwise nothing was sent (IK_LEASE_SHORT among the
 * codes) and done is not called. */
int ik_bankapi_submit(struct ik_bankapi_call *k, ik_err *err);

/* --dry-run: the request ik_bankapi_submit would send for key and body,
 * as text for a person, without sending anything: "POST URL", the headers
 * with the secrets masked (the bearer token and the signature as ***; an
 * OAuth2 token is not fetched), a blank line, the body.  *out malloc'd.
 * IK_OK or IK_SOFTWARE. */
int ik_bankapi_dry_run(struct ik_bankapi *a, const char *key, const char *body, char **out,
                       ik_err *err);

/* Moves the calls in flight on, running done for each one answered; waits
 * up to timeout_ms (-1: no limit) when none is, or until fd (>= 0, e.g.
 * stdin) is readable: *readable says so.  IK_OK or IK_SOFTWARE. */
int ik_bankapi_run(struct ik_bankapi *a, int fd, int timeout_ms, int *readable,
                   ik_err *err);

/* POST body (JSON) to the URL with the key header = key, the bearer
 * token and the signature when configured.  As ik_http_do.  With OAuth2,
 * first gets a token when there is none or it is about to expire (the
 * token endpoint's refusal (400, 401) is IK_CONFIG, 429/5xx IK_TEMPFAIL),
 * and on a 401 from the bank gets a new one and sends once more.  A submit
 * and a wait for that call. */
int ik_bankapi_post(struct ik_bankapi *a, const char *key, const char *body,
                    struct ik_http_res *res, ik_err *err);

/* 1 when a 2xx says it answers a request whose key the bank had seen (a
 * replay: the first answer was lost, a crash window was hit): the replay
 * header with its value (the value compared without case), or a JSON body
 * whose "replayed" is true; else 0. */
int ik_bankapi_replayed(const struct ik_bankapi *a, const struct ik_http_res *res);
#define IK_BANKAPI_REPLAY_DEFAULT "Idempotent-Replayed: true"   /* Stripe's */

/* What status means: IK_OK (2xx), IK_DECLINED, IK_TEMPFAIL or IK_CONFIG,
 * from the lists given to ik_bankapi_open. */
int ik_bankapi_classify(const struct ik_bankapi *a, long status);

/* Parses a status list ("402,422", "5xx" for 500-599, "4xx") into cls,
 * marking each status with code.  0, or -1 with why filled (a status
 * outside 400-599, a 2xx, garbage). */
int ik_bankapi_status_list(const char *list, unsigned char cls[600], int code,
                           char *why, size_t whysz);

/* No bank call on a dying lease.  IK_OK when env has no claim (the
 * re-notify path: no claim to protect) or its claim has at least need_ms +
 * margin_ms left now, measured on this machine's boot clock from when the
 * claim was sent (envelope.h ik_env_lease_left); else IK_LEASE_SHORT, with
 * err saying how much was left and how much was needed, or why what is
 * left cannot be proven (nothing must be sent then).  need_ms is the most
 * the call can take (its timeout, with its retries and backoffs); the
 * margin covers what must still happen under the lease after it: writing
 * the envelope and idemp-done's fenced write. */
#define IK_BANKAPI_LEASE_MARGIN_MS 2000
int ik_bankapi_lease_check(const cJSON *env, int64_t need_ms, int64_t margin_ms,
                           ik_err *err);

/* --stream: how many requests a step keeps in flight by default, and the
 * most it takes (charge-debit(1) says why this number). */
#define IK_BANKAPI_INFLIGHT_DEFAULT 64
#define IK_BANKAPI_INFLIGHT_MAX 1024

/* The in-flight count: opt (--inflight's value) when set, else
 * $IDEMKIT_<P>_INFLIGHT, else the default.  IK_OK, or IK_USAGE (a bad
 * --inflight) or IK_CONFIG (a bad variable) after a one-line complaint. */
int ik_bankapi_inflight(const char *prefix, const char *opt, size_t *out);

/* The command line charge-debit and charge-notify share: their common long
 * options (IK_BANKAPI_LONGOPTS, for a struct option array; --ref is the
 * debit's only, IK_BANKAPI_LONGOPT_REF) and one handler for them, so the
 * two commands cannot drift apart in what an option means. */
enum {
	IK_BANKAPI_O_CONNECT = 256, IK_BANKAPI_O_TIMEOUT, IK_BANKAPI_O_DECLINED,
	IK_BANKAPI_O_RETRY, IK_BANKAPI_O_MARGIN, IK_BANKAPI_O_CHECK, IK_BANKAPI_O_REQUEST,
	IK_BANKAPI_O_REF, IK_BANKAPI_O_REASON, IK_BANKAPI_O_CCERT, IK_BANKAPI_O_CKEY,
	IK_BANKAPI_O_INFLIGHT, IK_BANKAPI_O_DRYRUN, IK_BANKAPI_O_REPLAY,
	IK_BANKAPI_O_END      /* a command's own options start here */
};
#define IK_BANKAPI_SHORTOPTS "u:k:c:"
#define IK_BANKAPI_LONGOPTS \
	{ "url", required_argument, NULL, 'u' }, \
	{ "key-header", required_argument, NULL, 'k' }, \
	{ "cacert", required_argument, NULL, 'c' }, \
	{ "connect-timeout", required_argument, NULL, IK_BANKAPI_O_CONNECT }, \
	{ "timeout", required_argument, NULL, IK_BANKAPI_O_TIMEOUT }, \
	{ "declined-status", required_argument, NULL, IK_BANKAPI_O_DECLINED }, \
	{ "retry-status", required_argument, NULL, IK_BANKAPI_O_RETRY }, \
	{ "lease-margin", required_argument, NULL, IK_BANKAPI_O_MARGIN }, \
	{ "check", no_argument, NULL, IK_BANKAPI_O_CHECK }, \
	{ "request", required_argument, NULL, IK_BANKAPI_O_REQUEST }, \
	{ "reason", required_argument, NULL, IK_BANKAPI_O_REASON }, \
	{ "client-cert", required_argument, NULL, IK_BANKAPI_O_CCERT }, \
	{ "client-key", required_argument, NULL, IK_BANKAPI_O_CKEY }, \
	{ "inflight", required_argument, NULL, IK_BANKAPI_O_INFLIGHT }, \
	{ "dry-run", no_argument, NULL, IK_BANKAPI_O_DRYRUN }
#define IK_BANKAPI_LONGOPT_REF { "ref", required_argument, NULL, IK_BANKAPI_O_REF }
#define IK_BANKAPI_LONGOPT_REPLAY { "replay-header", required_argument, NULL, IK_BANKAPI_O_REPLAY }

struct ik_bankapi_cli {
	struct ik_bankapi_opts opts;
	int64_t lease_margin_ms;
	const char *inflight;      /* --inflight's value, or NULL */
	int check;                 /* --check */
	int dry_run;               /* --dry-run */
	/* the bank API opened on first use (ik_bankapi_cli_open) */
	int opened;
	ik_err open_err;
};
/* The defaults: timeouts 3 s and 10 s, the lease margin. */
void ik_bankapi_cli_init(struct ik_bankapi_cli *c);
/* 1 when ch (from getopt_long) was one of the shared options, taken into
 * c; 0 when it is none of them; -1 after a one-line complaint about its
 * value (the command exits 64). */
int ik_bankapi_cli_opt(struct ik_bankapi_cli *c, int ch, const char *arg);
/* Opens a with c's options the first time it is asked (a failure is said
 * once on stderr and kept): IK_OK, or the kept failure's code with *why. */
int ik_bankapi_cli_open(struct ik_bankapi *a, struct ik_bankapi_cli *c, const ik_err **why);

/* --dry-run: reads one envelope or bare event from fd and builds the
 * request the command would send for it (the key the chargeId plus
 * suffix: "" for the debit, ":notify" with the debit's ref for the
 * notification), as ik_bankapi_dry_run's text in *out.  Nothing is sent,
 * no store is opened, no lease is checked.  IK_OK, or IK_DATAERR (no or a
 * bad event), IK_CONFIG (the configuration, the jq program), IK_SOFTWARE. */
int ik_bankapi_cli_dry_run(struct ik_bankapi *a, struct ik_bankapi_cli *c, int fd,
                           const char *suffix, char **out, ik_err *err);

/* An option's status list, as ik_opt_duration: 0, or -1 after a one-line
 * complaint naming the option (the command then exits 64). */
int ik_bankapi_opt_status(const char *opt, const char *list);

/* The amount in major units as an exact decimal string, from ISO 4217's
 * minor-unit exponent of currency (2500 INR "25.00", 2500 JPY "2500",
 * 2500 BHD "2.500"; an unknown code has 2), in integer arithmetic. */
void ik_bankapi_amount_major(long long amount, const char *currency, char out[32]);

/* The request body for ev: the --request program run on event (the
 * message body's JSON text, unknown fields included) with $key, $amountMajor, $attempt
 * (claim.attempt or null) and $ref (the debit's ref or null); without one,
 * {chargeId, accountId, amount, currency, chargeType} plus debitRef when
 * ref is set.  *body is malloc'd.  IK_OK, IK_CONFIG (the program failed or
 * yielded nothing) or IK_SOFTWARE. */
int ik_bankapi_body(struct ik_bankapi *a, const char *event, const struct ik_event *ev,
                    const char *key, const cJSON *attempt, const char *ref,
                    char **body, ik_err *err);

/* The bank's reference in a 2xx answer: the --ref program (default .ref)
 * on the JSON body; a string of 1-128 printable characters, or an integer
 * below 2^53 in magnitude (what a double holds exactly), is the ref (*ref,
 * malloc'd); anything else leaves *ref NULL and says why in warn ("" when
 * a ref was found).  Never fails but on ENOMEM (-1). */
int ik_bankapi_ref(struct ik_bankapi *a, const struct ik_http_res *res, char **ref,
                   char *warn, size_t warnsz);

/* The reason in an error answer: the --reason program's string when one
 * is set and yields one, else "reason", "message" or "error" of a JSON
 * body, else the body's first line; bounded to IK_BANKAPI_REASON_MAX bytes
 * cut on a character boundary, valid UTF-8 (utf8.h) and with control
 * characters replaced; "" when there is none. */
void ik_bankapi_reason(struct ik_bankapi *a, const struct ik_http_res *res,
                       char out[IK_BANKAPI_REASON_MAX + 1]);

/* The request signature, scheme IDEMKIT-HMAC-SHA256 (charge-debit(1)):
 * the hex HMAC-SHA256, keyed with the HMAC key file's bytes, of
 *   "IDEMKIT-HMAC-SHA256\n" METHOD "\n" PATH "\n" KEY "\n" T "\n" hex(SHA-256(body))
 * with PATH the URL's path (and "?query" when there is one), KEY the
 * idempotency key's value and T the X-Idemkit-Timestamp (unix seconds).
 * Signing the key and the path means a captured request replayed under
 * another Idempotency-Key, or to another endpoint, no longer verifies.
 * Writes 64 hex digits and a NUL into out. */
#define IK_BANKAPI_SIG_HEX (2 * 32 + 1)
void ik_bankapi_sign(const unsigned char *key, size_t keylen, const char *method,
                     const char *path, const char *idem_key, long long t,
                     const char *body, size_t len, char out[IK_BANKAPI_SIG_HEX]);

#endif
