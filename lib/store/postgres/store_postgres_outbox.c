/* store_postgres_outbox.c: the PostgreSQL store's outbox (store.h,
 * outbox.h), on the adapter's own connection (store_postgres.c and
 * pg_conn.c call in through pg_store.h).
 *
 * Rules: with $IDEMKIT_OUTBOX set, the finish's and the re-notification's
 * own statement also calls pg_logical_emit_message(true, ...): a
 * transactional message in the WAL, decoded only if that transaction
 * commits (a group's, a pipeline batch's too), so the event can never be
 * written without the finish nor the finish without it, and the pipeline
 * gains no statement, no round trip and no commit.  The relay reads the
 * messages through logical decoding: a replication slot per table
 * (idemkit_TABLE, plugin pgoutput with messages on, over an empty
 * publication so the rows of the records table are filtered out in the
 * server), peeked, never consumed, in commit order.  An event's position
 * is (its transaction's commit LSN, its own LSN): commit order first, as
 * decoding hands them out.  The checkpoint is that position written in
 * the relay's row (idemkit_outbox_relay) by ONE statement that also checks
 * the lease (the fence: a statement reads the row it locks); the slot is
 * advanced to the checkpoint's commit LSN later, before the relay's next
 * peek, outside any transaction (pg_replication_slot_advance cannot run in
 * one): the slot frees WAL, the row says what was published.  One peek
 * reads ahead up to AHEAD_MAX events (a peek decodes from the slot on: per
 * batch of 10 it would be most of the relay's time).  The slot is never ahead of
 * the row, so events decoded again after a crash (the checkpoint's own
 * transaction) are skipped by position, and a stale relay's late advance
 * moves nothing the row has not passed.  Leases on the server's clock,
 * as the records'.  A message decoded only if a slot existed when it was
 * written: a claim is refused (CONFIG) while the slot is missing, a
 * finish never is (the money moved).  SQL only as constant text with
 * bound parameters; the table's names are checked identifiers.  The lag
 * gauge is store_postgres_outbox_stats.c's.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"
#include "store/store.h"

#define PEEK_FIRST 2048                /* changes a read peeks at first */
#define AHEAD_MAX 1024                 /* events read ahead from one peek */
#define PEEK_MAX (1 << 22)             /* and at most, doubling */
#define SLOT_BUSY_TRIES 100            /* a slot another backend holds: */
#define SLOT_BUSY_WAIT_MS 20           /* waited for this long at most */

/* An event (idemkit(7) OUTBOX, the schema under docs/) as JSON text, from
 * SQL expressions for its parts; EV is the claim's event as json.  Its
 * eventId is ik_outbox_event_id (store.c) written in SQL, byte for byte:
 * SHA-256 over each part with its NUL, the first 128 bits in hex
 * (tests/outbox-postgres.bats checks that the two agree).  Both users
 * below are printf formats ('%%'). */
#define EVENT_JSON(TYPE, ID, KEY, EV, REF, STATE, REASON, ATTEMPTS, AT) \
	"json_build_object('v', 1, 'type', " TYPE ", 'eventId', " ID ", 'chargeId', " KEY "," \
	" 'accountId', " EV "->'accountId', 'amount', " EV "->'amount'," \
	" 'currency', " EV "->'currency', 'chargeType', " EV "->'chargeType'," \
	" 'bankRef', " REF ", 'state', " STATE ", 'reason', " REASON "," \
	" 'attempts', " ATTEMPTS ", 'at', " AT ")::text"
#define EVENT_ID(OP, KEY, OWNER) \
	"substr(encode(sha256('idemkit.outbox.v1'::bytea || '\\x00'::bytea" \
	" || convert_to(" OP ", 'UTF8') || '\\x00'::bytea || convert_to(" KEY ", 'UTF8')" \
	" || '\\x00'::bytea || convert_to(COALESCE(" OWNER ", ''), 'UTF8') || '\\x00'::bytea)," \
	" 'hex'), 1, 32)"
/* A record's event column as json; text that is not an object (never one
 * idemp-claim accepted) gives null fields, never a failed finish. */
#define EVENT_EV(COL) "CASE WHEN " COL " LIKE '{%%' THEN " COL "::json ELSE '{}'::json END"

/* The event of a finish's (or re-notification's) row u, built by the
 * statement itself from what it wrote.  idemp-run's records (no charge)
 * emit nothing but still count as the row changed. */
