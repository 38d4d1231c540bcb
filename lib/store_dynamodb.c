/* store_dynamodb.c: the idempotency store on DynamoDB (dynamodb:TABLE).
 *
 * Rules: claim, finish, renotified and release are each ONE conditional
 * UpdateItem, evaluated by DynamoDB; a ConditionalCheckFailedException is
 * an outcome, never an error.  A refused claim is decided from the item
 * DynamoDB returns with ReturnValuesOnConditionCheckFailure=ALL_OLD, or,
 * when the server sends none (dynalite), from a ConsistentRead GetItem;
 * the fingerprint is checked first on both paths.  A refused finish is
 * decided the same way (ik_finish_decide): our own token on the record in
 * the state we asked for is our own finish, retried after its answer was
 * lost (the AWS layer retries a lost answer), and is IK_OK, never
 * LEASE_LOST.  Values go only through
 * ExpressionAttributeValues and names only through ExpressionAttribute-
 * Names (state, owner... are reserved words, and the key attribute name is
 * configurable: IDEMKIT_DYNAMODB_KEY, default pk).  expiresAt is epoch
 * seconds for DynamoDB TTL.
 * The unfinished records (IN_PROGRESS, FAILED, DEBITED_NOTIFICATION_FAILED)
 * also carry openState, the key of the sparse index idemkit-open: set by
 * the claim, kept by a FAILED or DNF finish, removed by DONE and by the
 * re-notify.  Listing them and counting them (stats) are Queries on that
 * index, never a Scan of the table (see "the open index" below).
 * History: the attribute history is a List of Maps, one per transition
 * (store.h's entry without a claim's attempt), appended by the same
 * conditional UpdateItem (list_append), so a write that does not match
 * adds nothing.  A claim's attempt is the one value only the item knows
 * (ADD-like if_not_exists(attempts) + 1): it is not stored but counted
 * back from attempts when the item is read, each claim having added one
 * entry and one attempt in one write.  DynamoDB refuses a second path into
 * history in the same expression, so the bound is kept after the write:
 * when the returned list is over IK_HISTORY_MAX, one more UpdateItem
 * removes the oldest, conditioned on the length it saw (another writer's
 * append in between: the next write trims).
 * In flight (store.h): the claim and the conditional updates are ops, small
 * state machines over ik_aws_submit (see "writes in flight"); the blocking
 * claim, finish, release and re-notify are the same ops run to their end,
 * so each request and each decision is written once.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "aws.h"
#include "log.h"
#include "outcome.h"
#include "store.h"
#include "store_dynamodb.h"
#include "util.h"

#define TARGET_PREFIX "DynamoDB_20120810."
#define ACTIVE_WAIT_MS 120000

struct op;

struct ddb {
	struct ik_aws *aws;
	char *table;
	char *key;      /* the partition key attribute name */
	/* writes in flight (see "writes in flight" below) */
	struct op *answered, *answered_last;   /* answers to act on */
	struct op *done, *done_last;           /* finished, callback due */
	size_t active;                         /* started, callback not yet called */
};

/* ---- items and records ------------------------------------------------- */

static const char *
attr_s(const cJSON *item, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, name);

	v = cJSON_GetObjectItemCaseSensitive(v, "S");
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t
attr_n(const cJSON *item, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, name);

	v = cJSON_GetObjectItemCaseSensitive(v, "N");
	return cJSON_IsString(v) ? strtoll(v->valuestring, NULL, 10) : 0;
}

static int
dup_attr(const cJSON *item, const char *name, char **out)
{
	const char *s = attr_s(item, name);

	*out = NULL;
	if (s && !(*out = strdup(s)))
		return -1;
	return 0;
}

/* The history List of an item as store.h's JSON array text; NULL with no
 * history.  attempts: the item's, to count claims' attempts back from.
 * 0, or -1 on ENOMEM. */
static int
hist_from_item(const cJSON *item, int64_t attempts, char **out)
{
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(item, "history"), "L"), *e, *m;
	struct ik_buf b = { 0 };
	int64_t claims = 0;
	char *text;
	int bad;

	*out = NULL;
	if (!cJSON_IsArray(l))
		return 0;
	cJSON_ArrayForEach(e, l) {
		const char *op = attr_s(cJSON_GetObjectItemCaseSensitive(e, "M"), "op");
		if (op && strcmp(op, "claim") == 0)
			claims++;
	}
	bad = ik_buf_addstr(&b, "[");
	cJSON_ArrayForEach(e, l) {
		struct ik_hist h = { 0 };

		m = cJSON_GetObjectItemCaseSensitive(e, "M");
		if (!cJSON_IsObject(m) || !(h.op = attr_s(m, "op")))
			continue;
		h.at = attr_n(m, "at");
		h.owner = attr_s(m, "owner");
		h.state = ik_state_parse(attr_s(m, "state"));
		h.debit_ref = attr_s(m, "debitRef");
		h.error = attr_s(m, "error");
		h.bank_replayed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(m, "bankReplayed"), "BOOL"));
		if (strcmp(h.op, "claim") == 0) {
			h.lease_until = attr_n(m, "leaseUntil");
			h.attempt = attempts - --claims;
		}
		if (!(text = ik_history_entry(&h))) {
			bad = -1;
			break;
		}
		if (b.len > 1)
			bad |= ik_buf_addstr(&b, ",");
		bad |= ik_buf_addstr(&b, text);
		free(text);
	}
	bad |= ik_buf_addstr(&b, "]");
	if (bad) {
		free(b.p);
		return -1;
	}
	*out = b.p;
	return 0;
}

int
ik_ddb_record_from_item(const cJSON *item, const char *keyattr, struct ik_record *r)
{
	memset(r, 0, sizeof *r);
	if (dup_attr(item, keyattr, &r->key) < 0 ||
	    dup_attr(item, "owner", &r->owner) < 0 ||
	    dup_attr(item, "fingerprint", &r->fingerprint) < 0 ||
	    dup_attr(item, "event", &r->event) < 0 ||
	    dup_attr(item, "debitRef", &r->debit_ref) < 0 ||
	    dup_attr(item, "lastError", &r->last_error) < 0) {
		ik_record_free(r);
		return -1;
	}
	r->state = ik_state_parse(attr_s(item, "state"));
	r->lease_until = attr_n(item, "leaseUntil");
	r->attempts = attr_n(item, "attempts");
	r->created_at = attr_n(item, "createdAt");
	r->updated_at = attr_n(item, "updatedAt");
	r->expires_at = attr_n(item, "expiresAt");
	if (hist_from_item(item, r->attempts, &r->history) < 0) {
		ik_record_free(r);
		return -1;
	}
	return 0;
}

