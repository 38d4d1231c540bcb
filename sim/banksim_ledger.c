/* banksim_ledger.c: bank-sim's SQLite ledger; see banksim.h.
 *
 * Rules: a key is debited at most once, decided inside one BEGIN IMMEDIATE
 * transaction (so two processes on one file agree too); a replay compares
 * the canonical request fields, not the raw bytes, so key order or spacing
 * never turns a replay into a mismatch; counters live in the same file so
 * /stats survives a restart like the ledger does.  One connection per
 * process behind a mutex: the server's threads take turns.  The statements
 * of every debit and notification are prepared once and kept (stmt): a
 * bench's bank answers thousands a second on the machine it measures, and
 * parsing them anew, under the mutex, held every other request longer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "banksim.h"
#include "core/outcome.h"
#include "core/util.h"

enum { S_BEGIN, S_COMMIT, S_ROLLBACK, S_BUMP, S_FIND, S_REPLAY, S_INSERT, S_NOTIFY, S_N };

static const char *const sqls[S_N] = {
	[S_BEGIN] = "BEGIN IMMEDIATE",
	[S_COMMIT] = "COMMIT",
	[S_ROLLBACK] = "ROLLBACK",
	[S_BUMP] = "INSERT INTO counters(name, n) VALUES (?1, 1)"
	    " ON CONFLICT(name) DO UPDATE SET n = n + 1",
	[S_FIND] = "SELECT ref, request, created_at FROM debits WHERE key = ?1",
	[S_REPLAY] = "UPDATE debits SET replays = replays + 1 WHERE key = ?1",
	[S_INSERT] = "INSERT INTO debits(key, ref, charge_id, account_id, amount, currency,"
	    " charge_type, request, created_at)"
	    " VALUES (?1, 'TXN-' || printf('%08d',"
	    "  coalesce((SELECT max(seq) FROM debits), 0) + 1), ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
	    " RETURNING ref",
	[S_NOTIFY] = "INSERT INTO notifications(key, count, body, first_at, last_at)"
	    " VALUES (?1, 1, ?2, ?3, ?3) ON CONFLICT(key) DO UPDATE"
	    " SET count = count + 1, last_at = ?3 RETURNING count",
};

struct ik_ledger {
	sqlite3 *db;
	pthread_mutex_t mu;
	sqlite3_stmt *st[S_N];   /* prepared on first use, under mu */
};

/* The kept statement, ready to bind (NULL: it would not prepare); give it
 * back with put() once its results were read. */
static sqlite3_stmt *
stmt(struct ik_ledger *l, int which)
{
	if (!l->st[which] && sqlite3_prepare_v3(l->db, sqls[which], -1,
	    SQLITE_PREPARE_PERSISTENT, &l->st[which], NULL) != SQLITE_OK)
		return NULL;
	return l->st[which];
}

static void
put(sqlite3_stmt *st)
{
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);   /* the bound strings are the caller's */
}

/* A statement without parameters or rows (the transaction's): 0 when it
 * ran. */
static int
run(struct ik_ledger *l, int which)
{
	sqlite3_stmt *st = stmt(l, which);
	int rc;

	if (!st)
		return -1;
	rc = sqlite3_step(st);
	put(st);
	return rc == SQLITE_DONE ? 0 : -1;
}

static const char schema[] =
	"PRAGMA journal_mode=WAL;"
	"PRAGMA synchronous=NORMAL;"
	"CREATE TABLE IF NOT EXISTS debits ("
	" seq INTEGER PRIMARY KEY AUTOINCREMENT,"
	" key TEXT NOT NULL UNIQUE,"
	" ref TEXT NOT NULL UNIQUE,"
	" charge_id TEXT NOT NULL, account_id TEXT NOT NULL,"
	" amount INTEGER NOT NULL, currency TEXT NOT NULL,"
	" charge_type TEXT NOT NULL, request TEXT NOT NULL,"
	" created_at INTEGER NOT NULL, replays INTEGER NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS notifications ("
	" key TEXT PRIMARY KEY, count INTEGER NOT NULL, body TEXT,"
	" first_at INTEGER NOT NULL, last_at INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS counters ("
	" name TEXT PRIMARY KEY, n INTEGER NOT NULL);";

