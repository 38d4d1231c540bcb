/* queue_sqlite.c: the embedded queue, SQS semantics in one SQLite file.
 *
 * URL: sqlite:PATH#NAME[?maxReceiveCount=N&dlq=NAME&visibility=SECS&
 *      retention=DURATION&delay=SECS].  Many named queues share one file.
 * Parameters, when given, are stored as the queue's configuration (table
 * queues), so every process that later opens sqlite:PATH#NAME without them
 * gets the same redrive policy and defaults.
 *
 * Rules:
 *  - receive is ONE BEGIN IMMEDIATE transaction that picks visible rows
 *    and updates them (new receipt, receiveCount + 1, visible_at), so two
 *    processes never get the same delivery;
 *  - every receive gives a fresh random receipt "MESSAGEID.HEX128"; delete
 *    and change-visibility match message AND receipt, so a stale handle
 *    never touches a message received again since (IK_LEASE_LOST);
 *  - a message received more than maxReceiveCount times moves to the DLQ
 *    (same file) instead of being delivered, as SQS's redrive policy does;
 *    a queue has one unless told otherwise (IK_QUEUE_DEFAULT_MAX_RECEIVE
 *    deliveries, to its dlq= or NAME-dlq; maxReceiveCount=0: none), so
 *    one message that can never be settled does not come back for ever;
 *    a queue named NAME-dlq is a dead-letter queue and has none;
 *  - messages older than the retention (default 4 days) are dropped;
 *  - WAL, synchronous=FULL, busy timeout, file mode 0600; one connection
 *    and prepared statements reused for the life of the process.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>
#include <sqlite3.h>

#include "conn/sqlite.h"
#include "core/outcome.h"
#include "core/util.h"
#include "queue/queue.h"
#include "queue/sqlite/queue_sqlite.h"

#define DEFAULT_VISIBILITY 30
#define DEFAULT_RETENTION_MS (4LL * 86400 * 1000)
#define CLEANUP_EVERY_MS 60000
#define POLL_MIN_MS 10
#define POLL_MAX_MS 100

static const char schema[] =
	"CREATE TABLE IF NOT EXISTS messages ("
	" id INTEGER PRIMARY KEY,"
	" queue TEXT NOT NULL,"
	" message_id TEXT NOT NULL UNIQUE,"
	" body TEXT NOT NULL,"
	" attrs TEXT,"                        /* JSON object of strings, or NULL */
	" sent_at INTEGER NOT NULL,"          /* epoch ms */
	" visible_at INTEGER NOT NULL,"       /* epoch ms */
	" receipt TEXT,"                      /* of the latest receive */
	" receive_count INTEGER NOT NULL DEFAULT 0);"
	"CREATE INDEX IF NOT EXISTS messages_visible ON messages(queue, visible_at);"
	"CREATE INDEX IF NOT EXISTS messages_sent ON messages(queue, sent_at);"
	"CREATE TABLE IF NOT EXISTS queues ("
	" name TEXT PRIMARY KEY,"
	" max_receive INTEGER NOT NULL DEFAULT 0,"   /* 0: the default, -1: none */
	" dlq TEXT,"
	" visibility_s INTEGER NOT NULL DEFAULT 30,"
	" retention_ms INTEGER NOT NULL DEFAULT 345600000,"
	" delay_s INTEGER NOT NULL DEFAULT 0);";

enum {
	S_BEGIN, S_COMMIT, S_ROLLBACK,
	S_PICK, S_TAKE, S_MOVE, S_EXPIRE,
	S_DELETE, S_EXISTS, S_CHVIS, S_SEND, S_STATS,
	S_COUNT
};