enum ik_ddb_refusal
ik_ddb_claim_refused(const cJSON *resp, const char *keyattr,
                     const struct ik_claim_req *req, struct ik_claim_res *res)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	struct ik_record *r = &res->cur;
	ik_err e = { 0 };

	ik_record_free(r);
	if (!cJSON_IsObject(item) || !item->child)
		return IK_DDB_NO_ITEM;
	if (ik_ddb_record_from_item(item, keyattr, r) < 0)
		return IK_DDB_NOMEM;
	switch (ik_claim_decide(req, res, &e)) {
	case IK_OK:
		return IK_DDB_DECIDED;
	case IK_EMPTY:             /* expired since: the claim may pass now */
		ik_record_free(r);
		return IK_DDB_CLAIMABLE;
	default:
		return IK_DDB_UNKNOWN_STATE;
	}
}

int
ik_ddb_finish_refused(const cJSON *resp, const char *keyattr, const struct ik_finish_req *req)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	struct ik_record r = { 0 };
	int rc;

	if (!cJSON_IsObject(item) || !item->child)
		return IK_EMPTY;
	if (ik_ddb_record_from_item(item, keyattr, &r) < 0)
		return IK_SOFTWARE;
	rc = ik_finish_decide(req, &r);
	ik_record_free(&r);
	return rc;
}

/* ---- requests ---------------------------------------------------------- */

static cJSON *
av_s(const char *s)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "S", s);
	return o;
}

static cJSON *
av_n(int64_t n)
{
	char buf[32];
	cJSON *o = cJSON_CreateObject();

	snprintf(buf, sizeof buf, "%lld", (long long)n);
	cJSON_AddStringToObject(o, "N", buf);
	return o;
}

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
	cJSON_AddItemToObject(m, "at", av_n(h->at));
	cJSON_AddItemToObject(m, "op", av_s(h->op));
	if (strcmp(h->op, "claim") == 0)
		cJSON_AddItemToObject(m, "leaseUntil", av_n(h->lease_until));
	if (h->state != IK_ST_NONE)
		cJSON_AddItemToObject(m, "state", av_s(ik_state_name(h->state)));
	if (h->owner)
		cJSON_AddItemToObject(m, "owner", av_s(h->owner));
	if (h->debit_ref)
		cJSON_AddItemToObject(m, "debitRef", av_s(h->debit_ref));
	if (h->error)
		cJSON_AddItemToObject(m, "error", av_s(h->error));
	if (h->bank_replayed)
		cJSON_AddBoolToObject(cJSON_AddObjectToObject(m, "bankReplayed"), "BOOL", 1);
	cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "L"), e);
	cJSON_AddItemToObject(vals, ":h", l);
	cJSON_AddArrayToObject(cJSON_AddObjectToObject(vals, ":hnil"), "L");
}

static void add_names(struct ddb *d, cJSON *req, const char *exprs);
static cJSON *new_req(struct ddb *d, const char *key);

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
	r = new_req(d, key);
	cJSON_AddStringToObject(r, "ConditionExpression", "size(#h) = :n");
	cJSON_AddStringToObject(r, "UpdateExpression", upd.p);
	add_names(d, r, "#h");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":n", av_n(n));
	free(upd.p);
	return r;
}

/* ---- the open index ----------------------------------------------------
 * idemkit-open: HASH openState (S), RANGE updatedAt (N), all attributes
 * projected.  Only unfinished records carry openState, so the index holds
 * what recovery and stats need and nothing of the DONE records a 30-day
 * retention piles up.  openState is "STATE#n", n = a hash of the key modulo
 * OPEN_SHARDS: one index partition key per state would take every claim's
 * write, and DynamoDB throttles the table's writes when an index partition
 * is over its limit (1 000 writes/s).  Shards are part of the schema: a
 * reader queries all OPEN_SHARDS of a state. */
#define OPEN_INDEX "idemkit-open"
#define OPEN_SHARDS 8

static const char *
open_key(char buf[64], enum ik_state st, const char *key)
{
	uint32_t h = 2166136261u;   /* FNV-1a */

	for (; *key; key++)
		h = (h ^ (unsigned char)*key) * 16777619u;
	snprintf(buf, 64, "%s#%u", ik_state_name(st), (unsigned)(h % OPEN_SHARDS));
	return buf;
}

/* The attribute names, by placeholder; "#k" is the key attribute. */
static const char *const names[][2] = {
	{ "#st", "state" }, { "#ow", "owner" }, { "#lu", "leaseUntil" },
	{ "#at", "attempts" }, { "#fp", "fingerprint" }, { "#ev", "event" },
	{ "#dr", "debitRef" }, { "#le", "lastError" }, { "#ca", "createdAt" },
	{ "#ua", "updatedAt" }, { "#xa", "expiresAt" }, { "#os", "openState" },
	{ "#h", "history" },
};

/* ExpressionAttributeNames for exactly the placeholders the expressions
 * use (DynamoDB refuses unused ones). */
static void
add_names(struct ddb *d, cJSON *req, const char *exprs)
{
	cJSON *o = cJSON_CreateObject();
	size_t i;

	if (strstr(exprs, "#k"))
		cJSON_AddStringToObject(o, "#k", d->key);
	for (i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strstr(exprs, names[i][0]))
			cJSON_AddStringToObject(o, names[i][0], names[i][1]);
	if (o->child)
		cJSON_AddItemToObject(req, "ExpressionAttributeNames", o);
	else
		cJSON_Delete(o);
}

static cJSON *
new_req(struct ddb *d, const char *key)
{
	cJSON *req = cJSON_CreateObject(), *k;

	cJSON_AddStringToObject(req, "TableName", d->table);
	if (key) {
		k = cJSON_AddObjectToObject(req, "Key");
		cJSON_AddItemToObject(k, d->key, av_s(key));
	}
	return req;
}

/* Append to the message in err and set its code. */
static int __attribute__((format(printf, 3, 4)))
errsuffix(ik_err *err, int code, const char *fmt, ...)
{
	char tail[512], msg[sizeof err->msg];
	va_list ap;

	if (!err)
		return code;
	va_start(ap, fmt);
	vsnprintf(tail, sizeof tail, fmt, ap);
	va_end(ap);
	memcpy(msg, err->msg, sizeof msg);
	return ik_errf(err, code, "%s%s", msg, tail);
}

