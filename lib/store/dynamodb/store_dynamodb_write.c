/* store_dynamodb_write.c: the DynamoDB adapter's conditional writes (see
 * store_dynamodb.c for the rules they keep): the claim, the finish, the
 * renewal, the re-notify and the release, each ONE conditional UpdateItem,
 * and the history each appends, kept bounded.  Each is an op over
 * ik_aws_submit, so they can be in flight; the blocking ones are the same
 * ops run to their end.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/utf8.h"
#include "core/util.h"
#include "store/dynamodb/store_dynamodb.h"
#include "store/store.h"

/* ---- the history (see the header) --------------------------------------- */

/* The SET clause that appends the entry in :h (a one-Map List). */
#define HIST_SET "#h = list_append(if_not_exists(#h, :hnil), :h)"

/* h as the values :h and :hnil of HIST_SET: a Map of store.h's entry with
 * its null fields left out, and without a claim's attempt. */
static void
add_hist(cJSON *vals, const struct ik_hist *h)
{
	cJSON *l = cJSON_CreateObject(), *e = cJSON_CreateObject(), *m;

	m = cJSON_AddObjectToObject(e, "M");
	cJSON_AddItemToObject(m, "at", ddb_av_n(h->at));
	cJSON_AddItemToObject(m, "op", ddb_av_s(h->op));
	if (strcmp(h->op, "claim") == 0)
		cJSON_AddItemToObject(m, "leaseUntil", ddb_av_n(h->lease_until));
	if (h->state != IK_ST_NONE)
		cJSON_AddItemToObject(m, "state", ddb_av_s(ik_state_name(h->state)));
	if (h->owner)
		cJSON_AddItemToObject(m, "owner", ddb_av_s(h->owner));
	if (h->debit_ref)
		cJSON_AddItemToObject(m, "debitRef", ddb_av_s(h->debit_ref));
	if (h->error)
		cJSON_AddItemToObject(m, "error", ddb_av_s(h->error));
	if (h->bank_replayed)
		cJSON_AddBoolToObject(cJSON_AddObjectToObject(m, "bankReplayed"), "BOOL", 1);
	cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "L"), e);
	cJSON_AddItemToObject(vals, ":h", l);
	cJSON_AddArrayToObject(cJSON_AddObjectToObject(vals, ":hnil"), "L");
}


/* After a write that appended to the history and returned it (UPDATED_NEW
 * in resp): over IK_HISTORY_MAX, one UpdateItem removes the oldest,
 * conditioned on the length seen; this is that request, NULL when none is
 * needed (or out of memory).  The write it follows stands whatever the
 * trim does: refused, another write came in between (and trims); any
 * other failure is logged, and the next write trims. */
static cJSON *
trim_req(struct ddb *d, const char *key, const cJSON *resp)
{
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(resp, "Attributes"), "history"), "L");
	int n = cJSON_GetArraySize(l), i, bad;
	struct ik_buf upd = { 0 };
	cJSON *r, *v;
	char part[32];

	if (!key || n <= IK_HISTORY_MAX)
		return NULL;
	bad = ik_buf_addstr(&upd, "REMOVE ");
	for (i = 0; i < n - IK_HISTORY_MAX; i++) {
		snprintf(part, sizeof part, "%s#h[%d]", i ? ", " : "", i);
		bad |= ik_buf_addstr(&upd, part);
	}
	if (bad) {
		free(upd.p);
		return NULL;
	}
	r = ddb_new_req(d, key);
	cJSON_AddStringToObject(r, "ConditionExpression", "size(#h) = :n");
	cJSON_AddStringToObject(r, "UpdateExpression", upd.p);
	ddb_add_names(d, r, "#h");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":n", ddb_av_n(n));
	free(upd.p);
	return r;
}

/* ---- writes in flight ---------------------------------------------------
 * The claim and the conditional updates (finish, renotified, release) are
 * each an op: a small state machine over ik_aws_submit, moved on by
 * advance() after ik_aws_run reported an answer (never from inside
 * ik_aws_run's callback, which only queues the answer: the next request
 * is submitted, and the caller's callback called, outside it).  The
 * blocking claim and finish are the same ops, run until they finished:
 * there is one implementation of each.  A sync op (a blocking call's)
 * reports at once; the others wait on d->done for ddb_run, so a blocking
 * call made while ops are in flight (a command's rare path, from a
 * callback or a start) moves them on but calls none of their callbacks. */

