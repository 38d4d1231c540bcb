/* store_sqlite_outbox.c: the SQLite store's outbox (store.h, outbox.h),
 * on the adapter's own connection (store_sqlite.c calls in).
 *
 * Rules: with $IDEMKIT_OUTBOX set, a TEMP trigger of the connection
 * inserts the event row from the very UPDATE that finishes (or
 * re-notifies) a record, so the event is in that statement's transaction
 * -- its own or the group commit's -- and the finish's code is unchanged;
 * a per-connection trigger follows the per-process setting.  The relay's
 * writes (lease, checkpoint) are each one BEGIN IMMEDIATE transaction:
 * the checkpoint reads the lease in the transaction that writes it.  SQL
 * only as constant text with bound parameters.
 */
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "conn/sqlite.h"
#include "core/outcome.h"
#include "store/sqlite/store_sqlite.h"
#include "store/store.h"

static int
sqerr(sqlite3 *db, const char *path, int rc, const char *what, ik_err *err)
{
	return ik_sqlite_err(db, rc, "sqlite", path, what, err);
}

static int
tx(sqlite3 *db, const char *path, const char *sql, ik_err *err)
{
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	return rc == SQLITE_OK ? IK_OK : sqerr(db, path, rc, sql, err);
}

static char *
col_str(sqlite3_stmt *s, int i)
{
	const unsigned char *t = sqlite3_column_text(s, i);
	return t ? strdup((const char *)t) : NULL;
}

/* The outbox tables, additive like the history column (the schema version
 * stays 1): the events, in the order written (seq, never reused:
 * AUTOINCREMENT), with a partial index of those waiting and one of those
 * published (the purge); and the relay's lease, one row. */
static const char schema_outbox[] =
	"CREATE TABLE IF NOT EXISTS outbox ("
	" seq INTEGER PRIMARY KEY AUTOINCREMENT,"
	" event_id TEXT NOT NULL UNIQUE,"
	" charge_id TEXT NOT NULL,"
	" type TEXT NOT NULL,"
	" body TEXT NOT NULL,"
	" created_at INTEGER NOT NULL,"
	" published_at INTEGER);"
	"CREATE INDEX IF NOT EXISTS outbox_waiting ON outbox (seq) WHERE published_at IS NULL;"
	"CREATE INDEX IF NOT EXISTS outbox_published ON outbox (published_at)"
	" WHERE published_at IS NOT NULL;"
	"CREATE TABLE IF NOT EXISTS outbox_relay ("
	" name TEXT PRIMARY KEY NOT NULL,"
	" holder TEXT NOT NULL,"
	" lease_until INTEGER NOT NULL) WITHOUT ROWID;";

int
ik_sq_outbox_schema(sqlite3 *db, const char *path, ik_err *err)
{
	int rc = sqlite3_exec(db, schema_outbox, NULL, NULL, NULL);
	return rc == SQLITE_OK ? IK_OK : sqerr(db, path, rc, "create the outbox", err);
}


/* ik_outbox_event_id(op, key, owner) for the trigger below. */
static void
fn_event_id(sqlite3_context *c, int argc, sqlite3_value **v)
{
	char id[IK_EVENT_ID_HEX];
	const char *op = (const char *)sqlite3_value_text(v[0]);
	const char *key = (const char *)sqlite3_value_text(v[1]);
	const char *owner = (const char *)sqlite3_value_text(v[2]);

	if (!op || !key) {
		sqlite3_result_error(c, "outbox event id: no op or key", -1);
		return;
	}
	ik_outbox_event_id(op, key, owner, id);
	sqlite3_result_text(c, id, -1, SQLITE_TRANSIENT);
}

/* Fires inside the finish's (or the re-notification's) own UPDATE, so the
 * event commits or rolls back with it; not for idemp-run's records (no
 * charge).  A record's event body that is not
 * JSON (never one idemp-claim accepted) gives null fields, never a failed
 * finish: the money moved. */