/* What a DynamoDB call's answer is to the caller: IK_AWS_ERROR only for
 * the error type the caller handles (pass, may be NULL); any other AWS
 * error becomes a code here (and *resp is freed).  Blocking calls and
 * calls in flight both go through it. */
static int
ddb_answer(struct ddb *d, const char *pass, int rc, cJSON **resp,
           const struct ik_aws_error *ae, ik_err *err)
{
	if (rc != IK_AWS_ERROR)
		return rc;
	if (pass && strcmp(ae->type, pass) == 0)
		return IK_AWS_ERROR;
	cJSON_Delete(*resp);
	*resp = NULL;
	if (strcmp(ae->type, "ResourceNotFoundException") == 0) {
		return errsuffix(err, IK_CONFIG, " (table %s: create it with idemp-init)", d->table);
	}
	/* The wording differs: "does not match the schema" (DynamoDB),
	 * "Missing the key" (dynalite), "One of the required keys was not
	 * given a value" (DynamoDB Local). */
	if (strcmp(ae->type, "ValidationException") == 0 &&
	    (strstr(ae->message, "key") || strstr(ae->message, "Key")) &&
	    (strstr(ae->message, "schema") || strstr(ae->message, "Missing the key") ||
	     strstr(ae->message, "required keys"))) {
		return errsuffix(err, IK_CONFIG, " (table %s: key attribute %s, "
		                 "IDEMKIT_DYNAMODB_KEY)", d->table, d->key);
	}
	return err ? err->code : IK_SOFTWARE;   /* IK_SOFTWARE: a request we got wrong */
}

/* One blocking DynamoDB call, answered as ddb_answer says. */
static int
ddb_call(struct ddb *d, const char *op, cJSON *req, const char *pass,
         cJSON **resp, ik_err *err)
{
	struct ik_aws_error ae;
	char target[64];
	int rc;

	*resp = NULL;
	if (!req)
		return ik_errf(err, IK_SOFTWARE, "dynamodb %s: out of memory", op);
	snprintf(target, sizeof target, TARGET_PREFIX "%s", op);
	rc = ik_aws_call(d->aws, target, req, resp, &ae, err);
	return ddb_answer(d, pass, rc, resp, &ae, err);
}

/* ---- the port ---------------------------------------------------------- */

/* The consistent read that decides a refused claim when the refusal came
 * without the old item (dynalite), and idemp-show's read. */
static cJSON *
get_req(struct ddb *d, const char *key)
{
	cJSON *req = new_req(d, key);

	cJSON_AddTrueToObject(req, "ConsistentRead");
	return req;
}

static int
get_item(struct ddb *d, const char *key, cJSON **resp, ik_err *err)
{
	cJSON *req = get_req(d, key);
	int rc = ddb_call(d, "GetItem", req, NULL, resp, err);

	cJSON_Delete(req);
	return rc;
}

/* ---- writes in flight ---------------------------------------------------
 * The claim and the conditional updates (finish, renotified, release) are
 * each an op: a small state machine over ik_aws_submit, moved on by
 * advance() after ik_aws_run reported an answer (never from inside
 * ik_aws_run's callback, which only queues the answer: the next request
 * is submitted, and the caller's callback called, outside it).  The
 * blocking claim and finish are the same ops, run until they finished:
 * there is one implementation of each.  A sync op (a blocking call's)
 * reports at once; the others wait on d->done for dd_run, so a blocking
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
	op_send((o), TARGET_PREFIX op, op, (req), (err))
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
	cJSON *r = new_req(d, req->key), *v;
	char os[64];

	cJSON_AddStringToObject(r, "ConditionExpression", cond);
	cJSON_AddStringToObject(r, "UpdateExpression", upd);
	add_names(d, r, "#k #st #ow #lu #at #ca #ua #xa #fp #ev #le #os #h");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":os", av_s(open_key(os, IK_ST_IN_PROGRESS, req->key)));
	cJSON_AddItemToObject(v, ":tok", av_s(req->token));
	cJSON_AddItemToObject(v, ":lease", av_n(req->now_ms + req->lease_ms));
	cJSON_AddItemToObject(v, ":zero", av_n(0));
	cJSON_AddItemToObject(v, ":one", av_n(1));
	cJSON_AddItemToObject(v, ":now", av_n(req->now_ms));
	cJSON_AddItemToObject(v, ":exp", av_n(req->expires_at));
	cJSON_AddItemToObject(v, ":fp", av_s(req->fingerprint));
	cJSON_AddItemToObject(v, ":ev", av_s(req->event ? req->event : ""));
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
		res->attempt = attr_n(attrs, "attempts");
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
	g = get_req(o->d, req->key);
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
	const char *key = attr_s(cJSON_GetObjectItemCaseSensitive(o->write, "Key"), o->d->key);

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
		g = get_req(o->d, key);
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

static int
dd_claim_start(struct ik_store *st, const struct ik_claim_req *req,
               struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err)
{
	return claim_start(st->impl, req, res, cb, arg, 0, err);
}

static int
dd_claim(struct ik_store *st, const struct ik_claim_req *req,
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
	add_names(d, r, exprs);
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

/* The blocking conditional update: IK_OK, IK_LEASE_LOST, or an error. */
static int
cond_update(struct ddb *d, cJSON *r, const char *cond, const char *upd, ik_err *err)
{
	struct sync s = { 0 };
	int rc = cond_start(d, r, cond, upd, NULL, sync_done, &s, 1, err);

	return rc == IK_OK ? sync_wait(d, &s, err) : rc;
}

