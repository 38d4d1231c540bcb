/* acker.c: the verdict carried out on the queue; see acker.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/envelope.h"
#include "core/event.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/acker.h"
#include "open/open_queue.h"
#include "queue/queue.h"

/* An envelope whose action needs the queue, held until the flush. */
enum hold_kind { H_DELETE, H_DLQ, H_CHVIS };

struct dlqmsg {            /* a DLQ copy in flight: what its send points to */
	char count[24], first[24], id[IK_CHARGE_ID_MAX + 1], errtext[1024];
	const char *step;
	struct ik_qattr at[10];
	struct ik_qsend m;
};

struct held {
	cJSON *env;
	cJSON *ack;            /* the "ack" fields decided so far */
	enum hold_kind kind;
	int verdict;           /* H_DLQ: the reason */
	const char *why;
	int vis;               /* H_CHVIS */
	int audit;             /* DUP_DONE: an audit line once deleted */
	int dlq;               /* sent to the DLQ: the delete completes it */
	int over;              /* finished: its result is recorded */
	struct dlqmsg *copy;   /* H_DLQ, while its send is in flight */
};

/* Calls one flush keeps outstanding on a queue (SQS; the SQLite queue runs
 * each to its end). */
#define ACKER_INFLIGHT 16

struct ik_acker {
	struct ik_acker_opts o;
	struct ik_queue *q, *dlq;
	int halted;            /* the exit code once configuration is broken */
	int config_run;        /* debits refused as CONFIG since one answered */
	int batching;
	struct held held[IK_ACKER_GROUP_MAX];
	size_t nheld;
	/* the flush's deletes: held[dels[j]] is receipts[j], res[j] */
	size_t dels[IK_ACKER_GROUP_MAX];
	const char *receipts[IK_ACKER_GROUP_MAX];
	struct ik_qresult res[IK_ACKER_GROUP_MAX];
	const char *single[IK_ACKER_GROUP_MAX];   /* held[i]'s receipt, a call alone */
	struct ik_qop ops[ACKER_INFLIGHT];
	int busy[ACKER_INFLIGHT];
	/* progress: per outcome in the table, then the P_ extras below */
	const struct ik_outcome *table;
	int ntable, dirty;
	long long *count;
	int64_t written;       /* ik_mono_ms of the last write, 0 before */
};

enum { P_RECEIVED, P_ACK_FAILED, P_LEFT, P_EXTRAS };
static const char *const extras[] = { "RECEIVED", "ACK_FAILED", "LEFT" };

/* Deletes per call: the SQLite queue takes a whole group in one
 * transaction (one durable commit), SQS at most its batch of 10. */
static size_t
batch_max(const struct ik_acker *a)
{
	return a->q && strcmp(a->q->ops->name, "sqlite") == 0 ? IK_ACKER_GROUP_MAX : IK_QUEUE_BATCH;
}

static const char *const steps[] = { "claim", "debit", "notify", "done" };

/* ---- the envelope's facts ---- */

/* The error text of the step that decided the verdict, or "". */
static const char *
deciding_error(const cJSON *env, int verdict, const char *why, const char **step)
{
	for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		cJSON *r = ik_env_result(env, steps[i]);
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
		if (r && (strcmp(why, steps[i]) == 0 || ik_env_step_code(env, steps[i]) == verdict) &&
		    cJSON_IsString(e)) {
			*step = steps[i];
			return e->valuestring;
		}
	}
	*step = why;
	return "";
}

static void
charge_id(const cJSON *env, char out[IK_CHARGE_ID_MAX + 1])
{
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "chargeId");

	if (cJSON_IsString(c) && strlen(c->valuestring) <= IK_CHARGE_ID_MAX)
		snprintf(out, IK_CHARGE_ID_MAX + 1, "%s", c->valuestring);
	else
		ik_event_peek_id(ik_env_body(env), out);
}

static int64_t
clamp_vis(int64_t v)
{
	return v > IK_QUEUE_MAX_VISIBILITY ? IK_QUEUE_MAX_VISIBILITY : v;
}

