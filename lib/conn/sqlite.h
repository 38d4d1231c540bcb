/* sqlite.h: what every SQLite file of idemkit shares (the store, the queue):
 * created 0600 before SQLite sees it, WAL, synchronous=FULL so a commit is
 * on disk before we report it, a busy timeout ($IDEMKIT_BUSY_TIMEOUT, default
 * 10s) so many processes can share one file, and one mapping of SQLite
 * errors to outcomes. */
#ifndef IK_SQLITE_H
#define IK_SQLITE_H

#include <sqlite3.h>

#include "core/err.h"

/* Opens (creating) path.  what names the file in messages ("sqlite",
 * "sqlite queue").  IK_OK with *db set, or an outcome code with err and
 * *db NULL. */
int ik_sqlite_open(const char *path, const char *what, sqlite3 **db, ik_err *err);

/* An SQLite result code as an outcome: contention, I/O and a full disk are
 * transient; a file that cannot be opened or written is configuration; the
 * rest is ours.  Fills err with "WHAT PATH: DOING: sqlite's message". */
int ik_sqlite_err(sqlite3 *db, int rc, const char *what, const char *path,
    const char *doing, ik_err *err);

#endif