enum op_kind { OP_CLAIM, OP_COND };
enum op_stage {
	ST_WRITE,      /* the conditional UpdateItem */
	ST_READ,       /* claim or finish refused without the old item: GetItem */
	ST_TRIM,       /* the write's history is over IK_HISTORY_MAX: trim it */
};

struct op {
	struct ddb *d;
	enum op_kind kind;
	enum op_stage stage;
	const struct ik_claim_req *req;   /* OP_CLAIM: the caller's */
	struct ik_claim_res *res;
	int tries;                        /* OP_CLAIM: writes made */
	cJSON *write;                     /* OP_COND: the UpdateItem, kept for its key */
	int hist;                         /* OP_COND: it appends to the history */
	const struct ik_finish_req *fin;  /* OP_COND of a finish: the caller's */
	int sync;
	ik_store_cb cb;
	void *arg;
	/* the answer of the call last made */
	int arc;
	cJSON *resp;
	struct ik_aws_error aerr;
	ik_err err;
	struct op *next;                  /* on d->answered or d->done */
};

/* The queue an op waits on: d->answered (answers to act on) or d->done
 * (finished, callback not yet called). */
static void
op_queue(struct op **head, struct op **tail, struct op *o)
{
	o->next = NULL;
	*(*head ? &(*tail)->next : head) = o;
	*tail = o;
}

static struct op *
op_dequeue(struct op **head, struct op **tail)
{
	struct op *o = *head;

	if (o && !(*head = o->next))
		*tail = NULL;
	return o;
}

/* ik_aws_submit's callback: the answer is only queued (see above). */
static void
op_answered(void *arg, int rc, cJSON *resp, const struct ik_aws_error *aerr,
            const ik_err *err)
{
	struct op *o = arg;

	o->arc = rc;
	o->resp = resp;
	memset(&o->aerr, 0, sizeof o->aerr);
	if (aerr)
		o->aerr = *aerr;
	ik_errclear(&o->err);
	if (rc != IK_OK && err)
		o->err = *err;
	op_queue(&o->d->answered, &o->d->answered_last, o);
}

/* Sends the op's next request (printed now: req is the caller's to free).
 * op is a literal: ik_aws_submit keeps the target for its messages. */
#define op_submit(o, op, req, err) \
	op_send((o), DDB_TARGET_PREFIX op, op, (req), (err))
static int
op_send(struct op *o, const char *target, const char *op, const cJSON *req, ik_err *err)
{
	if (!req)
		return ik_errf(err, IK_SOFTWARE, "dynamodb %s: out of memory", op);
	return ik_aws_submit(o->d->aws, target, req, op_answered, o, err);
}

/* The op is over with rc (o->err says why when rc != IK_OK). */
static void
op_end(struct op *o, int rc)
{
	struct ddb *d = o->d;

	if (rc == IK_OK)
		ik_errclear(&o->err);
	o->arc = rc;
	if (o->kind == OP_CLAIM && rc != IK_OK)
		ik_record_free(&o->res->cur);
	if (!o->sync) {
		op_queue(&d->done, &d->done_last, o);
		return;
	}
	d->active--;
	o->cb(o->arg, rc, &o->err);
	cJSON_Delete(o->write);
	free(o);
}

/* Trims the history the write just returned, when it is over the bound:
 * 1 when the trim is now in flight. */
static int
op_trim(struct op *o, const char *key, const cJSON *resp)
{
	cJSON *t = trim_req(o->d, key, resp);
	int rc;

	if (!t)
		return 0;
	rc = op_submit(o, "UpdateItem", t, &o->err);
	cJSON_Delete(t);
	if (rc != IK_OK) {
		ik_log(IK_LOG_WARN, "history not trimmed; the next write trims it", "table",
		       o->d->table, "chargeId", key, "error", o->err.msg, NULL);
		ik_errclear(&o->err);
		return 0;
	}
	o->stage = ST_TRIM;
	return 1;
}