/* The one visibility backoff: min(2^n * base, cap), in seconds: util.h's
 * ceiling without its jitter.  The value is the envelope's ack.visibility,
 * which an operator (and the tests) read back as "when will this come
 * again"; copies are spread already by when each was received. */
static int64_t
backoff(int64_t n, int64_t base, int64_t cap)
{
	return clamp_vis(ik_backoff_ceil(base, cap, n));
}

/* The n of a leave-backoff: how often the charge was tried, not how often
 * its message was delivered.  receiveCount counts every delivery, each
 * DUP_IN_PROGRESS look while another worker held the charge among them,
 * so under faults a charge had 9 or more before its first TEMPFAIL, which
 * then parked it for the whole cap with its record IN_PROGRESS
 * (RELIABILITY.md "stuck charges").  An ACQUIRED claim's attempt is the
 * record's claim count: the tries.  Attempt 1 gives 2^1 * base, what a
 * first delivery (receiveCount 1) always had.  Without a claim of ours (a
 * TEMPFAIL before or at the claim) receiveCount is all there is. */
static int64_t
tries(const cJSON *env)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"),
	                                                  "attempt");

	/* below 2^31: any n past the cap's is the cap, and the cast is defined */
	if (ik_env_step_code(env, "claim") == IK_OK && cJSON_IsNumber(a) &&
	    a->valuedouble >= 1 && a->valuedouble < 2147483648.0)
		return (int64_t)a->valuedouble;
	return ik_env_int(env, "receiveCount", 1);
}

/* DUP_IN_PROGRESS: most often the holder is a moment from finishing (the
 * copy came while the first was in the bank call), and the next look then
 * settles it (DUP_DONE: delete).  So come back soon, later on each
 * receive, and never after the lease ends, when the claim can be taken
 * over: the one backoff with base IK_ACKER_DUP_BASE_S, capped at the lease
 * remaining.  -1 when the claim says no lease. */
static int
dup_visibility(const cJSON *env, int64_t max_receive, int64_t *vis)
{
	const cJSON *claim = ik_env_result(env, "claim");
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(claim, "leaseUntil");
	const cJSON *h = cJSON_GetObjectItemCaseSensitive(claim, "holderLeaseMs");
	int64_t left, whole = -1;

	if (!cJSON_IsNumber(l))
		return -1;
	/* leaseUntil may be on the store's clock (PostgreSQL, Redis) or the
	 * holder's: against ours it may say more than a whole lease is left
	 * (that clock ahead: never wait past one) or less than is (behind). */
	left = (int64_t)l->valuedouble - ik_now_ms();
	if (cJSON_IsNumber(h) && h->valuedouble > 0 && h->valuedouble < 1e15) {
		whole = (int64_t)h->valuedouble;
		if (left > whole)
			left = whole;
	}
	left = left <= 0 ? 0 : (left + 999) / 1000;
	*vis = backoff(ik_env_int(env, "receiveCount", 1), IK_ACKER_DUP_BASE_S, left);
	/* The next delivery is the queue's last before its redrive policy
	 * dead-letters the message: spend it after the lease, when the claim
	 * can be taken over (a worker that died holding it), not before; with
	 * the holder's whole lease known, after that much, which no clock
	 * behind the store's can cut short. */
	if (max_receive > 0 && ik_env_int(env, "receiveCount", 1) >= max_receive - 1)
		*vis = clamp_vis(whole > 0 ? (whole + 999) / 1000 : left);
	return 0;
}

/* ---- queues ---- */