static const char *const counter_names[] = {
	"attempts", "replays", "declines", "mismatches", "errors", "hangs",
	"unauthorized", "badRequests", "notificationAttempts",
	"notificationFailures", "tokensIssued", "tokenRefusals", NULL,
};

static int
dberr(struct ik_ledger *l, ik_err *err, const char *what)
{
	int rc = sqlite3_errcode(l->db);
	int code = (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) ? IK_TEMPFAIL
	                                                      : IK_SOFTWARE;
	return ik_errf(err, code, "ledger %s: %s", what, sqlite3_errmsg(l->db));
}

int
ik_ledger_open(const char *path, struct ik_ledger **out, ik_err *err)
{
	struct ik_ledger *l;
	int fd;

	*out = NULL;
	/* Create the file 0600 ourselves: sqlite would use the umask, and
	 * its -wal/-shm files copy the main file's mode. */
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return ik_errf(err, IK_CONFIG, "ledger %s: %s", path, strerror(errno));
	close(fd);
	if (!(l = calloc(1, sizeof *l)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	pthread_mutex_init(&l->mu, NULL);
	if (sqlite3_open_v2(path, &l->db, SQLITE_OPEN_READWRITE |
	                    SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
		ik_errf(err, IK_CONFIG, "ledger %s: %s", path,
		        l->db ? sqlite3_errmsg(l->db) : "cannot open");
		ik_ledger_close(l);
		return IK_CONFIG;
	}
	sqlite3_busy_timeout(l->db, 5000);
	if (sqlite3_exec(l->db, schema, NULL, NULL, NULL) != SQLITE_OK) {
		ik_errf(err, IK_CONFIG, "ledger %s: %s", path, sqlite3_errmsg(l->db));
		ik_ledger_close(l);
		return IK_CONFIG;
	}
	*out = l;
	return IK_OK;
}

void
ik_ledger_close(struct ik_ledger *l)
{
	if (!l)
		return;
	for (int i = 0; i < S_N; i++)
		sqlite3_finalize(l->st[i]);
	sqlite3_close(l->db);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

static int
bump_locked(struct ik_ledger *l, const char *counter)
{
	sqlite3_stmt *st = stmt(l, S_BUMP);
	int rc;

	if (!st)
		return -1;
	sqlite3_bind_text(st, 1, counter, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	put(st);
	return rc == SQLITE_DONE ? 0 : -1;
}

int
ik_ledger_bump(struct ik_ledger *l, const char *counter, ik_err *err)
{
	int rc = IK_OK;

	pthread_mutex_lock(&l->mu);
	if (bump_locked(l, counter) < 0)
		rc = dberr(l, err, "count");
	pthread_mutex_unlock(&l->mu);
	return rc;
}

/* The fields a replay must match, in one fixed order. */
static char *
canonical(const struct ik_event *ev)
{
	int n = snprintf(NULL, 0, "%s|%s|%lld|%s|%s", ev->charge_id,
	                 ev->account_id, ev->amount, ev->currency, ev->charge_type);
	char *s = n < 0 ? NULL : malloc((size_t)n + 1);

	if (s)
		snprintf(s, (size_t)n + 1, "%s|%s|%lld|%s|%s", ev->charge_id,
		         ev->account_id, ev->amount, ev->currency, ev->charge_type);
	return s;
}

static int
debit_locked(struct ik_ledger *l, const char *key, const struct ik_event *ev,
             int declined, const char *req, struct ik_ledger_debit *out)
{
	sqlite3_stmt *st = stmt(l, S_FIND);
	int rc;

	if (!st)
		return -1;
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		const char *ref = (const char *)sqlite3_column_text(st, 0);
		const char *old = (const char *)sqlite3_column_text(st, 1);
		snprintf(out->ref, sizeof out->ref, "%s", ref ? ref : "");
		out->created_at = sqlite3_column_int64(st, 2);
		out->res = old && strcmp(old, req) == 0 ? IK_LEDGER_REPLAY
		                                        : IK_LEDGER_MISMATCH;
		put(st);
		if (out->res == IK_LEDGER_MISMATCH)
			return bump_locked(l, "mismatches");
		if (!(st = stmt(l, S_REPLAY)))
			return -1;
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		rc = sqlite3_step(st);
		put(st);
		if (rc != SQLITE_DONE)
			return -1;
		return bump_locked(l, "replays");
	}
	put(st);
	if (rc != SQLITE_DONE)
		return -1;
	if (declined) {
		out->res = IK_LEDGER_DECLINED;
		return bump_locked(l, "declines");
	}

	out->res = IK_LEDGER_NEW;
	out->created_at = ik_now_ms();
	if (!(st = stmt(l, S_INSERT)))
		return -1;
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, ev->charge_id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, ev->account_id, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 4, ev->amount);
	sqlite3_bind_text(st, 5, ev->currency, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 6, ev->charge_type, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 7, req, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 8, out->created_at);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		snprintf(out->ref, sizeof out->ref, "%s",
		         (const char *)sqlite3_column_text(st, 0));
	put(st);
	return rc == SQLITE_ROW ? 0 : -1;
}

int
ik_ledger_debit(struct ik_ledger *l, const char *key, const struct ik_event *ev,
                int declined, struct ik_ledger_debit *out, ik_err *err)
{
	char *req = canonical(ev);
	int rc = IK_OK;

	memset(out, 0, sizeof *out);
	if (!req)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	pthread_mutex_lock(&l->mu);
	if (run(l, S_BEGIN) < 0) {
		rc = dberr(l, err, "begin");
	} else if (debit_locked(l, key, ev, declined, req, out) < 0) {
		rc = dberr(l, err, "debit");
		run(l, S_ROLLBACK);
	} else if (run(l, S_COMMIT) < 0) {
		rc = dberr(l, err, "commit");
		run(l, S_ROLLBACK);
	}
	pthread_mutex_unlock(&l->mu);
	free(req);
	return rc;
}

int
ik_ledger_notify(struct ik_ledger *l, const char *key, const char *body,
                 int64_t *count, ik_err *err)
{
	sqlite3_stmt *st;
	int64_t now = ik_now_ms();
	int rc = IK_OK;

	pthread_mutex_lock(&l->mu);
	if (!(st = stmt(l, S_NOTIFY))) {
		rc = dberr(l, err, "notify");
		goto out;
	}
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, body, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, now);
	if (sqlite3_step(st) == SQLITE_ROW)
		*count = sqlite3_column_int64(st, 0);
	else
		rc = dberr(l, err, "notify");
	put(st);
out:
	pthread_mutex_unlock(&l->mu);
	return rc;
}

static int
scalar(struct ik_ledger *l, const char *sql, int64_t *v)
{
	sqlite3_stmt *st;
	int rc;

	if (sqlite3_prepare_v2(l->db, sql, -1, &st, NULL) != SQLITE_OK)
		return -1;
	rc = sqlite3_step(st);
	*v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
	sqlite3_finalize(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

cJSON *
ik_ledger_stats(struct ik_ledger *l, ik_err *err)
{
	cJSON *o = cJSON_CreateObject();
	sqlite3_stmt *st = NULL;
	int64_t debits, amount, notified;
	int i, bad = 0;

	if (!o) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&l->mu);
	if (scalar(l, "SELECT count(*) FROM debits", &debits) < 0 ||
	    scalar(l, "SELECT coalesce(sum(amount), 0) FROM debits", &amount) < 0 ||
	    scalar(l, "SELECT count(*) FROM notifications", &notified) < 0 ||
	    sqlite3_prepare_v2(l->db, "SELECT n FROM counters WHERE name = ?1",
	                       -1, &st, NULL) != SQLITE_OK) {
		bad = 1;
		goto out;
	}
	for (i = 0; counter_names[i]; i++) {
		int64_t n = 0;
		sqlite3_reset(st);
		sqlite3_bind_text(st, 1, counter_names[i], -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW)
			n = sqlite3_column_int64(st, 0);
		cJSON_AddNumberToObject(o, counter_names[i], (double)n);
		if (i == 0) {
			cJSON_AddNumberToObject(o, "debits", (double)debits);
			cJSON_AddNumberToObject(o, "debitedAmount", (double)amount);
		}
	}
	cJSON_AddNumberToObject(o, "notifications", (double)notified);
out:
	if (bad)
		dberr(l, err, "stats");
	sqlite3_finalize(st);
	pthread_mutex_unlock(&l->mu);
	if (bad) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

static cJSON *
debit_row(sqlite3_stmt *st)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "key", (const char *)sqlite3_column_text(st, 0));
	cJSON_AddStringToObject(o, "ref", (const char *)sqlite3_column_text(st, 1));
	cJSON_AddStringToObject(o, "chargeId", (const char *)sqlite3_column_text(st, 2));
	cJSON_AddStringToObject(o, "accountId", (const char *)sqlite3_column_text(st, 3));
	cJSON_AddNumberToObject(o, "amount", (double)sqlite3_column_int64(st, 4));
	cJSON_AddStringToObject(o, "currency", (const char *)sqlite3_column_text(st, 5));
	cJSON_AddStringToObject(o, "chargeType", (const char *)sqlite3_column_text(st, 6));
	cJSON_AddStringToObject(o, "status", "DEBITED");
	cJSON_AddNumberToObject(o, "createdAt", (double)sqlite3_column_int64(st, 7));
	cJSON_AddNumberToObject(o, "replays", (double)sqlite3_column_int64(st, 8));
	return o;
}

static cJSON *
notify_row(sqlite3_stmt *st)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "key", (const char *)sqlite3_column_text(st, 0));
	cJSON_AddNumberToObject(o, "count", (double)sqlite3_column_int64(st, 1));
	cJSON_AddNumberToObject(o, "firstAt", (double)sqlite3_column_int64(st, 2));
	cJSON_AddNumberToObject(o, "lastAt", (double)sqlite3_column_int64(st, 3));
	if (sqlite3_column_text(st, 4)) {
		cJSON *b = cJSON_Parse((const char *)sqlite3_column_text(st, 4));
		if (b)
			cJSON_AddItemToObject(o, "body", b);
	}
	return o;
}

