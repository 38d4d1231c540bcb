/* must be refused by tests/sqlcheck.py (see tests/security.bats) */
static int scalar(sqlite3 *db, const char *sql) { return sqlite3_prepare_v2(db, sql, -1, &s, NULL); }
int g(sqlite3 *db, const char *table) { scalar(db, "SELECT 1"); return scalar(db, table); }
