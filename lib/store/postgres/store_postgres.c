/* store_postgres.c: the PostgreSQL idempotency store (postgres://...,
 * postgresql://..., or a bare postgres: for libpq's PG* environment and
 * ~/.pgpass), through libpq, loaded when the store is opened (pq_dl.h).
 *
 * Rules: claim, finish, renotified, release and forget are each ONE
 * conditional statement under READ COMMITTED (an INSERT ... ON CONFLICT DO
 * UPDATE ... WHERE, an UPDATE or DELETE with a WHERE).  A refused claim is
 * decided by ik_claim_decide on the record read by a second statement
 * (READ COMMITTED lets it see the committed row that refused us), with the
 * server's now.  The lease is set and compared on the server's clock
 * (clock_timestamp()), never the worker's: req->now_ms is not used for it,
 * and the leaseUntil we report is the one the statement wrote.
 * Serialization failures and deadlocks are retried a bounded number of
 * times, then IK_TEMPFAIL; a lost connection is IK_TEMPFAIL at once (a
 * statement whose answer was lost is not replayed blindly) and the next
 * call reconnects, waiting up to RECONNECT_MS once per outage.  One connection per process, reused; statements are
 * prepared once per connection; SQL only through bound parameters (the
 * table name is checked against a strict identifier alphabet and quoted).
 * The URL's password is never copied into a message: only libpq sees it
 * (pg_url.c reads the URL).  Text is sent as UTF-8 to a UTF8 database
 * only; what a finish, release or forget writes is ours, so the server
 * refusing it is never DATAERR (a claim's event is the message's own).
 * Group commit (begin/commit) as in store_sqlite.c: the group's first
 * write opens one transaction; a failure rolls it back at once and fails
 * the rest of the group (store.h).  The connection (made again, the
 * statements prepared on it) and the claims and finishes in flight, the
 * same statements in libpq's pipeline mode, are pg_conn.c's; the outbox
 * (the event emitted by the finish's own statement, the relay's ops) is
 * store_postgres_outbox.c's; its errors' classification pg_err.c's;
 * idemp-init's part (the schema's migrations, the purge)
 * store_postgres_init.c's.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"
#include "store/store.h"

#define COLS "key, state, owner, lease_until, attempts, fingerprint, event," \
             " debit_ref, last_error, created_at, updated_at, expires_at"
#define XSTR(x) STR(x)
#define STR(x) #x
/* The history H with entry E (a jsonb object) appended, the last
 * IK_HISTORY_MAX kept (store.h): in the same statement as the transition. */
#define HPUSH(h, e) " jsonb_path_query_array(COALESCE(" h ", '[]'::jsonb) || " e "," \
	" '$[last - " XSTR(IK_HISTORY_MAX) " + 1 to last]')"


/* Each write with and without the history column: a table from before
 * schema version 3 keeps working (without history) until idemp-init
 * migrates it.  %1$s is the quoted table name. */
#define CLAIM_SQL(HCOL, HNEW, HSET) \
	"WITH n AS (SELECT " NOW_MS " AS ms)" \
	" INSERT INTO %1$s AS r (key, state, owner, lease_until, attempts, fingerprint," \
	"  event, created_at, updated_at, expires_at" HCOL ")" \
	" SELECT $1, 'IN_PROGRESS', $2, n.ms + $3::bigint, 1, $4, $5, n.ms, n.ms, $6::bigint" HNEW \
	" FROM n" \
	" ON CONFLICT (key) DO UPDATE SET owner = excluded.owner," \
	"  lease_until = excluded.lease_until, attempts = r.attempts + 1," \
	"  updated_at = excluded.updated_at, expires_at = excluded.expires_at," HSET \
	"  last_error = NULL" \
	" WHERE r.state = 'IN_PROGRESS' AND r.lease_until < excluded.updated_at" \
	"  AND r.fingerprint = excluded.fingerprint" \
	" RETURNING attempts, lease_until"
#define CLAIM_ENTRY(at, attempt, lease, owner) \
	"jsonb_build_object('at', " at ", 'op', 'claim', 'attempt', " attempt "," \
	" 'leaseUntil', " lease ", 'owner', " owner ")"
