/* store_dynamodb_init.c: the DynamoDB adapter's table (idemp-init): created
 * with its key and the open index, or checked and migrated (the index
 * added, the unfinished records written before it indexed), TTL on
 * expiresAt.  A deployment step, never a worker's.
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

#define ACTIVE_WAIT_MS 120000

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
ensure_ttl(struct ddb *d, ik_err *err)
{
	cJSON *req, *resp = NULL, *desc, *s, *a, *spec;
	int rc;

	req = ddb_new_req(d, NULL);
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
	req = ddb_new_req(d, NULL);
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

/* An index's AttributeDefinitions entries and its definition (KeySchema,
 * Projection), for CreateTable and UpdateTable. */
static void
add_attr_def(cJSON *defs, const char *name, const char *type)
{
	cJSON *t = cJSON_CreateObject();

	cJSON_AddStringToObject(t, "AttributeName", name);
	cJSON_AddStringToObject(t, "AttributeType", type);
	cJSON_AddItemToArray(defs, t);
}

/* The table's indexes: the open index (store_dynamodb.h), and the
 * outbox's (store_dynamodb_outbox.c), both sparse: an item is in one only
 * while it carries the index's HASH attribute. */
static const struct index {
	const char *name, *hash, *range;
} indexes[] = {
	{ DDB_OPEN_INDEX, "openState", "updatedAt" },
	{ DDB_OUTBOX_INDEX, "obPend", "obAt" },
};
#define NINDEX (sizeof indexes / sizeof indexes[0])

static cJSON *
index_def(const struct index *ix, const cJSON *throughput)
{
	cJSON *g = cJSON_CreateObject(), *ks, *k;

	cJSON_AddStringToObject(g, "IndexName", ix->name);
	ks = cJSON_AddArrayToObject(g, "KeySchema");
	k = cJSON_CreateObject();
	cJSON_AddStringToObject(k, "AttributeName", ix->hash);
	cJSON_AddStringToObject(k, "KeyType", "HASH");
	cJSON_AddItemToArray(ks, k);
	k = cJSON_CreateObject();
	cJSON_AddStringToObject(k, "AttributeName", ix->range);
	cJSON_AddStringToObject(k, "KeyType", "RANGE");
	cJSON_AddItemToArray(ks, k);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(g, "Projection"), "ProjectionType", "ALL");
	if (throughput)
		cJSON_AddItemToObject(g, "ProvisionedThroughput", cJSON_Duplicate(throughput, 1));
	return g;
}

/* The index's IndexStatus in a DescribeTable "Table", or NULL when the
 * table has no such index. */
static const char *
index_status(const cJSON *table, const char *ix)
{
	const cJSON *g, *name, *status;

	cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(table, "GlobalSecondaryIndexes")) {
		name = cJSON_GetObjectItemCaseSensitive(g, "IndexName");
		status = cJSON_GetObjectItemCaseSensitive(g, "IndexStatus");
		if (cJSON_IsString(name) && strcmp(name->valuestring, ix) == 0)
			return cJSON_IsString(status) ? status->valuestring : "ACTIVE";
	}
	return NULL;
}

/* Adds the index to a table made before it (UpdateTable).  On-demand
 * DynamoDB refuses ProvisionedThroughput for the index; a provisioned
 * table, and dynalite even on an on-demand one, insist on it: then the
 * index gets the table's own throughput (1/1 when the table shows none). */