static struct ik_queue *
queue_for(struct ik_acker *a, const cJSON *env, ik_err *err)
{
	const char *url = a->o.queue ? a->o.queue : ik_env_str(env, "queue");
	int batching;

	if (a->q && (!url || strcmp(a->q->url, url) == 0))
		return a->q;
	batching = a->batching;
	ik_acker_flush(a);   /* the held deletes belong to the queue being closed */
	a->batching = batching;
	ik_queue_close(a->q);
	a->q = NULL;
	/* and so does its DLQ: each queue has its own (sqlite:PATH#NAME-dlq,
	 * its dlq= parameter), and a poison message must reach its own
	 * queue's, not the one the previous queue's poison went to */
	ik_queue_close(a->dlq);
	a->dlq = NULL;
	if (ik_queue_open(url, &a->q, err) != IK_OK) {
		if (err->code == IK_CONFIG)
			a->halted = IK_CONFIG;
		return NULL;
	}
	a->q->stop = NULL;   /* an ack in progress is finished, not abandoned */
	return a->q;
}

static struct ik_queue *
dlq_for(struct ik_acker *a, struct ik_queue *q, ik_err *err)
{
	char *url;

	if (a->dlq)
		return a->dlq;
	if (!(url = ik_queue_dlq_url(a->o.dlq, q->url, err)))
		return NULL;
	if (ik_queue_open(url, &a->dlq, err) != IK_OK)
		a->dlq = NULL;
	free(url);
	return a->dlq;
}

static void
add_attr(struct ik_qattr *at, size_t *n, const char *k, const char *v)
{
	if (v && *v)
		at[(*n)++] = (struct ik_qattr){ (char *)k, (char *)v };
}

/* The DLQ copy of h's message: the body with why and where it came from
 * in message attributes.  IK_OK, or why it cannot be sent. */
