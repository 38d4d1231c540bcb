/* must be refused by tests/sqlcheck.py (see tests/security.bats) */
int f(sqlite3 *db, const char *extra) {
	const char *sql = "SELECT 1";
	if (extra) sql = extra;
	return sqlite3_exec(db, sql, 0, 0, 0);
}