static const char *const sql[S_COUNT] = {
	[S_BEGIN] = "BEGIN IMMEDIATE",
	[S_COMMIT] = "COMMIT",
	[S_ROLLBACK] = "ROLLBACK",
	[S_PICK] = "SELECT id, receive_count, message_id FROM messages"
	           " WHERE queue = ?1 AND visible_at <= ?2"
	           " ORDER BY visible_at, id LIMIT ?3",
	[S_TAKE] = "UPDATE messages SET receipt = ?1, receive_count = receive_count + 1,"
	           " visible_at = ?2 WHERE id = ?3"
	           " RETURNING body, receive_count, sent_at, attrs",
	[S_MOVE] = "UPDATE messages SET queue = ?1, visible_at = ?2, receipt = NULL,"
	           " receive_count = 0 WHERE id = ?3",
	[S_EXPIRE] = "DELETE FROM messages WHERE queue = ?1 AND sent_at < ?2",
	[S_DELETE] = "DELETE FROM messages"
	             " WHERE message_id = ?1 AND receipt = ?2 AND queue = ?3",
	[S_EXISTS] = "SELECT 1 FROM messages WHERE message_id = ?1",
	[S_CHVIS] = "UPDATE messages SET visible_at = ?1"
	            " WHERE message_id = ?2 AND receipt = ?3 AND queue = ?4",
	[S_SEND] = "INSERT INTO messages (queue, message_id, body, attrs, sent_at, visible_at)"
	           " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
	[S_STATS] = "SELECT coalesce(sum(visible_at <= ?2), 0),"
	            " coalesce(sum(visible_at > ?2 AND receipt IS NOT NULL), 0),"
	            " coalesce(sum(visible_at > ?2 AND receipt IS NULL), 0)"
	            " FROM messages WHERE queue = ?1",
};

struct conf {
	int64_t max_receive;
	char *dlq;
	int64_t visibility_s;
	int64_t retention_ms;
	int64_t delay_s;
};

/* An open queue: its database, statements and settings. */
struct sqlite_queue {
	sqlite3 *db;
	sqlite3_stmt *st[S_COUNT];
	char *path, *name;
	struct conf conf;
	int64_t last_cleanup;
};

static int
dberr(struct sqlite_queue *s, int rc, const char *what, ik_err *err)
{
	return ik_sqlite_err(s->db, rc, "sqlite queue", s->path, what, err);
}

static void
rollback(struct sqlite_queue *s)
{
	if (!sqlite3_get_autocommit(s->db)) {
		sqlite3_step(s->st[S_ROLLBACK]);
		sqlite3_reset(s->st[S_ROLLBACK]);
	}
}

/* Run a statement that returns no rows; resets it. */
static int
exec_st(struct sqlite_queue *s, int which, const char *what, ik_err *err)
{
	sqlite3_stmt *st = s->st[which];
	int rc = sqlite3_step(st);

	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return dberr(s, rc, what, err);
	return IK_OK;
}

static int
begin(struct sqlite_queue *s, ik_err *err)
{
	return exec_st(s, S_BEGIN, "begin", err);
}

static int
commit(struct sqlite_queue *s, ik_err *err)
{
	int rc = exec_st(s, S_COMMIT, "commit", err);

	if (rc != IK_OK)
		rollback(s);
	return rc;
}

/* Receipt "MESSAGEID.HEX": the id finds the row, the random part proves
 * this is the latest delivery. */
static void
new_receipt(const char *message_id, char *out, size_t cap)
{
	unsigned char r[16];
	char h[33];

	randombytes_buf(r, sizeof r);
	ik_hex(r, sizeof r, h);
	snprintf(out, cap, "%s.%s", message_id, h);
}

/* Split a receipt into its message id (into id, NUL-terminated) or -1. */
static int
receipt_id(const char *receipt, char id[64])
{
	const char *dot = receipt ? strchr(receipt, '.') : NULL;
	size_t n = dot ? (size_t)(dot - receipt) : 0;

	if (!dot || n == 0 || n >= 64 || strlen(dot + 1) != 32)
		return -1;
	memcpy(id, receipt, n);
	id[n] = '\0';
	return 0;
}

