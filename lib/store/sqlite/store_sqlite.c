/* store_sqlite.c: the embedded idempotency store (sqlite:PATH).
 *
 * Rules: claim and finish are each one conditional statement (an upsert
 * with a WHERE, an UPDATE with a WHERE); WAL with synchronous=FULL so a
 * commit is on disk before we report it; a busy timeout so many processes
 * can share one file; the file is created 0600; statements are prepared
 * once per process and reused; SQL only through bound parameters.
 * Group commit (begin/commit): the first write of a group opens one
 * BEGIN IMMEDIATE that the group's statements share; a failure inside rolls
 * it back at once and fails the rest of the group (store.h).
 * History: each transition's statement appends its entry (ik_history_entry,
 * bound as text) to the history column and keeps the last IK_HISTORY_MAX,
 * in the same statement, so a write that does not match adds nothing.  The
 * claim's entry gets its attempt inside the upsert (attempts + 1), the one
 * value only the row knows.
 * Outbox (store.h): store_sqlite_outbox.c, on this adapter's connection.
 */
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "conn/sqlite.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/sqlite/store_sqlite.h"
#include "store/store.h"

#define SCHEMA_VERSION 1

/* HIST_HEAD entry HIST_TAIL: the history column with the entry (a JSON
 * expression) appended, only the last :hmax (IK_HISTORY_MAX, bound) kept;
 * a NULL or broken history starts afresh rather than failing the
 * transition.  Plain literals, so every statement stays constant text. */
#define HIST_HEAD \
	"(SELECT json_group_array(json(x.value)) FROM (SELECT json_insert(CASE" \
	" WHEN json_valid(records.history) THEN records.history ELSE '[]' END, '$[#]', "
#define HIST_TAIL \
	") AS a) AS t, json_each(t.a) AS x WHERE x.key >= json_array_length(t.a) - :hmax)"

enum { Q_CLAIM, Q_GET, Q_FINISH, Q_RENOTIFIED, Q_RELEASE, Q_FORGET, Q_LIST, Q_BEGIN,
       Q_COMMIT, Q_ROLLBACK, Q_RENEW, Q_NOTE, Q_N };

static const char *const sql[Q_N] = {
	[Q_CLAIM] =
	"INSERT INTO records(key, state, owner, lease_until, attempts, fingerprint,"
	"  event, created_at, updated_at, expires_at, history)"
	" VALUES (?1, 'IN_PROGRESS', ?2, ?3, 1, ?4, ?5, ?6, ?6, ?7, json_array(json(?8)))"
	" ON CONFLICT(key) DO UPDATE SET owner = excluded.owner,"
	"  lease_until = excluded.lease_until, attempts = records.attempts + 1,"
	"  updated_at = excluded.updated_at, expires_at = excluded.expires_at,"
	"  last_error = NULL, history = "
	HIST_HEAD "json_set(json(?8), '$.attempt', records.attempts + 1)" HIST_TAIL
	" WHERE records.state = 'IN_PROGRESS' AND records.lease_until < ?6"
	"  AND records.fingerprint = excluded.fingerprint"
	" RETURNING attempts",
	[Q_GET] =
	"SELECT key, state, owner, lease_until, attempts, fingerprint, event,"
	" debit_ref, last_error, created_at, updated_at, expires_at, history"
	" FROM records WHERE key = ?1",
	[Q_FINISH] =
	"UPDATE records SET state = ?3, debit_ref = COALESCE(?4, debit_ref),"
	" last_error = ?5, updated_at = ?6, history = " HIST_HEAD "json(?7)" HIST_TAIL
	" WHERE key = ?1 AND state = 'IN_PROGRESS' AND owner = ?2",
	[Q_RENOTIFIED] =
	"UPDATE records SET state = 'DONE', last_error = NULL, updated_at = ?2,"
	" history = " HIST_HEAD "json(?3)" HIST_TAIL
	" WHERE key = ?1 AND state = 'DEBITED_NOTIFICATION_FAILED'",
	[Q_RELEASE] =
	"UPDATE records SET lease_until = 0, updated_at = ?3,"
	" history = " HIST_HEAD "json(?4)" HIST_TAIL
	" WHERE key = ?1 AND state = 'IN_PROGRESS' AND owner = ?2",
	[Q_FORGET] =
	"DELETE FROM records WHERE key = ?1 AND state = 'FAILED'",
	[Q_LIST] =
	"SELECT key, state, owner, lease_until, attempts, fingerprint, event,"
	" debit_ref, last_error, created_at, updated_at, expires_at, history"
	" FROM records WHERE (?1 IS NULL OR state = ?1)"
	" AND (?2 = 0 OR (state = 'IN_PROGRESS' AND lease_until < ?3))"
	" AND (?4 = 0 OR updated_at < ?3 - ?4)"
	" ORDER BY updated_at, key",
	[Q_RENEW] = (   /* no history: store.h; parenthesized for clang's -Wstring-concatenation */
	"UPDATE records SET lease_until = ?3"
	" WHERE key = ?1 AND state = 'IN_PROGRESS' AND owner = ?2 AND lease_until <> 0"),
	[Q_BEGIN] = "BEGIN IMMEDIATE",
	[Q_COMMIT] = "COMMIT",
	[Q_ROLLBACK] = "ROLLBACK",
	[Q_NOTE] = (   /* a reason only: store.h */
	"UPDATE records SET last_error = ?3"
	" WHERE key = ?1 AND state = 'IN_PROGRESS' AND owner = ?2"),
};