static int
finish_start(struct ddb *d, const struct ik_finish_req *req, ik_store_cb cb, void *arg,
             int sync, ik_err *err)
{
	cJSON *r = new_req(d, req->key), *v;
	char upd[256], os[64];
	int open = req->state != IK_ST_DONE;

	/* A DONE record leaves the open index; FAILED and DNF stay in it,
	 * under their own state. */
	snprintf(upd, sizeof upd, "SET #st = :st, #ua = :now, " HIST_SET "%s%s%s%s",
	         req->debit_ref ? ", #dr = :ref" : "",
	         req->last_error ? ", #le = :le" : "",
	         open ? ", #os = :os" : "",
	         req->last_error ? (open ? "" : " REMOVE #os") : (open ? " REMOVE #le" : " REMOVE #le, #os"));
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	if (open)
		cJSON_AddItemToObject(v, ":os", av_s(open_key(os, req->state, req->key)));
	cJSON_AddItemToObject(v, ":ip", av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", av_s(req->token));
	cJSON_AddItemToObject(v, ":st", av_s(ik_state_name(req->state)));
	cJSON_AddItemToObject(v, ":now", av_n(req->now_ms));
	if (req->debit_ref)
		cJSON_AddItemToObject(v, ":ref", av_s(req->debit_ref));
	if (req->last_error)
		cJSON_AddItemToObject(v, ":le", av_s(req->last_error));
	add_hist(v, &(struct ik_hist){ .op = "finish", .at = req->now_ms, .owner = req->token,
	         .state = req->state, .debit_ref = req->debit_ref, .error = req->last_error,
	         .bank_replayed = req->bank_replayed });
	cJSON_AddStringToObject(r, "ReturnValuesOnConditionCheckFailure", "ALL_OLD");
	return cond_start(d, r, "#st = :ip AND #ow = :tok", upd, req, cb, arg, sync, err);
}

static int
dd_finish_start(struct ik_store *st, const struct ik_finish_req *req, ik_store_cb cb,
                void *arg, ik_err *err)
{
	return finish_start(st->impl, req, cb, arg, 0, err);
}

static int
dd_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err)
{
	struct sync s = { 0 };
	int rc = finish_start(st->impl, req, sync_done, &s, 1, err);

	return rc == IK_OK ? sync_wait(st->impl, &s, err) : rc;
}

/* Fenced as the finish is; no history, so no trim follows (store.h). */
static int
dd_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
         int64_t lease_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = new_req(d, key), *v;

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", av_s(token));
	cJSON_AddItemToObject(v, ":lu", av_n(now_ms + lease_ms));
	return cond_update(d, r, "#st = :ip AND #ow = :tok", "SET #lu = :lu", err);
}

/* step.h's wait, for the store: see store.h. */
static int
dd_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err)
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

static size_t
dd_active(struct ik_store *st)
{
	return ((struct ddb *)st->impl)->active;
}

static int
dd_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = new_req(d, key), *v;

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":dnf", av_s("DEBITED_NOTIFICATION_FAILED"));
	cJSON_AddItemToObject(v, ":done", av_s("DONE"));
	cJSON_AddItemToObject(v, ":now", av_n(now_ms));
	add_hist(v, &(struct ik_hist){ .op = "renotified", .at = now_ms, .state = IK_ST_DONE });
	return cond_update(d, r, "#st = :dnf",
	                   "SET #st = :done, #ua = :now, " HIST_SET " REMOVE #le, #os", err);
}

static int
dd_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
           ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = new_req(d, key), *v;

	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":ip", av_s("IN_PROGRESS"));
	cJSON_AddItemToObject(v, ":tok", av_s(token));
	cJSON_AddItemToObject(v, ":zero", av_n(0));
	cJSON_AddItemToObject(v, ":now", av_n(now_ms));
	add_hist(v, &(struct ik_hist){ .op = "release", .at = now_ms, .owner = token });
	return cond_update(d, r, "#st = :ip AND #ow = :tok",
	                   "SET #lu = :zero, #ua = :now, " HIST_SET, err);
}

static int
dd_forget_failed(struct ik_store *st, const char *key, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = new_req(d, key), *v, *resp = NULL;
	int rc;

	cJSON_AddStringToObject(r, "ConditionExpression", "#st = :failed");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":failed", av_s("FAILED"));
	add_names(d, r, "#st");
	rc = ddb_call(d, "DeleteItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(resp);
	cJSON_Delete(r);
	if (rc == IK_AWS_ERROR) {
		ik_errclear(err);
		return IK_EMPTY;
	}
	return rc;
}

static int
dd_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *resp = NULL, *item;
	int rc;

	memset(r, 0, sizeof *r);
	if ((rc = get_item(d, key, &resp, err)) != IK_OK)
		return rc;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	if (!cJSON_IsObject(item) || !item->child)
		rc = IK_EMPTY;
	else if (ik_ddb_record_from_item(item, d->key, r) < 0)
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
	cJSON_Delete(resp);
	return rc;
}

static int
rec_cmp(const void *a, const void *b)
{
	const struct ik_record *x = a, *y = b;

	if (x->updated_at != y->updated_at)
		return x->updated_at < y->updated_at ? -1 : 1;
	return strcmp(x->key ? x->key : "", y->key ? y->key : "");
}

/* One page of the open index: a Query of openState = STATE#shard, oldest
 * update first.  IK_CONFIG when the table has no index yet (idemp-init
 * adds it). */
static int
query_open(struct ddb *d, cJSON *req, cJSON **resp, ik_err *err)
{
	int rc = ddb_call(d, "Query", req, "ValidationException", resp, err);

	if (rc != IK_AWS_ERROR)
		return rc;
	cJSON_Delete(*resp);
	*resp = NULL;
	if (err && strstr(err->msg, "index"))
		return errsuffix(err, IK_CONFIG, " (table %s: no index " OPEN_INDEX
		                 "; run idemp-init to add it)", d->table);
	return IK_SOFTWARE;
}

/* A Query request on one shard of the open index for state. */
static cJSON *
open_req(struct ddb *d, enum ik_state state, int shard, const char *range, cJSON **vals)
{
	cJSON *req = new_req(d, NULL);
	char os[64], kc[96];

	snprintf(os, sizeof os, "%s#%d", ik_state_name(state), shard);
	snprintf(kc, sizeof kc, "#os = :os%s", range ? range : "");
	cJSON_AddStringToObject(req, "IndexName", OPEN_INDEX);
	cJSON_AddStringToObject(req, "KeyConditionExpression", kc);
	*vals = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	cJSON_AddItemToObject(*vals, ":os", av_s(os));
	return req;
}

/* Pages on from resp's LastEvaluatedKey into req; 0 when there is none. */
static int
next_page(cJSON *req, cJSON *resp)
{
	cJSON *lek = resp ? cJSON_GetObjectItemCaseSensitive(resp, "LastEvaluatedKey") : NULL;

	if (!cJSON_IsObject(lek) || !lek->child)
		return 0;
	cJSON_DeleteItemFromObjectCaseSensitive(req, "ExclusiveStartKey");
	lek = cJSON_DetachItemFromObjectCaseSensitive(resp, "LastEvaluatedKey");
	cJSON_AddItemToObject(req, "ExclusiveStartKey", lek);
	return 1;
}