static void
trimmed(struct op *o, int rc, const char *key)
{
	if (rc != IK_OK && rc != IK_AWS_ERROR)
		ik_log(IK_LOG_WARN, "history not trimmed; the next write trims it", "table",
		       o->d->table, "chargeId", key, "error", o->err.msg, NULL);
	op_end(o, IK_OK);
}

/* ---- the claim --------------------------------------------------------- */

static cJSON *
claim_req(struct ddb *d, const struct ik_claim_req *req)
{
	static const char cond[] =
		"attribute_not_exists(#k) OR (#st = :ip AND #lu < :now AND #fp = :fp)";
	static const char upd[] =
		"SET #st = :ip, #ow = :tok, #lu = :lease,"
		" #at = if_not_exists(#at, :zero) + :one,"
		" #ca = if_not_exists(#ca, :now), #ua = :now, #xa = :exp, #fp = :fp,"
		" #ev = if_not_exists(#ev, :ev), #os = :os, " HIST_SET " REMOVE #le";
	cJSON *r = ddb_new_req(d, req->key), *v;
	char os[64];

	cJSON_AddStringToObject(r, "ConditionExpression", cond);
	cJSON_AddStringToObject(r, "UpdateExpression", upd);
	ddb_add_names(d, r, "#k #st #ow #lu #at #ca #ua #xa #fp #ev #le #os #h");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", ddb_av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":os", ddb_av_s(ddb_open_key(os, IK_ST_IN_PROGRESS, req->key)));
	cJSON_AddItemToObject(v, ":tok", ddb_av_s(req->token));
	cJSON_AddItemToObject(v, ":lease", ddb_av_n(req->now_ms + req->lease_ms));
	cJSON_AddItemToObject(v, ":zero", ddb_av_n(0));
	cJSON_AddItemToObject(v, ":one", ddb_av_n(1));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(req->now_ms));
	cJSON_AddItemToObject(v, ":exp", ddb_av_n(req->expires_at));
	cJSON_AddItemToObject(v, ":fp", ddb_av_s(req->fingerprint));
	cJSON_AddItemToObject(v, ":ev", ddb_av_s(req->event ? req->event : ""));
	add_hist(v, &(struct ik_hist){ .op = "claim", .at = req->now_ms,
	         .lease_until = req->now_ms + req->lease_ms, .owner = req->token });
	cJSON_AddStringToObject(r, "ReturnValues", "UPDATED_NEW");
	cJSON_AddStringToObject(r, "ReturnValuesOnConditionCheckFailure", "ALL_OLD");
	return r;
}

/* The claim's conditional write, the first or again (at most 3). */
static int
claim_write(struct op *o, ik_err *err)
{
	cJSON *r = claim_req(o->d, o->req);
	int rc;

	o->stage = ST_WRITE;
	o->tries++;
	rc = op_submit(o, "UpdateItem", r, err);
	cJSON_Delete(r);
	return rc;
}

/* A refused claim, decided (ik_ddb_claim_refused, the port's rule). */
static void
claim_decided(struct op *o, enum ik_ddb_refusal why)
{
	int rc;

	switch (why) {
	case IK_DDB_DECIDED:
		op_end(o, IK_OK);
		return;
	case IK_DDB_NOMEM:
		op_end(o, ik_errf(&o->err, IK_SOFTWARE, "out of memory"));
		return;
	case IK_DDB_UNKNOWN_STATE:
		op_end(o, ik_errf(&o->err, IK_SOFTWARE, "dynamodb %s: record %.128s is in a "
		       "state this version does not know; refusing the claim", o->d->table,
		       o->req->key));
		return;
	default:                 /* gone or expired since: claim again */
		break;
	}
	if (o->tries >= 3)
		rc = ik_errf(&o->err, IK_TEMPFAIL, "dynamodb UpdateItem: the record for %s "
		             "keeps changing under the claim", o->req->key);
	else if ((rc = claim_write(o, &o->err)) == IK_OK)
		return;
	op_end(o, rc);
}

