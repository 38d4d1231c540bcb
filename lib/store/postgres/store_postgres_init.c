/* store_postgres_init.c: the PostgreSQL store's idemp-init (the port's
 * init): the table created and migrated (each migration in its own
 * transaction, under an advisory lock), the outbox's part, a look at the
 * server's replication, then the records past their retention purged.  A
 * deployment step, never a worker's.  Split out of store_postgres.c along
 * that seam; what it uses of it through pg_store.h. */
#include <stdlib.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"
#include "store/store.h"

#define SCHEMA_VERSION 3
#define PURGE_BATCH "1000"     /* rows per purge transaction */
#define ADVISORY_NS "7652"     /* pg_advisory_lock(ns, hashtext(table)) */

/* Migration N takes the schema from version N-1 to N, each in its own
 * transaction.  %1$s the quoted table, %2$s its bare name (index names). */
static const char *const migrations[SCHEMA_VERSION + 1] = {
	[1] =
	"CREATE TABLE %1$s ("
	" key text PRIMARY KEY,"
	" state text NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE', 'FAILED',"
	"  'DEBITED_NOTIFICATION_FAILED')),"
	" owner text,"
	" lease_until bigint NOT NULL DEFAULT 0,"
	" attempts bigint NOT NULL DEFAULT 0,"
	" fingerprint text NOT NULL,"
	" event text,"
	" debit_ref text,"
	" last_error text,"
	" created_at bigint NOT NULL,"
	" updated_at bigint NOT NULL,"
	" expires_at bigint NOT NULL)",
	/* Recovery lists only the unfinished states: a partial index keeps
	 * them off a scan of the (mostly DONE) table; the purge walks
	 * expires_at. */
	[2] =
	"CREATE INDEX \"%2$s_recover\" ON %1$s (state, updated_at, key)"
	" WHERE state IN ('IN_PROGRESS', 'DEBITED_NOTIFICATION_FAILED', 'FAILED');"
	"CREATE INDEX \"%2$s_expires\" ON %1$s (expires_at)",
	/* Each record keeps its last transitions (store.h); a constant
	 * default adds the column without rewriting the table. */
	[3] =
	"ALTER TABLE %1$s ADD COLUMN IF NOT EXISTS history jsonb NOT NULL DEFAULT '[]'::jsonb",
};

static int
schema_version(struct pg *p, int *version, ik_err *err)
{
	const char *params[] = { p->u.table };
	PGresult *r = ik_pg_exec(p, "SELECT version FROM idemkit_schema WHERE tbl = $1",
	    1, params, 0, "schema version", err);
	int rc = IK_OK;

	if (!r)
		return err->code;
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		rc = ik_pg_err(p, r, "schema version", err);
	else
		*version = PQntuples(r) ? atoi(PQgetvalue(r, 0, 0)) : 0;
	PQclear(r);
	return rc;
}

/* Each pending migration in its own transaction, under an advisory lock
 * so many hosts may run idemp-init at once: the first migrates, the others
 * wait and then find nothing to do. */