#define EMIT(OP, TYPE) \
	" SELECT CASE WHEN x.ev->'idempRun' IS NULL THEN pg_logical_emit_message(true," \
	"  'idemkit.outbox.%s', " EVENT_JSON("'" TYPE "'", "x.id", "u.key", "x.ev", \
	    "u.debit_ref", "u.state", "u.last_error", "u.attempts", "u.updated_at") ") END" \
	" FROM u, LATERAL (SELECT " EVENT_ID("'" OP "'", "u.key", "u.owner") " AS id, " \
	    EVENT_EV("u.event") " AS ev) AS x"

/* After a new slot replaced one that was lost (a failover, or
 * max_slot_wal_keep_size), the events of the window the WAL can no longer
 * give, from the records' history (store_postgres.c writes each finish's
 * state, owner, reference and reason there, and each re-notification): the
 * same events, the same eventIds.  $1-$3: where the relay is in the window
 * (time, op, key), $4 its end, $5 how many.  A scan of the table: rare. */
#define RESYNC_SQL \
	"SELECT h.at, h.op, r.key, " EVENT_JSON( \
	    "CASE h.op WHEN 'finish' THEN 'charge.finished' ELSE 'charge.renotified' END", \
	    EVENT_ID("h.op", "r.key", "CASE h.op WHEN 'finish' THEN h.e->>'owner' ELSE r.owner END"), \
	    "r.key", "x.ev", \
	    "CASE h.op WHEN 'finish' THEN COALESCE(h.e->>'debitRef', r.debit_ref) ELSE r.debit_ref END", \
	    "CASE h.op WHEN 'finish' THEN h.e->>'state' ELSE 'DONE' END", \
	    "CASE h.op WHEN 'finish' THEN h.e->>'error' END", "r.attempts", "h.at") \
	" FROM %s AS r," \
	" LATERAL (SELECT (e->>'at')::bigint AS at, e->>'op' AS op, e" \
	"  FROM jsonb_array_elements(r.history) AS e) AS h," \
	" LATERAL (SELECT " EVENT_EV("r.event") " AS ev) AS x" \
	" WHERE r.updated_at >= $1::bigint AND h.op IN ('finish', 'renotified')" \
	"  AND (h.at, h.op, r.key) > ($1::bigint, $2::text, $3::text) AND h.at <= $4::bigint" \
	"  AND x.ev->'idempRun' IS NULL" \
	" ORDER BY h.at, h.op, r.key LIMIT $5::int"
#define RESYNC_MARGIN_MS "60000"   /* before the last checkpoint: a finish's
                                    * statement runs before its commit */
#define RETURNING " RETURNING r.key, r.owner, r.state, r.debit_ref, r.last_error," \
	" r.attempts, r.updated_at, r.event)"

static const char relay_table[] =
	"CREATE TABLE IF NOT EXISTS idemkit_outbox_relay ("
	" tbl text PRIMARY KEY,"
	" holder text NOT NULL,"
	" lease_until bigint NOT NULL,"
	" ckpt_commit pg_lsn NOT NULL DEFAULT '0/0',"
	" ckpt_msg pg_lsn NOT NULL DEFAULT '0/0',"
	" ckpt_at bigint NOT NULL DEFAULT 0,"
	/* a window to re-publish from the records (RESYNC_SQL): to 0 = none */
	" resync_from bigint NOT NULL DEFAULT 0,"
	" resync_op text NOT NULL DEFAULT '',"
	" resync_key text NOT NULL DEFAULT '',"
	" resync_to bigint NOT NULL DEFAULT 0)";

/* The finish's or re-notification's statement sql ("WITH n AS (...)
 * UPDATE ... WHERE ...", store_postgres.c) made into one that also emits
 * its event: the UPDATE becomes the CTE u, the message is selected from
 * its row, so the statement still answers one row when it changed one. */