static void
claim_advance(struct op *o, int rc, cJSON *resp)
{
	const struct ik_claim_req *req = o->req;
	struct ik_claim_res *res = o->res;
	cJSON *g, *attrs;
	enum ik_ddb_refusal why;

	switch (o->stage) {
	case ST_TRIM:
		trimmed(o, rc, req->key);
		return;
	case ST_READ:
		if (rc != IK_OK) {
			op_end(o, rc);
			return;
		}
		claim_decided(o, ik_ddb_claim_refused(resp, o->d->key, req, res));
		return;
	case ST_WRITE:
		break;
	}
	if (rc == IK_OK) {
		attrs = cJSON_GetObjectItemCaseSensitive(resp, "Attributes");
		res->code = IK_OK;
		res->attempt = ddb_attr_n(attrs, "attempts");
		res->lease_until = req->now_ms + req->lease_ms;
		if (res->attempt < 1)
			op_end(o, ik_errf(&o->err, IK_SOFTWARE, "dynamodb UpdateItem: no attempts "
			       "in the response"));
		else if (!op_trim(o, req->key, resp))
			op_end(o, IK_OK);
		return;
	}
	if (rc != IK_AWS_ERROR) {
		op_end(o, rc);
		return;
	}
	/* Refused: the item that refused it decides, from ALL_OLD or a read. */
	why = ik_ddb_claim_refused(resp, o->d->key, req, res);
	if (why != IK_DDB_NO_ITEM) {
		claim_decided(o, why);
		return;
	}
	o->stage = ST_READ;
	g = ddb_get_req(o->d, req->key);
	rc = op_submit(o, "GetItem", g, &o->err);
	cJSON_Delete(g);
	if (rc != IK_OK)
		op_end(o, rc);
}

/* ---- conditional updates ------------------------------------------------ */

/* A refused finish decided by the item in resp (ik_ddb_finish_refused):
 * IK_EMPTY when resp holds none. */
static int
finish_decided(struct op *o, const cJSON *resp)
{
	int rc = ik_ddb_finish_refused(resp, o->d->key, o->fin);

	return rc == IK_SOFTWARE ? ik_errf(&o->err, IK_SOFTWARE, "out of memory") : rc;
}

/* IK_OK, or IK_LEASE_LOST when the condition failed -- except our own
 * finish found again (finish_decided).  One that appends to the history
 * gets it back, to keep it bounded. */
static void
cond_advance(struct op *o, int rc, cJSON *resp)
{
	const char *key = ddb_attr_s(cJSON_GetObjectItemCaseSensitive(o->write, "Key"), o->d->key);

	cJSON *g;

	if (o->stage == ST_TRIM) {
		trimmed(o, rc, key);
		return;
	}
	if (o->stage == ST_READ) {       /* a refused finish's read */
		if (rc == IK_OK && (rc = finish_decided(o, resp)) == IK_EMPTY)
			rc = IK_LEASE_LOST;      /* no record at all */
		op_end(o, rc);
		return;
	}
	if (rc == IK_AWS_ERROR) {
		ik_errclear(&o->err);
		/* A finish refused may be our own, whose answer was lost and the
		 * request retried: the item decides (ALL_OLD, else a read). */
		if (!o->fin || (rc = finish_decided(o, resp)) != IK_EMPTY) {
			op_end(o, o->fin ? rc : IK_LEASE_LOST);
			return;
		}
		o->stage = ST_READ;
		g = ddb_get_req(o->d, key);
		if ((rc = op_submit(o, "GetItem", g, &o->err)) != IK_OK)
			op_end(o, rc);
		cJSON_Delete(g);
	} else if (rc != IK_OK || !o->hist || !op_trim(o, key, resp)) {
		op_end(o, rc);
	}
}

/* Moves on every op whose answer is in. */
static void
advance(struct ddb *d)
{
	struct op *o;
	cJSON *resp;
	int rc;

	while ((o = op_dequeue(&d->answered, &d->answered_last))) {
		resp = o->resp;
		o->resp = NULL;
		rc = ddb_answer(d, o->stage == ST_READ ? NULL : "ConditionalCheckFailedException",
		                o->arc, &resp, &o->aerr, &o->err);
		if (o->kind == OP_CLAIM)
			claim_advance(o, rc, resp);
		else
			cond_advance(o, rc, resp);
		cJSON_Delete(resp);
	}
}

