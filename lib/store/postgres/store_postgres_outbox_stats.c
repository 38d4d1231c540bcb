/* store_postgres_outbox_stats.c: the PostgreSQL outbox's lag gauge
 * (store.h outbox_stats): the events waiting past the relay's checkpoint,
 * an open resync window's and the slot's, counted by the server within
 * IDEMKIT_OUTBOX_COUNT_MAX WAL changes, and the oldest one's age.  Split
 * out of store_postgres_outbox.c along that seam; what it uses of it
 * through pg_store.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"
#include "store/store.h"

struct cnt {
	int64_t n, oldest;
};

/* An open resync window's events, counted first (the oldest). */
static int
resync_stats(struct pg *p, struct cnt *c, ik_err *err)
{
	char from[3][160], to[24];
	const char *params[] = { from[0], from[1], from[2], to, "2147483647" };
	char *sql;
	PGresult *r;
	int rc;

	if ((rc = ik_pgo_resync_window(p, from, to, err)) || strcmp(to, "0") == 0)
		return rc;
	if (!(sql = ik_pgo_resync_sql(p, "SELECT count(*), min(at) FROM (%s) AS w")))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = ik_pgo_q(p, sql, 5, params, 0, "outbox resync", &r, err);
	free(sql);
	if (rc)
		return rc;
	c->n = ik_pg_col_i64(r, 0, 0);
	c->oldest = ik_pg_col_i64(r, 0, 1);
	PQclear(r);
	return IK_OK;
}

/* The most WAL changes the lag gauge decodes (IDEMKIT_OUTBOX_COUNT_MAX;
 * 0: no bound): past them the events waiting are counted no further.
 * Anything else set there is CONFIG. */
#define COUNT_MAX_DEFAULT 30000

static int
count_max(int *max, ik_err *err)
{
	const char *v = getenv("IDEMKIT_OUTBOX_COUNT_MAX");
	char *end;
	long n;

	*max = COUNT_MAX_DEFAULT;
	if (!v || !*v)
		return IK_OK;
	n = strtol(v, &end, 10);
	if (*end || end == v || n < 0 || n > INT32_MAX)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_OUTBOX_COUNT_MAX=%.32s: not a number of "
		    "WAL changes (0 to %d; 0: no bound)", v, INT32_MAX);
	*max = (int)n;
	return IK_OK;
}

/* A big-endian 8-byte field of a pgoutput message as a bigint. */
#define BE64(E) "('x' || encode(" E ", 'hex'))::bit(64)::bigint"

/* The events waiting in the slot past the checkpoint, counted by the server
 * (peek(), in store_postgres_outbox.c, would bring every one of them
 * here: a backlog's whole size, at every metrics write of a --follow
 * relay) and within the first count_max changes: the gauge's cost is
 * bounded, not the backlog.
 * The same filter as peek(): our prefix, transactional, past the
 * checkpoint's position (the commit's LSN, then the message's), the
 * commit's time from its transaction's Begin. */
static int
slot_count(struct pg *p, uint64_t ck_commit, uint64_t ck_msg, struct cnt *c, int *capped,
    ik_err *err)
{
	char slot[IK_PG_TABLE_MAX + 16], lim[16], prefix[2 * (IK_PG_TABLE_MAX + 24) + 4];
	char plen_s[16], ckc[24], ckm[24];
	char name[IK_PG_TABLE_MAX + 24];
	const char *params[] = { slot, NULL, ckc, ckm, plen_s, prefix };
	int max, plen, rc;
	PGresult *r;

	*capped = 0;
	if (count_max(&max, err))
		return err->code;
	ik_pgo_slot_name(p, slot);
	snprintf(lim, sizeof lim, "%d", max);
	params[1] = max > 0 ? lim : NULL;
	snprintf(ckc, sizeof ckc, "%llu", (unsigned long long)ck_commit);
	snprintf(ckm, sizeof ckm, "%llu", (unsigned long long)ck_msg);
	plen = snprintf(name, sizeof name, "idemkit.outbox.%s", p->u.table) + 1;
	snprintf(plen_s, sizeof plen_s, "%d", plen);
	memcpy(prefix, "\\x", 2);
	for (int i = 0; i < plen; i++)
		snprintf(prefix + 2 + 2 * i, 3, "%02x", (unsigned char)name[i]);
	/* Decoding hands transactions out whole and in commit order (Begin,
	 * its messages, Commit), so a message's commit LSN is the largest
	 * Begin's so far in the peek's own order: one pass, no join. */
	if ((rc = ik_pgo_slot_query(p, "WITH ch AS MATERIALIZED (SELECT n, data FROM"
	    " pg_logical_slot_peek_binary_changes($1, NULL, $2::int, 'proto_version', '1',"
	    " 'publication_names', '" PUBLICATION "', 'messages', 'true')"
	    " WITH ORDINALITY AS t(lsn, xid, data, n)),"
	    " w AS (SELECT data, max(CASE WHEN substr(data, 1, 1) = '\\x42'::bytea AND"
	    " length(data) >= 21 THEN n END) OVER (ORDER BY n) AS bn,"
	    " max(CASE WHEN substr(data, 1, 1) = '\\x42'::bytea AND length(data) >= 21 THEN "
	    BE64("substr(data, 2, 8)") " END) OVER (ORDER BY n) AS cl FROM ch),"
	    " q AS (SELECT count(*) AS c, min(bn) AS bn FROM w"
	    " WHERE substr(data, 1, 2) = '\\x4d01'::bytea AND length(data) >= 14 + $5::int"
	    " AND substr(data, 11, $5::int) = $6::bytea AND bn IS NOT NULL"
	    " AND (cl, " BE64("substr(data, 3, 8)") ") > ($3::numeric, $4::numeric))"
	    " SELECT q.c, (SELECT " BE64("substr(data, 10, 8)") " FROM ch WHERE n = q.bn),"
	    " (SELECT count(*) FROM ch) FROM q", 6, params, 0, "outbox count", slot, &r, err)))
		return rc;
	if (!c->n && ik_pg_col_i64(r, 0, 0))
		c->oldest = ik_pg_col_i64(r, 0, 1) / 1000 + PG_EPOCH_MS;
	c->n += ik_pg_col_i64(r, 0, 0);
	*capped = max > 0 && ik_pg_col_i64(r, 0, 2) >= max;
	PQclear(r);
	return IK_OK;
}

/* The lag gauge: the events waiting, counted by the server within
 * count_max changes (slot_count), and the oldest one's age. */
int
ik_pgo_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out, ik_err *err)
{
	struct pg *p = st->impl;
	struct cnt c = { 0, 0 };
	uint64_t ck_commit, ck_msg;
	int rc, capped = 0;

	memset(out, 0, sizeof *out);
	if ((rc = ik_pgo_ready(p, err)) || (rc = resync_stats(p, &c, err)) ||
	    (rc = ik_pgo_checkpoint(p, &ck_commit, &ck_msg, err)) ||
	    (rc = slot_count(p, ck_commit, ck_msg, &c, &capped, err)))
		return rc;
	out->waiting = c.n;
	out->waiting_capped = capped;
	out->oldest_ms = c.n && now_ms > c.oldest ? now_ms - c.oldest : 0;
	return IK_OK;
}