int
ik_pgo_wrap(struct pg *p, int which, char **sql, ik_err *err)
{
	const char *emit = which == Q_FINISH ? EMIT("finish", "charge.finished") :
	    EMIT("renotified", "charge.renotified");
	const char *upd = strstr(*sql, ") UPDATE ");
	struct ik_buf b = { 0 };
	char *e;
	size_t n;

	if (strncmp(*sql, "WITH n AS (", 11) != 0 || !upd)
		return ik_errf(err, IK_SOFTWARE, "postgres: outbox: unexpected statement");
	n = strlen(emit) + sizeof p->u.table;
	if (!(e = malloc(n)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(e, n, emit, p->u.table);    /* emit: a constant of ours */
	if (ik_buf_add(&b, *sql, (size_t)(upd + 1 - *sql)) || ik_buf_addstr(&b, ", u AS (") ||
	    ik_buf_addstr(&b, upd + 2) || ik_buf_addstr(&b, RETURNING) || ik_buf_addstr(&b, e)) {
		free(e);
		ik_buf_free(&b);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	free(e);
	free(*sql);
	*sql = b.p;
	return IK_OK;
}

/* A new slot where one was before (the relay's row has a time: the last
 * checkpoint's, else the first slot's; a failover brought it across, or
 * the old slot was lost): what was finished from a little before that
 * until now is re-published from the records, once, before what the new
 * slot decodes.  Copies of what was published already carry the same
 * eventIds.  The first slot writes its time there instead: nothing
 * finished before it had an outbox. */
static int
resync_mark(struct pg *p, ik_err *err)
{
	const char *params[] = { p->u.table };
	PGresult *r;
	int rc;

	if ((rc = ik_pgo_q(p, "UPDATE idemkit_outbox_relay SET resync_from = ckpt_at - " RESYNC_MARGIN_MS
	    ", resync_op = '', resync_key = '', resync_to = " NOW_MS " WHERE tbl = $1"
	    " AND ckpt_at > 0 RETURNING resync_from, resync_to", 1, params, 0, "outbox resync",
	    &r, err)))
		return rc;
	if (PQntuples(r) == 1)
		ik_log(IK_LOG_WARN, "a new outbox slot where a relay worked before (a failover, or "
		    "a lost slot): the relay re-publishes from the records what finished from a "
		    "minute before its last checkpoint until now", "table", p->u.table,
		    "fromMs", PQgetvalue(r, 0, 0), "toMs", PQgetvalue(r, 0, 1), NULL);
	PQclear(r);
	if ((rc = ik_pgo_q(p, "INSERT INTO idemkit_outbox_relay AS o (tbl, holder, lease_until, ckpt_at)"
	    " VALUES ($1, '', 0, " NOW_MS ") ON CONFLICT (tbl) DO UPDATE"
	    " SET ckpt_at = excluded.ckpt_at WHERE o.ckpt_at = 0", 1, params, 0, "outbox slot time",
	    &r, err)))
		return rc;
	PQclear(r);
	return IK_OK;
}

/* idemp-init with the outbox on: wal_level, the relay's table, the empty
 * publication pgoutput wants, the slot.  Each idempotent; a concurrent
 * creator's duplicate is no error. */
int
ik_pgo_init(struct pg *p, ik_err *err)
{
	char slot[IK_PG_TABLE_MAX + 16];
	const char *params[] = { slot };
	PGresult *r;
	int rc, have, lost;

	ik_pgo_slot_name(p, slot);
	if ((rc = ik_pgo_q(p, "SELECT current_setting('wal_level')", 0, NULL, 0, "wal_level", &r, err)))
		return rc;
	if (strcmp(PQgetvalue(r, 0, 0), "logical") != 0) {
		rc = ik_errf(err, IK_CONFIG, "postgres %s: the outbox needs wal_level = logical "
		    "(it is %.16s; postgresql.conf, then a restart)", p->u.table, PQgetvalue(r, 0, 0));
		PQclear(r);
		return rc;
	}
	PQclear(r);
	if ((rc = ik_pgo_q(p, relay_table, 0, NULL, 0, "create idemkit_outbox_relay", &r, err)))
		return rc;
	PQclear(r);
	/* The publication before the slot: decoding reads the catalog as it
	 * was at each change, and pgoutput wants its publication there. */
	if ((rc = ik_pgo_q(p, "SELECT 1 FROM pg_publication WHERE pubname = '" PUBLICATION "'", 0, NULL,
	    0, "outbox publication", &r, err)))
		return rc;
	have = PQntuples(r) == 1;
	PQclear(r);
	if (!have) {
		if (!(r = ik_pg_exec(p, "CREATE PUBLICATION " PUBLICATION, 0, NULL, 0,
		    "create publication " PUBLICATION, err)))
			return err->code;
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
			if (!st || strcmp(st, "42710") != 0) {
				rc = ik_pg_err(p, r, "create publication " PUBLICATION, err);
				PQclear(r);
				return rc;
			}
		}
		PQclear(r);
	}
	if ((rc = ik_pgo_q(p, "SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = $1",
	    1, params, 0, "outbox slot", &r, err)))
		return rc;
	have = PQntuples(r) == 1;
	lost = have && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (lost) {
		/* invalidated (max_slot_wal_keep_size): it can decode nothing */
		ik_log(IK_LOG_WARN, "the outbox's replication slot lost its WAL; making it again",
		    "slot", slot, NULL);
		if ((rc = ik_pgo_q(p, "SELECT pg_drop_replication_slot($1)", 1, params, 0,
		    "drop the lost outbox slot", &r, err)))
			return rc;
		PQclear(r);
		have = 0;
	}
	if (!have) {
		if (!(r = ik_pg_exec(p, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
		    1, params, 0, "create the outbox's replication slot", err)))
			return err->code;
		if (PQresultStatus(r) != PGRES_TUPLES_OK) {
			const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
			if (!st || strcmp(st, "42710") != 0) {
				rc = ik_pg_err(p, r, "create the outbox's replication slot (the role "
				    "needs REPLICATION)", err);
				PQclear(r);
				return rc;
			}
		}
		PQclear(r);
		ik_log(IK_LOG_INFO, "created the outbox's replication slot", "slot", slot, NULL);
		if ((rc = resync_mark(p, err)))
			return rc;
	}
	return ik_pgo_check(p, err);
}

int
ik_pgo_ready(struct pg *p, ik_err *err)
{
	char name[16];

	/* connected, the table's columns and the slot known */
	return ik_pg_prepare(p, Q_GET, 1, "read record", name, err);
}

/* idemp-claim --check-store: ik_pgo_claim_gate, on a fresh look at the slot
 * (ik_pgo_ready() connects, and checks the slot once per connection). */
int
ik_pgo_claim_check(struct ik_store *st, ik_err *err)
{
	struct pg *p = st->impl;
	int rc;

	if (!ik_pgo_on())
		return IK_OK;
	return (rc = ik_pgo_ready(p, err)) ? rc : ik_pgo_claim_gate(p, err);
}

int
ik_pgo_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
    int64_t *until, ik_err *err)
{
	struct pg *p = st->impl;
	char lease[24];
	const char *params[] = { p->u.table, holder, lease };
	PGresult *r;
	int rc, got;

	if ((rc = ik_pgo_ready(p, err)))
		return rc;
	snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
	if ((rc = ik_pgo_q(p, "WITH n AS (SELECT " NOW_MS " AS ms)"
	    " INSERT INTO idemkit_outbox_relay AS r (tbl, holder, lease_until)"
	    " SELECT $1, $2, n.ms + $3::bigint FROM n"
	    " ON CONFLICT (tbl) DO UPDATE SET holder = excluded.holder,"
	    "  lease_until = excluded.lease_until"
	    " WHERE r.holder = excluded.holder OR r.lease_until <= (SELECT ms FROM n)"
	    " RETURNING lease_until", 3, params, 0, "outbox lease", &r, err)))
		return rc;
	got = PQntuples(r) == 1;
	PQclear(r);
	*until = now_ms + lease_ms;
	if (got)
		return IK_OK;
	/* The holder's end, on our clock (the lease runs on the server's). */
	if ((rc = ik_pgo_q(p, "SELECT lease_until - " NOW_MS " FROM idemkit_outbox_relay WHERE tbl = $1",
	    1, params, 0, "outbox lease", &r, err)))
		return rc;
	*until = now_ms + (PQntuples(r) ? ik_pg_col_i64(r, 0, 0) : 0);
	PQclear(r);
	return IK_DUP_IN_PROGRESS;
}

static uint64_t
lsn_parse(const char *s)
{
	char *e;
	uint64_t hi = strtoull(s, &e, 16);

	return *e == '/' ? hi << 32 | strtoull(e + 1, NULL, 16) : 0;
}

static void
lsn_fmt(uint64_t l, char out[24])
{
	snprintf(out, 24, "%X/%X", (unsigned)(l >> 32), (unsigned)l);
}

static uint64_t
be(const unsigned char *b, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v = v << 8 | b[i];
	return v;
}

/* The checkpoint: what was published last, (commit LSN, message LSN). */
int
ik_pgo_checkpoint(struct pg *p, uint64_t *commit, uint64_t *msg, ik_err *err)
{
	const char *params[] = { p->u.table };
	PGresult *r;
	int rc;

	*commit = *msg = 0;
	if ((rc = ik_pgo_q(p, "SELECT ckpt_commit::text, ckpt_msg::text FROM idemkit_outbox_relay"
	    " WHERE tbl = $1", 1, params, 0, "outbox checkpoint", &r, err)))
		return rc;
	if (PQntuples(r) == 1) {
		*commit = lsn_parse(PQgetvalue(r, 0, 0));
		*msg = lsn_parse(PQgetvalue(r, 0, 1));
	}
	PQclear(r);
	return IK_OK;
}

/* What one message of pgoutput says. */
struct dec {
	uint64_t commit, lsn;
	int64_t at;
	const char *body;
	size_t len;
};

/* Runs sql (n params, the slot's name among them) on the slot: IK_OK with
 * *out.  A slot serves one backend at a time: a gauge's peek and the
 * relay's, or its advance, meet (55006); each is short, so wait a little,
 * then TEMPFAIL.  A slot that is missing or lost its WAL is CONFIG. */
int
ik_pgo_slot_query(struct pg *p, const char *sql, int n, const char *const *params, int binary,
    const char *doing, const char *slot, PGresult **out, ik_err *err)
{
	PGresult *r;
	const char *st;
	int rc;

	for (int tries = 0;; tries++) {
		if (!(r = ik_pg_exec(p, sql, n, params, binary, doing, err)))
			return err->code;
		st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (PQresultStatus(r) == PGRES_TUPLES_OK || !st || strcmp(st, "55006") != 0 ||
		    tries >= SLOT_BUSY_TRIES)
			break;
		PQclear(r);
		ik_sleep_ms(SLOT_BUSY_WAIT_MS);
	}
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		*out = r;
		return IK_OK;
	}
	rc = ik_pg_err(p, r, doing, err);
	st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	if (st && strcmp(st, "55006") == 0)
		err->code = rc = IK_TEMPFAIL;
	PQclear(r);
	if (rc == IK_SOFTWARE && strstr(err->msg, "does not exist"))
		return ik_errf(err, IK_CONFIG, "postgres %s: the outbox's replication slot %s "
		    "does not exist: run idemp-init with IDEMKIT_OUTBOX set (after a "
		    "failover: slots are not copied to a standby before PostgreSQL 17, and "
		    "events finished on the old primary after the relay's last checkpoint "
		    "were not published; idemkit(7) OUTBOX)", p->u.table, slot);
	if (rc == IK_SOFTWARE && strstr(err->msg, "no longer get changes"))
		err->code = rc = IK_CONFIG;   /* the slot lost its WAL */
	return rc;
}

