/* pg_store.h: what the PostgreSQL store's files share, each calling only
 * those listed after it (store_postgres.c: the port's ops, the store's
 * blocking statements, opening and closing; store_postgres_init.c:
 * idemp-init's part, the schema and the purge; store_postgres_outbox_stats.c:
 * the outbox's lag gauge; store_postgres_outbox.c: its outbox; pg_conn.c:
 * the connection and its statements, and the claims and finishes in flight,
 * libpq's pipeline mode; pg_slot.c: the outbox's slot as each connection
 * sees it; pg_repl.c: idemp-init's look at the server's replication;
 * pg_url.c: the store URL; pg_err.c: its errors as outcomes, a server that
 * does not answer in time one of them).  Nothing else includes it but the
 * factory (open_store.c), for the constructor. */
#ifndef IK_PG_STORE_H
#define IK_PG_STORE_H

#include <stdint.h>

#include "core/err.h"
#include "dl/pq_dl.h"
#include "store/store.h"

#define MAX_RETRIES 5          /* serialization failures / deadlocks */
/* The server's clock, epoch ms. */
#define NOW_MS "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

/* The store URL (pg_url.c: postgres://..., postgresql://..., or
 * postgres: followed by a libpq key=value string or nothing), read with
 * libpq's own parser (PQconninfoParse), never by searching the text.
 *
 * Rules: which options are secret is libpq's word (dispchar "*": password,
 * sslpassword), and a secret is never copied into a message or into the
 * display form.  libpq's own messages about a string it cannot parse may
 * quote any part of it, a password's included, so they are shown with
 * their quoted parts cut out.  A URL whose password holds an unencoded '@'
 * or '/' is read by libpq as another host, port or database name, which
 * its connect errors then quote: refused (IK_CONFIG) before anything
 * connects, without quoting it.  Needs ik_pq_load (pq_dl.h) first.
 */
#define IK_PG_TABLE_MAX 48

struct ik_pg_url {
	char *conninfo;      /* for libpq: the URL without table=; wiped on free */
	char table[IK_PG_TABLE_MAX + 1];
	int secret;          /* a password (or another secret option) is in it */
	char *display;       /* for messages and output: secrets as *** */
};

/* url is the whole store URL.  IK_OK, IK_CONFIG (a bad URL, a bad
 * table=, a misread password: err says which without quoting it) or
 * IK_SOFTWARE. */
int ik_pg_url_parse(const char *url, struct ik_pg_url *u, ik_err *err);
void ik_pg_url_free(struct ik_pg_url *u);

/* The adapter's constructor, for the factory (open_store.c). */
int ik_store_postgres_open(const char *url, struct ik_store *s, ik_err *err);
/* The URL as messages show it (malloc'd; secrets as ***, from libpq's
 * parser), *secret set when it holds one. */
char *ik_store_postgres_display(const char *url, int *secret);

enum { Q_CLAIM, Q_GET, Q_FINISH, Q_RENOTIFIED, Q_RELEASE, Q_FORGET, Q_STATS, Q_RENEW, Q_NOTE,
       Q_N };

struct pop;

struct pg {
	PGconn *conn;
	struct ik_pg_url u;   /* its conninfo holds the password: wiped on close */
	char qtable[IK_PG_TABLE_MAX + 3];   /* quoted */
	char *sql[2][Q_N];    /* [has_history] */
	unsigned prepared;    /* bit per statement and variant, on this connection */
	int has_history;      /* the table has the history column (schema >= 3) */
	int checked;          /* has_history is known on this connection */
	int warned;           /* that it has not, once */
	int waited;           /* waited for this outage already */
	int connect_failed;   /* the last connect (or reconnect) failed */
	int timeout_ms;       /* IDEMKIT_PG_TIMEOUT: an answer's longest wait */
	int64_t batch_until;  /* the batch out is lost when unanswered by then */
	int group, in_tx, failed;
	int64_t sent_boot_ms; /* the boot clock just before run() last sent a statement */
	int obx_slot;         /* the outbox's slot exists (checked per connection) */
	/* the relay's read-ahead from the slot (store_postgres_outbox.c) */
	struct ik_outbox_ev *obx_ahead;
	size_t obx_n, obx_head;
	uint64_t obx_advanced;
	/* in flight (pipeline mode): ops queued for the next batch, the one
	 * batch sent and not yet answered, and those answered whose callback
	 * is still to come; active counts every op started and not called
	 * back. */
	struct pop *queued, **queued_last, *batch, *ans, *done, **done_last;
	size_t active;
};

