/* pg_conn.c: the PostgreSQL store's connection and its statements (made
 * and made again, the table's columns known, prepared, their rows read),
 * and its claims and finishes in flight (store.h "in flight") in libpq's
 * pipeline mode; see pg_store.h.  One file: a blocking statement first
 * waits for the batch out (ik_pg_conn_ok drains it), and a batch goes out
 * on a connection made and prepared as the blocking path's (send_batch). */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/postgres/pg_store.h"

#define RECONNECT_MS 5000      /* wait for a server that went away, once per outage */

/* ---- the connection and its statements ------------------------------- */

/* Whether the table has the history column, before the first statement
 * on each connection (an idemp-init elsewhere may have added it).  Without it (a table from
 * before schema version 3) the statements without history are used and a
 * warning says to run idemp-init. */
int
ik_pg_history_column(struct pg *p, ik_err *err)
{
	const char *params[] = { p->qtable };
	PGresult *r = ik_pg_wait(p, PQsendQueryParams(p->conn, "SELECT 1 FROM pg_attribute WHERE "
	    "attrelid = to_regclass($1) AND attname = 'history' AND NOT attisdropped",
	    1, NULL, params, NULL, NULL, 0), "read the table's columns", err);
	int rc = IK_OK, had = p->has_history;

	if (!r)
		return err->code;
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		rc = ik_pg_err(p, r, "read the table's columns", err);
	else if (!(p->has_history = PQntuples(r) == 1) && (had || !p->warned)) {
		p->warned = 1;
		ik_log(IK_LOG_WARN, "the table has no history column (a schema from before "
		    "version 3): records keep no history until idemp-init migrates it",
		    "table", p->u.table, NULL);
	}
	PQclear(r);
	if (rc == IK_OK && ik_pgo_on())
		rc = ik_pgo_check(p, err);     /* the outbox's slot, on this connection too */
	p->checked = rc == IK_OK;
	return rc;
}

/* The server's notices (CREATE ... IF NOT EXISTS skipping) are not ours
 * to print: libpq would write them to stderr, outside the log's format. */