/* The state whose open-index shards hold every record f can match;
 * IK_ST_NONE when f takes DONE records too (then only a Scan finds them),
 * -1 when nothing can match (expired with another state than IN_PROGRESS). */
static int
list_part(const struct ik_list_filter *f)
{
	if (f->expired)
		return f->state == IK_ST_NONE || f->state == IK_ST_IN_PROGRESS ?
		       IK_ST_IN_PROGRESS : -1;
	return f->state == IK_ST_DONE ? IK_ST_NONE : (int)f->state;
}

/* The request of one listing: a Query of one shard of the open index
 * (part != IK_ST_NONE), else a consistent Scan with a FilterExpression,
 * which reads, and is billed for, the whole table. */
static cJSON *
list_req(struct ddb *d, const struct ik_list_filter *f, int part, int shard)
{
	cJSON *req, *v = NULL;
	char filter[160] = "";

	if (part != IK_ST_NONE) {
		req = open_req(d, part, shard, f->older_than_ms > 0 ? " AND #ua < :cut" : NULL, &v);
		if (f->expired) {
			strcat(filter, "#lu < :now");
			cJSON_AddItemToObject(v, ":now", av_n(f->now_ms));
		}
		if (f->older_than_ms > 0)
			cJSON_AddItemToObject(v, ":cut", av_n(f->now_ms - f->older_than_ms));
		if (*filter)
			cJSON_AddStringToObject(req, "FilterExpression", filter);
		strcat(filter, " ");
		strcat(filter, cJSON_GetObjectItemCaseSensitive(req, "KeyConditionExpression")->valuestring);
		add_names(d, req, filter);
		return req;
	}
	req = new_req(d, NULL);
	cJSON_AddTrueToObject(req, "ConsistentRead");
	if (f->state != IK_ST_NONE)
		strcat(filter, "#st = :st");
	if (f->older_than_ms > 0)
		strcat(filter, *filter ? " AND #ua < :cut" : "#ua < :cut");
	if (*filter) {
		cJSON_AddStringToObject(req, "FilterExpression", filter);
		add_names(d, req, filter);
		v = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
		if (f->state != IK_ST_NONE)
			cJSON_AddItemToObject(v, ":st", av_s(ik_state_name(f->state)));
		if (f->older_than_ms > 0)
			cJSON_AddItemToObject(v, ":cut", av_n(f->now_ms - f->older_than_ms));
	}
	return req;
}

/* Unfinished records: Queries on the open index, eventually consistent
 * like every index read (a record finished a moment ago may still be
 * listed; the steps that act on it are conditional writes).  DONE or any
 * state: a paginated Scan.  The matches are held and sorted like the
 * SQLite listing (updatedAt, key). */
static int
dd_list(struct ik_store *st, const struct ik_list_filter *f, ik_record_cb cb,
        void *arg, ik_err *err)
{
	struct ddb *d = st->impl;
	struct ik_record *recs = NULL, *t;
	size_t n = 0, cap = 0, i;
	cJSON *req = NULL, *resp = NULL, *items, *it;
	int rc = IK_OK, part = list_part(f), shard, shards;

	if (part < 0)
		return IK_EMPTY;
	shards = part == IK_ST_NONE ? 1 : OPEN_SHARDS;
	for (shard = 0; shard < shards; shard++) {
		req = list_req(d, f, part, shard);
		do {
			cJSON_Delete(resp);
			resp = NULL;
			rc = part == IK_ST_NONE ? ddb_call(d, "Scan", req, NULL, &resp, err)
			                        : query_open(d, req, &resp, err);
			if (rc != IK_OK)
				goto out;
			items = cJSON_GetObjectItemCaseSensitive(resp, "Items");
			cJSON_ArrayForEach(it, items) {
				if (n == cap) {
					cap = cap ? cap * 2 : 64;
					if (!(t = realloc(recs, cap * sizeof *recs))) {
						rc = ik_errf(err, IK_SOFTWARE, "out of memory");
						goto out;
					}
					recs = t;
				}
				if (ik_ddb_record_from_item(it, d->key, &recs[n]) < 0) {
					rc = ik_errf(err, IK_SOFTWARE, "out of memory");
					goto out;
				}
				n++;
			}
		} while (next_page(req, resp));
		cJSON_Delete(req);
		req = NULL;
	}
	if (n)
		qsort(recs, n, sizeof *recs, rec_cmp);
	for (i = 0; i < n; i++)
		if (cb(&recs[i], arg))
			break;
	rc = n ? IK_OK : IK_EMPTY;
out:
	cJSON_Delete(req);
	cJSON_Delete(resp);
	for (i = 0; i < n; i++)
		ik_record_free(&recs[i]);
	free(recs);
	return rc;
}

/* ---- stats: Queries on the open index, DescribeTable for DONE ---------- */

static int describe(struct ddb *d, cJSON **resp, ik_err *err);

/* Walks every shard of state's open records, oldest update first (only
 * updatedAt and leaseUntil are returned): how many, how many with an ended
 * lease, and the oldest updatedAt of each (0: none). */
static int
open_walk(struct ddb *d, enum ik_state state, int64_t now_ms, int64_t *n, int64_t *ended,
          int64_t *oldest, int64_t *oldest_ended, ik_err *err)
{
	cJSON *req, *resp = NULL, *v, *it;
	int64_t ua;
	int rc = IK_OK, shard;

	*n = *ended = *oldest = *oldest_ended = 0;
	for (shard = 0; shard < OPEN_SHARDS && rc == IK_OK; shard++) {
		req = open_req(d, state, shard, NULL, &v);
		cJSON_AddStringToObject(req, "ProjectionExpression", "#ua, #lu");
		add_names(d, req, "#os #ua #lu");
		do {
			cJSON_Delete(resp);
			resp = NULL;
			if ((rc = query_open(d, req, &resp, err)) != IK_OK)
				break;
			cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Items")) {
				ua = attr_n(it, "updatedAt");
				++*n;
				if (!*oldest || ua < *oldest)
					*oldest = ua;
				if (attr_n(it, "leaseUntil") < now_ms) {
					++*ended;
					if (!*oldest_ended || ua < *oldest_ended)
						*oldest_ended = ua;
				}
			}
		} while (next_page(req, resp));
		cJSON_Delete(req);
	}
	cJSON_Delete(resp);
	return rc;
}