static int
migrate(struct pg *p, ik_err *err)
{
	const char *lparams[] = { p->u.table };
	PGresult *lr;
	int rc, version = 0;

	if (!(lr = ik_pg_exec(p, "SELECT pg_advisory_lock(" ADVISORY_NS ", hashtext($1))",
	    1, lparams, 0, "schema lock", err)))
		return err->code;
	rc = PQresultStatus(lr) == PGRES_TUPLES_OK ? IK_OK : ik_pg_err(p, lr, "schema lock", err);
	PQclear(lr);
	if (rc)
		return rc;
	rc = ik_pg_exec_sql(p, "CREATE TABLE IF NOT EXISTS idemkit_schema (tbl text PRIMARY KEY,"
	    " version integer NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())",
	    "create idemkit_schema", err);
	if (!rc)
		rc = schema_version(p, &version, err);
	if (!rc && version > SCHEMA_VERSION)
		rc = ik_errf(err, IK_CONFIG, "postgres %s: schema version %d is newer than "
		    "this idemkit (%d)", p->u.table, version, SCHEMA_VERSION);
	for (int v = version + 1; !rc && v <= SCHEMA_VERSION; v++) {
		char *ddl = ik_pg_with_table(p, migrations[v]), num[16];
		const char *params[] = { p->u.table, num };
		PGresult *r;

		snprintf(num, sizeof num, "%d", v);
		if (!ddl) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			break;
		}
		if (!(rc = ik_pg_exec_sql(p, "BEGIN", "begin migration", err)) &&
		    !(rc = ik_pg_exec_sql(p, ddl, "migrate", err))) {
			r = ik_pg_exec(p, "INSERT INTO idemkit_schema (tbl, version)"
			    " VALUES ($1, $2::integer) ON CONFLICT (tbl) DO UPDATE"
			    " SET version = excluded.version, migrated_at = now()",
			    2, params, 0, "record schema version", err);
			if (!r)
				rc = err->code;
			else if (PQresultStatus(r) != PGRES_COMMAND_OK)
				rc = ik_pg_err(p, r, "record schema version", err);
			PQclear(r);
			if (!rc)
				rc = ik_pg_exec_sql(p, "COMMIT", "commit migration", err);
		}
		if (rc)
			ik_pg_rollback(p);
		else
			ik_log(IK_LOG_INFO, "migrated", "table", p->u.table, "version", num, NULL);
		free(ddl);
	}
	if (p->conn && PQstatus(p->conn) == CONNECTION_OK) {
		ik_err e = { 0 };
		PQclear(ik_pg_exec(p, "SELECT pg_advisory_unlock(" ADVISORY_NS ", hashtext($1))",
		    1, lparams, 0, "schema unlock", &e));
	}
	return rc;
}

/* Deletes records past their retention in batches of PURGE_BATCH rows, each
 * its own short transaction (SKIP LOCKED: never waits on a worker); never
 * one whose lease is live on the server's clock (expiresAt is on the
 * claiming worker's): forgotten, it could be claimed afresh and debited
 * while its holder debits it. */
static int
purge(struct pg *p, ik_err *err)
{
	char *q = ik_pg_with_table(p,
	    "DELETE FROM %1$s WHERE key IN (SELECT key FROM %1$s"
	    " WHERE expires_at < floor(extract(epoch FROM clock_timestamp()))::bigint"
	    " AND NOT (state = 'IN_PROGRESS' AND lease_until >= " NOW_MS ")"
	    " ORDER BY expires_at LIMIT " PURGE_BATCH " FOR UPDATE SKIP LOCKED)");
	long long total = 0, got;
	char num[24];
	int rc = IK_OK;

	if (!q)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	do {
		PGresult *r = ik_pg_exec(p, q, 0, NULL, 0, "purge", err);
		if (!r) {
			rc = err->code;
			break;
		}
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			rc = ik_pg_err(p, r, "purge", err);
			PQclear(r);
			break;
		}
		got = atoll(PQcmdTuples(r));
		total += got;
		PQclear(r);
	} while (got == atoll(PURGE_BATCH));
	free(q);
	snprintf(num, sizeof num, "%lld", total);
	if (!rc)
		ik_log(IK_LOG_INFO, "purged expired records", "table", p->u.table, "deleted", num, NULL);
	return rc;
}

int
ik_pg_init(struct ik_store *st, ik_err *err)
{
	struct pg *p = st->impl;
	int rc;

	if ((rc = ik_pg_conn_ok(p, err)) || (rc = migrate(p, err)) || (rc = ik_pg_history_column(p, err)) ||
	    (ik_pgo_on() && (rc = ik_pgo_init(p, err))))
		return rc;
	ik_pg_replication_check(p);
	return purge(p, err);
}