/* Walks a peek's rows: calls f on each of our transactional messages past
 * the checkpoint, in order, until it returns nonzero.  *rows: how many
 * rows the peek gave. */
static int
peek(struct pg *p, int upto, uint64_t ck_commit, uint64_t ck_msg,
    int (*f)(const struct dec *d, void *arg), void *arg, int *rows, ik_err *err)
{
	char slot[IK_PG_TABLE_MAX + 16], lim[16], prefix[IK_PG_TABLE_MAX + 24];
	const char *params[] = { slot, upto > 0 ? lim : NULL };
	uint64_t commit = 0;
	int64_t at = 0;
	size_t plen;
	PGresult *r;
	int rc;

	ik_pgo_slot_name(p, slot);
	snprintf(lim, sizeof lim, "%d", upto);
	plen = (size_t)snprintf(prefix, sizeof prefix, "idemkit.outbox.%s", p->u.table) + 1;
	if ((rc = ik_pgo_slot_query(p, "SELECT data FROM pg_logical_slot_peek_binary_changes($1,"
	    " NULL, $2::int, 'proto_version', '1', 'publication_names', '" PUBLICATION "',"
	    " 'messages', 'true')", 2, params, 1, "outbox read", slot, &r, err)))
		return rc;
	*rows = PQntuples(r);
	for (int i = 0; i < *rows; i++) {
		const unsigned char *d = (const unsigned char *)PQgetvalue(r, i, 0);
		size_t n = (size_t)PQgetlength(r, i, 0);
		struct dec m;

		if (n >= 21 && d[0] == 'B') {
			commit = be(d + 1, 8);
			at = (int64_t)be(d + 9, 8) / 1000 + PG_EPOCH_MS;
			continue;
		}
		/* 'M', flags (1: transactional), its LSN, prefix\0, length, content */
		if (n < 10 + plen + 4 || d[0] != 'M' || !(d[1] & 1) ||
		    memcmp(d + 10, prefix, plen) != 0)
			continue;
		m = (struct dec){ .commit = commit, .lsn = be(d + 2, 8), .at = at,
		    .body = (const char *)d + 10 + plen + 4, .len = be(d + 10 + plen, 4) };
		if (m.len > n - 10 - plen - 4)
			continue;
		if (m.commit < ck_commit || (m.commit == ck_commit && m.lsn <= ck_msg))
			continue;    /* published: its transaction decoded again */
		if (f(&m, arg))
			break;
	}
	PQclear(r);
	return IK_OK;
}