#define GET_SQL(HREAD) "SELECT " COLS ", " HREAD ", " NOW_MS " FROM %1$s WHERE key = $1"
/* A keyed write's state test: (state = 'X') IS TRUE is the same test
 * (state is NOT NULL), but neither an index condition nor a proof of the
 * _recover index's predicate, so the only index a plan can take is the
 * primary key.  Written as state = 'X', a plan made on a new or small
 * table -- and a long-lived worker's prepared statements keep theirs
 * until the table is next analyzed -- walked the _recover index (state,
 * updated_at, key) with the key a non-leading column: each finish read
 * every IN_PROGRESS entry of it, live and dead, and cost more with each
 * record written (the bench's PostgreSQL scenario: half the server's CPU
 * in that scan, and slower the more messages it ran). */
#define KEYED_STATE(col, st) " (" col " = '" st "') IS TRUE"
#define FINISH_SQL(HSET) \
	"WITH n AS (SELECT " NOW_MS " AS ms)" \
	" UPDATE %1$s AS r SET state = $3, debit_ref = COALESCE($4, r.debit_ref)," HSET \
	" last_error = $5, updated_at = n.ms FROM n" \
	" WHERE r.key = $1 AND" KEYED_STATE("r.state", "IN_PROGRESS") " AND r.owner = $2"
#define RENOTIFIED_SQL(HSET) \
	"WITH n AS (SELECT " NOW_MS " AS ms)" \
	" UPDATE %1$s AS r SET state = 'DONE'," HSET " last_error = NULL, updated_at = n.ms" \
	" FROM n WHERE r.key = $1 AND" KEYED_STATE("r.state", "DEBITED_NOTIFICATION_FAILED")
#define RELEASE_SQL(HSET) \
	"WITH n AS (SELECT " NOW_MS " AS ms)" \
	" UPDATE %1$s AS r SET lease_until = 0," HSET " updated_at = n.ms" \
	" FROM n WHERE r.key = $1 AND" KEYED_STATE("r.state", "IN_PROGRESS") " AND r.owner = $2"
/* The lease on the server's clock, as the claim set it; no history. */
#define RENEW_SQL \
	"UPDATE %1$s SET lease_until = " NOW_MS " + $3::bigint" \
	" WHERE key = $1 AND" KEYED_STATE("state", "IN_PROGRESS") " AND owner = $2" \
	" AND lease_until <> 0"
#define FORGET_SQL "DELETE FROM %1$s WHERE key = $1 AND" KEYED_STATE("state", "FAILED")
/* The reason a claim is left (store.h's note): fenced as the finish is,
 * and nothing else; no history. */
#define NOTE_SQL \
	"UPDATE %1$s SET last_error = $3" \
	" WHERE key = $1 AND" KEYED_STATE("state", "IN_PROGRESS") " AND owner = $2"
/* One statement, one snapshot: the unfinished states from the partial
 * index (their literal states let the planner prove it covers them), and
 * DONE estimated as the planner does (reltuples scaled to the table's
 * pages now) less those: never a count of the DONE rows. */
#define STATS_SQL \
	"WITH n AS (SELECT " NOW_MS " AS ms)," \
	" o AS (SELECT state, count(*) AS c, min(updated_at) AS m FROM %1$s" \
	"  WHERE state IN ('IN_PROGRESS', 'DEBITED_NOTIFICATION_FAILED', 'FAILED') GROUP BY state)," \
	" s AS (SELECT count(*) AS c, min(updated_at) AS m FROM %1$s" \
	"  WHERE state = 'IN_PROGRESS' AND lease_until < (SELECT ms FROM n))" \
	" SELECT (SELECT ms FROM n)," \
	" COALESCE((SELECT c FROM o WHERE state = 'IN_PROGRESS'), 0)," \
	" COALESCE((SELECT c FROM o WHERE state = 'FAILED'), 0)," \
	" COALESCE((SELECT c FROM o WHERE state = 'DEBITED_NOTIFICATION_FAILED'), 0)," \
	" (SELECT m FROM o WHERE state = 'DEBITED_NOTIFICATION_FAILED'), s.c, s.m," \
	" (SELECT CASE WHEN c.relpages > 0 THEN c.reltuples / c.relpages *" \
	"   (pg_relation_size(c.oid) / current_setting('block_size')::bigint)" \
	"   ELSE greatest(c.reltuples, 0) END::bigint FROM pg_class c WHERE c.oid = '%1$s'::regclass)" \
	" FROM s"

