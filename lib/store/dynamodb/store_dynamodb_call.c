/* store_dynamodb_call.c: what every file of the DynamoDB adapter shares
 * (store_dynamodb.h), below them all: items and records, requests and the
 * call, the open index's keys, the table's description and a listing's
 * next page.  It calls none of them back. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/dynamodb/store_dynamodb.h"
#include "store/store.h"

/* ---- items and records ------------------------------------------------- */

const char *
ddb_attr_s(const cJSON *item, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, name);

	v = cJSON_GetObjectItemCaseSensitive(v, "S");
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

int64_t
ddb_attr_n(const cJSON *item, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, name);

	v = cJSON_GetObjectItemCaseSensitive(v, "N");
	return cJSON_IsString(v) ? strtoll(v->valuestring, NULL, 10) : 0;
}

static int
dup_attr(const cJSON *item, const char *name, char **out)
{
	const char *s = ddb_attr_s(item, name);

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
		const char *op = ddb_attr_s(cJSON_GetObjectItemCaseSensitive(e, "M"), "op");
		if (op && strcmp(op, "claim") == 0)
			claims++;
	}
	bad = ik_buf_addstr(&b, "[");
	cJSON_ArrayForEach(e, l) {
		struct ik_hist h = { 0 };

		m = cJSON_GetObjectItemCaseSensitive(e, "M");
		if (!cJSON_IsObject(m) || !(h.op = ddb_attr_s(m, "op")))
			continue;
		h.at = ddb_attr_n(m, "at");
		h.owner = ddb_attr_s(m, "owner");
		h.state = ik_state_parse(ddb_attr_s(m, "state"));
		h.debit_ref = ddb_attr_s(m, "debitRef");
		h.error = ddb_attr_s(m, "error");
		h.bank_replayed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(m, "bankReplayed"), "BOOL"));
		if (strcmp(h.op, "claim") == 0) {
			h.lease_until = ddb_attr_n(m, "leaseUntil");
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
	r->state = ik_state_parse(ddb_attr_s(item, "state"));
	r->lease_until = ddb_attr_n(item, "leaseUntil");
	r->attempts = ddb_attr_n(item, "attempts");
	r->created_at = ddb_attr_n(item, "createdAt");
	r->updated_at = ddb_attr_n(item, "updatedAt");
	r->expires_at = ddb_attr_n(item, "expiresAt");
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

cJSON *
ddb_av_s(const char *s)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "S", s);
	return o;
}

cJSON *
ddb_av_n(int64_t n)
{
	char buf[32];
	cJSON *o = cJSON_CreateObject();

	snprintf(buf, sizeof buf, "%lld", (long long)n);
	cJSON_AddStringToObject(o, "N", buf);
	return o;
}

/* ---- the open index (store_dynamodb.h) --------------------------------- */

unsigned
ddb_shard(const char *key)
{
	uint32_t h = 2166136261u;   /* FNV-1a */

	for (; *key; key++)
		h = (h ^ (unsigned char)*key) * 16777619u;
	return (unsigned)(h % DDB_OPEN_SHARDS);
}

const char *
ddb_open_key(char buf[64], enum ik_state st, const char *key)
{
	snprintf(buf, 64, "%s#%u", ik_state_name(st), ddb_shard(key));
	return buf;
}

/* The attribute names, by placeholder; "#k" is the key attribute. */
static const char *const names[][2] = {
	{ "#st", "state" }, { "#ow", "owner" }, { "#lu", "leaseUntil" },
	{ "#at", "attempts" }, { "#fp", "fingerprint" }, { "#ev", "event" },
	{ "#dr", "debitRef" }, { "#le", "lastError" }, { "#ca", "createdAt" },
	{ "#ua", "updatedAt" }, { "#xa", "expiresAt" }, { "#os", "openState" },
	{ "#h", "history" },
	/* the outbox (store_dynamodb_outbox.c) */
	{ "#obf", "obFin" }, { "#obr", "obRen" }, { "#obt", "t" }, { "#obp", "obPend" },
	{ "#oba", "obAt" }, { "#rh", "relayHolder" }, { "#ru", "relayUntil" },
	{ "#sarn", "obStream" }, { "#spos", "obPos" },
};