struct rd {
	struct ik_outbox_ev *ev;
	size_t max, *n;
	int oom;
};

static char *
jstr(cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return strdup(cJSON_IsString(v) ? v->valuestring : "");
}

/* e from an event's JSON text; -1 when out of memory (e to be freed). */
static int
fill(struct ik_outbox_ev *e, const char *body, size_t len, int64_t seq, int64_t at,
    const char *pos)
{
	cJSON *o = cJSON_ParseWithLength(body, len);

	e->seq = seq;
	e->at = at;
	e->pos = strdup(pos);
	e->body = strndup(body, len);
	e->id = jstr(o, "eventId");
	e->charge_id = jstr(o, "chargeId");
	e->type = jstr(o, "type");
	cJSON_Delete(o);
	return e->pos && e->body && e->id && e->charge_id && e->type ? 0 : -1;
}

static int
take(const struct dec *d, void *arg)
{
	struct rd *x = arg;
	char pos[64], a[24], b[24];

	if (*x->n >= x->max)
		return 1;
	lsn_fmt(d->commit, a);
	lsn_fmt(d->lsn, b);
	snprintf(pos, sizeof pos, "%s %s", a, b);
	if (fill(&x->ev[(*x->n)++], d->body, d->len, (int64_t)d->lsn, d->at, pos)) {
		x->oom = 1;
		return 1;
	}
	return *x->n >= x->max;
}