static const char schema_v1[] =
	"CREATE TABLE IF NOT EXISTS records ("
	" key TEXT PRIMARY KEY NOT NULL,"
	" state TEXT NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE', 'FAILED',"
	"  'DEBITED_NOTIFICATION_FAILED')),"
	" owner TEXT,"
	" lease_until INTEGER NOT NULL DEFAULT 0,"
	" attempts INTEGER NOT NULL DEFAULT 0,"
	" fingerprint TEXT NOT NULL,"
	" event TEXT,"
	" debit_ref TEXT,"
	" last_error TEXT,"
	" created_at INTEGER NOT NULL,"
	" updated_at INTEGER NOT NULL,"
	" expires_at INTEGER NOT NULL"
	") WITHOUT ROWID;"
	"CREATE INDEX IF NOT EXISTS records_state ON records (state, updated_at);"
	"PRAGMA user_version = 1;";

struct sq {
	sqlite3 *db;
	char *path;
	sqlite3_stmt *st[Q_N];
	int group;      /* between begin and commit */
	int in_tx;      /* the group's transaction is open */
	int failed;     /* something in the group failed: it was rolled back */
};

static int
sqerr(struct sq *q, int rc, const char *what, ik_err *err)
{
	return ik_sqlite_err(q->db, rc, "sqlite", q->path, what, err);
}

static sqlite3_stmt *
stmt(struct sq *q, int which, ik_err *err)
{
	int rc;

	if (q->st[which]) {
		sqlite3_reset(q->st[which]);
		sqlite3_clear_bindings(q->st[which]);
		return q->st[which];
	}
	rc = sqlite3_prepare_v3(q->db, sql[which], -1, SQLITE_PREPARE_PERSISTENT,
	    &q->st[which], NULL);
	if (rc != SQLITE_OK) {
		sqerr(q, rc, "prepare", err);
		return NULL;
	}
	return q->st[which];
}

/* Runs a statement that returns no rows. */
static int
exec1(struct sq *q, sqlite3_stmt *s, const char *what, ik_err *err)
{
	int rc = sqlite3_step(s);
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		return sqerr(q, rc, what, err);
	return IK_OK;
}

/* err may be NULL (a rollback on a path that already failed keeps the
 * first error, not the rollback's). */
static int
simple(struct sq *q, int which, ik_err *err)
{
	ik_err mine = { 0 };
	sqlite3_stmt *s;

	if (!err)
		err = &mine;
	s = stmt(q, which, err);
	return s ? exec1(q, s, sql[which], err) : err->code;
}