static void
no_notice(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

/* Connected, or reconnected when the server went away.  libpq's own
 * message never holds the password (pg_url.c refuses a URL it would
 * misread).  The client encoding is UTF8 whatever the environment says
 * (what we send is UTF-8, utf8.h), and a database that cannot store all
 * of UTF-8 is refused before anything is claimed: a reason it could not
 * store would fail a finish after the debit. */
int
ik_pg_conn_ok(struct pg *p, ik_err *err)
{
	char msg[512];
	const char *enc;

	if (p->batch)
		ik_pg_drain(p);     /* a blocking call while ops are in flight: store.h */
	/* A connection kept from an earlier statement may have been closed by
	 * the server since (a restart, a kill, a fail-over): no answer is due,
	 * so read what it sent (a notice, or its FATAL and end of file) and
	 * connect afresh below, before anything is sent, rather than lose the
	 * next statement to it; a finish after the bank's yes would otherwise
	 * be refused and the charge sent to the bank again. */
	for (int i = 0; i < 8 && p->conn && PQstatus(p->conn) == CONNECTION_OK &&
	    ik_fd_ready(PQsocket(p->conn)); i++)
		if (PQconsumeInput(p->conn) != 1)
			break;
	if (p->conn && PQstatus(p->conn) == CONNECTION_OK)
		return IK_OK;
	p->connect_failed = 1;      /* until a connect below succeeds */
	if (p->in_tx) {
		/* The transaction went with the connection: never carry on in a
		 * new one as if the group's earlier writes were there. */
		p->in_tx = 0;
		return ik_errf(err, IK_TEMPFAIL, "postgres %s: connection lost inside a "
		    "transaction", p->u.table);
	}
	p->prepared = 0;
	if (p->conn) {
		/* A connection we had went away (a restart, a fail-over): wait
		 * up to RECONNECT_MS for the server rather than fail every
		 * envelope that arrives meanwhile, each of which would be
		 * debited again once its lease ends.  Once per outage: after
		 * that wait each call tries once, so a stream cannot stall. */
		int64_t until = ik_mono_ms() + (p->waited ? 0 : RECONNECT_MS);

		PQreset(p->conn);
		while (PQstatus(p->conn) != CONNECTION_OK && ik_mono_ms() < until &&
		    ik_sleep_ms(200) == 0)
			PQreset(p->conn);
		p->waited = PQstatus(p->conn) != CONNECTION_OK;
		/* Said once per outage, so that an operator sees the restart
		 * or fail-over the workers rode through. */
		if (!p->waited)
			ik_log(IK_LOG_WARN, "store connection lost; reconnected", "store", "postgres",
			    "table", p->u.table, NULL);
	} else {
		/* client_encoding after dbname: it overrides the URL's and
		 * PGCLIENTENCODING. */
		/* A peer gone silently (a host down, a partition) is found by
		 * TCP within about 30 s, not the kernel's 15 minutes: keepalives
		 * while an answer is awaited, a bound on data left unacknowledged.
		 * Before dbname, so that the URL's own settings win. */
		const char *kw[] = { "connect_timeout", "keepalives", "keepalives_idle",
		                     "keepalives_interval", "keepalives_count", "tcp_user_timeout",
		                     "fallback_application_name", "dbname", "client_encoding", NULL };
		const char *val[] = { getenv("PGCONNECT_TIMEOUT") ? getenv("PGCONNECT_TIMEOUT") : "10",
		                      "1", "10", "5", "3", "30000",
		                      "idemkit", p->u.conninfo, "UTF8", NULL };
		p->conn = PQconnectdbParams(kw, val, 1);
	}
	if (!p->conn)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (PQstatus(p->conn) == CONNECTION_OK) {
		PQsetNoticeProcessor(p->conn, no_notice, NULL);
		p->checked = 0;
		p->connect_failed = 0;
		if ((enc = PQparameterStatus(p->conn, "server_encoding")) && strcmp(enc, "UTF8") != 0) {
			snprintf(msg, sizeof msg, "%.64s", enc);
			PQfinish(p->conn);
			p->conn = NULL;
			return ik_errf(err, IK_CONFIG, "postgres %s: the database's encoding is %s, "
			    "not UTF8: it cannot store every reason a bank may give; use a UTF8 "
			    "database (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0, or "
			    "createdb -E UTF8 -T template0)", p->u.table, msg);
		}
		return IK_OK;
	}
	snprintf(msg, sizeof msg, "%s", PQerrorMessage(p->conn));
	ik_pg_trim(msg);
	if (PQconnectionNeedsPassword(p->conn))
		return ik_errf(err, IK_CONFIG, "postgres %s: connect: a password is needed "
		    "(PGPASSWORD, PGPASSFILE or ~/.pgpass): %s", p->u.table, msg);
	return ik_errf(err, ik_pg_connect_config(msg) ? IK_CONFIG : IK_TEMPFAIL,
	    "postgres %s: connect: %s", p->u.table, msg);
}

/* Statement which prepared on this connection (connected, history
 * known), its name in name[16]. */
/* The finish's $6 (the bank's replay, for the history entry) typed here:
 * a table without the history column does not use it, and the server
 * refuses a parameter it cannot type from the statement.  0: inferred. */
static const Oid finish_types[6] = { 0, 0, 0, 0, 0, 16 /* BOOLOID */ };

int
ik_pg_prepare(struct pg *p, int which, int n, const char *doing, char *name, ik_err *err)
{
	PGresult *r;
	int rc, bit;

	if ((rc = ik_pg_conn_ok(p, err)) || (!p->checked && (rc = ik_pg_history_column(p, err))))
		return rc;
	bit = which + Q_N * p->has_history;
	snprintf(name, 16, "ik%d", bit);
	if (!(p->prepared & (1u << bit))) {
		r = ik_pg_wait(p, PQsendPrepare(p->conn, name, p->sql[p->has_history][which], n,
		    which == Q_FINISH ? finish_types : NULL), doing, err);
		if (!r)
			return err->code;
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			rc = ik_pg_err(p, r, doing, err);
			PQclear(r);
			return rc;
		}
		PQclear(r);
		p->prepared |= 1u << bit;
	}
	return IK_OK;
}

/* A statement with no parameters and no rows (BEGIN, COMMIT, DDL). */
int
ik_pg_exec_sql(struct pg *p, const char *q, const char *doing, ik_err *err)
{
	PGresult *r;
	int rc;

	if ((rc = ik_pg_conn_ok(p, err)))
		return rc;
	if (!(r = ik_pg_wait(p, PQsendQuery(p->conn, q), doing, err)))
		return err->code;
	rc = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK ?
	    IK_OK : ik_pg_err(p, r, doing, err);
	PQclear(r);
	return rc;
}