static int
bad_receipt(struct sqlite_queue *s, ik_err *err)
{
	return ik_errf(err, IK_DATAERR, "sqlite queue %s#%s: not a receipt handle of this queue",
	               s->path, s->name);
}

/* ---- configuration ---- */

static int
parse_params(const char *params, struct conf *c, int *given, ik_err *err)
{
	char *dup = strdup(params), *save = NULL, *kv;
	int rc = IK_OK;

	if (!dup)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	*given = 0;
	for (kv = strtok_r(dup, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
		char *v = strchr(kv, '=');
		long long n;
		int64_t ms;

		if (!v) {
			rc = ik_errf(err, IK_CONFIG, "queue parameter '%s': expected KEY=VALUE", kv);
			break;
		}
		*v++ = '\0';
		*given = 1;
		if (strcmp(kv, "maxReceiveCount") == 0 && ik_parse_int(v, 0, 1000, &n) == 0) {
			c->max_receive = n ? n : -1;   /* 0: none, stored as -1 */
		} else if (strcmp(kv, "dlq") == 0 && *v) {
			free(c->dlq);
			if (!(c->dlq = strdup(v))) {
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
				break;
			}
		} else if (strcmp(kv, "visibility") == 0 &&
		           ik_parse_int(v, 0, IK_QUEUE_MAX_VISIBILITY, &n) == 0) {
			c->visibility_s = n;
		} else if (strcmp(kv, "delay") == 0 &&
		           ik_parse_int(v, 0, IK_QUEUE_MAX_DELAY, &n) == 0) {
			c->delay_s = n;
		} else if (strcmp(kv, "retention") == 0 && ik_parse_duration(v, &ms) == 0 &&
		           ms >= 1000 && ms <= 14LL * 86400 * 1000) {
			c->retention_ms = ms;
		} else {
			rc = ik_errf(err, IK_CONFIG,
			             "queue parameter %s=%s: expected maxReceiveCount=0..1000, "
			             "dlq=NAME, visibility=0..43200, delay=0..900 or "
			             "retention=1s..14d", kv, v);
			break;
		}
	}
	free(dup);
	if (rc == IK_OK && c->max_receive > 0 && !c->dlq)
		rc = ik_errf(err, IK_CONFIG, "queue parameter maxReceiveCount needs dlq=NAME");
	return rc;
}

/* Load the stored configuration, or store the URL's when it gave one. */
static int
load_conf(struct sqlite_queue *s, const char *params, ik_err *err)
{
	sqlite3_stmt *st = NULL;
	int given = 0, rc;

	s->conf = (struct conf){ 0, NULL, DEFAULT_VISIBILITY, DEFAULT_RETENTION_MS, 0 };
	if ((rc = parse_params(params, &s->conf, &given, err)) != IK_OK)
		return rc;
	if (given) {
		rc = sqlite3_prepare_v2(s->db,
			"INSERT INTO queues (name, max_receive, dlq, visibility_s, retention_ms, delay_s)"
			" VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name) DO UPDATE SET"
			" max_receive = ?2, dlq = ?3, visibility_s = ?4, retention_ms = ?5, delay_s = ?6"
			" WHERE (max_receive, dlq, visibility_s, retention_ms, delay_s)"
			" IS NOT (?2, ?3, ?4, ?5, ?6)", -1, &st, NULL);
		if (rc == SQLITE_OK) {
			sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 2, s->conf.max_receive);
			sqlite3_bind_text(st, 3, s->conf.dlq, -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 4, s->conf.visibility_s);
			sqlite3_bind_int64(st, 5, s->conf.retention_ms);
			sqlite3_bind_int64(st, 6, s->conf.delay_s);
			rc = sqlite3_step(st);
			rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
		}
	} else {
		rc = sqlite3_prepare_v2(s->db,
			"SELECT max_receive, dlq, visibility_s, retention_ms, delay_s"
			" FROM queues WHERE name = ?1", -1, &st, NULL);
		if (rc == SQLITE_OK) {
			sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
			rc = sqlite3_step(st);
			if (rc == SQLITE_ROW) {
				const unsigned char *d = sqlite3_column_text(st, 1);
				s->conf.max_receive = sqlite3_column_int64(st, 0);
				s->conf.dlq = d ? strdup((const char *)d) : NULL;
				s->conf.visibility_s = sqlite3_column_int64(st, 2);
				s->conf.retention_ms = sqlite3_column_int64(st, 3);
				s->conf.delay_s = sqlite3_column_int64(st, 4);
			}
			rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
		}
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_OK)
		return dberr(s, rc, "queue configuration", err);
	return IK_OK;
}