static char *
col_str(sqlite3_stmt *s, int i)
{
	const unsigned char *t = sqlite3_column_text(s, i);
	return t ? strdup((const char *)t) : NULL;
}

static void
read_record(sqlite3_stmt *s, struct ik_record *r)
{
	r->key = col_str(s, 0);
	r->state = ik_state_parse((const char *)sqlite3_column_text(s, 1));
	r->owner = col_str(s, 2);
	r->lease_until = sqlite3_column_int64(s, 3);
	r->attempts = sqlite3_column_int64(s, 4);
	r->fingerprint = col_str(s, 5);
	r->event = col_str(s, 6);
	r->debit_ref = col_str(s, 7);
	r->last_error = col_str(s, 8);
	r->created_at = sqlite3_column_int64(s, 9);
	r->updated_at = sqlite3_column_int64(s, 10);
	r->expires_at = sqlite3_column_int64(s, 11);
	r->history = col_str(s, 12);
}

static int
get_locked(struct sq *q, const char *key, struct ik_record *r, ik_err *err)
{
	sqlite3_stmt *s = stmt(q, Q_GET, err);
	int rc;

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		read_record(s, r);
		sqlite3_reset(s);
		return IK_OK;
	}
	sqlite3_reset(s);
	if (rc == SQLITE_DONE)
		return IK_EMPTY;
	return sqerr(q, rc, "read record", err);
}

/* The history column, added to a store made before it.  Additive, so the
 * schema version stays 1: an older idemkit still running on the same file
 * during an upgrade (it refuses a newer version) keeps working, and its
 * writes only add no history. */
static int
add_history(struct sq *q, ik_err *err)
{
	sqlite3_stmt *s;
	int rc, have;

	rc = sqlite3_prepare_v2(q->db, "SELECT 1 FROM pragma_table_info('records')"
	    " WHERE name = 'history'", -1, &s, NULL);
	if (rc != SQLITE_OK)
		return sqerr(q, rc, "schema", err);
	rc = sqlite3_step(s);
	have = rc == SQLITE_ROW;
	sqlite3_finalize(s);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return sqerr(q, rc, "schema", err);
	if (!have && (rc = sqlite3_exec(q->db, "ALTER TABLE records ADD COLUMN history TEXT",
	    NULL, NULL, NULL)) != SQLITE_OK)
		return sqerr(q, rc, "add the history column", err);
	return IK_OK;
}

static int
migrate(struct sq *q, ik_err *err)
{
	sqlite3_stmt *s;
	int rc, version;

	if ((rc = simple(q, Q_BEGIN, err)))
		return rc;
	rc = sqlite3_prepare_v2(q->db, "PRAGMA user_version", -1, &s, NULL);
	if (rc != SQLITE_OK) {
		simple(q, Q_ROLLBACK, NULL);
		return sqerr(q, rc, "schema version", err);
	}
	version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
	sqlite3_finalize(s);
	if (version > SCHEMA_VERSION) {
		simple(q, Q_ROLLBACK, NULL);
		return ik_errf(err, IK_CONFIG, "sqlite %s: schema version %d is newer "
		    "than this idemkit (%d)", q->path, version, SCHEMA_VERSION);
	}
	if (version < 1 && (rc = sqlite3_exec(q->db, schema_v1, NULL, NULL, NULL))) {
		simple(q, Q_ROLLBACK, NULL);
		return sqerr(q, rc, "create schema", err);
	}
	/* Later versions: `if (version < 2) ...` here, each in this transaction. */
	if ((rc = add_history(q, err)) || (rc = ik_sq_outbox_schema(q->db, q->path, err))) {
		simple(q, Q_ROLLBACK, NULL);
		return rc;
	}
	return simple(q, Q_COMMIT, err);
}

