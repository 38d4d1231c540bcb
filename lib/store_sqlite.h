/* store_sqlite.h: the SQLite adapter's statements for the stats op, exposed
 * for the query-plan test (tests/unit/sqlite_stats_plan.c), which proves
 * they search the records_state index instead of scanning the table.
 * Commands use store.h only. */
#ifndef IK_STORE_SQLITE_H
#define IK_STORE_SQLITE_H

enum { IK_SQ_STATS_COUNT, IK_SQ_STATS_STUCK, IK_SQ_STATS_DNF, IK_SQ_STATS_N };
extern const char *const ik_sq_stats_sql[IK_SQ_STATS_N];

#endif