/* The redrive policy in force, from the configuration: none (-1 stored),
 * the one given, or the default -- to the dlq= given, else NAME-dlq --
 * unless the queue is itself a dead-letter queue by name (NAME-dlq):
 * reading a DLQ must not move its messages on again. */
static int
redrive_policy(struct sqlite_queue *s, ik_err *err)
{
	size_t n = strlen(s->name);

	if (s->conf.max_receive < 0) {
		s->conf.max_receive = 0;
		return IK_OK;
	}
	if (s->conf.max_receive > 0 || (n > 4 && strcmp(s->name + n - 4, "-dlq") == 0))
		return IK_OK;
	if (!s->conf.dlq) {
		if (!(s->conf.dlq = malloc(n + 5)))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		memcpy(s->conf.dlq, s->name, n);
		memcpy(s->conf.dlq + n, "-dlq", 5);
	}
	s->conf.max_receive = IK_QUEUE_DEFAULT_MAX_RECEIVE;
	return IK_OK;
}

/* ---- operations ---- */

static int
attrs_from_json(const char *json, struct ik_qmsg *m)
{
	cJSON *o, *it;
	size_t n = 0;

	if (!json)
		return 0;
	if (!(o = cJSON_Parse(json)))
		return -1;
	m->attrs = calloc((size_t)cJSON_GetArraySize(o) + 1, sizeof *m->attrs);
	if (!m->attrs) {
		cJSON_Delete(o);
		return -1;
	}
	cJSON_ArrayForEach(it, o) {
		if (!cJSON_IsString(it))
			continue;
		m->attrs[n].name = strdup(it->string);
		m->attrs[n].value = strdup(it->valuestring);
		if (!m->attrs[n].name || !m->attrs[n].value) {
			m->nattrs = n + 1;
			cJSON_Delete(o);
			return -1;
		}
		n++;
	}
	m->nattrs = n;
	cJSON_Delete(o);
	return 0;
}

static char *
attrs_to_json(const struct ik_qattr *a, size_t n)
{
	cJSON *o;
	char *s;

	if (n == 0)
		return NULL;
	if (!(o = cJSON_CreateObject()))
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!cJSON_AddStringToObject(o, a[i].name, a[i].value)) {
			cJSON_Delete(o);
			return NULL;
		}
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return s;
}

