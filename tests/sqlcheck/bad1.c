/* must be refused by tests/sqlcheck.py (see tests/security.bats) */
int f(sqlite3 *db, const char *key) {
	char q[256];
	snprintf(q, sizeof q, "SELECT * FROM t WHERE k = '%s'", key);
	return sqlite3_prepare_v2(db, q, -1, &s, NULL);
}