static int
dd_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *resp = NULL, *t;
	int64_t n, ended, oldest, oldest_ended;
	int rc;

	memset(out, 0, sizeof *out);
	if ((rc = open_walk(d, IK_ST_IN_PROGRESS, now_ms, &out->in_progress, &out->stuck,
	                    &oldest, &oldest_ended, err)) != IK_OK)
		return rc;
	out->oldest_stuck_ms = out->stuck ? now_ms - oldest_ended : 0;
	if ((rc = open_walk(d, IK_ST_DNF, now_ms, &out->dnf, &ended, &oldest, &oldest_ended,
	                    err)) != IK_OK)
		return rc;
	out->oldest_dnf_ms = out->dnf ? now_ms - oldest : 0;
	if ((rc = open_walk(d, IK_ST_FAILED, now_ms, &out->failed, &ended, &oldest,
	                    &oldest_ended, err)) != IK_OK)
		return rc;
	/* DONE: the table's ItemCount (refreshed about every 6 hours on
	 * DynamoDB) less the open records: an estimate, never a Scan. */
	if ((rc = describe(d, &resp, err)) == IK_AWS_ERROR)
		return errsuffix(err, IK_CONFIG, " (table %s: create it with idemp-init)", d->table);
	if (rc != IK_OK)
		return rc;
	t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(resp, "Table"),
	                                     "ItemCount");
	n = cJSON_IsNumber(t) ? (int64_t)t->valuedouble : 0;
	n -= out->in_progress + out->dnf + out->failed;
	out->done = n > 0 ? n : 0;
	out->done_approx = 1;
	cJSON_Delete(resp);
	return IK_OK;
}

/* ---- init: the table, its key schema, TTL ------------------------------ */

static int
check_schema(struct ddb *d, const cJSON *table, ik_err *err)
{
	const cJSON *ks = cJSON_GetObjectItemCaseSensitive(table, "KeySchema");
	const cJSON *defs = cJSON_GetObjectItemCaseSensitive(table, "AttributeDefinitions");
	const cJSON *k0 = cJSON_GetArrayItem(ks, 0), *def;
	const char *name = NULL, *type = NULL, *kt = NULL;

	if (k0) {
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(k0, "AttributeName");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(k0, "KeyType");
		name = cJSON_IsString(a) ? a->valuestring : NULL;
		kt = cJSON_IsString(b) ? b->valuestring : NULL;
	}
	cJSON_ArrayForEach(def, defs) {
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(def, "AttributeName");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(def, "AttributeType");
		if (name && cJSON_IsString(a) && strcmp(a->valuestring, name) == 0 &&
		    cJSON_IsString(b))
			type = b->valuestring;
	}
	if (cJSON_GetArraySize(ks) != 1 || !name || !kt || strcmp(kt, "HASH") != 0 ||
	    strcmp(name, d->key) != 0 || !type || strcmp(type, "S") != 0)
		return ik_errf(err, IK_CONFIG, "dynamodb table %s: key schema is %s%.100s "
		               "%s %s, want a single HASH key %s of type S "
		               "(IDEMKIT_DYNAMODB_KEY)", d->table,
		               cJSON_GetArraySize(ks) > 1 ? "composite, first " : "",
		               name ? name : "?", kt ? kt : "?", type ? type : "?", d->key);
	return IK_OK;
}

static int
describe(struct ddb *d, cJSON **resp, ik_err *err)
{
	cJSON *req = new_req(d, NULL);
	int rc = ddb_call(d, "DescribeTable", req, "ResourceNotFoundException", resp, err);

	cJSON_Delete(req);
	return rc;
}

static int
ensure_ttl(struct ddb *d, ik_err *err)
{
	cJSON *req, *resp = NULL, *desc, *s, *a, *spec;
	int rc;

	req = new_req(d, NULL);
	rc = ddb_call(d, "DescribeTimeToLive", req, "UnknownOperationException", &resp, err);
	cJSON_Delete(req);
	if (rc == IK_AWS_ERROR)
		goto unsupported;
	if (rc != IK_OK)
		return rc;
	desc = cJSON_GetObjectItemCaseSensitive(resp, "TimeToLiveDescription");
	s = cJSON_GetObjectItemCaseSensitive(desc, "TimeToLiveStatus");
	a = cJSON_GetObjectItemCaseSensitive(desc, "AttributeName");
	if (cJSON_IsString(s) && (strcmp(s->valuestring, "ENABLED") == 0 ||
	                          strcmp(s->valuestring, "ENABLING") == 0)) {
		if (!cJSON_IsString(a) || strcmp(a->valuestring, "expiresAt") != 0)
			ik_log(IK_LOG_WARN, "TTL is enabled on another attribute; records "
			       "will not expire", "table", d->table,
			       "attribute", cJSON_IsString(a) ? a->valuestring : NULL, NULL);
		cJSON_Delete(resp);
		return IK_OK;
	}
	cJSON_Delete(resp);
	resp = NULL;
	req = new_req(d, NULL);
	spec = cJSON_AddObjectToObject(req, "TimeToLiveSpecification");
	cJSON_AddTrueToObject(spec, "Enabled");
	cJSON_AddStringToObject(spec, "AttributeName", "expiresAt");
	rc = ddb_call(d, "UpdateTimeToLive", req, "UnknownOperationException", &resp, err);
	cJSON_Delete(req);
	cJSON_Delete(resp);
	resp = NULL;
	if (rc == IK_AWS_ERROR)
		goto unsupported;
	return rc;
unsupported:
	cJSON_Delete(resp);
	ik_errclear(err);
	ik_log(IK_LOG_WARN, "the DynamoDB endpoint does not support TTL; records "
	       "will not expire", "table", d->table, NULL);
	return IK_OK;
}

/* The open index's AttributeDefinitions entries and its definition
 * (KeySchema, Projection), for CreateTable and UpdateTable. */
static void
add_attr_def(cJSON *defs, const char *name, const char *type)
{
	cJSON *t = cJSON_CreateObject();

	cJSON_AddStringToObject(t, "AttributeName", name);
	cJSON_AddStringToObject(t, "AttributeType", type);
	cJSON_AddItemToArray(defs, t);
}

