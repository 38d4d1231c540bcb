/* must be refused by tests/sqlcheck.py (see tests/security.bats) */
int f(sqlite3 *db, const char *key) {
	char *q = sqlite3_mprintf("DELETE FROM t WHERE k = %Q", key);
	return sqlite3_exec(db, q, 0, 0, 0);
}
