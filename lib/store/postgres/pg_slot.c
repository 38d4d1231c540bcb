/* pg_slot.c: the PostgreSQL outbox's replication slot as every connection
 * of the store sees it (pg_store.h): whether the outbox is on, the slot's
 * name, the slot looked for on each new connection (what was read ahead
 * on another one dropped), and the claims refused while it is missing.
 * Below the connection (pg_conn.c) and the outbox's ops
 * (store_postgres_outbox.c), which both use it; it uses neither. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"
#include "store/store.h"

int
ik_pgo_on(void)
{
	return ik_outbox_url() != NULL;
}

void
ik_pgo_slot_name(const struct pg *p, char out[IK_PG_TABLE_MAX + 16])
{
	snprintf(out, IK_PG_TABLE_MAX + 16, "idemkit_%s", p->u.table);
}

/* Runs q with n text parameters; *out the result on IK_OK. */
int
ik_pgo_q(struct pg *p, const char *sql, int n, const char *const *params, int binary,
    const char *doing, PGresult **out, ik_err *err)
{
	PGresult *r = ik_pg_exec(p, sql, n, params, binary, doing, err);
	int rc;

	*out = NULL;
	if (!r)
		return err->code;
	if (PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK) {
		*out = r;
		return IK_OK;
	}
	rc = ik_pg_err(p, r, doing, err);
	PQclear(r);
	return rc;
}

/* Per connection, with the outbox on: whether the slot is there to decode
 * what the finishes emit (p->obx_slot), and that the server can. */
int
ik_pgo_check(struct pg *p, ik_err *err)
{
	char slot[IK_PG_TABLE_MAX + 16];
	const char *params[] = { slot };
	PGresult *r;
	int rc;

	/* What was read ahead on another connection may be another server's
	 * (a failover: its last transactions may never have reached this one). */
	ik_pgo_close(p);
	ik_pgo_slot_name(p, slot);
	if ((rc = ik_pgo_q(p, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1"
	    " AND database = current_database() AND wal_status IS DISTINCT FROM 'lost')",
	    1, params, 0, "outbox slot", &r, err)))
		return rc;
	p->obx_slot = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	return IK_OK;
}

/* Before a claim: no claim while the finishes' events would be lost. */
int
ik_pgo_claim_gate(struct pg *p, ik_err *err)
{
	char slot[IK_PG_TABLE_MAX + 16];

	if (!ik_pgo_on() || p->obx_slot)
		return IK_OK;
	ik_pgo_slot_name(p, slot);
	return ik_errf(err, IK_CONFIG, "postgres %s: IDEMKIT_OUTBOX is set but the replication "
	    "slot %s does not exist (or lost its WAL): a finish's event would be lost; run "
	    "idemp-init with IDEMKIT_OUTBOX set (a role with REPLICATION) to create it",
	    p->u.table, slot);
}

void
ik_pgo_close(struct pg *p)
{
	for (size_t i = p->obx_head; i < p->obx_n; i++)
		ik_outbox_ev_free(&p->obx_ahead[i]);
	free(p->obx_ahead);
	p->obx_ahead = NULL;
	p->obx_n = p->obx_head = 0;
}