#define DEBIT_COLS "key, ref, charge_id, account_id, amount, currency," \
                   " charge_type, created_at, replays"

int
ik_ledger_list(struct ik_ledger *l, int notifications, char **ndjson, ik_err *err)
{
	struct ik_buf b = {0};
	sqlite3_stmt *st = NULL;
	int rc = IK_OK, s;

	*ndjson = NULL;
	pthread_mutex_lock(&l->mu);
	if (sqlite3_prepare_v2(l->db, notifications
	    ? "SELECT key, count, first_at, last_at, body FROM notifications ORDER BY first_at, key"
	    : "SELECT " DEBIT_COLS " FROM debits ORDER BY seq",
	    -1, &st, NULL) != SQLITE_OK) {
		rc = dberr(l, err, "list");
		goto out;
	}
	while ((s = sqlite3_step(st)) == SQLITE_ROW) {
		cJSON *o = notifications ? notify_row(st) : debit_row(st);
		char *line = o ? cJSON_PrintUnformatted(o) : NULL;
		cJSON_Delete(o);
		if (!line || ik_buf_addstr(&b, line) < 0 || ik_buf_add(&b, "\n", 1) < 0) {
			free(line);
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			goto out;
		}
		free(line);
	}
	if (s != SQLITE_DONE)
		rc = dberr(l, err, "list");
out:
	sqlite3_finalize(st);
	pthread_mutex_unlock(&l->mu);
	if (rc != IK_OK) {
		ik_buf_free(&b);
		return rc;
	}
	if (!b.p && ik_buf_add(&b, "", 0) < 0)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	*ndjson = b.p;
	return IK_OK;
}

int
ik_ledger_get(struct ik_ledger *l, const char *key, cJSON **out, ik_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc, s;

	*out = NULL;
	pthread_mutex_lock(&l->mu);
	if (sqlite3_prepare_v2(l->db, "SELECT " DEBIT_COLS " FROM debits WHERE key = ?1",
	                       -1, &st, NULL) != SQLITE_OK) {
		rc = dberr(l, err, "get");
		goto out;
	}
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	s = sqlite3_step(st);
	if (s == SQLITE_ROW) {
		*out = debit_row(st);
		rc = *out ? IK_OK : ik_errf(err, IK_SOFTWARE, "out of memory");
	} else if (s == SQLITE_DONE) {
		rc = IK_EMPTY;
	} else {
		rc = dberr(l, err, "get");
	}
out:
	sqlite3_finalize(st);
	pthread_mutex_unlock(&l->mu);
	return rc;
}