void
ik_pg_rollback(struct pg *p)
{
	ik_err err;

	if (p->conn && PQstatus(p->conn) == CONNECTION_OK)
		PQclear(ik_pg_wait(p, PQsendQuery(p->conn, "ROLLBACK"), "roll back", &err));
	p->in_tx = 0;
}

int64_t
ik_pg_col_i64(PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static char *
col_str(PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? NULL : strdup(PQgetvalue(r, row, col));
}

void
ik_pg_read_record(PGresult *r, int row, struct ik_record *rec)
{
	rec->key = col_str(r, row, 0);
	rec->state = ik_state_parse(PQgetvalue(r, row, 1));
	rec->owner = col_str(r, row, 2);
	rec->lease_until = ik_pg_col_i64(r, row, 3);
	rec->attempts = ik_pg_col_i64(r, row, 4);
	rec->fingerprint = col_str(r, row, 5);
	rec->event = col_str(r, row, 6);
	rec->debit_ref = col_str(r, row, 7);
	rec->last_error = col_str(r, row, 8);
	rec->created_at = ik_pg_col_i64(r, row, 9);
	rec->updated_at = ik_pg_col_i64(r, row, 10);
	rec->expires_at = ik_pg_col_i64(r, row, 11);
	rec->history = col_str(r, row, 12);
}

/* printf of a migration or statement with the table's names. */
char *
ik_pg_with_table(struct pg *p, const char *fmt)
{
	size_t n = strlen(fmt) + 4 * sizeof p->qtable;
	char *s = malloc(n);

	if (s)
		snprintf(s, n, fmt, p->qtable, p->u.table);
	return s;
}

/* ---- in flight --------------------------------------------------------- */

/* In flight (store.h): claims and finishes go out in libpq's pipeline
 * mode on the one connection, each still its own statement above.  The
 * ops started while a batch is out wait in queued; when it is answered
 * they go out as the next batch, followed by one sync: the statements up
 * to a sync are one implicit transaction, so a batch is one durable
 * commit, as a group is on the blocking path, and no callback is called
 * before its sync came back (committed).  A statement that fails aborts
 * its batch: the others are rolled back with it and sent again in the
 * next one (each op fails at most once for another's sake per failure,
 * so this ends); the failed one answers its error, or is sent again when
 * it was a serialization failure or deadlock, MAX_RETRIES times at most.
 * A refused claim reads the record in the next batch, after its own
 * commit, and is decided by ik_claim_decide on the server's now; a lease
 * that ended meanwhile claims again, boundedly, as pg_claim does.  A
 * refused finish reads the record too, decided by ik_finish_decide: one
 * whose earlier send committed finds its own token in the state it asked
 * for.  So a connection lost with a batch out sends its finishes again,
 * once, on the reconnected one (the money moved: a TEMPFAIL there would
 * send the charge to the bank again once its lease ended), and answers
 * its claims TEMPFAIL (a claim's statement may or may not have
 * committed: never replayed blindly, its lease settles it); the ops still
 * queued go out on the reconnected one.  A batch goes out sorted by
 * key (pop_sorted), so batches never lock rows in a cycle.  One batch out at a
 * time: the server runs one connection's statements one after another
 * anyway, and the next batch gathers while this one commits.  Blocking
 * mode: a batch is at most the in-flight count (1024) of short statements
 * whose answers fit the socket's buffers, so a write never waits on our
 * own unread answers. */
struct pop {
	struct pop *next;
	int which;                 /* Q_CLAIM, Q_GET (a refused claim's read), Q_FINISH */
	int n;                     /* its parameters */
	const char *params[6];
	char lease[24], exp[24];
	const struct ik_claim_req *creq;   /* NULL for a finish */
	struct ik_claim_res *res;
	int fstate, resent;        /* a finish: the state it sets; sent again once */
	struct ik_record fcur;     /* a refused finish's record */
	ik_store_cb cb;
	void *arg;
	int rounds, tries;         /* claim rounds (pg_claim's), tries of this statement */
	/* this statement's answer, read before the sync */
	int got, aborted, failed_state;
	int64_t rows, attempt, lease_until, now;
	char tuples[8];
	int rc;
	ik_err err;
};

static void
pop_queue(struct pop **head, struct pop ***last, struct pop *o)
{
	o->next = NULL;
	if (!*head)
		*last = head;
	**last = o;
	*last = &o->next;
}

static struct pop *
pop_take(struct pop **head, struct pop ***last)
{
	struct pop *o = *head;

	if (o && !(*head = o->next))
		*last = head;
	return o;
}

/* o is answered: its callback comes from the next ik_pg_run. */
static void
pop_done(struct pg *p, struct pop *o, int rc)
{
	o->rc = rc;
	if (rc == IK_OK)
		memset(&o->err, 0, sizeof o->err);
	else if (o->res)
		ik_record_free(&o->res->cur);
	ik_record_free(&o->fcur);
	pop_queue(&p->done, &p->done_last, o);
}

static void
pop_stage(struct pop *o, int which)
{
	o->which = which;
	o->tries = 0;
	o->n = which == Q_GET ? 1 : 6;   /* a claim and a finish: 6 */
}

/* The queue sorted by key, stably (a key's own ops keep their order):
 * every batch, of this connection and of every other process's, takes
 * its row locks in the same order, so two batches wait for each other's
 * commit at most, never in a cycle.  Unsorted, a claim batch (whose
 * refused INSERT ... ON CONFLICT still locks the row) and a finish batch
 * that met two keys in opposite orders deadlocked, and the server broke
 * it only after deadlock_timeout (1 s by default), holding both steps. */
static struct pop *
pop_sorted(struct pop *a)
{
	struct pop *b, *h, **t = &h, *slow = a, *fast;

	if (!a || !a->next)
		return a;
	for (fast = a->next; fast && fast->next; fast = fast->next->next)
		slow = slow->next;
	b = slow->next;
	slow->next = NULL;
	a = pop_sorted(a);
	b = pop_sorted(b);
	while (a && b) {
		struct pop **m = strcmp(b->params[0], a->params[0]) < 0 ? &b : &a;

		*t = *m;
		t = &(*m)->next;
		*m = (*m)->next;
	}
	*t = a ? a : b;
	return h;
}

/* Sends what is queued as one batch, then its sync.  Ops that cannot be
 * sent (no connection) answer the error at once. */
static void
send_batch(struct pg *p)
{
	struct pop *o, **last = &p->batch;
	char name[16];
	ik_err err = { 0 };
	int rc;

	if (!p->queued || p->batch)
		return;
	/* Out of pipeline mode here: connect, read the table's columns and
	 * prepare as the blocking path does. */
	if ((rc = ik_pg_prepare(p, Q_CLAIM, 6, "claim", name, &err)) == IK_OK &&
	    (rc = ik_pg_prepare(p, Q_GET, 1, "read record", name, &err)) == IK_OK &&
	    (rc = ik_pg_prepare(p, Q_FINISH, 6, "finish", name, &err)) == IK_OK &&
	    PQenterPipelineMode(p->conn) != 1)
		rc = ik_pg_err(p, NULL, "pipeline mode", &err);
	if (rc == IK_OK) {
		p->queued = pop_sorted(p->queued);
		for (p->queued_last = &p->queued; *p->queued_last; p->queued_last = &(*p->queued_last)->next)
			;
	}
	while (rc == IK_OK && (o = pop_take(&p->queued, &p->queued_last))) {
		ik_err gerr;
		if (o->which == Q_CLAIM && ik_pgo_claim_gate(p, &gerr)) {
			/* no claim while a finish's event would be lost; the
			 * finishes still go (the money moved) */
			o->err = gerr;
			pop_done(p, o, gerr.code);
			continue;
		}
		snprintf(name, sizeof name, "ik%d", o->which + Q_N * p->has_history);
		o->got = o->aborted = o->failed_state = 0;
		o->tries++;
		/* the server's lease begins after this reading (store.h): a claim
		 * queued behind a slow batch or a reconnect keeps its whole lease */
		if (o->which == Q_CLAIM)
			o->res->sent_boot_ms = ik_boot_ms();
		if (PQsendQueryPrepared(p->conn, name, o->n, o->params, NULL, NULL, 0) != 1) {
			rc = ik_pg_err(p, NULL, "send", &err);
			pop_queue(&p->queued, &p->queued_last, o);   /* not sent */
			break;
		}
		*last = o;
		last = &o->next;
		*last = NULL;
	}
	p->ans = p->batch;
	if (rc == IK_OK && (PQpipelineSync(p->conn) != 1 || PQflush(p->conn) != 0))
		rc = ik_pg_err(p, NULL, "send", &err);
	p->batch_until = ik_mono_ms() + p->timeout_ms;
	if (rc == IK_OK)
		return;
	/* Nothing of it can be answered now: the sent ops' outcome is unknown,
	 * the queued ones never went. */
	while ((o = p->batch)) {
		p->batch = o->next;
		o->err = err;
		pop_done(p, o, rc);
	}
	while ((o = pop_take(&p->queued, &p->queued_last))) {
		o->err = err;
		pop_done(p, o, rc);
	}
	if (p->conn && PQpipelineStatus(p->conn) != PQ_PIPELINE_OFF)
		PQexitPipelineMode(p->conn);
}

/* The answer to o's statement, read before the batch's sync. */
static void
pop_answer(struct pg *p, struct pop *o, PGresult *r)
{
	const char *doing = o->which == Q_CLAIM ? "claim" : o->which == Q_GET ?
	    "read record" : "finish";
	const char *st;

	o->got = 1;
	switch (PQresultStatus(r)) {
	case PGRES_PIPELINE_ABORTED:
		o->aborted = 1;
		return;
	case PGRES_COMMAND_OK:
	case PGRES_TUPLES_OK:
		o->rows = PQntuples(r);
		snprintf(o->tuples, sizeof o->tuples, "%s", PQcmdTuples(r));
		if (o->which == Q_CLAIM && o->rows == 1) {
			o->attempt = ik_pg_col_i64(r, 0, 0);
			o->lease_until = ik_pg_col_i64(r, 0, 1);
		} else if (o->which == Q_GET && o->rows == 1) {
			struct ik_record *cur = o->res ? &o->res->cur : &o->fcur;

			ik_record_free(cur);
			ik_pg_read_record(r, 0, cur);
			o->now = ik_pg_col_i64(r, 0, 13);
		}
		return;
	default:
		st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		o->failed_state = st && (strcmp(st, "40001") == 0 || strcmp(st, "40P01") == 0) ?
		    2 : 1;
		o->rc = ik_pg_err(p, r, doing, &o->err);
		/* What a finish writes is ours: see changed(). */
		if (o->which == Q_FINISH && o->rc == IK_DATAERR)
			o->rc = o->err.code = IK_SOFTWARE;
		return;
	}
}

/* The batch's sync came back: each op answers, or goes on to its next
 * statement in the next batch. */
static void
batch_end(struct pg *p)
{
	struct pop *o;
	int failed = 0;

	for (o = p->batch; o; o = o->next)
		failed |= o->failed_state != 0 || !o->got;
	while ((o = p->batch)) {
		struct ik_claim_req now_req;
		int rc;

		p->batch = o->next;
		if (failed && !o->failed_state) {
			/* rolled back with the batch: the same statement again */
			o->tries--;
			pop_queue(&p->queued, &p->queued_last, o);
			continue;
		}
		if (o->failed_state) {
			if (o->failed_state == 2 && o->tries < MAX_RETRIES)
				pop_queue(&p->queued, &p->queued_last, o);
			else
				pop_done(p, o, o->rc);
			continue;
		}
		switch (o->which) {
		case Q_FINISH:
			if (strcmp(o->tuples, "1") == 0) {
				pop_done(p, o, IK_OK);
			} else {
				pop_stage(o, Q_GET);   /* refused: the record decides */
				pop_queue(&p->queued, &p->queued_last, o);
			}
			break;
		case Q_CLAIM:
			if (o->rows == 1) {
				o->res->code = IK_OK;
				o->res->attempt = o->attempt;
				o->res->lease_until = o->lease_until;
				pop_done(p, o, IK_OK);
			} else {
				pop_stage(o, Q_GET);   /* refused: the record decides */
				pop_queue(&p->queued, &p->queued_last, o);
			}
			break;
		case Q_GET:
			if (!o->creq) {
				/* a finish: params[1] is its token */
				struct ik_finish_req fr = { .token = o->params[1], .state = o->fstate };

				pop_done(p, o, ik_finish_decide(&fr, o->rows == 1 ? &o->fcur : NULL));
				break;
			}
			rc = IK_EMPTY;     /* forgotten meanwhile: claim afresh */
			if (o->rows == 1) {
				now_req = *o->creq;
				now_req.now_ms = o->now;
				/* cur stays for the answer (claimed() reports it) */
				if ((rc = ik_claim_decide(&now_req, o->res, &o->err)) == IK_EMPTY)
					ik_record_free(&o->res->cur);
			}
			if (rc != IK_EMPTY) {
				pop_done(p, o, rc);
			} else if (++o->rounds >= MAX_RETRIES) {
				pop_done(p, o, ik_errf(&o->err, IK_TEMPFAIL, "postgres %s: claim: "
				    "the record kept changing under us; try again", p->u.table));
			} else {
				pop_stage(o, Q_CLAIM);
				pop_queue(&p->queued, &p->queued_last, o);
			}
			break;
		}
	}
	PQexitPipelineMode(p->conn);    /* idle now: blocking calls may follow */
}

/* The connection went with a batch out, or (late) the batch's answers did
 * not come by its deadline and the connection is dropped: its statements
 * may or may not have committed.  A finish goes again, once, on the next
 * connection (the record decides one that had committed, above); a claim
 * answers TEMPFAIL (its lease settles it), never sent again blindly. */
static void
batch_lost(struct pg *p, int late)
{
	struct pop *o;
	ik_err err;
	int again = 0;

	if (late)
		ik_pg_late(p, "statements in flight", &err);
	else
		ik_pg_err(p, NULL, "connection lost with statements in flight", &err);
	while ((o = p->batch)) {
		p->batch = o->next;
		if (!o->creq && !o->resent) {
			o->resent = 1;
			pop_stage(o, Q_FINISH);
			pop_queue(&p->queued, &p->queued_last, o);
			again++;
			continue;
		}
		o->err = err;
		pop_done(p, o, IK_TEMPFAIL);
	}
	if (again)
		ik_log(IK_LOG_WARN, "finishes in flight when the connection went: sending them "
		    "again on a new one (one the server had made is found in its record)",
		    "store", "postgres", "table", p->u.table, IK_LOG_NUM("finishes", again),
		    "error", err.msg, NULL);
	p->ans = NULL;
	if (p->conn && PQpipelineStatus(p->conn) != PQ_PIPELINE_OFF)
		PQexitPipelineMode(p->conn);
}

/* Reads what the server has sent, without waiting. */
static void
batch_read(struct pg *p)
{
	PGresult *r;

	if (PQconsumeInput(p->conn) != 1) {
		batch_lost(p, 0);
		return;
	}
	while (p->batch && !PQisBusy(p->conn)) {
		if (PQstatus(p->conn) != CONNECTION_OK) {
			batch_lost(p, 0);
			return;
		}
		if (!(r = PQgetResult(p->conn))) {
			/* the end of one statement's answers */
			if (p->ans && p->ans->got)
				p->ans = p->ans->next;
			continue;
		}
		if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
			PQclear(r);
			p->ans = NULL;
			batch_end(p);
			return;
		}
		if (p->ans)
			pop_answer(p, p->ans, r);
		PQclear(r);
	}
}