/* One receive transaction: up to max visible messages into msgs. */
static int
receive_once(struct sqlite_queue *s, int max, int64_t vis_ms, struct ik_qmsg *msgs,
             size_t *n, ik_err *err)
{
	int64_t now = ik_now_ms(), ids[IK_QUEUE_BATCH];
	int64_t counts[IK_QUEUE_BATCH];
	char mids[IK_QUEUE_BATCH][40];
	int rc, picked, moved;

	if ((rc = begin(s, err)) != IK_OK)
		return rc;
	if (now - s->last_cleanup >= CLEANUP_EVERY_MS) {
		sqlite3_stmt *st = s->st[S_EXPIRE];
		sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, now - s->conf.retention_ms);
		if ((rc = exec_st(s, S_EXPIRE, "retention", err)) != IK_OK)
			goto fail;
		s->last_cleanup = now;
	}
	do {
		sqlite3_stmt *st = s->st[S_PICK];
		int want = max - (int)*n;

		picked = moved = 0;
		sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, now);
		sqlite3_bind_int(st, 3, want);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			ids[picked] = sqlite3_column_int64(st, 0);
			counts[picked] = sqlite3_column_int64(st, 1);
			snprintf(mids[picked++], sizeof mids[0], "%s",
			         (const char *)sqlite3_column_text(st, 2));
		}
		sqlite3_reset(st);
		if (rc != SQLITE_DONE) {
			rc = dberr(s, rc, "receive", err);
			goto fail;
		}
		for (int i = 0; i < picked; i++) {
			char receipt[128];
			struct ik_qmsg *m = &msgs[*n];

			if (s->conf.max_receive > 0 && counts[i] >= s->conf.max_receive) {
				/* redrive: the DLQ gets it instead of a consumer */
				st = s->st[S_MOVE];
				sqlite3_bind_text(st, 1, s->conf.dlq, -1, SQLITE_STATIC);
				sqlite3_bind_int64(st, 2, now);
				sqlite3_bind_int64(st, 3, ids[i]);
				if ((rc = exec_st(s, S_MOVE, "redrive", err)) != IK_OK)
					goto fail;
				moved++;
				continue;
			}
			memset(m, 0, sizeof *m);
			new_receipt(mids[i], receipt, sizeof receipt);
			m->receipt = strdup(receipt);
			m->message_id = strdup(mids[i]);
			st = s->st[S_TAKE];
			sqlite3_bind_text(st, 1, receipt, -1, SQLITE_TRANSIENT);
			sqlite3_bind_int64(st, 2, now + vis_ms);
			sqlite3_bind_int64(st, 3, ids[i]);
			rc = sqlite3_step(st);
			if (rc == SQLITE_ROW) {
				const char *body = (const char *)sqlite3_column_text(st, 0);
				m->body = body ? strdup(body) : NULL;
				m->receive_count = sqlite3_column_int64(st, 1);
				m->sent_at = sqlite3_column_int64(st, 2);
				if (attrs_from_json((const char *)sqlite3_column_text(st, 3), m) < 0)
					m->body = (free(m->body), NULL);
			}
			sqlite3_reset(st);
			(*n)++;
			if (rc != SQLITE_ROW) {
				rc = dberr(s, rc == SQLITE_DONE ? SQLITE_INTERNAL : rc, "receive", err);
				goto fail;
			}
			if (!m->message_id || !m->body || !m->receipt) {
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
				goto fail;
			}
		}
		/* moved rows freed room for more: look again */
	} while (moved > 0 && (int)*n < max);
	return commit(s, err);
fail:
	rollback(s);
	for (size_t i = 0; i < *n; i++)
		ik_qmsg_free(&msgs[i]);
	*n = 0;
	return rc;
}

static int
sq_receive(struct ik_queue *q, int max, int wait_s, int visibility_s,
           struct ik_qmsg *msgs, size_t *n, ik_err *err)
{
	struct sqlite_queue *s = q->impl;
	int64_t deadline = ik_mono_ms() + (int64_t)wait_s * 1000, pause = POLL_MIN_MS;
	int64_t vis_ms = (visibility_s < 0 ? s->conf.visibility_s : visibility_s) * 1000LL;
	int rc;

	*n = 0;
	if (max < 1 || max > IK_QUEUE_BATCH)
		return ik_errf(err, IK_USAGE, "receive: at most %d messages", IK_QUEUE_BATCH);
	for (;;) {
		if ((rc = receive_once(s, max, vis_ms, msgs, n, err)) != IK_OK || *n > 0)
			return rc;
		if ((q->stop && *q->stop) || ik_mono_ms() >= deadline)
			return IK_OK;
		ik_sleep_ms(pause);   /* a stop signal ends it early: the loop checks stop */
		pause = pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : pause * 2;
	}
}