static struct op *
op_new(struct ddb *d, enum op_kind kind, ik_store_cb cb, void *arg, ik_err *err)
{
	struct op *o = calloc(1, sizeof *o);

	if (!o) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	o->d = d;
	o->kind = kind;
	o->cb = cb;
	o->arg = arg;
	return o;
}

/* A blocking call: its op reports here, at once. */
struct sync {
	int fired, rc;
	ik_err err;
};

static void
sync_done(void *arg, int rc, const ik_err *err)
{
	struct sync *s = arg;

	s->fired = 1;
	s->rc = rc;
	if (rc != IK_OK && err)
		s->err = *err;
}

/* Runs the calls in flight until the blocking op behind s reported. */
static int
sync_wait(struct ddb *d, struct sync *s, ik_err *err)
{
	while (!s->fired) {
		if (ik_aws_run(d->aws, NULL, 0, -1, err) != IK_OK)
			return err->code ? err->code : IK_SOFTWARE;
		advance(d);
	}
	if (s->rc != IK_OK && err)
		*err = s->err;
	return s->rc;
}

static int
claim_start(struct ddb *d, const struct ik_claim_req *req, struct ik_claim_res *res,
            ik_store_cb cb, void *arg, int sync, ik_err *err)
{
	struct op *o;
	int rc;

	memset(res, 0, sizeof *res);
	if (!(o = op_new(d, OP_CLAIM, cb, arg, err)))
		return err->code;
	o->req = req;
	o->res = res;
	o->sync = sync;
	if ((rc = claim_write(o, err)) != IK_OK) {
		free(o);
		return rc;
	}
	d->active++;
	return IK_OK;
}

int
ddb_claim_start(struct ik_store *st, const struct ik_claim_req *req,
               struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err)
{
	return claim_start(st->impl, req, res, cb, arg, 0, err);
}

int
ddb_claim(struct ik_store *st, const struct ik_claim_req *req,
         struct ik_claim_res *res, ik_err *err)
{
	struct sync s = { 0 };
	int rc = claim_start(st->impl, req, res, sync_done, &s, 1, err);

	return rc == IK_OK ? sync_wait(st->impl, &s, err) : rc;
}

/* Starts the conditional update r (consumed) with cond and upd. */
static int
cond_start(struct ddb *d, cJSON *r, const char *cond, const char *upd,
           const struct ik_finish_req *fin, ik_store_cb cb, void *arg, int sync,
           ik_err *err)
{
	char exprs[512];
	struct op *o;
	int rc;

	if (!(o = op_new(d, OP_COND, cb, arg, err))) {
		cJSON_Delete(r);
		return err->code;
	}
	o->write = r;
	o->fin = fin;
	o->sync = sync;
	o->hist = strstr(upd, "#h") != NULL;
	cJSON_AddStringToObject(r, "ConditionExpression", cond);
	cJSON_AddStringToObject(r, "UpdateExpression", upd);
	snprintf(exprs, sizeof exprs, "%s %s", cond, upd);
	ddb_add_names(d, r, exprs);
	if (o->hist)
		cJSON_AddStringToObject(r, "ReturnValues", "UPDATED_NEW");
	if ((rc = op_submit(o, "UpdateItem", r, err)) != IK_OK) {
		cJSON_Delete(r);
		free(o);
		return rc;
	}
	d->active++;
	return IK_OK;
}

/* ---- the outbox's part: inside the finish's and the re-notification's
 * own UpdateItem (store_dynamodb_outbox.c has the relay's ops) -------------- */

/* The outbox index's key for an item: its shard, as the open index has
 * them for the same reason (store_dynamodb.h). */
static const char *
pend_key(char buf[16], const char *key)
{
	snprintf(buf, 16, "%u", ddb_shard(key));
	return buf;
}

