/* must pass tests/sqlcheck.py: every accepted form of constant SQL */
#define COLS "a, b," \
   " c"
static const char *const sql[2] = { [0] = "SELECT " COLS " FROM t", [1] = "COMMIT" };
static const char schema[] = "CREATE TABLE t(a); PRAGMA user_version = 1;";
static int scalar(sqlite3 *db, const char *q) { return sqlite3_prepare_v2(db, q, -1, &s, NULL); }
int f(sqlite3 *db, int n, int which) {
	const char *p = "PRAGMA x; PRAGMA y;";
	scalar(db, "SELECT count(*) FROM t");
	sqlite3_exec(db, schema, 0, 0, 0);
	sqlite3_exec(db, p, 0, 0, 0);
	sqlite3_prepare_v3(db, sql[which], -1, 0, &s, NULL);
	return sqlite3_prepare_v2(db, n ? "SELECT 1" : "SELECT " COLS " FROM t", -1, &s, NULL);
}