static const char *const sql_fmt[2][Q_N] = {
	/* [0]: a table without the history column */
	{
		[Q_CLAIM] = CLAIM_SQL("", "", ""),
		[Q_GET] = GET_SQL("NULL"),
		[Q_FINISH] = FINISH_SQL(""),
		[Q_RENOTIFIED] = RENOTIFIED_SQL(""),
		[Q_RELEASE] = RELEASE_SQL(""),
		[Q_FORGET] = FORGET_SQL,
		[Q_STATS] = STATS_SQL,
		[Q_RENEW] = RENEW_SQL,
		[Q_NOTE] = NOTE_SQL,
	},
	{
		[Q_CLAIM] = CLAIM_SQL(", history",
		    ", jsonb_build_array(" CLAIM_ENTRY("n.ms", "1", "n.ms + $3::bigint", "$2::text") ")",
		    " history =" HPUSH("r.history", CLAIM_ENTRY("excluded.updated_at",
		        "r.attempts + 1", "excluded.lease_until", "excluded.owner")) ","),
		[Q_GET] = GET_SQL("history::text"),
		[Q_FINISH] = FINISH_SQL(" history =" HPUSH("r.history", "(jsonb_build_object("
		    "'at', n.ms, 'op', 'finish', 'state', $3::text, 'owner', $2::text,"
		    " 'debitRef', $4::text, 'error', $5::text) || CASE WHEN $6 THEN"
		    " '{\"bankReplayed\": true}'::jsonb ELSE '{}'::jsonb END)") ","),
		[Q_RENOTIFIED] = RENOTIFIED_SQL(" history =" HPUSH("r.history", "jsonb_build_object("
		    "'at', n.ms, 'op', 'renotified', 'state', 'DONE')") ","),
		[Q_RELEASE] = RELEASE_SQL(" history =" HPUSH("r.history", "jsonb_build_object("
		    "'at', n.ms, 'op', 'release', 'owner', $2::text)") ","),
		[Q_FORGET] = FORGET_SQL,
		[Q_STATS] = STATS_SQL,
		[Q_RENEW] = RENEW_SQL,
		[Q_NOTE] = NOTE_SQL,
	},
};

/* Runs statement which with n text parameters; *out holds the result on
 * IK_OK (PGRES_COMMAND_OK or TUPLES_OK), else the error is in err.
 * Outside a transaction, serialization failures and deadlocks are retried. */
static int
run(struct pg *p, int which, int n, const char *const *params, const char *doing,
    PGresult **out, ik_err *err)
{
	char name[16];
	PGresult *r;
	int rc, tries = 0;

	*out = NULL;
again:
	if ((rc = ik_pg_prepare(p, which, n, doing, name, err)))
		return rc;
	p->sent_boot_ms = ik_boot_ms();   /* connected: a claim's lease proof (store.h) */
	r = ik_pg_wait(p, PQsendQueryPrepared(p->conn, name, n, params, NULL, NULL, 0), doing, err);
	tries++;
	if (!r)
		return err->code;
	switch (PQresultStatus(r)) {
	case PGRES_COMMAND_OK:
	case PGRES_TUPLES_OK:
		*out = r;
		return IK_OK;
	default:
		break;
	}
	{
		const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (!p->in_tx && st && (strcmp(st, "40001") == 0 || strcmp(st, "40P01") == 0) &&
		    tries < MAX_RETRIES) {
			PQclear(r);
			goto again;
		}
	}
	rc = ik_pg_err(p, r, doing, err);
	if (tries > 1 && err) {
		size_t l = strlen(err->msg);
		snprintf(err->msg + l, sizeof err->msg - l, " (after %d tries)", tries);
	}
	PQclear(r);
	return rc;
}

