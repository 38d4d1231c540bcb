/* must be refused by tests/sqlcheck.py (see tests/security.bats) */
int f(sqlite3 *db, int all, const char *extra) {
	return sqlite3_prepare_v2(db, all ? "SELECT 1" : extra, -1, &s, NULL);
}