/* IK_OK when deleted or already gone (as SQS), IK_LEASE_LOST when the
 * message is still there under a newer receipt. */
static int
delete_one(struct sqlite_queue *s, const char *receipt, ik_err *err)
{
	sqlite3_stmt *st = s->st[S_DELETE];
	char id[64];
	int rc;

	if (receipt_id(receipt, id) < 0)
		return bad_receipt(s, err);
	sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
	sqlite3_bind_text(st, 2, receipt, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, s->name, -1, SQLITE_STATIC);
	if ((rc = exec_st(s, S_DELETE, "delete", err)) != IK_OK)
		return rc;
	if (sqlite3_changes(s->db) > 0)
		return IK_OK;
	st = s->st[S_EXISTS];
	sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc == SQLITE_DONE)
		return IK_OK;
	if (rc != SQLITE_ROW)
		return dberr(s, rc, "delete", err);
	return ik_errf(err, IK_LEASE_LOST,
	               "stale receipt handle: message %s was received again since", id);
}

static int
sq_del(struct ik_queue *q, const char *receipt, ik_err *err)
{
	return delete_one(q->impl, receipt, err);
}

/* Any n (the acker gives a whole group): one transaction, one commit. */
static int
sq_del_batch(struct ik_queue *q, const char *const *receipts, size_t n,
             struct ik_qresult *res, ik_err *err)
{
	struct sqlite_queue *s = q->impl;
	int rc;

	if ((rc = begin(s, err)) != IK_OK)
		return rc;
	for (size_t i = 0; i < n; i++) {
		ik_err e = { 0 };
		res[i].code = delete_one(s, receipts[i], &e);
		snprintf(res[i].msg, sizeof res[i].msg, "%s", e.msg);
		if (res[i].code == IK_TEMPFAIL || res[i].code == IK_SOFTWARE) {
			rollback(s);
			*err = e;
			return e.code;
		}
	}
	return commit(s, err);
}

static int
sq_chvis(struct ik_queue *q, const char *receipt, int visibility_s, ik_err *err)
{
	struct sqlite_queue *s = q->impl;
	sqlite3_stmt *st = s->st[S_CHVIS];
	char id[64];
	int rc;

	if (receipt_id(receipt, id) < 0)
		return bad_receipt(s, err);
	sqlite3_bind_int64(st, 1, ik_now_ms() + visibility_s * 1000LL);
	sqlite3_bind_text(st, 2, id, -1, SQLITE_TRANSIENT);
	sqlite3_bind_text(st, 3, receipt, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, s->name, -1, SQLITE_STATIC);
	if ((rc = exec_st(s, S_CHVIS, "change visibility", err)) != IK_OK)
		return rc;
	if (sqlite3_changes(s->db) == 0)
		return ik_errf(err, IK_LEASE_LOST,
		               "stale receipt handle: message %s was deleted or received again", id);
	return IK_OK;
}