static int
sq_init(struct ik_store *st, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s;
	int rc;

	if ((rc = migrate(q, err)))
		return rc;
	/* Records past their retention (DynamoDB's TTL does this there), never
	 * one whose lease is live: forgotten, it could be claimed afresh and
	 * debited while its holder debits it (idemp-claim also refuses a
	 * retention not longer than the lease). */
	rc = sqlite3_prepare_v2(q->db, "DELETE FROM records WHERE expires_at < ?1 / 1000"
	    " AND NOT (state = 'IN_PROGRESS' AND lease_until >= ?1)", -1, &s, NULL);
	if (rc != SQLITE_OK)
		return sqerr(q, rc, "purge", err);
	sqlite3_bind_int64(s, 1, ik_now_ms());
	rc = sqlite3_step(s);
	sqlite3_finalize(s);
	if (rc != SQLITE_DONE)
		return sqerr(q, rc, "purge", err);
	return IK_OK;
}

/* Before a write: inside a group, opens its transaction on first use and
 * refuses once the group failed.  *own is set when the caller must run its
 * own transaction (not in a group). */
static int
group_write(struct sq *q, int *own, ik_err *err)
{
	int rc;

	*own = !q->group;
	if (!q->group)
		return IK_OK;
	if (q->failed)
		return ik_errf(err, IK_TEMPFAIL, "sqlite %s: group rolled back after "
		    "an earlier failure", q->path);
	if (!q->in_tx) {
		if ((rc = simple(q, Q_BEGIN, err))) {
			q->failed = 1;
			return rc;
		}
		q->in_tx = 1;
	}
	return IK_OK;
}

/* A write in a group failed: undo the whole group now. */
static void
group_fail(struct sq *q)
{
	if (!q->group)
		return;
	if (q->in_tx)
		simple(q, Q_ROLLBACK, NULL);
	q->in_tx = 0;
	q->failed = 1;
}

static int
sq_begin(struct ik_store *st, ik_err *err)
{
	struct sq *q = st->impl;

	if (q->group)
		return ik_errf(err, IK_SOFTWARE, "sqlite %s: group already open", q->path);
	q->group = 1;
	q->in_tx = q->failed = 0;
	return IK_OK;
}

static int
sq_commit(struct ik_store *st, ik_err *err)
{
	struct sq *q = st->impl;
	int rc = IK_OK;

	if (!q->group)
		return ik_errf(err, IK_SOFTWARE, "sqlite %s: no group open", q->path);
	if (q->failed)
		rc = ik_errf(err, IK_TEMPFAIL, "sqlite %s: group rolled back", q->path);
	else if (q->in_tx && (rc = simple(q, Q_COMMIT, err)))
		simple(q, Q_ROLLBACK, NULL);
	q->group = q->in_tx = q->failed = 0;
	return rc;
}

static int
sq_claim(struct ik_store *st, const struct ik_claim_req *req,
    struct ik_claim_res *res, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s;
	char *entry;
	int rc, own;

	memset(res, 0, sizeof *res);
	if ((rc = group_write(q, &own, err)))
		return rc;
	if (own && (rc = simple(q, Q_BEGIN, err)))
		return rc;
	if (!(s = stmt(q, Q_CLAIM, err)))
		goto fail;
	sqlite3_bind_text(s, 1, req->key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, req->token, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 3, req->now_ms + req->lease_ms);
	sqlite3_bind_text(s, 4, req->fingerprint, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 5, req->event, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 6, req->now_ms);
	sqlite3_bind_int64(s, 7, req->expires_at);
	if (!(entry = ik_history_entry(&(struct ik_hist){ .op = "claim", .at = req->now_ms,
	    .attempt = 1, .lease_until = req->now_ms + req->lease_ms, .owner = req->token }))) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		goto fail;
	}
	sqlite3_bind_text(s, 8, entry, -1, free);
	sqlite3_bind_int(s, sqlite3_bind_parameter_index(s, ":hmax"), IK_HISTORY_MAX);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		res->code = IK_OK;
		res->attempt = sqlite3_column_int64(s, 0);
		res->lease_until = req->now_ms + req->lease_ms;
		rc = sqlite3_step(s);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE) {
		sqerr(q, rc, "claim", err);
		goto fail;
	}
	if (res->attempt == 0) {
		/* The condition failed: the current record says why. */
		rc = get_locked(q, req->key, &res->cur, err);
		if (rc == IK_EMPTY)
			ik_errf(err, IK_SOFTWARE, "sqlite %s: claim refused but no record", q->path);
		if (rc != IK_OK)
			goto fail;
		/* In the same transaction the record cannot let the claim
		 * through: that answer would be a bug, not a retry. */
		if ((rc = ik_claim_decide(req, res, err)) == IK_EMPTY)
			ik_errf(err, IK_SOFTWARE, "sqlite %s: claim refused by a claimable record",
			    q->path);
		if (rc != IK_OK)
			goto fail;
	}
	if (own && (rc = simple(q, Q_COMMIT, err)))
		goto fail;
	return IK_OK;