/* ExpressionAttributeNames for exactly the placeholders the expressions
 * use (DynamoDB refuses unused ones). */
void
ddb_add_names(struct ddb *d, cJSON *req, const char *exprs)
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

cJSON *
ddb_new_req(struct ddb *d, const char *key)
{
	cJSON *req = cJSON_CreateObject(), *k;

	cJSON_AddStringToObject(req, "TableName", d->table);
	if (key) {
		k = cJSON_AddObjectToObject(req, "Key");
		cJSON_AddItemToObject(k, d->key, ddb_av_s(key));
	}
	return req;
}

/* Append to the message in err and set its code. */
int
ddb_errsuffix(ik_err *err, int code, const char *fmt, ...)
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
int
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
		return ddb_errsuffix(err, IK_CONFIG, " (table %s: create it with idemp-init)", d->table);
	}
	/* The wording differs: "does not match the schema" (DynamoDB),
	 * "Missing the key" (dynalite), "One of the required keys was not
	 * given a value" (DynamoDB Local). */
	if (strcmp(ae->type, "ValidationException") == 0 &&
	    (strstr(ae->message, "key") || strstr(ae->message, "Key")) &&
	    (strstr(ae->message, "schema") || strstr(ae->message, "Missing the key") ||
	     strstr(ae->message, "required keys"))) {
		return ddb_errsuffix(err, IK_CONFIG, " (table %s: key attribute %s, "
		                 "IDEMKIT_DYNAMODB_KEY)", d->table, d->key);
	}
	return err ? err->code : IK_SOFTWARE;   /* IK_SOFTWARE: a request we got wrong */
}

/* One blocking DynamoDB call, answered as ddb_answer says. */
int
ddb_call(struct ddb *d, const char *op, cJSON *req, const char *pass,
         cJSON **resp, ik_err *err)
{
	struct ik_aws_error ae;
	char target[64];
	int rc;

	*resp = NULL;
	if (!req)
		return ik_errf(err, IK_SOFTWARE, "dynamodb %s: out of memory", op);
	snprintf(target, sizeof target, DDB_TARGET_PREFIX "%s", op);
	rc = ik_aws_call(d->aws, target, req, resp, &ae, err);
	return ddb_answer(d, pass, rc, resp, &ae, err);
}

/* ---- requests of the port's and idemp-init's ---------------------------- */

/* The consistent read that decides a refused claim when the refusal came
 * without the old item (dynalite), and idemp-show's read. */
cJSON *
ddb_get_req(struct ddb *d, const char *key)
{
	cJSON *req = ddb_new_req(d, key);

	cJSON_AddTrueToObject(req, "ConsistentRead");
	return req;
}

int
ddb_describe(struct ddb *d, cJSON **resp, ik_err *err)
{
	cJSON *req = ddb_new_req(d, NULL);
	int rc = ddb_call(d, "DescribeTable", req, "ResourceNotFoundException", resp, err);

	cJSON_Delete(req);
	return rc;
}

/* Pages on from resp's LastEvaluatedKey into req; 0 when there is none. */
int
ddb_next_page(cJSON *req, cJSON *resp)
{
	cJSON *lek = resp ? cJSON_GetObjectItemCaseSensitive(resp, "LastEvaluatedKey") : NULL;

	if (!cJSON_IsObject(lek) || !lek->child)
		return 0;
	cJSON_DeleteItemFromObjectCaseSensitive(req, "ExclusiveStartKey");
	lek = cJSON_DetachItemFromObjectCaseSensitive(resp, "LastEvaluatedKey");
	cJSON_AddItemToObject(req, "ExclusiveStartKey", lek);
	return 1;
}
