/* store_dynamodb_list.c: the DynamoDB adapter's reads of many records:
 * the listing and the stats, Queries on the open index (store_dynamodb.h)
 * for the unfinished records, never a Scan of the table for them.
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
		return ddb_errsuffix(err, IK_CONFIG, " (table %s: no index " DDB_OPEN_INDEX
		                 "; run idemp-init to add it)", d->table);
	return IK_SOFTWARE;
}

/* A Query request on one shard of the open index for state. */
static cJSON *
open_req(struct ddb *d, enum ik_state state, int shard, const char *range, cJSON **vals)
{
	cJSON *req = ddb_new_req(d, NULL);
	char os[64], kc[96];

	snprintf(os, sizeof os, "%s#%d", ik_state_name(state), shard);
	snprintf(kc, sizeof kc, "#os = :os%s", range ? range : "");
	cJSON_AddStringToObject(req, "IndexName", DDB_OPEN_INDEX);
	cJSON_AddStringToObject(req, "KeyConditionExpression", kc);
	*vals = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	cJSON_AddItemToObject(*vals, ":os", ddb_av_s(os));
	return req;
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
			cJSON_AddItemToObject(v, ":now", ddb_av_n(f->now_ms));
		}
		if (f->older_than_ms > 0)
			cJSON_AddItemToObject(v, ":cut", ddb_av_n(f->now_ms - f->older_than_ms));
		if (*filter)
			cJSON_AddStringToObject(req, "FilterExpression", filter);
		strcat(filter, " ");
		strcat(filter, cJSON_GetObjectItemCaseSensitive(req, "KeyConditionExpression")->valuestring);
		ddb_add_names(d, req, filter);
		return req;
	}
	req = ddb_new_req(d, NULL);
	cJSON_AddTrueToObject(req, "ConsistentRead");
	/* Records only: the outbox relay's lease item has no state. */
	strcat(filter, f->state != IK_ST_NONE ? "#st = :st" : "attribute_exists(#st)");
	if (f->older_than_ms > 0)
		strcat(filter, " AND #ua < :cut");
	cJSON_AddStringToObject(req, "FilterExpression", filter);
	ddb_add_names(d, req, filter);
	if (f->state != IK_ST_NONE || f->older_than_ms > 0)
		v = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	if (f->state != IK_ST_NONE)
		cJSON_AddItemToObject(v, ":st", ddb_av_s(ik_state_name(f->state)));
	if (f->older_than_ms > 0)
		cJSON_AddItemToObject(v, ":cut", ddb_av_n(f->now_ms - f->older_than_ms));
	return req;
}

/* Unfinished records: Queries on the open index, eventually consistent
 * like every index read (a record finished a moment ago may still be
 * listed; the steps that act on it are conditional writes).  DONE or any
 * state: a paginated Scan.  The matches are held and sorted like the
 * SQLite listing (updatedAt, key). */
int
ddb_list(struct ik_store *st, const struct ik_list_filter *f, ik_record_cb cb,
        void *arg, ik_err *err)
{
	struct ddb *d = st->impl;
	struct ik_record *recs = NULL, *t;
	size_t n = 0, cap = 0, i;
	cJSON *req = NULL, *resp = NULL, *items, *it;
	int rc = IK_OK, part = list_part(f), shard, shards;

	if (part < 0)
		return IK_EMPTY;
	shards = part == IK_ST_NONE ? 1 : DDB_OPEN_SHARDS;
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
		} while (ddb_next_page(req, resp));
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
	for (shard = 0; shard < DDB_OPEN_SHARDS && rc == IK_OK; shard++) {
		req = open_req(d, state, shard, NULL, &v);
		cJSON_AddStringToObject(req, "ProjectionExpression", "#ua, #lu");
		ddb_add_names(d, req, "#os #ua #lu");
		do {
			cJSON_Delete(resp);
			resp = NULL;
			if ((rc = query_open(d, req, &resp, err)) != IK_OK)
				break;
			cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Items")) {
				ua = ddb_attr_n(it, "updatedAt");
				++*n;
				if (!*oldest || ua < *oldest)
					*oldest = ua;
				if (ddb_attr_n(it, "leaseUntil") < now_ms) {
					++*ended;
					if (!*oldest_ended || ua < *oldest_ended)
						*oldest_ended = ua;
				}
			}
		} while (ddb_next_page(req, resp));
		cJSON_Delete(req);
	}
	cJSON_Delete(resp);
	return rc;
}

int
ddb_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out, ik_err *err)
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
	if ((rc = ddb_describe(d, &resp, err)) == IK_AWS_ERROR)
		return ddb_errsuffix(err, IK_CONFIG, " (table %s: create it with idemp-init)", d->table);
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