/* pg_err.c */
int ik_pg_err(struct pg *p, PGresult *r, const char *doing, ik_err *err);
void ik_pg_trim(char *s);
PGresult *ik_pg_wait(struct pg *p, int sent, const char *doing, ik_err *err);
/* PQexecParams with n text parameters, its answer waited for as ik_pg_wait
 * does: the result (an error result included), or NULL with err set. */
PGresult *ik_pg_exec(struct pg *p, const char *sql, int n, const char *const *params,
    int binary, const char *doing, ik_err *err);
int ik_pg_late(struct pg *p, const char *doing, ik_err *err);
int ik_pg_connect_config(const char *msg);

/* pg_conn.c: the connection and its statements */
int ik_pg_prepare(struct pg *p, int which, int n, const char *doing, char *name, ik_err *err);
int64_t ik_pg_col_i64(PGresult *r, int row, int col);
void ik_pg_read_record(PGresult *r, int row, struct ik_record *rec);
/* and for idemp-init's part: the connection made (or made again), the
 * history column looked for, a statement with no parameters and no rows, a
 * rollback, a statement with the table's names (malloc'd; NULL when out of
 * memory). */
int ik_pg_conn_ok(struct pg *p, ik_err *err);
int ik_pg_history_column(struct pg *p, ik_err *err);
int ik_pg_exec_sql(struct pg *p, const char *q, const char *doing, ik_err *err);
void ik_pg_rollback(struct pg *p);
char *ik_pg_with_table(struct pg *p, const char *fmt);

/* store_postgres_init.c: the port's init (idemp-init). */
int ik_pg_init(struct ik_store *st, ik_err *err);

/* pg_conn.c: the in-flight ops (store.h), and for the store: a blocking
 * call first waits for the batch out (drain), close frees what is left. */
int ik_pg_claim_start(struct ik_store *st, const struct ik_claim_req *req,
    struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err);
int ik_pg_finish_start(struct ik_store *st, const struct ik_finish_req *req, ik_store_cb cb,
    void *arg, ik_err *err);
int ik_pg_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err);
void ik_pg_warm(struct ik_store *st);
size_t ik_pg_active(struct ik_store *st);
void ik_pg_drain(struct pg *p);
void ik_pg_pops_free(struct pop *o);

/* pg_slot.c: with $IDEMKIT_OUTBOX set (on), the slot checked per
 * connection (check, which drops the relay's read-ahead: close) and claims
 * refused without it (claim_gate); the slot's name, and a statement (q). */
int ik_pgo_on(void);
int ik_pgo_check(struct pg *p, ik_err *err);
int ik_pgo_claim_gate(struct pg *p, ik_err *err);
void ik_pgo_close(struct pg *p);
void ik_pgo_slot_name(const struct pg *p, char out[IK_PG_TABLE_MAX + 16]);
int ik_pgo_q(struct pg *p, const char *sql, int n, const char *const *params, int binary,
    const char *doing, PGresult **out, ik_err *err);

/* store_postgres_outbox.c: the finish and re-notification statements made
 * to emit their event (wrap, at open), idemp-claim --check-store's look at
 * the slot (claim_check), idemp-init's part (init), and the outbox ops. */
int ik_pgo_wrap(struct pg *p, int which, char **sql, ik_err *err);
int ik_pgo_claim_check(struct ik_store *st, ik_err *err);
int ik_pgo_init(struct pg *p, ik_err *err);
int ik_pgo_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err);
int ik_pgo_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
    ik_err *err);
int ik_pgo_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev,
    size_t n, int64_t now_ms, ik_err *err);
int ik_pgo_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n,
    ik_err *err);
/* and for the lag gauge: the publication pgoutput reads, the zero of the
 * server's timestamps, a statement on the slot (slot_query: a slot another
 * backend holds is waited for), the connection made ready, the checkpoint,
 * an open resync window and its statement. */
#define PUBLICATION "idemkit_outbox"
#define PG_EPOCH_MS 946684800000LL     /* 2000-01-01, PostgreSQL's timestamps' zero */
int ik_pgo_slot_query(struct pg *p, const char *sql, int n, const char *const *params,
    int binary, const char *doing, const char *slot, PGresult **out, ik_err *err);
int ik_pgo_ready(struct pg *p, ik_err *err);
int ik_pgo_checkpoint(struct pg *p, uint64_t *commit, uint64_t *msg, ik_err *err);
int ik_pgo_resync_window(struct pg *p, char from[3][160], char to[24], ik_err *err);
char *ik_pgo_resync_sql(const struct pg *p, const char *outer);

/* store_postgres_outbox_stats.c: the outbox's lag gauge. */
int ik_pgo_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out,
    ik_err *err);

/* pg_repl.c: warns (stderr) when the server's replication would lose
 * finished records on a failover; never fails. */
void ik_pg_replication_check(struct pg *p);

#endif