/* The record and the server's now; IK_OK, IK_EMPTY or an error. */
static int
get_now(struct pg *p, const char *key, struct ik_record *rec, int64_t *now, ik_err *err)
{
	const char *params[] = { key };
	PGresult *r;
	int rc;

	if ((rc = run(p, Q_GET, 1, params, "read record", &r, err)))
		return rc;
	if (PQntuples(r) != 1) {
		PQclear(r);
		return IK_EMPTY;
	}
	ik_pg_read_record(r, 0, rec);
	if (now)
		*now = ik_pg_col_i64(r, 0, 13);
	PQclear(r);
	return IK_OK;
}

/* Before a write: inside a group, opens its transaction on first use and
 * refuses once the group failed. */
static int
group_write(struct pg *p, ik_err *err)
{
	int rc;

	if (!p->group)
		return IK_OK;
	if (p->failed)
		return ik_errf(err, IK_TEMPFAIL, "postgres %s: group rolled back after "
		    "an earlier failure", p->u.table);
	if (!p->in_tx) {
		if ((rc = ik_pg_exec_sql(p, "BEGIN ISOLATION LEVEL READ COMMITTED", "begin", err))) {
			p->failed = 1;
			return rc;
		}
		p->in_tx = 1;
	}
	return IK_OK;
}

static void
group_fail(struct pg *p)
{
	if (!p->group)
		return;
	if (p->in_tx)
		ik_pg_rollback(p);
	p->failed = 1;
}

static int
pg_begin(struct ik_store *st, ik_err *err)
{
	struct pg *p = st->impl;

	if (p->group)
		return ik_errf(err, IK_SOFTWARE, "postgres %s: group already open", p->u.table);
	p->group = 1;
	p->in_tx = p->failed = 0;
	return IK_OK;
}

static int
pg_commit(struct ik_store *st, ik_err *err)
{
	struct pg *p = st->impl;
	int rc = IK_OK;

	if (!p->group)
		return ik_errf(err, IK_SOFTWARE, "postgres %s: no group open", p->u.table);
	if (p->failed)
		rc = ik_errf(err, IK_TEMPFAIL, "postgres %s: group rolled back", p->u.table);
	else if (p->in_tx && (rc = ik_pg_exec_sql(p, "COMMIT", "commit", err)))
		ik_pg_rollback(p);
	p->in_tx = 0;
	p->group = p->failed = 0;
	return rc;
}

static int
pg_claim(struct ik_store *st, const struct ik_claim_req *req, struct ik_claim_res *res,
    ik_err *err)
{
	struct pg *p = st->impl;
	char lease[24], exp[24], name[16];
	const char *params[] = { req->key, req->token, lease, req->fingerprint,
	                         req->event ? req->event : "", exp };
	PGresult *r;
	int rc;

	memset(res, 0, sizeof *res);
	snprintf(lease, sizeof lease, "%lld", (long long)req->lease_ms);
	snprintf(exp, sizeof exp, "%lld", (long long)req->expires_at);
	if ((rc = group_write(p, err)))
		return rc;
	/* The outbox's slot is known once the claim is prepared. */
	if (ik_pgo_on() && ((rc = ik_pg_prepare(p, Q_CLAIM, 6, "claim", name, err)) ||
	    (rc = ik_pgo_claim_gate(p, err))))
		goto fail;
	/* A lease that ran out between our two statements lets the claim
	 * through on the next try; bounded, since every round means another
	 * holder's lease ended. */
	for (int round = 0; round < MAX_RETRIES; round++) {
		struct ik_claim_req now_req = *req;
		if ((rc = run(p, Q_CLAIM, 6, params, "claim", &r, err)))
			goto fail;
		/* read once connected, just before the send (a reconnect may
		 * have waited): the lease is proven from it (store.h) */
		res->sent_boot_ms = p->sent_boot_ms;
		if (PQntuples(r) == 1) {
			res->code = IK_OK;
			res->attempt = ik_pg_col_i64(r, 0, 0);
			res->lease_until = ik_pg_col_i64(r, 0, 1);
			PQclear(r);
			return IK_OK;
		}
		PQclear(r);
		/* Refused: the committed record that refused it decides, on the
		 * server's clock. */
		rc = get_now(p, req->key, &res->cur, &now_req.now_ms, err);
		if (rc == IK_EMPTY)
			continue;       /* forgotten meanwhile: claim afresh */
		if (rc != IK_OK)
			goto fail;
		if ((rc = ik_claim_decide(&now_req, res, err)) != IK_EMPTY) {
			if (rc != IK_OK)
				goto fail;
			return IK_OK;
		}
		ik_record_free(&res->cur);
		if (p->in_tx)
			break;  /* in a group our view cannot change: a bug, not a retry */
	}
	rc = ik_errf(err, IK_TEMPFAIL, "postgres %s: claim: the record kept changing "
	    "under us; try again", p->u.table);
fail:
	group_fail(p);
	ik_record_free(&res->cur);
	return rc;
}