/* A blocking call while a batch is out: waits for its answers (their
 * callbacks come from the next ik_pg_run). */
void
ik_pg_drain(struct pg *p)
{
	struct pollfd pf;

	while (p->batch) {
		pf = (struct pollfd){ .fd = PQsocket(p->conn), .events = POLLIN };
		if (pf.fd < 0 || ik_mono_ms() >= p->batch_until) {
			batch_lost(p, pf.fd >= 0);
			break;
		}
		poll(&pf, 1, 1000);
		batch_read(p);
	}
}

int
ik_pg_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err)
{
	struct pg *p = st->impl;
	struct pollfd pf[2];
	struct pop *o;
	int n = 0;

	(void)err;    /* each op answers its own trouble */
	if (readable)
		*readable = 0;
	send_batch(p);
	if (p->batch)
		batch_read(p);   /* answers libpq already holds */
	if (p->batch && ik_mono_ms() >= p->batch_until)
		batch_lost(p, 1);   /* no answer in time: each op TEMPFAIL */
	if (!p->done && (p->batch || fd >= 0)) {
		if (p->batch) {
			int64_t left = p->batch_until - ik_mono_ms();
			pf[n++] = (struct pollfd){ .fd = PQsocket(p->conn), .events = POLLIN };
			if (timeout_ms < 0 || left < timeout_ms)
				timeout_ms = left < 1 ? 1 : (int)left;
		}
		if (fd >= 0)
			pf[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
		if (poll(pf, (nfds_t)n, timeout_ms) > 0) {
			if (fd >= 0 && readable && (pf[n - 1].revents & (POLLIN | POLLHUP | POLLERR)))
				*readable = 1;
			if (p->batch && pf[0].revents)
				batch_read(p);
		}
	}
	send_batch(p);       /* the next batch goes out before the callbacks run */
	while ((o = pop_take(&p->done, &p->done_last))) {
		p->active--;
		o->cb(o->arg, o->rc, &o->err);
		free(o);
	}
	return IK_OK;
}

/* Connected and the batch's statements prepared before the first envelope
 * comes (a stream's start: the connection and its authentication, the
 * table's columns and three prepares, about 35 ms on loopback, were the
 * first envelope's wait).  A connect that failed leaves no connection
 * behind, so the first op connects afresh and reports it, as without this
 * call (a connection kept would make it wait for a reconnect instead). */
void
ik_pg_warm(struct ik_store *st)
{
	struct pg *p = st->impl;
	char name[16];
	ik_err err = { 0 };

	if (p->queued || p->batch || p->conn)
		return;
	if (ik_pg_prepare(p, Q_CLAIM, 6, "claim", name, &err) == IK_OK &&
	    ik_pg_prepare(p, Q_GET, 1, "read record", name, &err) == IK_OK &&
	    ik_pg_prepare(p, Q_FINISH, 6, "finish", name, &err) == IK_OK)
		return;
	if (p->conn && PQstatus(p->conn) != CONNECTION_OK) {
		PQfinish(p->conn);
		p->conn = NULL;
		p->connect_failed = 0;
	}
}

size_t
ik_pg_active(struct ik_store *st)
{
	return ((struct pg *)st->impl)->active;
}

static struct pop *
pop_new(struct pg *p, ik_store_cb cb, void *arg, ik_err *err)
{
	struct pop *o;

	if (p->group) {
		ik_errf(err, IK_SOFTWARE, "postgres %s: in-flight ops inside a group",
		    p->u.table);
		return NULL;
	}
	if (!(o = calloc(1, sizeof *o))) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	o->cb = cb;
	o->arg = arg;
	return o;
}

int
ik_pg_claim_start(struct ik_store *st, const struct ik_claim_req *req,
    struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err)
{
	struct pg *p = st->impl;
	struct pop *o = pop_new(p, cb, arg, err);

	if (!o)
		return err->code;
	memset(res, 0, sizeof *res);
	snprintf(o->lease, sizeof o->lease, "%lld", (long long)req->lease_ms);
	snprintf(o->exp, sizeof o->exp, "%lld", (long long)req->expires_at);
	o->params[0] = req->key;
	o->params[1] = req->token;
	o->params[2] = o->lease;
	o->params[3] = req->fingerprint;
	o->params[4] = req->event ? req->event : "";
	o->params[5] = o->exp;
	o->creq = req;
	o->res = res;
	pop_stage(o, Q_CLAIM);
	pop_queue(&p->queued, &p->queued_last, o);
	p->active++;
	return IK_OK;
}

int
ik_pg_finish_start(struct ik_store *st, const struct ik_finish_req *req, ik_store_cb cb,
    void *arg, ik_err *err)
{
	struct pg *p = st->impl;
	struct pop *o = pop_new(p, cb, arg, err);

	if (!o)
		return err->code;
	o->params[0] = req->key;
	o->params[1] = req->token;
	o->params[2] = ik_state_name(req->state);
	o->params[3] = req->debit_ref;
	o->params[4] = req->last_error;
	o->params[5] = req->bank_replayed ? "true" : "false";
	o->fstate = req->state;
	pop_stage(o, Q_FINISH);
	pop_queue(&p->queued, &p->queued_last, o);
	p->active++;
	return IK_OK;
}

/* At close, ops not called back are dropped (their envelopes go with the
 * step: store.h). */
void
ik_pg_pops_free(struct pop *o)
{
	while (o) {
		struct pop *next = o->next;
		if (o->res)
			ik_record_free(&o->res->cur);
		ik_record_free(&o->fcur);
		free(o);
		o = next;
	}
}