fail:
	if (own)
		simple(q, Q_ROLLBACK, NULL);
	else
		group_fail(q);
	ik_record_free(&res->cur);
	return err->code ? err->code : IK_SOFTWARE;
}

/* Binds h's history entry to parameter i, and the bound: IK_OK, or
 * IK_SOFTWARE (out of memory) with the statement reset. */
static int
bind_entry(sqlite3_stmt *s, int i, const struct ik_hist *h, ik_err *err)
{
	char *e = ik_history_entry(h);

	if (!e) {
		sqlite3_reset(s);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	sqlite3_bind_text(s, i, e, -1, free);
	sqlite3_bind_int(s, sqlite3_bind_parameter_index(s, ":hmax"), IK_HISTORY_MAX);
	return IK_OK;
}

/* Runs a one-statement conditional write (its own transaction, or the
 * group's): IK_OK when it changed the row, IK_LEASE_LOST when not. */
static int
changed(struct sq *q, sqlite3_stmt *s, const char *what, ik_err *err)
{
	int own, rc = group_write(q, &own, err);

	if (rc) {
		sqlite3_reset(s);
		return rc;
	}
	if ((rc = exec1(q, s, what, err))) {
		group_fail(q);
		return rc;
	}
	return sqlite3_changes(q->db) == 1 ? IK_OK : IK_LEASE_LOST;
}

static int
sq_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_FINISH, err);

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, req->key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, req->token, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, ik_state_name(req->state), -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 4, req->debit_ref, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 5, req->last_error, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 6, req->now_ms);
	if (bind_entry(s, 7, &(struct ik_hist){ .op = "finish", .at = req->now_ms,
	    .owner = req->token, .state = req->state, .debit_ref = req->debit_ref,
	    .error = req->last_error, .bank_replayed = req->bank_replayed }, err))
		return err->code;
	return changed(q, s, "finish", err);
}

static int
sq_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    int64_t lease_ms, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_RENEW, err);

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, token, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 3, now_ms + lease_ms);
	return changed(q, s, "renew", err);
}

static int
sq_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_RENOTIFIED, err);

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, now_ms);
	if (bind_entry(s, 3, &(struct ik_hist){ .op = "renotified", .at = now_ms,
	    .state = IK_ST_DONE }, err))
		return err->code;
	return changed(q, s, "mark notified", err);
}

static int
sq_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
    ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_RELEASE, err);

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, token, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 3, now_ms);
	if (bind_entry(s, 4, &(struct ik_hist){ .op = "release", .at = now_ms, .owner = token },
	    err))
		return err->code;
	return changed(q, s, "release", err);
}

static int
sq_note(struct ik_store *st, const char *key, const char *token, const char *reason,
    ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_NOTE, err);

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, token, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, reason, -1, SQLITE_STATIC);
	return changed(q, s, "note", err);
}