static const char outbox_trigger[] =
	"CREATE TEMP TRIGGER IF NOT EXISTS ik_outbox AFTER UPDATE OF state ON main.records"
	" WHEN ((old.state = 'IN_PROGRESS' AND new.state <> 'IN_PROGRESS')"
	"  OR (old.state = 'DEBITED_NOTIFICATION_FAILED' AND new.state = 'DONE'))"
	"  AND NOT (json_valid(new.event) AND json_type(new.event, '$.idempRun') IS NOT NULL)"
	" BEGIN"
	" INSERT OR IGNORE INTO outbox (event_id, charge_id, type, body, created_at)"
	" SELECT x.id, new.key, x.type, json_object('v', 1, 'type', x.type, 'eventId', x.id,"
	"  'chargeId', new.key, 'accountId', json_extract(x.ev, '$.accountId'),"
	"  'amount', json_extract(x.ev, '$.amount'),"
	"  'currency', json_extract(x.ev, '$.currency'),"
	"  'chargeType', json_extract(x.ev, '$.chargeType'),"
	"  'bankRef', new.debit_ref, 'state', new.state, 'reason', new.last_error,"
	"  'attempts', new.attempts, 'at', new.updated_at), new.updated_at"
	" FROM (SELECT y.type AS type,"
	"  ik_outbox_event_id(CASE y.type WHEN 'charge.finished' THEN 'finish'"
	"   ELSE 'renotified' END, new.key, new.owner) AS id,"
	"  CASE WHEN json_valid(new.event) THEN new.event ELSE '{}' END AS ev"
	"  FROM (SELECT CASE old.state WHEN 'IN_PROGRESS' THEN 'charge.finished'"
	"   ELSE 'charge.renotified' END AS type) AS y) AS x;"
	" END;";

int
ik_sq_outbox_enable(sqlite3 *db, const char *path, ik_err *err)
{
	int rc = sqlite3_create_function(db, "ik_outbox_event_id", 3,
	    SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS, NULL, fn_event_id, NULL, NULL);

	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, outbox_trigger, NULL, NULL, NULL);
	return rc == SQLITE_OK ? IK_OK : sqerr(db, path, rc, "outbox trigger", err);
}

/* Prepares sql (a constant) for one call; NULL with err. */
static sqlite3_stmt *
prep(sqlite3 *db, const char *path, const char *what, const char *text, ik_err *err)
{
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(db, text, -1, &s, NULL);

	if (rc != SQLITE_OK) {
		sqerr(db, path, rc, what, err);
		return NULL;
	}
	return s;
}

/* Runs s (finalizing it) as the one statement of a transaction already
 * open: IK_OK or the error, the transaction rolled back. */
static int
tx_step(sqlite3 *db, const char *path, sqlite3_stmt *s, const char *what, ik_err *err)
{
	int rc = sqlite3_step(s);

	sqlite3_finalize(s);
	if (rc == SQLITE_DONE || rc == SQLITE_ROW)
		return IK_OK;
	sqerr(db, path, rc, what, err);
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	return err->code;
}

int
ik_sq_outbox_lease(sqlite3 *db, const char *path, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err)
{
	sqlite3_stmt *s;
	int rc, changed_n;

	if ((rc = tx(db, path, "BEGIN IMMEDIATE", err)))
		return rc;
	if (!(s = prep(db, path, "outbox lease",
	    "INSERT INTO outbox_relay (name, holder, lease_until) VALUES ('relay', ?1, ?2 + ?3)"
	    " ON CONFLICT(name) DO UPDATE SET holder = excluded.holder,"
	    "  lease_until = excluded.lease_until"
	    " WHERE outbox_relay.holder = excluded.holder OR outbox_relay.lease_until <= ?2",
	    err)))
		goto fail;
	sqlite3_bind_text(s, 1, holder, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, now_ms);
	sqlite3_bind_int64(s, 3, lease_ms);
	if ((rc = tx_step(db, path, s, "outbox lease", err)))
		return rc;
	changed_n = sqlite3_changes(db);
	*until = now_ms + lease_ms;
	if (!changed_n) {
		if (!(s = prep(db, path, "outbox lease",
		    "SELECT lease_until FROM outbox_relay WHERE name = 'relay'", err)))
			goto fail;
		*until = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
		sqlite3_finalize(s);
	}
	if ((rc = tx(db, path, "COMMIT", err)))
		goto fail;
	return changed_n ? IK_OK : IK_DUP_IN_PROGRESS;
fail:
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	return err->code;
}