/* A one-statement conditional write: IK_OK when it changed one row,
 * IK_LEASE_LOST when none. */
static int
changed(struct pg *p, int which, int n, const char *const *params, const char *doing,
    ik_err *err)
{
	PGresult *r;
	int rc;

	if ((rc = group_write(p, err)))
		return rc;
	if ((rc = run(p, which, n, params, doing, &r, err))) {
		group_fail(p);
		/* What these write is ours (a state, a token, a reason the port
		 * made valid UTF-8), never the message's: the server refusing it
		 * is our fault, never "this message is bad" (DATAERR sends it to
		 * the DLQ, and a finish comes after the money moved). */
		if (rc == IK_DATAERR)
			rc = err->code = IK_SOFTWARE;
		return rc;
	}
	rc = strcmp(PQcmdTuples(r), "1") == 0 ? IK_OK : IK_LEASE_LOST;
	PQclear(r);
	return rc;
}

/* Alone (not in a group), a finish whose connection went before its answer
 * came is sent again, once, on a new one, and a refused finish is decided
 * by its record (ik_finish_decide): one whose earlier send committed, or a
 * group's redone alone after a commit whose answer was lost, finds its own
 * token in the state it asked for.  The money moved: a TEMPFAIL or a
 * LEASE_LOST there would be a lie, and the first a second trip to the
 * bank.  In a group a refusal stands (the group's redo decides it). */
static int
pg_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err)
{
	struct pg *p = st->impl;
	const char *params[] = { req->key, req->token, ik_state_name(req->state),
	                         req->debit_ref, req->last_error,
	                         req->bank_replayed ? "true" : "false" };
	struct ik_record cur;
	int rc = changed(p, Q_FINISH, 6, params, "finish", err);

	if (p->group)
		return rc;
	if (rc == IK_TEMPFAIL && !p->connect_failed && p->conn &&
	    PQstatus(p->conn) != CONNECTION_OK) {
		ik_log(IK_LOG_WARN, "the finish's connection went before its answer; sending it "
		    "again on a new one", "store", "postgres", "table", p->u.table,
		    "error", err->msg, NULL);
		ik_errclear(err);
		rc = changed(p, Q_FINISH, 6, params, "finish", err);
	}
	if (rc != IK_LEASE_LOST)
		return rc;
	memset(&cur, 0, sizeof cur);
	if ((rc = get_now(p, req->key, &cur, NULL, err)) == IK_OK || rc == IK_EMPTY)
		rc = ik_finish_decide(req, rc == IK_OK ? &cur : NULL);
	ik_record_free(&cur);
	return rc;
}

static int
pg_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    int64_t lease_ms, ik_err *err)
{
	char lease[32];
	const char *params[] = { key, token, lease };

	snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
	return changed(st->impl, Q_RENEW, 3, params, "renew", err);
}

static int
pg_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err)
{
	const char *params[] = { key };

	return changed(st->impl, Q_RENOTIFIED, 1, params, "mark notified", err);
}

static int
pg_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    ik_err *err)
{
	const char *params[] = { key, token };

	return changed(st->impl, Q_RELEASE, 2, params, "release", err);
}