static int
add_index(struct ddb *d, const cJSON *table, const struct index *ix, ik_err *err)
{
	const cJSON *pt = cJSON_GetObjectItemCaseSensitive(table, "ProvisionedThroughput");
	const cJSON *rcu = cJSON_GetObjectItemCaseSensitive(pt, "ReadCapacityUnits");
	const cJSON *wcu = cJSON_GetObjectItemCaseSensitive(pt, "WriteCapacityUnits");
	cJSON *req, *resp = NULL, *defs, *upd, *c, *tp = NULL;
	int rc;

	for (;;) {
		req = ddb_new_req(d, NULL);
		defs = cJSON_AddArrayToObject(req, "AttributeDefinitions");
		add_attr_def(defs, d->key, "S");
		add_attr_def(defs, ix->hash, "S");
		add_attr_def(defs, ix->range, "N");
		upd = cJSON_AddArrayToObject(req, "GlobalSecondaryIndexUpdates");
		c = cJSON_CreateObject();
		cJSON_AddItemToObject(c, "Create", index_def(ix, tp));
		cJSON_AddItemToArray(upd, c);
		rc = ddb_call(d, "UpdateTable", req, "ValidationException", &resp, err);
		cJSON_Delete(req);
		/* An endpoint that takes the request and drops the index (dynalite
		 * does) would leave us waiting for an index that never comes. */
		if (rc == IK_OK && !index_status(cJSON_GetObjectItemCaseSensitive(resp,
		                                 "TableDescription"), ix->name))
			rc = ik_errf(err, IK_CONFIG, "dynamodb UpdateTable: table %s: the endpoint "
			             "accepted the index %s but did not add it (dynalite "
			             "cannot add an index to a table; recreate the table with "
			             "idemp-init)", d->table, ix->name);
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
		ik_log(IK_LOG_INFO, "adding index", "table", d->table, "index", ix->name, NULL);
	return rc;
}

/* The stream the outbox relay reads (store_dynamodb_stream.c): on a table
 * without one, turned on (NEW_IMAGE); a stream the table has already is
 * left as its owner set it (another view type cannot be changed without
 * turning it off, which would cut its readers: the relay reads the index
 * then, and says so).  An endpoint without streams (dynalite) is told
 * nothing it does not keep: the relay reads the index there. */
static void
add_stream_spec(cJSON *req)
{
	cJSON *ss = cJSON_AddObjectToObject(req, "StreamSpecification");

	cJSON_AddTrueToObject(ss, "StreamEnabled");
	cJSON_AddStringToObject(ss, "StreamViewType", "NEW_IMAGE");
}

static int
ensure_stream(struct ddb *d, const cJSON *table, ik_err *err)
{
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(table, "StreamSpecification");
	cJSON *req, *resp = NULL;
	int rc;

	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "StreamEnabled")))
		return IK_OK;
	req = ddb_new_req(d, NULL);
	add_stream_spec(req);
	rc = ddb_call(d, "UpdateTable", req, "ValidationException", &resp, err);
	cJSON_Delete(req);
	cJSON_Delete(resp);
	if (rc == IK_AWS_ERROR) {
		ik_log(IK_LOG_INFO, "the DynamoDB endpoint keeps no streams here; the outbox "
		       "relay reads the outbox index", "table", d->table, "error", err->msg, NULL);
		ik_errclear(err);
		return IK_OK;
	}
	if (rc == IK_OK)
		ik_log(IK_LOG_INFO, "turned the table's stream on, for the outbox relay",
		       "table", d->table, NULL);
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

	req = ddb_new_req(d, NULL);
	cJSON_AddStringToObject(req, "FilterExpression", filter);
	cJSON_AddStringToObject(req, "ProjectionExpression", "#k, #st");
	ddb_add_names(d, req, "#k #st #os");
	v = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":done", ddb_av_s("DONE"));
	cJSON_AddTrueToObject(req, "ConsistentRead");
	do {
		cJSON_Delete(resp);
		resp = NULL;
		if ((rc = ddb_call(d, "Scan", req, NULL, &resp, err)) != IK_OK)
			break;
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Items")) {
			key = ddb_attr_s(it, d->key);
			state = ddb_attr_s(it, "state");
			if (!key || !state || ik_state_parse(state) == IK_ST_NONE)
				continue;
			r = ddb_new_req(d, key);
			rv = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
			cJSON_AddItemToObject(rv, ":st", ddb_av_s(state));
			cJSON_AddItemToObject(rv, ":os", ddb_av_s(ddb_open_key(os, ik_state_parse(state), key)));
			rc = ddb_cond_update(d, r, "#st = :st AND attribute_not_exists(#os)",
			                 "SET #os = :os", err);
			if (rc == IK_LEASE_LOST)
				rc = IK_OK;
			if (rc != IK_OK)
				break;
			n++;
		}
	} while (rc == IK_OK && ddb_next_page(req, resp));
	cJSON_Delete(req);
	cJSON_Delete(resp);
	if (rc == IK_OK && n) {
		char buf[32];
		snprintf(buf, sizeof buf, "%ld", n);
		ik_log(IK_LOG_INFO, "indexed unfinished records", "table", d->table,
		       "index", DDB_OPEN_INDEX, "records", buf, NULL);
	}
	return rc;
}

int
ddb_init(struct ik_store *st, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *resp = NULL, *req, *a, *t, *s;
	int64_t deadline = ik_mono_ms() + ACTIVE_WAIT_MS;
	const char *ix;
	long nap = 50;
	int rc, created = 0, added = 0, ready, streamed = 0;
	size_t i;

	for (;;) {
		rc = ddb_describe(d, &resp, err);
		if (rc == IK_AWS_ERROR && !created) {
			cJSON_Delete(resp);
			resp = NULL;
			ik_errclear(err);
			req = ddb_new_req(d, NULL);
			a = cJSON_AddArrayToObject(req, "AttributeDefinitions");
			add_attr_def(a, d->key, "S");
			for (i = 0; i < NINDEX; i++) {
				add_attr_def(a, indexes[i].hash, "S");
				add_attr_def(a, indexes[i].range, "N");
			}
			a = cJSON_AddArrayToObject(req, "GlobalSecondaryIndexes");
			for (i = 0; i < NINDEX; i++)
				cJSON_AddItemToArray(a, index_def(&indexes[i], NULL));
			a = cJSON_AddArrayToObject(req, "KeySchema");
			t = cJSON_CreateObject();
			cJSON_AddStringToObject(t, "AttributeName", d->key);
			cJSON_AddStringToObject(t, "KeyType", "HASH");
			cJSON_AddItemToArray(a, t);
			cJSON_AddStringToObject(req, "BillingMode", "PAY_PER_REQUEST");
			if (ik_outbox_url())
				add_stream_spec(req);
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
			/* A table from before an index gets it, one at a time (an
			 * UpdateTable adds one); the outbox's only when the outbox
			 * is on (a table made since has it anyway). */
			ready = cJSON_IsString(s) && strcmp(s->valuestring, "ACTIVE") == 0;
			for (i = 0; ready && i < NINDEX; i++) {
				if (strcmp(indexes[i].name, DDB_OUTBOX_INDEX) == 0 && !ik_outbox_url())
					continue;
				if ((ix = index_status(t, indexes[i].name)) && strcmp(ix, "ACTIVE") == 0)
					continue;
				ready = 0;
				if (!ix && !(added & 1 << i)) {
					added |= 1 << i;
					if ((rc = add_index(d, t, &indexes[i], err)) != IK_OK) {
						cJSON_Delete(resp);
						return rc;
					}
				}
			}
			if (ready && ik_outbox_url() && !streamed) {
				/* The table is ACTIVE again after it (an UpdateTable
				 * makes it UPDATING for a moment). */
				streamed = 1;
				if ((rc = ensure_stream(d, t, err)) != IK_OK) {
					cJSON_Delete(resp);
					return rc;
				}
				ready = 0;
			}
			if (ready)
				break;
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