int
ik_sq_outbox_read(sqlite3 *db, const char *path, size_t max, struct ik_outbox_ev *ev, size_t *n,
    ik_err *err)
{
	sqlite3_stmt *s = prep(db, path, "outbox read",
	    "SELECT seq, event_id, charge_id, type, body, created_at FROM outbox"
	    " WHERE published_at IS NULL ORDER BY seq LIMIT ?1", err);
	int rc;

	*n = 0;
	if (!s)
		return err->code;
	sqlite3_bind_int64(s, 1, (int64_t)max);
	while (*n < max && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct ik_outbox_ev *e = &ev[(*n)++];
		e->seq = sqlite3_column_int64(s, 0);
		e->id = col_str(s, 1);
		e->charge_id = col_str(s, 2);
		e->type = col_str(s, 3);
		e->body = col_str(s, 4);
		e->at = sqlite3_column_int64(s, 5);
		if (!e->id || !e->charge_id || !e->type || !e->body) {
			sqlite3_finalize(s);
			for (size_t i = 0; i < *n; i++)
				ik_outbox_ev_free(&ev[i]);
			*n = 0;
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
	}
	sqlite3_finalize(s);
	if (*n < max && rc != SQLITE_DONE) {
		for (size_t i = 0; i < *n; i++)
			ik_outbox_ev_free(&ev[i]);
		*n = 0;
		return sqerr(db, path, rc, "outbox read", err);
	}
	return IK_OK;
}

int
ik_sq_outbox_ack(sqlite3 *db, const char *path, const char *holder,
    const struct ik_outbox_ev *ev, size_t n,
    int64_t now_ms, ik_err *err)
{
	sqlite3_stmt *s;
	int rc, held;

	if ((rc = tx(db, path, "BEGIN IMMEDIATE", err)))
		return rc;
	/* The fence: the lease still ours and live, read in the transaction
	 * that writes the checkpoint (BEGIN IMMEDIATE: no one writes between). */
	if (!(s = prep(db, path, "outbox checkpoint", "SELECT 1 FROM outbox_relay WHERE name = 'relay'"
	    " AND holder = ?1 AND lease_until > ?2", err)))
		goto fail;
	sqlite3_bind_text(s, 1, holder, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, now_ms);
	held = sqlite3_step(s) == SQLITE_ROW;
	sqlite3_finalize(s);
	if (!held) {
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
		return IK_LEASE_LOST;
	}
	for (size_t i = 0; i < n; i++) {
		if (!(s = prep(db, path, "outbox checkpoint", "UPDATE outbox SET published_at = ?1"
		    " WHERE seq = ?2 AND published_at IS NULL", err)))
			goto fail;
		sqlite3_bind_int64(s, 1, now_ms);
		sqlite3_bind_int64(s, 2, ev[i].seq);
		if ((rc = tx_step(db, path, s, "outbox checkpoint", err)))
			return rc;
	}
	if ((rc = tx(db, path, "COMMIT", err)))
		goto fail;
	return IK_OK;
fail:
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	return err->code;
}

int
ik_sq_outbox_purge(sqlite3 *db, const char *path, int64_t before_ms, size_t batch, int64_t *n,
    ik_err *err)
{
	sqlite3_stmt *s = prep(db, path, "outbox purge",
	    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox"
	    " WHERE published_at IS NOT NULL AND published_at < ?1 LIMIT ?2)", err);
	int rc;

	*n = 0;
	if (!s)
		return err->code;
	sqlite3_bind_int64(s, 1, before_ms);
	sqlite3_bind_int64(s, 2, (int64_t)batch);
	rc = sqlite3_step(s);
	sqlite3_finalize(s);
	if (rc != SQLITE_DONE)
		return sqerr(db, path, rc, "outbox purge", err);
	*n = sqlite3_changes(db);
	return IK_OK;
}

int
ik_sq_outbox_stats(sqlite3 *db, const char *path, int64_t now_ms, struct ik_outbox_stats *out,
    ik_err *err)
{
	sqlite3_stmt *s = prep(db, path, "outbox stats",
	    "SELECT (SELECT count(*) FROM outbox WHERE published_at IS NULL),"
	    " (SELECT min(created_at) FROM outbox WHERE published_at IS NULL),"
	    " (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL)", err);
	int rc;

	memset(out, 0, sizeof *out);
	if (!s)
		return err->code;
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		out->waiting = sqlite3_column_int64(s, 0);
		out->oldest_ms = out->waiting && now_ms > sqlite3_column_int64(s, 1) ?
		    now_ms - sqlite3_column_int64(s, 1) : 0;
		out->published = sqlite3_column_int64(s, 2);
	}
	sqlite3_finalize(s);
	return rc == SQLITE_ROW ? IK_OK : sqerr(db, path, rc, "outbox stats", err);
}
