/* pg_store.h: what the PostgreSQL store's files share
 * (store_postgres.c: the store and its blocking statements; pg_pipe.c: its
 * claims and finishes in flight, libpq's pipeline mode; pg_repl.c:
 * idemp-init's look at the server's replication).  Nothing else includes
 * it. */
#ifndef IK_PG_STORE_H
#define IK_PG_STORE_H

#include <stdint.h>

#include "pg_url.h"
#include "pq_dl.h"
#include "store.h"

#define MAX_RETRIES 5          /* serialization failures / deadlocks */

enum { Q_CLAIM, Q_GET, Q_FINISH, Q_RENOTIFIED, Q_RELEASE, Q_FORGET, Q_STATS, Q_RENEW, Q_N };

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
	int group, in_tx, failed;
	/* in flight (pipeline mode): ops queued for the next batch, the one
	 * batch sent and not yet answered, and those answered whose callback
	 * is still to come; active counts every op started and not called
	 * back. */
	struct pop *queued, **queued_last, *batch, *ans, *done, **done_last;
	size_t active;
};

/* store_postgres.c */
int ik_pg_err(struct pg *p, PGresult *r, const char *doing, ik_err *err);
int ik_pg_prepare(struct pg *p, int which, int n, const char *doing, char *name, ik_err *err);
int64_t ik_pg_col_i64(PGresult *r, int row, int col);
void ik_pg_read_record(PGresult *r, int row, struct ik_record *rec);

/* pg_pipe.c: the in-flight ops (store.h), and for the store: a blocking
 * call first waits for the batch out (drain), close frees what is left. */
int ik_pg_claim_start(struct ik_store *st, const struct ik_claim_req *req,
    struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err);
int ik_pg_finish_start(struct ik_store *st, const struct ik_finish_req *req, ik_store_cb cb,
    void *arg, ik_err *err);
int ik_pg_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err);
size_t ik_pg_active(struct ik_store *st);
void ik_pg_drain(struct pg *p);
void ik_pg_pops_free(struct pop *o);

/* pg_repl.c: warns (stderr) when the server's replication would lose
 * finished records on a failover; never fails. */
void ik_pg_replication_check(struct pg *p);

#endif