static int
dlq_copy(struct ik_acker *a, struct held *h, ik_err *err)
{
	struct dlqmsg *c;
	const cJSON *env = h->env;
	const char *e;

	if (!(c = h->copy = calloc(1, sizeof *c)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	e = deciding_error(env, h->verdict, h->why, &c->step);
	c->m = (struct ik_qsend){ .body = ik_env_body(env), .attrs = c->at };
	snprintf(c->count, sizeof c->count, "%lld", (long long)ik_env_int(env, "receiveCount", 0));
	/* the DLQ copy is a new message: keep when the first one was sent */
	if (ik_env_first_sent_at(env) > 0)
		snprintf(c->first, sizeof c->first, "%lld", (long long)ik_env_first_sent_at(env));
	snprintf(c->errtext, sizeof c->errtext, "%s", e);
	charge_id(env, c->id);
	/* SQS refuses empty attribute values: only what is there */
#define ATTR(k, v) add_attr(c->at, &c->m.nattrs, k, v)
	ATTR("idemkit.reason", ik_code_name(h->verdict));
	ATTR("idemkit.error", c->errtext);
	ATTR("idemkit.step", c->step);
	ATTR("idemkit.sourceQueue", a->q->url);
	ATTR("idemkit.messageId", ik_env_str(env, "messageId"));
	ATTR("idemkit.receiveCount", c->count);
	ATTR("idemkit.chargeId", c->id);
	ATTR(IK_ATTR_FIRST_SENT_AT, c->first);
#undef ATTR
	if (!*c->m.body)   /* no queue takes an empty body; keep it in sight instead */
		return ik_errf(err, IK_DATAERR, "empty body: not sent to the DLQ");
	return IK_OK;
}

/* h's DLQ copy is there: its ack says where, the audit line says so. */
static void
dlq_sent(struct ik_acker *a, struct held *h)
{
	struct dlqmsg *c = h->copy;

	cJSON_AddStringToObject(h->ack, "dlq", a->dlq->url);
	cJSON_AddStringToObject(h->ack, "dlqMessageId", c->m.message_id);
	ik_log(IK_LOG_AUDIT, "sent to the DLQ", "step", "ack", "chargeId", c->id[0] ? c->id : NULL,
	       "messageId", ik_env_str(h->env, "messageId"), "outcome", ik_code_name(h->verdict),
	       "dlq", a->dlq->url, "error", c->errtext[0] ? c->errtext : NULL, NULL);
}

static void
dlq_free(struct held *h)
{
	if (h->copy)
		free(h->copy->m.message_id);
	free(h->copy);
	h->copy = NULL;
}

/* ---- progress ---- */

static void
progress_write(struct ik_acker *a)
{
	size_t len = strlen(a->o.progress);
	char *tmp = malloc(len + 5);
	FILE *f;
	int n = a->ntable, bad;

	a->dirty = 0;
	a->written = ik_mono_ms();
	if (!tmp)
		return;
	memcpy(tmp, a->o.progress, len);
	memcpy(tmp + len, ".tmp", 5);
	if ((f = fopen(tmp, "w"))) {
		for (int i = 0; i < n + P_EXTRAS; i++)
			fprintf(f, "%s\t%lld\n", i < n ? a->table[i].name : extras[i - n],
			        a->count[i]);
		bad = ferror(f);
		if (fclose(f) != 0 || bad || rename(tmp, a->o.progress) != 0)
			remove(tmp);
	}
	free(tmp);
}

/* The counts the file holds already (none when there is no file). */
static void
progress_read(struct ik_acker *a)
{
	FILE *f = fopen(a->o.progress, "r");
	char name[64];
	long long v;

	if (!f)
		return;
	while (fscanf(f, "%63s %lld", name, &v) == 2) {
		const struct ik_outcome *o = ik_outcome_by_name(name);
		if (o)
			a->count[o - a->table] = v;
		for (int i = 0; i < P_EXTRAS; i++)
			if (strcmp(name, extras[i]) == 0)
				a->count[a->ntable + i] = v;
	}
	fclose(f);
}

int
ik_acker_tick(void *acker)
{
	struct ik_acker *a = acker;
	int64_t wait;

	if (!a->dirty)
		return -1;
	wait = a->written + IK_ACKER_PROGRESS_MS - ik_mono_ms();
	if (a->written && wait > 0)
		return (int)wait;
	progress_write(a);
	return -1;
}

/* env, finished: counted as idemkit-code --tally counts it. */
static void
progress_count(struct ik_acker *a, const cJSON *env)
{
	const struct ik_outcome *v;
	int settled = ik_env_settled(env, &v), n = a->ntable;

	if (v)
		a->count[v - a->table]++;
	a->count[n + P_RECEIVED]++;
	a->count[n + P_ACK_FAILED] += !v || ik_env_step_code(env, "ack") != IK_OK;
	a->count[n + P_LEFT] += !settled;
	a->dirty = 1;
	ik_acker_tick(a);
}

/* ---- recording the result ---- */

/* env's "ack" = {"outcome": code, the fields of ack (freed), "error", "at"}. */
static int
finish(struct ik_acker *a, cJSON *env, cJSON *ack, int code, const char *msg,
       int audit, int dlq)
{
	cJSON *r = ik_env_set_result(env, "ack", code);
	char id[IK_CHARGE_ID_MAX + 1];

	if (r && ack)
		for (cJSON *c = ack->child; c; c = c->next)
			if (strcmp(c->string, "outcome") != 0)
				cJSON_AddItemToObject(r, c->string, cJSON_Duplicate(c, 1));
	cJSON_Delete(ack);
	if (r && msg && *msg)
		cJSON_AddStringToObject(r, "error", msg);
	if (r && code != IK_OK && dlq)
		/* in the DLQ and still here: a duplicate there, never a loss */
		cJSON_AddBoolToObject(r, "dlqSentNotDeleted", 1);
	/* When the message was settled (epoch ms): with claim.leaseUntil it
	 * gives claim-to-ack latency (make bench).  Last, so that scripts
	 * matching the fields before it are not disturbed. */
	if (r)
		cJSON_AddNumberToObject(r, "at", (double)ik_now_ms());
	if (code == IK_OK && audit) {
		charge_id(env, id);
		ik_log(IK_LOG_AUDIT, "duplicate of a finished charge deleted", "step", "ack",
		       "chargeId", id[0] ? id : NULL, "messageId", ik_env_str(env, "messageId"),
		       "outcome", "DUP_DONE", NULL);
	}
	if (code != IK_OK && a->o.log_failures)
		ik_log(IK_LOG_WARN, "ack failed", "step", "ack",
		       "messageId", ik_env_str(env, "messageId"),
		       "action", cJSON_GetStringValue(cJSON_GetObjectItem(r, "action")),
		       "outcome", ik_code_name(code), "error", msg, NULL);
	if (a->count)
		progress_count(a, env);
	return code;
}

/* ---- the flush: the held actions carried out, calls in flight ----
 * First the DLQ copies (concurrently, on the DLQ); a message whose copy is
 * there becomes a delete, one whose copy failed is left (its result says
 * why).  Then on the source queue, concurrently: the deletes, in batches
 * (entry i of a batch is the envelope at dels[i] of that batch's own
 * slice), and the visibility changes.  A call's failure is each of its
 * entries' own, exactly as when they went one after another. */

/* h is over: its result recorded from the call's (msg: the error). */
static void
held_over(struct ik_acker *a, struct held *h, int code, const char *msg)
{
	dlq_free(h);
	finish(a, h->env, h->ack, code, code == IK_OK ? NULL : msg, h->audit, h->dlq);
	h->ack = NULL;
	h->over = 1;
}

/* What a finished call means for the envelopes it was for. */
static void
op_done(struct ik_acker *a, struct ik_qop *op)
{
	struct held *h = op->arg;
	const size_t *d = op->arg;

	switch (op->kind) {
	case IK_QOP_SEND:
		if (op->rc == IK_OK) {
			dlq_sent(a, h);
			dlq_free(h);
			h->dlq = 1;
			h->kind = H_DELETE;
		} else {
			/* not in the DLQ: leave it, it comes back */
			ik_errwrap(&op->err, "DLQ %s", a->dlq->url);
			held_over(a, h, op->rc, op->err.msg);
		}
		break;
	case IK_QOP_DEL_BATCH:
		for (size_t i = 0; i < op->n; i++)
			held_over(a, &a->held[d[i]], op->rc != IK_OK ? op->rc : op->res[i].code,
			          op->rc != IK_OK ? op->err.msg : op->res[i].msg);
		break;
	case IK_QOP_DEL:
	case IK_QOP_CHVIS:
	case IK_QOP_RECEIVE:
		held_over(a, h, op->rc, op->err.msg);
		break;
	}
	a->busy[op - a->ops] = 0;
}

/* A free call slot, waiting for a call on q to finish when none is. */
static struct ik_qop *
op_slot(struct ik_acker *a, struct ik_queue *q)
{
	for (;;) {
		struct ik_qop *done;
		for (int i = 0; i < ACKER_INFLIGHT; i++)
			if (!a->busy[i]) {
				a->busy[i] = 1;
				memset(&a->ops[i], 0, sizeof a->ops[i]);
				return &a->ops[i];
			}
		if ((done = ik_queue_reap(q, -1)))
			op_done(a, done);
	}
}

/* Every call started on q has finished. */
static void
op_drain(struct ik_acker *a, struct ik_queue *q)
{
	while (q->pending) {
		struct ik_qop *done = ik_queue_reap(q, -1);
		if (done)
			op_done(a, done);
	}
}

static void
flush_dlq(struct ik_acker *a)
{
	ik_err err = { 0 };

	for (size_t i = 0; i < a->nheld; i++) {
		struct held *h = &a->held[i];
		struct ik_qop *op;

		if (h->over || h->kind != H_DLQ)
			continue;
		if (!dlq_for(a, a->q, &err) || dlq_copy(a, h, &err) != IK_OK) {
			held_over(a, h, err.code, err.msg);
			continue;
		}
		op = op_slot(a, a->dlq);
		op->kind = IK_QOP_SEND;
		op->msg = &h->copy->m;
		op->arg = h;
		ik_queue_submit(a->dlq, op);
	}
	if (a->dlq)
		op_drain(a, a->dlq);
}

static void
flush_source(struct ik_acker *a)
{
	struct ik_queue *q = a->q;
	size_t nd = 0, max = batch_max(a);

	for (size_t i = 0; i < a->nheld; i++) {
		struct held *h = &a->held[i];
		struct ik_qop *op;

		if (h->over)
			continue;
		a->single[i] = ik_env_str(h->env, "receipt");
		if (h->kind == H_DELETE) {
			a->dels[nd] = i;
			a->receipts[nd++] = a->single[i];
			continue;
		}
		op = op_slot(a, q);
		op->kind = IK_QOP_CHVIS;
		op->receipts = &a->single[i];
		op->visibility_s = h->vis;
		op->arg = h;
		ik_queue_submit(q, op);
	}
	for (size_t j = 0; j < nd; j += max) {
		size_t n = nd - j < max ? nd - j : max;
		struct ik_qop *op = op_slot(a, q);

		if (n == 1) {
			op->kind = IK_QOP_DEL;
			op->arg = &a->held[a->dels[j]];
		} else {
			op->kind = IK_QOP_DEL_BATCH;
			op->arg = &a->dels[j];
			op->res = &a->res[j];
		}
		op->receipts = &a->receipts[j];
		op->n = n;
		ik_queue_submit(q, op);
	}
	op_drain(a, q);
}

int
ik_acker_flush(void *acker)
{
	struct ik_acker *a = acker;

	a->batching = 0;
	if (a->nheld == 0)
		return 0;
	flush_dlq(a);
	flush_source(a);
	memset(a->held, 0, a->nheld * sizeof a->held[0]);
	a->nheld = 0;
	return 0;
}

int
ik_acker_begin(void *acker)
{
	((struct ik_acker *)acker)->batching = 1;
	return 0;
}

int
ik_acker_halted(void *acker)
{
	return ((struct ik_acker *)acker)->halted;
}

/* Hold env's action for the flush; carried out now unless a batch is open
 * and has room. */
static int
hold(struct ik_acker *a, const struct held *h)
{
	int batching = a->batching;

	if (h->kind == H_CHVIS)
		cJSON_AddNumberToObject(h->ack, "visibility", (double)h->vis);
	if (a->nheld == IK_ACKER_GROUP_MAX)
		ik_acker_flush(a);
	a->held[a->nheld++] = *h;
	if (!batching) {
		ik_acker_flush(a);
		return ik_env_step_code(h->env, "ack");
	}
	a->batching = 1;
	return IK_OK;
}

/* The bank refused this charge with a status in neither of its lists
 * (CONFIG from the debit), or the store refused its claim as CONFIG (a
 * table or, with the outbox, a replication slot that is not there).  A
 * configuration that refuses every charge (a wrong URL, credentials, a
 * missing slot) must stop the worker before it walks the whole queue:
 * IK_ACKER_CONFIG_RUN such refusals with no debit answered between them
 * halt the acker (78).  One charge refused among good ones must
 * neither stop the others nor come back for ever: it is left like any
 * CONFIG, and on its last delivery goes to the DLQ with its reason
 * (last_delivery, below).  Its record (a debit's; a refused claim made
 * none) stays IN_PROGRESS, nothing debited; charge-recover --dlq re-drives
 * it after a fix, with the same idempotency key. */
static void
config_refusal(struct ik_acker *a, const cJSON *env, int verdict, const char *why)
{
	int debit = ik_env_step_code(env, "debit");

	if (debit == IK_OK || debit == IK_DECLINED)
		a->config_run = 0;
	if (verdict != IK_CONFIG || (strcmp(why, "debit") != 0 && strcmp(why, "claim") != 0))
		return;
	if (++a->config_run >= IK_ACKER_CONFIG_RUN)
		a->halted = IK_CONFIG;
}

/* A message to be left (TEMPFAIL, LEASE_SHORT, DUP_IN_PROGRESS,
 * LEASE_LOST, CONFIG...) on the last delivery the queue's redrive policy
 * allows goes to the DLQ now, with its reason: left, the queue's own
 * redrive would move it at its next receive without one (the embedded
 * queue's, SQS's), and an operator would not know why a charge whose
 * record is IN_PROGRESS (maybe debited: a TEMPFAIL may be a timeout)
 * stopped coming back.  charge-recover --dlq re-drives it, with the same
 * idempotency key.  The action to take. */
static enum ik_action
last_delivery(struct ik_acker *a, const cJSON *env, enum ik_action act, cJSON *ack)
{
	if (act != IK_ACT_LEAVE && act != IK_ACT_LEAVE_LEASE && act != IK_ACT_LEAVE_BACKOFF)
		return act;
	if (a->q->max_receive <= 0 || ik_env_int(env, "receiveCount", 1) < a->q->max_receive)
		return act;
	cJSON_ReplaceItemInObjectCaseSensitive(ack, "action",
	    cJSON_CreateString(ik_action_name(IK_ACT_DLQ)));
	cJSON_AddNumberToObject(ack, "maxReceiveCount", (double)a->q->max_receive);
	return IK_ACT_DLQ;
}

int
ik_acker_ack(struct ik_acker *a, cJSON *env)
{
	const char *why = "", *receipt = ik_env_str(env, "receipt");
	int verdict = ik_env_verdict(env, &why);
	const struct ik_outcome *o = ik_outcome_by_code(verdict);
	enum ik_action act = o ? o->action : IK_ACT_LEAVE;
	int64_t vis = -1;
	ik_err err = { 0 };
	cJSON *ack = cJSON_CreateObject();
	struct held h = { .env = env, .ack = ack, .verdict = verdict, .why = why };

	if (!ack)
		return finish(a, env, NULL, IK_SOFTWARE, "out of memory", 0, 0);
	if (!receipt || !*receipt) {
		cJSON_AddStringToObject(ack, "action", "none");
		return finish(a, env, ack, IK_DATAERR,
		              "not an envelope from sqs-recv (no receipt): nothing to ack", 0, 0);
	}
	cJSON_AddStringToObject(ack, "action", ik_action_name(act));
	cJSON_AddStringToObject(ack, "verdict", ik_code_name(verdict));
	if (why && *why)
		cJSON_AddStringToObject(ack, "why", why);
	if (!queue_for(a, env, &err))
		return finish(a, env, ack, err.code, err.msg, 0, 0);
	config_refusal(a, env, verdict, why);
	act = last_delivery(a, env, act, ack);
	switch (act) {
	case IK_ACT_DLQ:
		h.kind = H_DLQ;   /* deleted only once the copy is in the DLQ */
		return hold(a, &h);
	case IK_ACT_DELETE:
	case IK_ACT_DELETE_AUDIT:
		h.kind = H_DELETE;
		h.audit = act == IK_ACT_DELETE_AUDIT;
		return hold(a, &h);
	case IK_ACT_LEAVE_LEASE:
		if (dup_visibility(env, a->q->max_receive, &vis) == 0) {
			h.kind = H_CHVIS;
			h.vis = (int)vis;
			return hold(a, &h);
		}
		/* no lease to wait for: back off instead */
		/* fall through */
	case IK_ACT_LEAVE_BACKOFF:
		h.kind = H_CHVIS;
		h.vis = (int)backoff(tries(env), a->o.backoff_base_s, a->o.backoff_cap_s);
		return hold(a, &h);
	case IK_ACT_LEAVE:
	case IK_ACT_NONE:
		break;
	}
	return finish(a, env, ack, IK_OK, NULL, 0, 0);
}

int
ik_acker_open(const struct ik_acker_opts *o, struct ik_acker **out, ik_err *err)
{
	struct ik_acker *a;

	if (!(*out = a = calloc(1, sizeof *a)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	a->o = *o;
	if (o->progress) {
		a->table = ik_outcomes(&a->ntable);
		if (!(a->count = calloc((size_t)a->ntable + P_EXTRAS, sizeof *a->count))) {
			free(a);
			*out = NULL;
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		progress_read(a);
	}
	return IK_OK;
}

void
ik_acker_close(struct ik_acker *a)
{
	if (!a)
		return;
	ik_acker_flush(a);
	if (a->dirty)
		progress_write(a);
	ik_queue_close(a->q);
	ik_queue_close(a->dlq);
	free(a->count);
	free(a);
}