/* RESYNC_SQL with the table's name, wrapped in outer (a printf format of
 * one %s: the query) when not NULL; malloc'd, NULL when out of memory. */
char *
ik_pgo_resync_sql(const struct pg *p, const char *outer)
{
	size_t n = sizeof RESYNC_SQL + sizeof p->qtable;
	char *a = malloc(n), *b;

	if (!a)
		return NULL;
	snprintf(a, n, RESYNC_SQL, p->qtable);
	if (!outer)
		return a;
	n = strlen(a) + strlen(outer) + 1;
	if ((b = malloc(n)))
		snprintf(b, n, outer, a);
	free(a);
	return b;
}

/* The window to re-publish from the records, when one is open: from[0..2]
 * where the relay is in it (time, op, key), *to its end (0: none). */
int
ik_pgo_resync_window(struct pg *p, char from[3][160], char to[24], ik_err *err)
{
	const char *params[] = { p->u.table };
	PGresult *r;
	int rc;

	strcpy(to, "0");
	if ((rc = ik_pgo_q(p, "SELECT resync_from, resync_op, resync_key, resync_to"
	    " FROM idemkit_outbox_relay WHERE tbl = $1 AND resync_to > 0", 1, params, 0,
	    "outbox resync", &r, err)))
		return rc;
	if (PQntuples(r) == 1) {
		for (int i = 0; i < 3; i++)
			snprintf(from[i], 160, "%s", PQgetvalue(r, 0, i));
		snprintf(to, 24, "%s", PQgetvalue(r, 0, 3));
	}
	PQclear(r);
	if (strcmp(to, "0") != 0 && !p->has_history) {
		ik_log(IK_LOG_ERROR, "the table has no history column (run idemp-init): the "
		    "events of the window the lost slot held cannot be re-published",
		    "table", p->u.table, NULL);
		strcpy(to, "0");
		/* said once: the window is closed */
		if ((rc = ik_pgo_q(p, "UPDATE idemkit_outbox_relay SET resync_to = 0 WHERE tbl = $1",
		    1, params, 0, "outbox resync", &r, err)))
			return rc;
		PQclear(r);
	}
	return IK_OK;
}

/* The next events of an open resync window into ev; when it has none
 * left the window is closed (whoever sees it so: it only moves forward). */