static cJSON *
open_index_def(const cJSON *throughput)
{
	cJSON *g = cJSON_CreateObject(), *ks, *k;

	cJSON_AddStringToObject(g, "IndexName", OPEN_INDEX);
	ks = cJSON_AddArrayToObject(g, "KeySchema");
	k = cJSON_CreateObject();
	cJSON_AddStringToObject(k, "AttributeName", "openState");
	cJSON_AddStringToObject(k, "KeyType", "HASH");
	cJSON_AddItemToArray(ks, k);
	k = cJSON_CreateObject();
	cJSON_AddStringToObject(k, "AttributeName", "updatedAt");
	cJSON_AddStringToObject(k, "KeyType", "RANGE");
	cJSON_AddItemToArray(ks, k);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(g, "Projection"), "ProjectionType", "ALL");
	if (throughput)
		cJSON_AddItemToObject(g, "ProvisionedThroughput", cJSON_Duplicate(throughput, 1));
	return g;
}

/* The open index's IndexStatus in a DescribeTable "Table", or NULL when
 * the table has no such index. */
static const char *
open_index_status(const cJSON *table)
{
	const cJSON *g, *name, *status;

	cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(table, "GlobalSecondaryIndexes")) {
		name = cJSON_GetObjectItemCaseSensitive(g, "IndexName");
		status = cJSON_GetObjectItemCaseSensitive(g, "IndexStatus");
		if (cJSON_IsString(name) && strcmp(name->valuestring, OPEN_INDEX) == 0)
			return cJSON_IsString(status) ? status->valuestring : "ACTIVE";
	}
	return NULL;
}

/* Adds the open index to a table made before it (UpdateTable).  On-demand
 * DynamoDB refuses ProvisionedThroughput for the index; a provisioned
 * table, and dynalite even on an on-demand one, insist on it: then the
 * index gets the table's own throughput (1/1 when the table shows none). */
static int
add_open_index(struct ddb *d, const cJSON *table, ik_err *err)
{
	const cJSON *pt = cJSON_GetObjectItemCaseSensitive(table, "ProvisionedThroughput");
	const cJSON *rcu = cJSON_GetObjectItemCaseSensitive(pt, "ReadCapacityUnits");
	const cJSON *wcu = cJSON_GetObjectItemCaseSensitive(pt, "WriteCapacityUnits");
	cJSON *req, *resp = NULL, *defs, *upd, *c, *tp = NULL;
	int rc;

	for (;;) {
		req = new_req(d, NULL);
		defs = cJSON_AddArrayToObject(req, "AttributeDefinitions");
		add_attr_def(defs, d->key, "S");
		add_attr_def(defs, "openState", "S");
		add_attr_def(defs, "updatedAt", "N");
		upd = cJSON_AddArrayToObject(req, "GlobalSecondaryIndexUpdates");
		c = cJSON_CreateObject();
		cJSON_AddItemToObject(c, "Create", open_index_def(tp));
		cJSON_AddItemToArray(upd, c);
		rc = ddb_call(d, "UpdateTable", req, "ValidationException", &resp, err);
		cJSON_Delete(req);
		/* An endpoint that takes the request and drops the index (dynalite
		 * does) would leave us waiting for an index that never comes. */
		if (rc == IK_OK && !open_index_status(cJSON_GetObjectItemCaseSensitive(resp,
		                                      "TableDescription")))
			rc = ik_errf(err, IK_CONFIG, "dynamodb UpdateTable: table %s: the endpoint "
			             "accepted the index " OPEN_INDEX " but did not add it (dynalite "
			             "cannot add an index to a table; recreate the table with "
			             "idemp-init)", d->table);
		cJSON_Delete(resp);
		resp = NULL;
		if (rc != IK_AWS_ERROR || tp || !strstr(err->msg, "rovisionedThroughput"))
			break;
		ik_errclear(err);
		tp = cJSON_CreateObject();
		cJSON_AddNumberToObject(tp, "ReadCapacityUnits",
		                        cJSON_IsNumber(rcu) && rcu->valuedouble >= 1 ? rcu->valuedouble : 1);
		cJSON_AddNumberToObject(tp, "WriteCapacityUnits",
		                        cJSON_IsNumber(wcu) && wcu->valuedouble >= 1 ? wcu->valuedouble : 1);
	}
	cJSON_Delete(tp);
	if (rc == IK_AWS_ERROR)
		rc = err->code ? err->code : IK_SOFTWARE;
	if (rc == IK_OK)
		ik_log(IK_LOG_INFO, "adding index", "table", d->table, "index", OPEN_INDEX, NULL);
	return rc;
}

/* On a table idemp-init did not just create: the unfinished records
 * written before the index (by an older idemkit) get their openState.  A
 * Scan of the key and state, in idemp-init only (a deployment step, never
 * a worker's); it finds nothing to do once every record is indexed, and
 * finishes a migration that was cut short.  Each update is conditioned on
 * the state it read, so a record finished meanwhile is left as its writer
 * left it. */
static int
backfill_open(struct ddb *d, ik_err *err)
{
	static const char filter[] = "#st <> :done AND attribute_not_exists(#os)";
	cJSON *req, *resp = NULL, *v, *it, *r, *rv;
	const char *key, *state;
	char os[64];
	long n = 0;
	int rc;

	req = new_req(d, NULL);
	cJSON_AddStringToObject(req, "FilterExpression", filter);
	cJSON_AddStringToObject(req, "ProjectionExpression", "#k, #st");
	add_names(d, req, "#k #st #os");
	v = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":done", av_s("DONE"));
	cJSON_AddTrueToObject(req, "ConsistentRead");
	do {
		cJSON_Delete(resp);
		resp = NULL;
		if ((rc = ddb_call(d, "Scan", req, NULL, &resp, err)) != IK_OK)
			break;
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Items")) {
			key = attr_s(it, d->key);
			state = attr_s(it, "state");
			if (!key || !state || ik_state_parse(state) == IK_ST_NONE)
				continue;
			r = new_req(d, key);
			rv = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
			cJSON_AddItemToObject(rv, ":st", av_s(state));
			cJSON_AddItemToObject(rv, ":os", av_s(open_key(os, ik_state_parse(state), key)));
			rc = cond_update(d, r, "#st = :st AND attribute_not_exists(#os)",
			                 "SET #os = :os", err);
			if (rc == IK_LEASE_LOST)
				rc = IK_OK;
			if (rc != IK_OK)
				break;
			n++;
		}
	} while (rc == IK_OK && next_page(req, resp));
	cJSON_Delete(req);
	cJSON_Delete(resp);
	if (rc == IK_OK && n) {
		char buf[32];
		snprintf(buf, sizeof buf, "%ld", n);
		ik_log(IK_LOG_INFO, "indexed unfinished records", "table", d->table,
		       "index", OPEN_INDEX, "records", buf, NULL);
	}
	return rc;
}