const char *
ddb_outbox_finish(cJSON *vals, const struct ik_finish_req *req)
{
	cJSON *m;
	char p[16];

	if (!ik_outbox_url())
		return "";
	m = cJSON_AddObjectToObject(cJSON_AddObjectToObject(vals, ":obf"), "M");
	cJSON_AddItemToObject(m, "t", ddb_av_n(req->now_ms));
	cJSON_AddItemToObject(m, "s", ddb_av_s(ik_state_name(req->state)));
	if (req->debit_ref)
		cJSON_AddItemToObject(m, "r", ddb_av_s(req->debit_ref));
	if (req->last_error)
		cJSON_AddItemToObject(m, "e", ddb_av_s(req->last_error));
	cJSON_AddItemToObject(vals, ":obp", ddb_av_s(pend_key(p, req->key)));
	cJSON_AddItemToObject(vals, ":oba", ddb_av_n(req->now_ms));
	return ", #obf = :obf, #obp = :obp, #oba = :oba";
}

const char *
ddb_outbox_renotified(cJSON *vals, const char *key, int64_t now_ms)
{
	cJSON *m;
	char p[16];

	if (!ik_outbox_url())
		return "";
	m = cJSON_AddObjectToObject(cJSON_AddObjectToObject(vals, ":obr"), "M");
	cJSON_AddItemToObject(m, "t", ddb_av_n(now_ms));
	cJSON_AddItemToObject(vals, ":obp", ddb_av_s(pend_key(p, key)));
	cJSON_AddItemToObject(vals, ":oba", ddb_av_n(now_ms));
	/* A finished event still waiting keeps its place (obAt): the item's
	 * events go out in their order. */
	return ", #obr = :obr, #obp = if_not_exists(#obp, :obp),"
	       " #oba = if_not_exists(#oba, :oba)";
}

/* The blocking conditional update: IK_OK, IK_LEASE_LOST, or an error. */
int
ddb_cond_update(struct ddb *d, cJSON *r, const char *cond, const char *upd, ik_err *err)
{
	struct sync s = { 0 };
	int rc = cond_start(d, r, cond, upd, NULL, sync_done, &s, 1, err);

	return rc == IK_OK ? sync_wait(d, &s, err) : rc;
}

static int
finish_start(struct ddb *d, const struct ik_finish_req *req, ik_store_cb cb, void *arg,
             int sync, ik_err *err)
{
	cJSON *r = ddb_new_req(d, req->key), *v;
	char upd[384], os[64];
	int open = req->state != IK_ST_DONE;

	/* A DONE record leaves the open index; FAILED and DNF stay in it,
	 * under their own state.  The outbox's event is set by this write. */
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	snprintf(upd, sizeof upd, "SET #st = :st, #ua = :now, " HIST_SET "%s%s%s%s%s",
	         req->debit_ref ? ", #dr = :ref" : "",
	         req->last_error ? ", #le = :le" : "",
	         open ? ", #os = :os" : "", ddb_outbox_finish(v, req),
	         req->last_error ? (open ? "" : " REMOVE #os") : (open ? " REMOVE #le" : " REMOVE #le, #os"));
	if (open)
		cJSON_AddItemToObject(v, ":os", ddb_av_s(ddb_open_key(os, req->state, req->key)));
	cJSON_AddItemToObject(v, ":ip", ddb_av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", ddb_av_s(req->token));
	cJSON_AddItemToObject(v, ":st", ddb_av_s(ik_state_name(req->state)));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(req->now_ms));
	if (req->debit_ref)
		cJSON_AddItemToObject(v, ":ref", ddb_av_s(req->debit_ref));
	if (req->last_error)
		cJSON_AddItemToObject(v, ":le", ddb_av_s(req->last_error));
	add_hist(v, &(struct ik_hist){ .op = "finish", .at = req->now_ms, .owner = req->token,
	         .state = req->state, .debit_ref = req->debit_ref, .error = req->last_error,
	         .bank_replayed = req->bank_replayed });
	cJSON_AddStringToObject(r, "ReturnValuesOnConditionCheckFailure", "ALL_OLD");
	return cond_start(d, r, "#st = :ip AND #ow = :tok", upd, req, cb, arg, sync, err);
}