static int
resync_read(struct pg *p, size_t max, struct ik_outbox_ev *ev, size_t *n, ik_err *err)
{
	char from[3][160], to[24], lim[16], pos[224];
	const char *params[] = { from[0], from[1], from[2], to, lim };
	const char *cparams[] = { p->u.table, to };
	char *sql;
	PGresult *r;
	int rc, rows;

	*n = 0;
	if ((rc = ik_pgo_resync_window(p, from, to, err)) || strcmp(to, "0") == 0)
		return rc;
	snprintf(lim, sizeof lim, "%zu", max);
	if (!(sql = ik_pgo_resync_sql(p, NULL)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = ik_pgo_q(p, sql, 5, params, 0, "outbox resync", &r, err);
	free(sql);
	if (rc)
		return rc;
	rows = PQntuples(r);
	for (int i = 0; i < rows && (size_t)i < max; i++) {
		snprintf(pos, sizeof pos, "R %s %s %s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
		    PQgetvalue(r, i, 2));
		if (fill(&ev[(*n)++], PQgetvalue(r, i, 3), (size_t)PQgetlength(r, i, 3),
		    ik_pg_col_i64(r, i, 0), ik_pg_col_i64(r, i, 0), pos)) {
			PQclear(r);
			for (size_t j = 0; j < *n; j++)
				ik_outbox_ev_free(&ev[j]);
			*n = 0;
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
	}
	PQclear(r);
	if (rows)
		return IK_OK;
	if ((rc = ik_pgo_q(p, "UPDATE idemkit_outbox_relay SET resync_to = 0 WHERE tbl = $1"
	    " AND resync_to = $2::bigint", 2, cparams, 0, "outbox resync", &r, err)))
		return rc;
	PQclear(r);
	ik_log(IK_LOG_INFO, "the outbox's resync from the records is done", "table",
	    p->u.table, NULL);
	return IK_OK;
}

static void
pos_parse(const char *pos, uint64_t *commit, uint64_t *lsn)
{
	const char *sp = strchr(pos, ' ');

	*commit = lsn_parse(pos);
	*lsn = sp ? lsn_parse(sp + 1) : 0;
}

/* The slot follows the checkpoint's commit (that transaction is decoded
 * again, its published events skipped by position), so the server
 * recycles the WAL before it; before each peek, so the peek decodes less.
 * Best effort: the row is what counts, and a slot busy with another
 * relay's peek is advanced next time. */
static void
advance(struct pg *p, uint64_t commit)
{
	char slot[IK_PG_TABLE_MAX + 16], lsn[24];
	const char *params[] = { slot, lsn };
	PGresult *r;
	ik_err e = { 0 };

	if (commit <= p->obx_advanced)
		return;
	ik_pgo_slot_name(p, slot);
	lsn_fmt(commit, lsn);
	r = ik_pg_exec(p, "SELECT pg_replication_slot_advance(slot_name, $2::pg_lsn)"
	    " FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn < $2::pg_lsn",
	    2, params, 0, "advance the outbox's slot", &e);
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
		p->obx_advanced = commit;
	} else {
		if (r)
			ik_pg_err(p, r, "advance the outbox's slot", &e);
		ik_log(IK_LOG_WARN, e.msg, NULL);
	}
	PQclear(r);
}

/* Fills the read-ahead from one peek past the checkpoint. */
static int
read_ahead(struct pg *p, uint64_t ck_commit, uint64_t ck_msg, ik_err *err)
{
	size_t n = 0;
	struct rd x = { NULL, AHEAD_MAX, &n, 0 };
	int rc, rows = 0, upto = PEEK_FIRST;

	ik_pgo_close(p);
	advance(p, ck_commit);
	if (!(x.ev = calloc(AHEAD_MAX, sizeof *x.ev)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	/* A peek stops after the transaction that reached upto changes; one
	 * that gave only published events (a big group's, decoded again) and
	 * may have more behind is asked again for more. */
	for (;;) {
		if ((rc = peek(p, upto, ck_commit, ck_msg, take, &x, &rows, err)))
			break;
		if (x.oom) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			break;
		}
		if (n > 0 || rows < upto || upto >= PEEK_MAX) {
			p->obx_ahead = x.ev;
			p->obx_n = n;
			return IK_OK;
		}
		upto *= 2;
	}
	for (size_t i = 0; i < n; i++)
		ik_outbox_ev_free(&x.ev[i]);
	free(x.ev);
	return rc;
}

/* The next events past the checkpoint: an open resync window's first,
 * then the slot's, from what was read ahead (one peek decodes the WAL
 * from the slot's position on: done per batch it would be most of the
 * relay's time); what the checkpoint has passed meanwhile (another relay
 * held the lease) is dropped. */
int
ik_pgo_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n, ik_err *err)
{
	struct pg *p = st->impl;
	uint64_t ck_commit, ck_msg, c, l;
	int rc;

	*n = 0;
	/* An open resync window first: those events were written before what
	 * the slot decodes (per chargeId, in order). */
	if ((rc = ik_pgo_ready(p, err)) || (rc = resync_read(p, max, ev, n, err)) || *n > 0 ||
	    (rc = ik_pgo_checkpoint(p, &ck_commit, &ck_msg, err)))
		return rc;
	while (p->obx_head < p->obx_n) {
		pos_parse(p->obx_ahead[p->obx_head].pos, &c, &l);
		if (c > ck_commit || (c == ck_commit && l > ck_msg))
			break;
		ik_outbox_ev_free(&p->obx_ahead[p->obx_head++]);
	}
	if (p->obx_head == p->obx_n && (rc = read_ahead(p, ck_commit, ck_msg, err)))
		return rc;
	/* Copies: only the checkpoint (above, by position) takes an event out
	 * of the read-ahead, so what a batch did not send (cut at a chargeId's
	 * second event, or refused by the queue) is handed out again first;
	 * moved out, it was skipped, and the next checkpoint passed it. */
	for (size_t i = p->obx_head; *n < max && i < p->obx_n; i++)
		if (ik_outbox_ev_copy(&ev[(*n)++], &p->obx_ahead[i]) < 0) {
			for (size_t j = 0; j < *n; j++)
				ik_outbox_ev_free(&ev[j]);
			*n = 0;
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
	return IK_OK;
}

/* The checkpoint inside a resync window: pos "TIME OP KEY", fenced as
 * the slot's. */
static int
resync_ack(struct pg *p, const char *holder, const char *pos, ik_err *err)
{
	char at[24], op[16];
	const char *key;
	const char *params[] = { p->u.table, holder, at, op, NULL };
	PGresult *r;
	int rc, held;

	if (sscanf(pos, "%23s %15s", at, op) != 2 || !(key = strchr(pos, ' ')) ||
	    !(key = strchr(key + 1, ' ')))
		return ik_errf(err, IK_SOFTWARE, "postgres: outbox: a resync event without its "
		    "position");
	params[4] = key + 1;
	if ((rc = ik_pgo_q(p, "UPDATE idemkit_outbox_relay SET resync_from = $3::bigint,"
	    " resync_op = $4, resync_key = $5"
	    " WHERE tbl = $1 AND holder = $2 AND lease_until > " NOW_MS, 5, params, 0,
	    "outbox resync checkpoint", &r, err)))
		return rc;
	held = strcmp(PQcmdTuples(r), "1") == 0;
	PQclear(r);
	return held ? IK_OK : IK_LEASE_LOST;
}

int
ik_pgo_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev, size_t n,
    int64_t now_ms, ik_err *err)
{
	struct pg *p = st->impl;
	char commit[24], msg[24];
	const char *params[] = { p->u.table, holder, commit, msg };
	PGresult *r;
	int rc, held;

	if (n == 0)
		return IK_OK;
	if ((rc = ik_pgo_ready(p, err)))
		return rc;
	if (ev[n - 1].pos && strncmp(ev[n - 1].pos, "R ", 2) == 0)
		return resync_ack(p, holder, ev[n - 1].pos + 2, err);
	if (!ev[n - 1].pos || sscanf(ev[n - 1].pos, "%23s %23s", commit, msg) != 2)
		return ik_errf(err, IK_SOFTWARE, "postgres: outbox: an event without its position");
	/* The fence and the checkpoint in one statement; never backwards. */
	if ((rc = ik_pgo_q(p, "UPDATE idemkit_outbox_relay SET"
	    " ckpt_msg = CASE WHEN ($3::pg_lsn, $4::pg_lsn) > (ckpt_commit, ckpt_msg)"
	    "  THEN $4::pg_lsn ELSE ckpt_msg END,"
	    " ckpt_commit = greatest(ckpt_commit, $3::pg_lsn), ckpt_at = " NOW_MS
	    " WHERE tbl = $1 AND holder = $2 AND lease_until > " NOW_MS, 4, params, 0,
	    "outbox checkpoint", &r, err)))
		return rc;
	held = strcmp(PQcmdTuples(r), "1") == 0;
	PQclear(r);
	if (!held)
		return IK_LEASE_LOST;
	return IK_OK;
}

/* The events live in the WAL, which the server recycles once the slot has
 * passed them: nothing of ours to delete. */
int
ik_pgo_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n, ik_err *err)
{
	*n = 0;
	return IK_OK;
}