static int
dd_init(struct ik_store *st, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *resp = NULL, *req, *a, *t, *s;
	int64_t deadline = ik_mono_ms() + ACTIVE_WAIT_MS;
	const char *ix;
	long nap = 50;
	int rc, created = 0, added = 0;

	for (;;) {
		rc = describe(d, &resp, err);
		if (rc == IK_AWS_ERROR && !created) {
			cJSON_Delete(resp);
			resp = NULL;
			ik_errclear(err);
			req = new_req(d, NULL);
			a = cJSON_AddArrayToObject(req, "AttributeDefinitions");
			add_attr_def(a, d->key, "S");
			add_attr_def(a, "openState", "S");
			add_attr_def(a, "updatedAt", "N");
			a = cJSON_AddArrayToObject(req, "GlobalSecondaryIndexes");
			cJSON_AddItemToArray(a, open_index_def(NULL));
			a = cJSON_AddArrayToObject(req, "KeySchema");
			t = cJSON_CreateObject();
			cJSON_AddStringToObject(t, "AttributeName", d->key);
			cJSON_AddStringToObject(t, "KeyType", "HASH");
			cJSON_AddItemToArray(a, t);
			cJSON_AddStringToObject(req, "BillingMode", "PAY_PER_REQUEST");
			rc = ddb_call(d, "CreateTable", req, "ResourceInUseException", &resp, err);
			cJSON_Delete(req);
			cJSON_Delete(resp);
			resp = NULL;
			if (rc == IK_AWS_ERROR)      /* someone else is creating it */
				ik_errclear(err);
			else if (rc != IK_OK)
				return rc;
			else
				ik_log(IK_LOG_INFO, "created table", "table", d->table,
				       "key", d->key, NULL);
			created = 1;
			continue;
		}
		if (rc == IK_AWS_ERROR) {
			/* created, yet not found: eventual consistency; wait */
			ik_errclear(err);
		} else if (rc != IK_OK) {
			return rc;
		} else {
			t = cJSON_GetObjectItemCaseSensitive(resp, "Table");
			s = cJSON_GetObjectItemCaseSensitive(t, "TableStatus");
			if ((rc = check_schema(d, t, err)) != IK_OK) {
				cJSON_Delete(resp);
				return rc;
			}
			ix = open_index_status(t);
			if (cJSON_IsString(s) && strcmp(s->valuestring, "ACTIVE") == 0 && !ix &&
			    !added) {
				/* a table from before the index */
				added = 1;
				if ((rc = add_open_index(d, t, err)) != IK_OK) {
					cJSON_Delete(resp);
					return rc;
				}
			} else if (cJSON_IsString(s) && strcmp(s->valuestring, "ACTIVE") == 0 &&
			           ix && strcmp(ix, "ACTIVE") == 0) {
				break;
			}
			if (cJSON_IsString(s) && strcmp(s->valuestring, "DELETING") == 0) {
				cJSON_Delete(resp);
				return ik_errf(err, IK_TEMPFAIL, "dynamodb table %s is being "
				               "deleted", d->table);
			}
		}
		cJSON_Delete(resp);
		resp = NULL;
		if (ik_mono_ms() > deadline)
			return ik_errf(err, IK_TEMPFAIL, "dynamodb table %s: not ACTIVE "
			               "after %d s", d->table, ACTIVE_WAIT_MS / 1000);
		ik_sleep_ms(nap);
		if (nap < 1000)
			nap *= 2;
	}
	cJSON_Delete(resp);
	/* A table we did not just create may hold unfinished records written
	 * before the index (or while an earlier migration was cut short). */
	if (!created && (rc = backfill_open(d, err)) != IK_OK)
		return rc;
	return ensure_ttl(d, err);
}

static void
dd_close(struct ik_store *st)
{
	struct ddb *d = st->impl;
	struct op *o;

	if (!d)
		return;
	/* Answers not yet acted on or reported (a stream that ended early):
	 * the calls still in flight die with the client. */
	while ((o = op_dequeue(&d->answered, &d->answered_last)) ||
	       (o = op_dequeue(&d->done, &d->done_last))) {
		cJSON_Delete(o->resp);
		cJSON_Delete(o->write);
		free(o);
	}
	ik_aws_close(d->aws);
	free(d->table);
	free(d->key);
	free(d);
	st->impl = NULL;
}

static const struct ik_store_ops dynamodb_ops = {
	.name = "dynamodb",
	.init = dd_init,
	.claim = dd_claim,
	.finish = dd_finish,
	.renew = dd_renew,
	.renotified = dd_renotified,
	.release = dd_release,
	.forget_failed = dd_forget_failed,
	.get = dd_get,
	.list = dd_list,
	.close = dd_close,
	.stats = dd_stats,
	.claim_start = dd_claim_start,
	.finish_start = dd_finish_start,
	.run = dd_run,
	.active = dd_active,
};

int
ik_store_dynamodb_open(const char *table, struct ik_store *s, ik_err *err)
{
	const char *key = getenv("IDEMKIT_DYNAMODB_KEY");
	size_t n = strlen(table);
	struct ddb *d;
	int rc;

	if (n < 3 || n > 255 ||
	    strspn(table, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n)
		return ik_errf(err, IK_CONFIG, "dynamodb table name \"%.64s\": want 3-255 "
		               "characters of [A-Za-z0-9_.-]", table);
	if (!key || !*key)
		key = "pk";
	if (strlen(key) > 255 || strpbrk(key, "\r\n"))
		return ik_errf(err, IK_CONFIG, "IDEMKIT_DYNAMODB_KEY: not an attribute name");
	if (!(d = calloc(1, sizeof *d)) || !(d->table = strdup(table)) ||
	    !(d->key = strdup(key))) {
		if (d)
			free(d->table);
		free(d);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	if ((rc = ik_aws_open("dynamodb", &d->aws, err)) != IK_OK) {
		free(d->table);
		free(d->key);
		free(d);
		return rc;
	}
	s->ops = &dynamodb_ops;
	s->impl = d;
	return IK_OK;
}