static int
pg_note(struct ik_store *st, const char *key, const char *token, const char *reason,
    ik_err *err)
{
	const char *params[] = { key, token, reason };

	return changed(st->impl, Q_NOTE, 3, params, "note", err);
}

static int
pg_forget_failed(struct ik_store *st, const char *key, ik_err *err)
{
	const char *params[] = { key };
	int rc = changed(st->impl, Q_FORGET, 1, params, "forget", err);

	return rc == IK_LEASE_LOST ? IK_EMPTY : rc;
}

static int
pg_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err)
{
	memset(r, 0, sizeof *r);
	return get_now(st->impl, key, r, NULL, err);
}

/* The recovery lists name their state as a literal, so the planner can
 * prove the partial index covers them (a parameter would hide that). */
static int
pg_list(struct ik_store *st, const struct ik_list_filter *f, ik_record_cb cb, void *arg,
    ik_err *err)
{
	struct pg *p = st->impl;
	struct ik_buf q = { 0 };
	char older[24];
	const char *params[] = { older };
	PGresult *r;
	int rc, n, stop = 0;
	enum ik_state state = f->expired ? IK_ST_IN_PROGRESS : f->state;

	snprintf(older, sizeof older, "%lld", (long long)f->older_than_ms);
	if ((rc = ik_pg_conn_ok(p, err)) || (!p->checked && (rc = ik_pg_history_column(p, err))))
		return rc;
	ik_buf_addstr(&q, "SELECT " COLS);
	ik_buf_addstr(&q, p->has_history ? ", history::text FROM " : ", NULL FROM ");
	ik_buf_addstr(&q, p->qtable);
	ik_buf_addstr(&q, " WHERE $1::bigint >= 0");
	if (state != IK_ST_NONE) {
		ik_buf_addstr(&q, " AND state = '");
		ik_buf_addstr(&q, ik_state_name(state));   /* ours, not outside data */
		ik_buf_addstr(&q, "'");
	}
	if (f->expired)
		ik_buf_addstr(&q, " AND lease_until < " NOW_MS);
	if (f->older_than_ms > 0)
		ik_buf_addstr(&q, " AND updated_at < " NOW_MS " - $1::bigint");
	ik_buf_addstr(&q, " ORDER BY updated_at, key");
	if (!q.p)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	r = ik_pg_exec(p, q.p, 1, params, 0, "list", err);
	ik_buf_free(&q);
	if (!r)
		return err->code;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		rc = ik_pg_err(p, r, "list", err);
		PQclear(r);
		return rc;
	}
	n = PQntuples(r);
	for (int i = 0; i < n && !stop; i++) {
		struct ik_record rec = { 0 };
		ik_pg_read_record(r, i, &rec);
		stop = cb(&rec, arg);
		ik_record_free(&rec);
	}
	PQclear(r);
	return n ? IK_OK : IK_EMPTY;
}

/* The stats op (store.h): one statement, the unfinished states from the
 * partial index, DONE estimated (done_approx).  tests/postgres.bats checks
 * the server's plan. */
static int
pg_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out, ik_err *err)
{
	struct pg *p = st->impl;
	PGresult *r;
	int64_t now, est;
	int rc;

	memset(out, 0, sizeof *out);
	if ((rc = run(p, Q_STATS, 0, NULL, "stats", &r, err)))
		return rc;
	if (PQntuples(r) != 1) {
		PQclear(r);
		return ik_errf(err, IK_SOFTWARE, "postgres %s: stats: no row", p->u.table);
	}
	now = ik_pg_col_i64(r, 0, 0);
	out->in_progress = ik_pg_col_i64(r, 0, 1);
	out->failed = ik_pg_col_i64(r, 0, 2);
	out->dnf = ik_pg_col_i64(r, 0, 3);
	out->oldest_dnf_ms = out->dnf ? now - ik_pg_col_i64(r, 0, 4) : 0;
	out->stuck = ik_pg_col_i64(r, 0, 5);
	out->oldest_stuck_ms = out->stuck ? now - ik_pg_col_i64(r, 0, 6) : 0;
	est = ik_pg_col_i64(r, 0, 7) - out->in_progress - out->failed - out->dnf;
	out->done = est > 0 ? est : 0;
	out->done_approx = 1;
	PQclear(r);
	return IK_OK;
}

