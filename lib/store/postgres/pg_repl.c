/* pg_repl.c: idemp-init's look at how the PostgreSQL server replicates.
 *
 * A record that says a charge was debited (DONE, DEBITED_NOTIFICATION_FAILED)
 * must survive a failover: a standby promoted without it would let a
 * redelivery claim the charge again.  The bank's idempotency key still
 * absorbs that second debit, but the record and the notification would be
 * made twice, and a failover would cost a replay per charge in the window.
 * That holds only when a commit waits for a standby's flush:
 * synchronous_standby_names names the standbys, and synchronous_commit is
 * on or remote_apply (remote_write returns before the standby's disk has
 * it, local and off before any standby has it; off loses the last commits
 * even on a crash with no standby at all).  The server knows whether it
 * streams to standbys (pg_stat_replication counts them, to any role).
 *
 * So: a warning on stderr naming the setting, nothing else; the store is
 * the team's to configure (docs/RELIABILITY.md), and the exit status of
 * idemp-init is unchanged.  What could not be read is not a warning:
 * settings a role cannot see say nothing about the store.
 */
#include <string.h>

#include "core/log.h"
#include "store/postgres/pg_store.h"

void
ik_pg_replication_check(struct pg *p)
{
	ik_err e = { 0 };
	PGresult *r = ik_pg_exec(p, "SELECT current_setting('synchronous_standby_names'),"
	    " current_setting('synchronous_commit'), (SELECT count(*) FROM pg_stat_replication)",
	    0, NULL, 0, "replication check", &e);
	const char *names, *commit, *n;
	int standbys;

	if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		PQclear(r);
		return;
	}
	names = PQgetvalue(r, 0, 0);
	commit = PQgetvalue(r, 0, 1);
	n = PQgetvalue(r, 0, 2);
	standbys = n && strcmp(n, "0") != 0;
	if (standbys && names && !*names)
		ik_log(IK_LOG_WARN, "the server streams to standbys asynchronously "
		    "(synchronous_standby_names is empty): a failover loses the commits "
		    "not yet streamed, finished records included; name the standbys in "
		    "synchronous_standby_names", "setting", "synchronous_standby_names",
		    "standbys", n, NULL);
	if (commit && strcmp(commit, "on") != 0 && strcmp(commit, "remote_apply") != 0 &&
	    (standbys || strcmp(commit, "off") == 0))
		ik_log(IK_LOG_WARN, "a commit returns before it is durable where a failover "
		    "(or, when off, a crash) needs it: set synchronous_commit to on or "
		    "remote_apply", "setting", "synchronous_commit", "value", commit,
		    "standbys", n, NULL);
	PQclear(r);
}
