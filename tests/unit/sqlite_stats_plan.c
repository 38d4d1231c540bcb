/* sqlite_stats_plan: the SQLite store's stats statements against a store
 * of argv[1] holding 2000 DONE records and a few unfinished ones.  For each
 * statement prints "NAME plan DETAIL" per EXPLAIN QUERY PLAN row and
 * "NAME fullscan N" (SQLITE_STMTSTATUS_FULLSCAN_STEP after running it), so
 * tests/idemp-stats.bats can prove no statement scans the table. */
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "core/outcome.h"
#include "open/open_store.h"
#include "store/sqlite/store_sqlite.h"
#include "store/store.h"

static const char *const names[IK_SQ_STATS_N] = { "COUNT", "STUCK", "DNF" };

int
main(int argc, char **argv)
{
	char url[4096], sqlbuf[1024];
	struct ik_store *s;
	sqlite3 *db;
	sqlite3_stmt *st;
	ik_err err = { 0 };
	int i;

	if (argc != 2)
		return 64;
	snprintf(url, sizeof url, "sqlite:%s", argv[1]);
	if (ik_store_open(url, &s, &err) != IK_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	ik_store_close(s);
	if (sqlite3_open(argv[1], &db) != SQLITE_OK)
		return 1;
	sqlite3_exec(db, "BEGIN;"
	    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)"
	    " INSERT INTO records(key, state, fingerprint, created_at, updated_at, expires_at)"
	    " SELECT 'D' || i, 'DONE', 'f', i, i, 4000000000 FROM n;"
	    "INSERT INTO records(key, state, fingerprint, lease_until, created_at, updated_at,"
	    " expires_at) VALUES ('S1', 'IN_PROGRESS', 'f', 5, 1, 1, 4000000000),"
	    " ('L1', 'IN_PROGRESS', 'f', 9000000000000, 1, 1, 4000000000),"
	    " ('N1', 'DEBITED_NOTIFICATION_FAILED', 'f', 0, 1, 7, 4000000000);"
	    "ANALYZE; COMMIT;", NULL, NULL, NULL);
	for (i = 0; i < IK_SQ_STATS_N; i++) {
		snprintf(sqlbuf, sizeof sqlbuf, "EXPLAIN QUERY PLAN %s", ik_sq_stats_sql[i]);
		if (sqlite3_prepare_v2(db, sqlbuf, -1, &st, NULL) != SQLITE_OK) {
			fprintf(stderr, "%s\n", sqlite3_errmsg(db));
			return 1;
		}
		if (i == IK_SQ_STATS_COUNT)
			sqlite3_bind_text(st, 1, "IN_PROGRESS", -1, SQLITE_STATIC);
		else if (i == IK_SQ_STATS_STUCK)
			sqlite3_bind_int64(st, 1, 1000);
		while (sqlite3_step(st) == SQLITE_ROW)
			printf("%s plan %s\n", names[i], (const char *)sqlite3_column_text(st, 3));
		sqlite3_finalize(st);
		if (sqlite3_prepare_v2(db, ik_sq_stats_sql[i], -1, &st, NULL) != SQLITE_OK)
			return 1;
		if (i == IK_SQ_STATS_COUNT)
			sqlite3_bind_text(st, 1, "IN_PROGRESS", -1, SQLITE_STATIC);
		else if (i == IK_SQ_STATS_STUCK)
			sqlite3_bind_int64(st, 1, 1000);
		while (sqlite3_step(st) == SQLITE_ROW)
			printf("%s row %lld\n", names[i], (long long)sqlite3_column_int64(st, 0));
		printf("%s fullscan %d\n", names[i],
		       sqlite3_stmt_status(st, SQLITE_STMTSTATUS_FULLSCAN_STEP, 0));
		printf("%s steps %d\n", names[i], sqlite3_stmt_status(st, SQLITE_STMTSTATUS_VM_STEP, 0));
		sqlite3_finalize(st);
	}
	sqlite3_close(db);
	return 0;
}
