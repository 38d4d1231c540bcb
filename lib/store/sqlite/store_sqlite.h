/* store_sqlite.h: the SQLite adapter's statements for the stats op, exposed
 * for the query-plan test (tests/unit/sqlite_stats_plan.c), which proves
 * they search the records_state index instead of scanning the table; and
 * its outbox (store_sqlite_outbox.c), on the adapter's connection db; its
 * constructor.  Commands use store.h only. */
#ifndef IK_STORE_SQLITE_H
#define IK_STORE_SQLITE_H

enum { IK_SQ_STATS_COUNT, IK_SQ_STATS_STUCK, IK_SQ_STATS_DNF, IK_SQ_STATS_N };
extern const char *const ik_sq_stats_sql[IK_SQ_STATS_N];

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "core/err.h"

struct ik_outbox_ev;
struct ik_outbox_stats;
struct ik_store;

/* The adapter's constructor, for the factory (open_store.c). */
int ik_store_sqlite_open(const char *path, struct ik_store *s, ik_err *err);

/* The outbox tables (in the migration's transaction); the trigger and its
 * eventId function on this connection ($IDEMKIT_OUTBOX set); the outbox
 * ops of store.h. */
int ik_sq_outbox_schema(sqlite3 *db, const char *path, ik_err *err);
int ik_sq_outbox_enable(sqlite3 *db, const char *path, ik_err *err);
int ik_sq_outbox_lease(sqlite3 *db, const char *path, const char *holder, int64_t now_ms,
    int64_t lease_ms, int64_t *until, ik_err *err);
int ik_sq_outbox_read(sqlite3 *db, const char *path, size_t max, struct ik_outbox_ev *ev,
    size_t *n, ik_err *err);
int ik_sq_outbox_ack(sqlite3 *db, const char *path, const char *holder,
    const struct ik_outbox_ev *ev,
    size_t n, int64_t now_ms, ik_err *err);
int ik_sq_outbox_purge(sqlite3 *db, const char *path, int64_t before_ms, size_t batch,
    int64_t *n, ik_err *err);
int ik_sq_outbox_stats(sqlite3 *db, const char *path, int64_t now_ms,
    struct ik_outbox_stats *out, ik_err *err);

#endif