static int
send_one(struct sqlite_queue *s, struct ik_qsend *m, int64_t now, ik_err *err)
{
	sqlite3_stmt *st = s->st[S_SEND];
	char id[37], *attrs = NULL;
	int delay = m->delay_s > 0 ? m->delay_s : (int)s->conf.delay_s;
	int rc;

	if (m->nattrs && !(attrs = attrs_to_json(m->attrs, m->nattrs)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	ik_uuid4(id);
	sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, m->body, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, attrs, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 5, now);
	sqlite3_bind_int64(st, 6, now + delay * 1000LL);
	rc = exec_st(s, S_SEND, "send", err);
	sqlite3_clear_bindings(st);
	free(attrs);
	if (rc != IK_OK)
		return rc;
	if (!(m->message_id = strdup(id)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}

static int
sq_send(struct ik_queue *q, struct ik_qsend *m, ik_err *err)
{
	int rc = ik_qsend_check(m, err);

	return rc != IK_OK ? rc : send_one(q->impl, m, ik_now_ms(), err);
}

static int
sq_send_batch(struct ik_queue *q, struct ik_qsend *m, size_t n,
              struct ik_qresult *res, ik_err *err)
{
	struct sqlite_queue *s = q->impl;
	int64_t now = ik_now_ms();
	int rc;

	if ((rc = begin(s, err)) != IK_OK)
		return rc;
	for (size_t i = 0; i < n; i++) {
		ik_err e = { 0 };
		res[i].code = ik_qsend_check(&m[i], &e);
		if (res[i].code == IK_OK)
			res[i].code = send_one(s, &m[i], now, &e);
		snprintf(res[i].msg, sizeof res[i].msg, "%s", e.msg);
		if (res[i].code == IK_TEMPFAIL || res[i].code == IK_SOFTWARE) {
			rollback(s);
			for (size_t j = 0; j <= i; j++)
				m[j].message_id = (free(m[j].message_id), NULL);
			*err = e;
			return e.code;
		}
	}
	if ((rc = commit(s, err)) != IK_OK)
		for (size_t j = 0; j < n; j++)
			m[j].message_id = (free(m[j].message_id), NULL);
	return rc;
}

static int
sq_stats(struct ik_queue *q, struct ik_qstats *out, ik_err *err)
{
	struct sqlite_queue *s = q->impl;
	sqlite3_stmt *st = s->st[S_STATS];
	int rc;

	sqlite3_bind_text(st, 1, s->name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, ik_now_ms());
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		out->visible = sqlite3_column_int64(st, 0);
		out->inflight = sqlite3_column_int64(st, 1);
		out->delayed = sqlite3_column_int64(st, 2);
	}
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? IK_OK : dberr(s, rc, "attributes", err);
}

static void
sq_free(struct sqlite_queue *s)
{
	for (int i = 0; i < S_COUNT; i++)
		sqlite3_finalize(s->st[i]);
	sqlite3_close(s->db);
	free(s->conf.dlq);
	free(s->path);
	free(s->name);
	free(s);
}

static void
sq_close(struct ik_queue *q)
{
	if (q->impl)
		sq_free(q->impl);
	q->impl = NULL;
}

static const struct ik_queue_ops sqlite_ops = {
	.name = "sqlite",
	.receive = sq_receive,
	.del = sq_del,
	.del_batch = sq_del_batch,
	.change_visibility = sq_chvis,
	.send = sq_send,
	.send_batch = sq_send_batch,
	.stats = sq_stats,
	.close = sq_close,
};

int
ik_queue_sqlite_open(const char *path, const char *name, const char *params,
                     struct ik_queue *q, ik_err *err)
{
	struct sqlite_queue *s;
	int rc;

	if (sodium_init() < 0)
		return ik_errf(err, IK_SOFTWARE, "libsodium failed to initialise");
	if (!(s = calloc(1, sizeof *s)) || !(s->path = strdup(path)) ||
	    !(s->name = strdup(name))) {
		if (s)
			free(s->path), free(s);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	if ((rc = ik_sqlite_open(path, "sqlite queue", &s->db, err)) != IK_OK)
		goto fail;
	rc = sqlite3_exec(s->db, schema, NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = dberr(s, rc, "schema", err);
		goto fail;
	}
	for (int i = 0; i < S_COUNT; i++)
		if ((rc = sqlite3_prepare_v3(s->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT,
		                             &s->st[i], NULL)) != SQLITE_OK) {
			rc = dberr(s, rc, "prepare", err);
			goto fail;
		}
	if ((rc = load_conf(s, params, err)) != IK_OK ||
	    (rc = redrive_policy(s, err)) != IK_OK)
		goto fail;
	q->max_receive = s->conf.max_receive;
	q->ops = &sqlite_ops;
	q->impl = s;
	return IK_OK;
fail:
	sq_free(s);
	return rc;
}