static int
sq_forget_failed(struct ik_store *st, const char *key, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_FORGET, err);
	int rc;

	if (!s)
		return err->code;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	rc = changed(q, s, "forget", err);
	return rc == IK_LEASE_LOST ? IK_EMPTY : rc;
}

static int
sq_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err)
{
	memset(r, 0, sizeof *r);
	return get_locked(st->impl, key, r, err);
}

static int
sq_list(struct ik_store *st, const struct ik_list_filter *f, ik_record_cb cb,
    void *arg, ik_err *err)
{
	struct sq *q = st->impl;
	sqlite3_stmt *s = stmt(q, Q_LIST, err);
	int rc, n = 0;

	if (!s)
		return err->code;
	if (f->state != IK_ST_NONE)
		sqlite3_bind_text(s, 1, ik_state_name(f->state), -1, SQLITE_STATIC);
	sqlite3_bind_int(s, 2, f->expired);
	sqlite3_bind_int64(s, 3, f->now_ms);
	sqlite3_bind_int64(s, 4, f->older_than_ms);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct ik_record r = { 0 };
		int stop;
		read_record(s, &r);
		stop = cb(&r, arg);
		ik_record_free(&r);
		n++;
		if (stop) {
			rc = SQLITE_DONE;
			break;
		}
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		return sqerr(q, rc, "list", err);
	return n ? IK_OK : IK_EMPTY;
}

static void
sq_close(struct ik_store *st)
{
	struct sq *q = st->impl;

	if (!q)
		return;
	for (int i = 0; i < Q_N; i++)
		sqlite3_finalize(q->st[i]);
	sqlite3_close(q->db);
	free(q->path);
	free(q);
	st->impl = NULL;
}

/* ---- stats: index searches only (store.h) ------------------------------
 * Each statement is a SEARCH of records_state (state, updated_at) for one
 * state; none scans the table (tests/unit/sqlite_stats_plan.c).  They run
 * in one read transaction, so the counts agree with each other. */
const char *const ik_sq_stats_sql[IK_SQ_STATS_N] = {
	[IK_SQ_STATS_COUNT] = "SELECT count(*) FROM records WHERE state = ?1",
	[IK_SQ_STATS_STUCK] =
	"SELECT count(*), min(updated_at) FROM records"
	" WHERE state = 'IN_PROGRESS' AND lease_until < ?1",
	[IK_SQ_STATS_DNF] =
	"SELECT count(*), min(updated_at) FROM records"
	" WHERE state = 'DEBITED_NOTIFICATION_FAILED'",
};

/* One statement that returns one row: its columns into n[0] and n[1]
 * (n[1] NULL -> 0).  arg: text for COUNT, a time for STUCK. */
static int
stats_row(struct sq *q, int which, const char *state, int64_t now_ms, int64_t n[2],
    ik_err *err)
{
	sqlite3_stmt *s;
	int rc;

	if ((rc = sqlite3_prepare_v2(q->db, ik_sq_stats_sql[which], -1, &s, NULL)) != SQLITE_OK)
		return sqerr(q, rc, "stats", err);
	if (which == IK_SQ_STATS_COUNT)
		sqlite3_bind_text(s, 1, state, -1, SQLITE_STATIC);
	else if (which == IK_SQ_STATS_STUCK)
		sqlite3_bind_int64(s, 1, now_ms);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		n[0] = sqlite3_column_int64(s, 0);
		n[1] = sqlite3_column_count(s) > 1 ? sqlite3_column_int64(s, 1) : 0;
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	return rc == SQLITE_OK ? IK_OK : sqerr(q, rc, "stats", err);
}

