/* banksim.h: bank-sim, the core-banking and notification-gateway
 * simulator used by the demo, the tests and a user's staging.
 *
 * Two parts, both private to bank-sim:
 *  - the ledger (banksim_ledger.c): SQLite, debits UNIQUE on the
 *    idempotency key, notifications counted per key, and the counters
 *    behind GET /stats.  A debit is one BEGIN IMMEDIATE transaction
 *    (look up the key, then insert), so concurrent requests and even
 *    several processes on one file never debit a key twice.
 *  - the HTTP server (banksim_server.c) on libmicrohttpd: never a
 *    hand-written HTTP parser.
 */
#ifndef IK_BANKSIM_H
#define IK_BANKSIM_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/err.h"
#include "core/event.h"

/* ---- ledger ---- */

struct ik_ledger;

enum ik_ledger_res {
	IK_LEDGER_NEW,        /* debited now */
	IK_LEDGER_REPLAY,     /* the key was debited before with the same request */
	IK_LEDGER_MISMATCH,   /* the key was used before with a different request */
	IK_LEDGER_DECLINED,   /* a new key for a declined account: nothing debited */
};

struct ik_ledger_debit {
	int res;                   /* enum ik_ledger_res */
	char ref[32];              /* "TXN-…" of the (original) debit */
	int64_t created_at;        /* epoch ms of the original debit */
};

/* Opens (creating, mode 0600) the ledger file.  IK_OK or IK_CONFIG. */
int ik_ledger_open(const char *path, struct ik_ledger **out, ik_err *err);
void ik_ledger_close(struct ik_ledger *l);

/* One debit attempt under key.  declined: the account is refused (applies
 * to a new key only; a replay of a debited key still answers the original
 * result). */
int ik_ledger_debit(struct ik_ledger *l, const char *key,
                    const struct ik_event *ev, int declined,
                    struct ik_ledger_debit *out, ik_err *err);

/* Record an accepted notification; *count gets how many times this key
 * was accepted so far. */
int ik_ledger_notify(struct ik_ledger *l, const char *key, const char *body,
                     int64_t *count, ik_err *err);

/* counters: attempts, replays, declines, mismatches, errors, hangs,
 * unauthorized, badRequests, notificationAttempts, notificationFailures. */
int ik_ledger_bump(struct ik_ledger *l, const char *counter, ik_err *err);

/* {"attempts":N,"debits":N,...}; NULL with err on failure. */
cJSON *ik_ledger_stats(struct ik_ledger *l, ik_err *err);
/* All debits (or notifications) as one JSON object per line, oldest first. */
int ik_ledger_list(struct ik_ledger *l, int notifications, char **ndjson,
                   ik_err *err);
/* The debit under key as an object; IK_EMPTY when absent. */
int ik_ledger_get(struct ik_ledger *l, const char *key, cJSON **out,
                  ik_err *err);

/* ---- server ---- */

/* Faults, changeable at run time through POST /control. */
struct ik_banksim_faults {
	char **decline;            /* accounts refused with 402 */
	size_t ndecline;
	int64_t latency_ms;        /* added before answering a POST */
	double error_rate;         /* fraction of debits answered error_status */
	int error_status;          /* default 503 */
	int hang;                  /* debits are never answered */
	double notify_fail_rate;   /* fraction of notifications answered notify_fail_status */
	int notify_fail_status;    /* default 503 */
	int notify_hang;           /* notifications are never answered */
	int oauth_reject;          /* every bearer token is refused (401) */
	uint64_t seed;             /* for the rates; 0: random */
};

struct ik_banksim_cfg {
	const char *db_path;
	const char *listen;        /* numeric address; default 127.0.0.1 */
	int port;                  /* 0: any free port */
	const char *token_file;    /* NULL: no bearer token required */
	const char *hmac_key_file; /* NULL: no signature required */
	const char *tls_cert, *tls_key;  /* PEM files; both or neither */
	const char *tls_client_ca; /* PEM CA: require client certificates it signed */
	const char *oauth_client_id;          /* OAuth2 client credentials: POST */
	const char *oauth_client_secret_file; /* /oauth/token issues bearer tokens */
	int64_t oauth_expires_in;             /* seconds; 0: 3600 */
	unsigned max_conns;        /* 0: 256 */
	struct ik_banksim_faults faults;  /* copied; decline list duplicated */
};

struct ik_banksim;

int ik_banksim_start(const struct ik_banksim_cfg *cfg, struct ik_banksim **out,
                     ik_err *err);
/* The port actually bound, and the base URL ("http://127.0.0.1:PORT"). */
int ik_banksim_port(const struct ik_banksim *b);
const char *ik_banksim_url(const struct ik_banksim *b);
/* Stops answering, wakes hanging requests, wipes secrets, frees. */
void ik_banksim_stop(struct ik_banksim *b);

/* Parses "ACC-1,ACC-2" into f->decline (replacing it); 0 or -1 ENOMEM. */
int ik_banksim_set_decline(struct ik_banksim_faults *f, const char *csv);
void ik_banksim_faults_free(struct ik_banksim_faults *f);

#endif
