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
 * index, never a Scan of the table (store_dynamodb.h, store_dynamodb_list.c).
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
 * state machines over ik_aws_submit (store_dynamodb_write.c); the blocking
 * claim, finish, release and re-notify are the same ops run to their end,
 * so each request and each decision is written once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/dynamodb/store_dynamodb.h"
#include "store/store.h"

/* ---- the port ---------------------------------------------------------- */

static int
ddb_get_item(struct ddb *d, const char *key, cJSON **resp, ik_err *err)
{
	cJSON *req = ddb_get_req(d, key);
	int rc = ddb_call(d, "GetItem", req, NULL, resp, err);

	cJSON_Delete(req);
	return rc;
}

static int
dd_forget_failed(struct ik_store *st, const char *key, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, key), *v, *resp = NULL, *item;
	int rc;

	/* Never the outbox's event with it: a FAILED record whose event waits
	 * stays until the relay published it. */
	cJSON_AddStringToObject(r, "ConditionExpression",
	                        "#st = :failed AND attribute_not_exists(#obp)");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":failed", ddb_av_s("FAILED"));
	ddb_add_names(d, r, "#st #obp");
	rc = ddb_call(d, "DeleteItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(resp);
	cJSON_Delete(r);
	if (rc != IK_AWS_ERROR)
		return rc;
	ik_errclear(err);
	resp = NULL;
	if ((rc = ddb_get_item(d, key, &resp, err)) != IK_OK)
		return rc;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	rc = ddb_attr_s(item, "obPend") && ik_state_parse(ddb_attr_s(item, "state")) == IK_ST_FAILED ?
	     ik_errf(err, IK_TEMPFAIL, "dynamodb %s: %.128s: its outbox event is not yet "
	             "published; run idemp-outbox first", d->table, key) : IK_EMPTY;
	cJSON_Delete(resp);
	return rc;
}

static int
dd_get(struct ik_store *st, const char *key, struct ik_record *r, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *resp = NULL, *item;
	int rc;

	memset(r, 0, sizeof *r);
	if ((rc = ddb_get_item(d, key, &resp, err)) != IK_OK)
		return rc;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	if (!cJSON_IsObject(item) || !item->child)
		rc = IK_EMPTY;
	else if (ik_ddb_record_from_item(item, d->key, r) < 0)
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
	cJSON_Delete(resp);
	return rc;
}

static void
dd_close(struct ik_store *st)
{
	struct ddb *d = st->impl;

	if (!d)
		return;
	ddb_ops_drop(d);
	ddb_outbox_close(d);
	ddb_stream_free(d);
	free(d->obx_holder);
	ik_aws_close(d->aws);
	free(d->table);
	free(d->key);
	free(d);
	st->impl = NULL;
}

static const struct ik_store_ops dynamodb_ops = {
	.name = "dynamodb",
	.init = ddb_init,
	.claim = ddb_claim,
	.finish = ddb_finish,
	.renew = ddb_renew,
	.renotified = ddb_renotified,
	.release = ddb_release,
	.forget_failed = dd_forget_failed,
	.get = dd_get,
	.list = ddb_list,
	.close = dd_close,
	.stats = ddb_stats,
	.claim_start = ddb_claim_start,
	.finish_start = ddb_finish_start,
	.run = ddb_run,
	.active = ddb_active,
	.note = ddb_note,
	.outbox_lease = ddb_outbox_lease,
	.outbox_read = ddb_outbox_read,
	.outbox_ack = ddb_outbox_ack,
	.outbox_purge = ddb_outbox_purge,
	.outbox_stats = ddb_outbox_stats,
	.outbox_batch = DDB_OUTBOX_BATCH,
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