static int
sq_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out, ik_err *err)
{
	struct sq *q = st->impl;
	int64_t *counts[] = { &out->in_progress, &out->done, &out->failed, &out->dnf };
	static const enum ik_state states[] = { IK_ST_IN_PROGRESS, IK_ST_DONE, IK_ST_FAILED,
	                                        IK_ST_DNF };
	int64_t n[2];
	int rc;
	size_t i;

	memset(out, 0, sizeof *out);
	if ((rc = sqlite3_exec(q->db, "BEGIN", NULL, NULL, NULL)) != SQLITE_OK)
		return sqerr(q, rc, "stats", err);
	for (i = 0; i < sizeof states / sizeof states[0]; i++) {
		if ((rc = stats_row(q, IK_SQ_STATS_COUNT, ik_state_name(states[i]), now_ms, n, err)))
			goto out;
		*counts[i] = n[0];
	}
	if ((rc = stats_row(q, IK_SQ_STATS_STUCK, NULL, now_ms, n, err)))
		goto out;
	out->stuck = n[0];
	out->oldest_stuck_ms = n[0] ? now_ms - n[1] : 0;
	if ((rc = stats_row(q, IK_SQ_STATS_DNF, NULL, now_ms, n, err)))
		goto out;
	out->oldest_dnf_ms = n[0] ? now_ms - n[1] : 0;
out:
	sqlite3_exec(q->db, "COMMIT", NULL, NULL, NULL);
	return rc;
}

/* ---- the outbox: store_sqlite_outbox.c, on this connection ----------- */

static int
sq_outbox_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err)
{
	struct sq *q = st->impl;
	return ik_sq_outbox_lease(q->db, q->path, holder, now_ms, lease_ms, until, err);
}

static int
sq_outbox_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
    ik_err *err)
{
	struct sq *q = st->impl;
	return ik_sq_outbox_read(q->db, q->path, max, ev, n, err);
}

static int
sq_outbox_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev, size_t n,
    int64_t now_ms, ik_err *err)
{
	struct sq *q = st->impl;
	return ik_sq_outbox_ack(q->db, q->path, holder, ev, n, now_ms, err);
}

static int
sq_outbox_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n,
    ik_err *err)
{
	struct sq *q = st->impl;
	return ik_sq_outbox_purge(q->db, q->path, before_ms, batch, n, err);
}

static int
sq_outbox_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out,
    ik_err *err)
{
	struct sq *q = st->impl;
	return ik_sq_outbox_stats(q->db, q->path, now_ms, out, err);
}

static const struct ik_store_ops sqlite_ops = {
	.name = "sqlite",
	.init = sq_init,
	.claim = sq_claim,
	.finish = sq_finish,
	.renew = sq_renew,
	.renotified = sq_renotified,
	.release = sq_release,
	.note = sq_note,
	.forget_failed = sq_forget_failed,
	.get = sq_get,
	.list = sq_list,
	.close = sq_close,
	.begin = sq_begin,
	.commit = sq_commit,
	.stats = sq_stats,
	.outbox_lease = sq_outbox_lease,
	.outbox_read = sq_outbox_read,
	.outbox_ack = sq_outbox_ack,
	.outbox_purge = sq_outbox_purge,
	.outbox_stats = sq_outbox_stats,
};

int
ik_store_sqlite_open(const char *path, struct ik_store *st, ik_err *err)
{
	struct sq *q;
	int rc;

	if (!(q = calloc(1, sizeof *q)) || !(q->path = strdup(path))) {
		free(q);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	st->impl = q;
	st->ops = &sqlite_ops;
	/* A 16 MiB page cache (default 2 MiB) keeps the B-tree's interior
	 * pages of a store with millions of records in memory, so a claim
	 * costs the same with 10^3 or 10^6 records (make bench); it is only
	 * allocated as pages are used. */
	if ((rc = ik_sqlite_open(path, "sqlite", &q->db, err)) == IK_OK &&
	    (rc = sqlite3_exec(q->db, "PRAGMA cache_size = -16384", NULL, NULL, NULL)) != SQLITE_OK)
		rc = sqerr(q, rc, "cache size", err);
	if (rc == IK_OK && (rc = migrate(q, err)) == IK_OK &&
	    (!ik_outbox_url() || (rc = ik_sq_outbox_enable(q->db, q->path, err)) == IK_OK))
		return IK_OK;
	sq_close(st);
	st->ops = NULL;
	return rc;
}
