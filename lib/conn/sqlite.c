/* sqlite.c: opening idemkit's SQLite files the same way everywhere; see
 * sqlite.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conn/sqlite.h"
#include "core/outcome.h"
#include "core/util.h"

int
ik_sqlite_err(sqlite3 *db, int rc, const char *what, const char *path,
    const char *doing, ik_err *err)
{
	int code;

	switch (rc & 0xff) {
	case SQLITE_BUSY: case SQLITE_LOCKED: case SQLITE_IOERR: case SQLITE_FULL:
	case SQLITE_PROTOCOL:
		code = IK_TEMPFAIL;
		break;
	case SQLITE_CANTOPEN: case SQLITE_PERM: case SQLITE_READONLY:
	case SQLITE_AUTH: case SQLITE_NOTADB:
		code = IK_CONFIG;
		break;
	default:
		code = IK_SOFTWARE;
	}
	return ik_errf(err, code, "%s %s: %s: %s", what, path, doing,
	    db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

/* WAL is a property of the file; switching needs a moment alone with it,
 * so a crowd of first openers may each be told "busy" and must try again. */
static int
set_wal(sqlite3 *db, const char *what, const char *path, ik_err *err)
{
	for (int tries = 0; tries < 200; tries++) {
		sqlite3_stmt *s;
		int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
		int ok = 0;

		if (rc != SQLITE_OK)
			return ik_sqlite_err(db, rc, what, path, "journal mode", err);
		rc = sqlite3_step(s);
		if (rc == SQLITE_ROW)
			ok = strcmp((const char *)sqlite3_column_text(s, 0), "wal") == 0;
		sqlite3_finalize(s);
		if (ok)
			return IK_OK;
		if (rc != SQLITE_ROW && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
			return ik_sqlite_err(db, rc, what, path, "journal mode", err);
		ik_sleep_ms(5 + tries);
	}
	return ik_errf(err, IK_TEMPFAIL, "%s %s: could not switch to WAL (busy)", what, path);
}

int
ik_sqlite_open(const char *path, const char *what, sqlite3 **db, ik_err *err)
{
	const char *bt = getenv("IDEMKIT_BUSY_TIMEOUT");
	int64_t busy_ms = 10000;
	int fd, rc;

	*db = NULL;
	if (bt && *bt && ik_parse_duration(bt, &busy_ms) < 0)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_BUSY_TIMEOUT: \"%s\" is not a duration", bt);
	/* Create the file ourselves so it is 0600 from its first byte; SQLite
	 * gives the -wal and -shm files the same mode.  Only a file not there
	 * yet: SQLite's locks are POSIX record locks, which belong to the
	 * process, and closing any descriptor of the file drops them all.  A
	 * process that opens the file a second time (the embedded queue and
	 * its DLQ live in one file) would lose the shared lock its first
	 * connection holds; another process closing its last connection would
	 * then take the file as unused, checkpoint and delete the WAL under
	 * this one, whose writes went on into the deleted WAL: acked deletes
	 * lost, then "database disk image is malformed". */
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	else if (errno != EEXIST || access(path, R_OK | W_OK) != 0)
		return ik_errf(err, errno == EACCES || errno == ENOENT || errno == EROFS ||
		    errno == EISDIR || errno == ENOTDIR ? IK_CONFIG : IK_TEMPFAIL,
		    "%s %s: %s", what, path, strerror(errno));
	rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK)
		goto fail;
	sqlite3_busy_timeout(*db, (int)(busy_ms > 600000 ? 600000 : busy_ms));
	if ((rc = set_wal(*db, what, path, err)) != IK_OK)
		goto out;
	rc = sqlite3_exec(*db, "PRAGMA synchronous = FULL", NULL, NULL, NULL);
	if (rc == SQLITE_OK)
		return IK_OK;
fail:
	rc = ik_sqlite_err(*db, rc, what, path, "open", err);
out:
	sqlite3_close(*db);
	*db = NULL;
	return rc;
}