int
ddb_finish_start(struct ik_store *st, const struct ik_finish_req *req, ik_store_cb cb,
                void *arg, ik_err *err)
{
	return finish_start(st->impl, req, cb, arg, 0, err);
}

int
ddb_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err)
{
	struct sync s = { 0 };
	int rc = finish_start(st->impl, req, sync_done, &s, 1, err);

	return rc == IK_OK ? sync_wait(st->impl, &s, err) : rc;
}

/* Fenced as the finish is; no history, so no trim follows (store.h). */
int
ddb_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
         int64_t lease_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, key), *v;

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", ddb_av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", ddb_av_s(token));
	cJSON_AddItemToObject(v, ":lu", ddb_av_n(now_ms + lease_ms));
	cJSON_AddItemToObject(v, ":zero", ddb_av_n(0));
	return ddb_cond_update(d, r, "#st = :ip AND #ow = :tok AND #lu <> :zero", "SET #lu = :lu",
	                       err);
}

/* step.h's wait, for the store: see store.h. */
int
ddb_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct op *o;
	int rc;

	if (readable)
		*readable = 0;
	/* Answers already in (from a blocking call meanwhile): no wait. */
	rc = ik_aws_run(d->aws, fd >= 0 ? &p : NULL, fd >= 0 ? 1 : 0,
	                d->done || d->answered ? 0 : timeout_ms, err);
	if (rc != IK_OK)
		return rc;
	if (fd >= 0 && readable && (p.revents & (POLLIN | POLLHUP | POLLERR)))
		*readable = 1;
	advance(d);
	while ((o = op_dequeue(&d->done, &d->done_last))) {
		d->active--;
		o->cb(o->arg, o->arc, &o->err);
		cJSON_Delete(o->write);
		free(o);
	}
	return IK_OK;
}

size_t
ddb_active(struct ik_store *st)
{
	return ((struct ddb *)st->impl)->active;
}

int
ddb_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, key), *v;
	char upd[256];

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":dnf", ddb_av_s("DEBITED_NOTIFICATION_FAILED"));
	cJSON_AddItemToObject(v, ":done", ddb_av_s("DONE"));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(now_ms));
	add_hist(v, &(struct ik_hist){ .op = "renotified", .at = now_ms, .state = IK_ST_DONE });
	snprintf(upd, sizeof upd, "SET #st = :done, #ua = :now, " HIST_SET "%s REMOVE #le, #os",
	         ddb_outbox_renotified(v, key, now_ms));
	return ddb_cond_update(d, r, "#st = :dnf", upd, err);
}

/* The reason a TEMPFAIL or CONFIG debit left the claim (store.h): fenced
 * as the finish is, lastError only, no history (so no trim). */
int
ddb_note(struct ik_store *st, const char *key, const char *token, const char *reason,
         ik_err *err)
{
	struct ddb *d = st->impl;
	const char *text;
	char *copy = NULL;
	cJSON *r, *v;
	int rc;

	/* What a bank said, raw: DynamoDB refuses a body that is not UTF-8. */
	if (ik_utf8_clean(reason, &text, &copy) < 0)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	r = ddb_new_req(d, key);
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", ddb_av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", ddb_av_s(token));
	cJSON_AddItemToObject(v, ":le", ddb_av_s(text ? text : ""));
	rc = ddb_cond_update(d, r, "#st = :ip AND #ow = :tok", "SET #le = :le", err);
	free(copy);
	return rc;
}

int
ddb_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
           ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, key), *v;

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", ddb_av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", ddb_av_s(token));
	cJSON_AddItemToObject(v, ":zero", ddb_av_n(0));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(now_ms));
	add_hist(v, &(struct ik_hist){ .op = "release", .at = now_ms, .owner = token });
	return ddb_cond_update(d, r, "#st = :ip AND #ow = :tok",
	                   "SET #lu = :zero, #ua = :now, " HIST_SET, err);
}


void
ddb_ops_drop(struct ddb *d)
{
	struct op *o;

	while ((o = op_dequeue(&d->answered, &d->answered_last)) ||
	       (o = op_dequeue(&d->done, &d->done_last))) {
		cJSON_Delete(o->resp);
		cJSON_Delete(o->write);
		free(o);
	}
}