static void
pg_close(struct ik_store *st)
{
	struct pg *p = st->impl;

	if (!p)
		return;
	ik_pg_pops_free(p->queued);
	ik_pg_pops_free(p->batch);
	ik_pg_pops_free(p->done);
	ik_pgo_close(p);
	if (p->conn)
		PQfinish(p->conn);
	ik_pg_url_free(&p->u);
	for (int v = 0; v < 2; v++)
		for (int i = 0; i < Q_N; i++)
			free(p->sql[v][i]);
	free(p);
	st->impl = NULL;
}

static const struct ik_store_ops postgres_ops = {
	.name = "postgres",
	.init = ik_pg_init,
	.claim = pg_claim,
	.finish = pg_finish,
	.renew = pg_renew,
	.renotified = pg_renotified,
	.release = pg_release,
	.note = pg_note,
	.claim_check = ik_pgo_claim_check,
	.forget_failed = pg_forget_failed,
	.get = pg_get,
	.list = pg_list,
	.close = pg_close,
	.begin = pg_begin,
	.commit = pg_commit,
	.stats = pg_stats,
	.claim_start = ik_pg_claim_start,
	.finish_start = ik_pg_finish_start,
	.run = ik_pg_run,
	.active = ik_pg_active,
	.warm = ik_pg_warm,
	.outbox_lease = ik_pgo_lease,
	.outbox_read = ik_pgo_read,
	.outbox_ack = ik_pgo_ack,
	.outbox_purge = ik_pgo_purge,
	.outbox_stats = ik_pgo_stats,
};

/* url is the whole store URL: postgres://..., postgresql://..., postgres:. */
int
ik_store_postgres_open(const char *url, struct ik_store *st, ik_err *err)
{
	struct pg *p;
	const char *t;
	int64_t ms;
	int rc;

	if ((rc = ik_pq_load(err)) != IK_OK)
		return ik_errwrap(err, "postgres");
	if (!(p = calloc(1, sizeof *p)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	st->impl = p;
	st->ops = &postgres_ops;
	if ((rc = ik_pg_url_parse(url, &p->u, err)))
		goto fail;
	snprintf(p->qtable, sizeof p->qtable, "\"%s\"", p->u.table);
	p->timeout_ms = 30000;
	if ((t = getenv("IDEMKIT_PG_TIMEOUT")) && *t) {
		if (ik_parse_duration(t, &ms) < 0 || ms < 1 || ms > 600000) {
			rc = ik_errf(err, IK_CONFIG, "IDEMKIT_PG_TIMEOUT: want a duration up to 10m");
			goto fail;
		}
		p->timeout_ms = (int)ms;
	}
	for (int v = 0; v < 2; v++)
		for (int i = 0; i < Q_N; i++)
			if (!(p->sql[v][i] = ik_pg_with_table(p, sql_fmt[v][i]))) {
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
				goto fail;
			}
	/* The outbox: the finish and the re-notification emit their event
	 * in their own statement (store_postgres_outbox.c). */
	for (int v = 0; ik_pgo_on() && v < 2; v++)
		if ((rc = ik_pgo_wrap(p, Q_FINISH, &p->sql[v][Q_FINISH], err)) ||
		    (rc = ik_pgo_wrap(p, Q_RENOTIFIED, &p->sql[v][Q_RENOTIFIED], err)))
			goto fail;
	return IK_OK;
fail:
	pg_close(st);
	st->ops = NULL;
	return rc;
}

char *
ik_store_postgres_display(const char *url, int *secret)
{
	struct ik_pg_url u;
	ik_err err;
	char *d;

	*secret = 0;
	/* A URL libpq cannot read is not shown: the open says why, and fails. */
	if (ik_pq_load(&err) != IK_OK || ik_pg_url_parse(url, &u, &err) != IK_OK)
		return strdup("postgres:");
	d = u.display;
	u.display = NULL;
	*secret = u.secret;
	ik_pg_url_free(&u);
	return d;
}
