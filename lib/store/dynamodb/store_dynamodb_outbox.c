/* store_dynamodb_outbox.c: the DynamoDB store's outbox (store.h, outbox.h).
 *
 * Rules: with $IDEMKIT_OUTBOX set, the finish's own conditional UpdateItem
 * (and the re-notification's) also sets the event on the record's item:
 * obFin, a Map of what only the finish knows (its time, state, the bank's
 * reference and the reason), or obRen (the re-notification's time), and
 * obPend + obAt, the keys of the sparse index idemkit-outbox, which holds
 * the items with an event not yet published and nothing else.  A write
 * that does not match sets nothing, so a refused finish has no event.
 * The event's other fields are the record's own and do not change after
 * a finish (the charge's event, attempts, the owner the eventId is
 * derived from: ik_outbox_event_id, as on every store), so the relay
 * builds the same event body on every re-publish.
 * The relay learns which items have an event waiting from the table's
 * stream where it has one (store_dynamodb_stream.c), else from the index
 * (eventually consistent, like every index read), and sweeps the index
 * too, as that file says; then it reads the items so found with
 * consistent BatchGetItems, so an event checkpointed a moment ago (or
 * shown by both) is not sent again; an item holds at
 * most a finished and a re-notified event, in that order.  It reads up to
 * AHEAD_MAX events at once and keeps them for the next batches while its
 * lease holds (the read-ahead, below), and checkpoints a batch (up to
 * IK_OUTBOX_BATCH_MAX: outbox_batch) with its updates all at once.  The checkpoint
 * removes the event from its item, conditioned on the event's time (a
 * newer one, after an idemp-forget and a new claim, stays).  What was
 * published is not kept, so the purge has nothing to delete.
 * The relay's lease is one more item of the table, key DDB_RELAY_KEY, taken by one
 * conditional UpdateItem.  The checkpoint of a batch is one transaction
 * with the lease's check, or, item by item (below), made only after a
 * consistent read found the lease ours and live: a checkpoint only ever
 * records events the queue accepted, so one made by a relay whose lease
 * just ended is true all the same (the new holder sends them again,
 * under the same eventIds, at worst).
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

#define TYPE_FIN "charge.finished"
#define TYPE_REN "charge.renotified"
#define AHEAD_MAX (4 * DDB_OUTBOX_BATCH)   /* events read ahead (below) */
#define BGI_MAX 100          /* BatchGetItem's most keys per call */
#define TX_MAX 100           /* TransactWriteItems' most items */
#define PAR_MAX 64           /* calls in flight at once (par_send) */

/* ---- calls at once --------------------------------------------------------
 * The relay's reads of the index's shards and its checkpoint's updates go
 * out together (ik_aws_submit), not one after another: a round's time is
 * what its lease must cover. */
struct par {
	int done, rc;
	cJSON *resp;
	struct ik_aws_error ae;
	ik_err err;
};

static void
par_answered(void *arg, int rc, cJSON *resp, const struct ik_aws_error *aerr, const ik_err *err)
{
	struct par *p = arg;

	p->done = 1;
	p->rc = rc;
	p->resp = resp;
	if (aerr)
		p->ae = *aerr;
	if (rc != IK_OK && err)
		p->err = *err;
}

/* The n requests of op (a literal) at once, at most PAR_MAX in flight
 * (as idemp-done --stream keeps its finishes: a burst of a whole batch's
 * connections at once is refused by the listen queue of a small endpoint),
 * each answered into p[i] as ddb_answer says (pass as there); p[i].resp is
 * the caller's to free.  IK_OK when every one was sent and answered (each
 * with its own rc), else the error that kept one from being sent (none is
 * sent after it) or the answers lost. */
#define par_calls(d, op, pass, reqs, p, n, err) \
	par_send((d), DDB_TARGET_PREFIX op, (pass), (reqs), (p), (n), (err))
static int
par_send(struct ddb *d, const char *target, const char *pass, cJSON *const *reqs,
         struct par *p, size_t n, ik_err *err)
{
	size_t i, sent = 0, done = 0;
	int rc = IK_OK;

	memset(p, 0, n * sizeof *p);
	/* Bounded: each turn sends one more or waits for an answer. */
	for (;;) {
		while (rc == IK_OK && sent < n && sent - done < PAR_MAX)
			if ((rc = ik_aws_submit(d->aws, target, reqs[sent], par_answered, &p[sent],
			    err)) == IK_OK)
				sent++;
		for (done = 0, i = 0; i < sent; i++)
			done += p[i].done;
		if (done == sent && (sent == n || rc != IK_OK))
			break;
		if (done < sent && ik_aws_run(d->aws, NULL, 0, -1, err) != IK_OK)
			return err->code ? err->code : IK_SOFTWARE;
	}
	for (i = 0; i < sent; i++)
		p[i].rc = ddb_answer(d, pass, p[i].rc, &p[i].resp, &p[i].ae, &p[i].err);
	return rc;
}

static void
par_free(struct par *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cJSON_Delete(p[i].resp);
}

/* ---- the relay's lease --------------------------------------------------- */

int
ddb_outbox_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
                 int64_t *until, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, DDB_RELAY_KEY), *v, *resp = NULL, *item;
	const char *h;
	int rc;

	cJSON_AddStringToObject(r, "ConditionExpression",
	                        "attribute_not_exists(#rh) OR #rh = :h OR #ru <= :now");
	cJSON_AddStringToObject(r, "UpdateExpression", "SET #rh = :h, #ru = :u");
	ddb_add_names(d, r, "#rh #ru");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":h", ddb_av_s(holder));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(now_ms));
	cJSON_AddItemToObject(v, ":u", ddb_av_n(now_ms + lease_ms));
	cJSON_AddStringToObject(r, "ReturnValuesOnConditionCheckFailure", "ALL_OLD");
	/* The lease before: whether this was a renewal of ours (below). */
	cJSON_AddStringToObject(r, "ReturnValues", "UPDATED_OLD");
	rc = ddb_call(d, "UpdateItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(r);
	*until = now_ms + lease_ms;
	if (!d->obx_holder || strcmp(d->obx_holder, holder) != 0) {
		free(d->obx_holder);
		d->obx_holder = strdup(holder);
	}
	if (rc != IK_AWS_ERROR) {
		item = cJSON_GetObjectItemCaseSensitive(resp, "Attributes");
		h = ddb_attr_s(item, "relayHolder");
		/* The read-ahead holds only while the lease was ours throughout:
		 * taken afresh (another may have checkpointed meanwhile), ended, or
		 * not known to be ours, it is read again. */
		if (rc != IK_OK || lease_ms == 0 || !h || strcmp(h, holder) != 0 ||
		    ddb_attr_n(item, "relayUntil") <= now_ms) {
			ddb_outbox_close(d);
			ddb_stream_reload(d);
		}
		cJSON_Delete(resp);
		return rc;
	}
	ddb_outbox_close(d);
	ddb_stream_reload(d);
	ik_errclear(err);
	/* Another's live lease: its end, from ALL_OLD or a read (dynalite). */
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	if (!cJSON_IsObject(item) || !item->child) {
		cJSON_Delete(resp);
		resp = NULL;
		r = ddb_get_req(d, DDB_RELAY_KEY);
		rc = ddb_call(d, "GetItem", r, NULL, &resp, err);
		cJSON_Delete(r);
		if (rc != IK_OK)
			return rc;
		item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	}
	*until = ddb_attr_n(item, "relayUntil");
	cJSON_Delete(resp);
	return IK_DUP_IN_PROGRESS;
}

/* Whether holder's lease is live at now_ms, by a consistent read. */
static int
lease_held(struct ddb *d, const char *holder, int64_t now_ms, ik_err *err)
{
	cJSON *r = ddb_get_req(d, DDB_RELAY_KEY), *resp = NULL, *item;
	const char *h;
	int rc = ddb_call(d, "GetItem", r, NULL, &resp, err);

	cJSON_Delete(r);
	if (rc != IK_OK)
		return rc;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	h = ddb_attr_s(item, "relayHolder");
	rc = h && strcmp(h, holder) == 0 && ddb_attr_n(item, "relayUntil") > now_ms ?
	     IK_OK : IK_LEASE_LOST;
	cJSON_Delete(resp);
	return rc;
}

/* ---- reading the events ------------------------------------------------- */

/* One Query page of the outbox index's shard, oldest first. */
static cJSON *
pend_req(struct ddb *d, int shard, size_t limit, const char *projection)
{
	cJSON *req = ddb_new_req(d, NULL), *v;
	char p[16], exprs[96];

	snprintf(p, sizeof p, "%d", shard);
	cJSON_AddStringToObject(req, "IndexName", DDB_OUTBOX_INDEX);
	cJSON_AddStringToObject(req, "KeyConditionExpression", "#obp = :p");
	v = cJSON_AddObjectToObject(req, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":p", ddb_av_s(p));
	if (limit)
		cJSON_AddNumberToObject(req, "Limit", (double)limit);
	snprintf(exprs, sizeof exprs, "#obp %s", projection ? projection : "");
	if (projection)
		cJSON_AddStringToObject(req, "ProjectionExpression", projection);
	ddb_add_names(d, req, exprs);
	return req;
}

/* A Query's answer on the outbox index (ddb_answer passing
 * ValidationException): IK_CONFIG when the table has no index yet. */
static int
pend_answer(struct ddb *d, int rc, cJSON **resp, ik_err *err)
{
	if (rc != IK_AWS_ERROR)
		return rc;
	cJSON_Delete(*resp);
	*resp = NULL;
	if (strstr(err->msg, "ndex"))
		return ddb_errsuffix(err, IK_CONFIG, " (table %s: no index " DDB_OUTBOX_INDEX
		                     "; run idemp-init with IDEMKIT_OUTBOX set to add it)",
		                     d->table);
	return IK_SOFTWARE;
}

static int
query_pend(struct ddb *d, cJSON *req, cJSON **resp, ik_err *err)
{
	return pend_answer(d, ddb_call(d, "Query", req, "ValidationException", resp, err),
	                   resp, err);
}

static int
by_at(const void *a, const void *b)
{
	int64_t x = ddb_attr_n(*(cJSON *const *)a, "obAt");
	int64_t y = ddb_attr_n(*(cJSON *const *)b, "obAt");

	return x < y ? -1 : x > y;
}

/* The event's fields from the record's event (the ChargeDueEvent), null
 * when the record's event is not JSON (never one idemp-claim accepted):
 * a finish is never refused for it, the money moved. */
static void
add_from_event(cJSON *o, const cJSON *ev, const char *name)
{
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(ev, name);

	cJSON_AddItemToObject(o, name, f ? cJSON_Duplicate(f, 1) : cJSON_CreateNull());
}

static void
add_s_or_null(cJSON *o, const char *name, const char *s)
{
	if (s)
		cJSON_AddStringToObject(o, name, s);
	else
		cJSON_AddNullToObject(o, name);
}

/* The event of item's finish (m: obFin) or re-notification (obRen), as
 * idemkit(7) and docs/outbox-event.schema.json say, in the fields' order
 * the other stores write.  0, or -1 when out of memory. */
static int
make_ev(const cJSON *item, const char *keyattr, const char *type, const cJSON *m,
        cJSON *ev, struct ik_outbox_ev *e)
{
	const char *key = ddb_attr_s(item, keyattr), *owner = ddb_attr_s(item, "owner");
	int fin = strcmp(type, TYPE_FIN) == 0;
	char id[IK_EVENT_ID_HEX];
	cJSON *o = cJSON_CreateObject();

	ik_outbox_event_id(fin ? "finish" : "renotified", key, owner, id);
	memset(e, 0, sizeof *e);
	e->at = e->seq = ddb_attr_n(m, "t");
	cJSON_AddNumberToObject(o, "v", 1);
	cJSON_AddStringToObject(o, "type", type);
	cJSON_AddStringToObject(o, "eventId", id);
	cJSON_AddStringToObject(o, "chargeId", key);
	add_from_event(o, ev, "accountId");
	add_from_event(o, ev, "amount");
	add_from_event(o, ev, "currency");
	add_from_event(o, ev, "chargeType");
	add_s_or_null(o, "bankRef", fin ? ddb_attr_s(m, "r") : ddb_attr_s(item, "debitRef"));
	add_s_or_null(o, "state", fin ? ddb_attr_s(m, "s") : "DONE");
	add_s_or_null(o, "reason", fin ? ddb_attr_s(m, "e") : NULL);
	cJSON_AddNumberToObject(o, "attempts", (double)ddb_attr_n(item, "attempts"));
	cJSON_AddNumberToObject(o, "at", (double)e->at);
	e->body = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	e->id = strdup(id);
	e->charge_id = strdup(key);
	e->type = strdup(type);
	if (!e->body || !e->id || !e->charge_id || !e->type) {
		ik_outbox_ev_free(e);
		return -1;
	}
	return 0;
}

/* The update that removes an event from its item, conditioned on its
 * time.  pass 0: as the item's last event (the index keys go too); pass 1,
 * a finished event with a re-notified one behind it: the finished one
 * only (the item keeps its place in the index, at the next one's time). */
static cJSON *
clear_req(struct ddb *d, const char *key, int fin, int pass, int64_t at)
{
	const char *cond = fin ?
	    (pass ? "#obf.#obt = :t" : "#obf.#obt = :t AND attribute_not_exists(#obr)") :
	    "#obr.#obt = :t AND attribute_not_exists(#obf)";
	const char *upd = fin ?
	    (pass ? "REMOVE #obf SET #oba = #obr.#obt" : "REMOVE #obf, #obp, #oba") :
	    "REMOVE #obr, #obp, #oba";
	char exprs[160];
	cJSON *r = ddb_new_req(d, key), *v;

	cJSON_AddStringToObject(r, "ConditionExpression", cond);
	cJSON_AddStringToObject(r, "UpdateExpression", upd);
	snprintf(exprs, sizeof exprs, "%s %s", cond, upd);
	ddb_add_names(d, r, exprs);
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":t", ddb_av_n(at));
	return r;
}

/* An event removed from its item after pass 0 (answered rc) was refused:
 * pass 1 for a finished one.  IK_OK also when it was gone already
 * (another relay's checkpoint). */
static int
clear_more(struct ddb *d, const char *key, int fin, int64_t at, int rc, ik_err *err)
{
	cJSON *r, *resp = NULL;

	if (rc != IK_AWS_ERROR)
		return rc;
	ik_errclear(err);
	if (!fin)
		return IK_OK;
	r = clear_req(d, key, fin, 1, at);
	rc = ddb_call(d, "UpdateItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(r);
	cJSON_Delete(resp);
	if (rc != IK_AWS_ERROR)
		return rc;
	ik_errclear(err);
	return IK_OK;
}

static int
clear_ev(struct ddb *d, const char *key, const char *type, int64_t at, ik_err *err)
{
	int fin = strcmp(type, TYPE_FIN) == 0, rc;
	cJSON *r = clear_req(d, key, fin, 0, at), *resp = NULL;

	rc = ddb_call(d, "UpdateItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(r);
	cJSON_Delete(resp);
	return clear_more(d, key, fin, at, rc, err);
}

/* ---- the read-ahead --------------------------------------------------------
 * One read of the index and of the items behind it is three round trips in
 * series; made per batch it was most of the relay's time.  So a read takes
 * up to AHEAD_MAX events at once and keeps them (d->obx, oldest first);
 * outbox_read hands out copies of the first ones and only the checkpoint
 * removes them, so what a batch did not send (a cut at a chargeId's second
 * event, a queue that refused one) is read again first, as the port says.
 * It stays true while this relay holds the lease without a break: only the
 * holder checkpoints, a finish adds no event to an item whose event waits
 * (a re-notification behind one is left in the index, for the next read),
 * and idemp-forget leaves an item whose event waits.  So it is dropped
 * whenever the lease was not simply renewed, and after a failed
 * checkpoint. */

void
ddb_outbox_close(struct ddb *d)
{
	for (size_t i = 0; i < d->obx_n; i++)
		ik_outbox_ev_free(&d->obx[i]);
	free(d->obx);
	d->obx = NULL;
	d->obx_n = 0;
	ddb_stream_rewind(d);
}

/* The consistent items of found[0..n) (the keys the index gave, oldest
 * first), BatchGetItem's BGI_MAX keys a call, the calls at once: what the
 * index said may be a moment old.  *items: every item answered, oldest
 * first (the caller frees it); keys left unprocessed (throttling) wait
 * for the next read, *partial set then. */
static int
fresh_items(struct ddb *d, cJSON **found, size_t n, cJSON **items, int *partial,
            ik_err *err)
{
	size_t nc = (n + BGI_MAX - 1) / BGI_MAX, c, i, m = 0;
	struct par *p = calloc(nc, sizeof *p);
	cJSON **reqs = calloc(nc, sizeof *reqs), **a = NULL, *it, *keys, *k, *t;
	int rc = IK_OK;

	*items = cJSON_CreateArray();
	if (!p || !reqs || !*items) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	for (c = 0; c < nc; c++) {
		reqs[c] = cJSON_CreateObject();
		t = cJSON_AddObjectToObject(cJSON_AddObjectToObject(reqs[c], "RequestItems"),
		                            d->table);
		keys = cJSON_AddArrayToObject(t, "Keys");
		cJSON_AddTrueToObject(t, "ConsistentRead");
		for (i = c * BGI_MAX; i < n && i < (c + 1) * BGI_MAX; i++) {
			k = cJSON_CreateObject();
			cJSON_AddItemToObject(k, d->key, ddb_av_s(ddb_attr_s(found[i], d->key)));
			cJSON_AddItemToArray(keys, k);
		}
	}
	rc = par_calls(d, "BatchGetItem", NULL, reqs, p, nc, err);
	for (c = 0; c < nc && rc == IK_OK; c++)
		if ((rc = p[c].rc) != IK_OK)
			*err = p[c].err;
	if (rc != IK_OK)
		goto out;
	*partial = 0;
	for (c = 0; c < nc; c++) {
		m += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(p[c].resp, "Responses"), d->table));
		t = cJSON_GetObjectItemCaseSensitive(p[c].resp, "UnprocessedKeys");
		*partial |= cJSON_IsObject(t) && t->child;
	}
	if (m && !(a = calloc(m, sizeof *a))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	for (m = 0, c = 0; c < nc; c++) {
		t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p[c].resp,
		    "Responses"), d->table);
		while (t && (it = t->child))
			a[m++] = cJSON_DetachItemViaPointer(t, it);
	}
	/* BatchGetItem answers in no order: oldest first again. */
	qsort(a, m, sizeof *a, by_at);
	for (i = 0; i < m; i++)
		cJSON_AddItemToArray(*items, a[i]);
out:
	for (c = 0; reqs && c < nc; c++)
		cJSON_Delete(reqs[c]);
	if (p)
		par_free(p, nc);
	free(p);
	free(reqs);
	free(a);
	return rc;
}

/* The events of items (oldest first) into d->obx, which holds none now
 * (its array, emptied by the checkpoints, is made anew).  idemp-run's
 * records are no charge: their events are dropped, never published (as
 * the other stores write none). */
static int
take_items(struct ddb *d, cJSON *items, ik_err *err)
{
	size_t cap = 2 * (size_t)cJSON_GetArraySize(items);
	cJSON *rec;
	int rc = IK_OK;

	free(d->obx);
	d->obx = NULL;
	d->obx_n = 0;
	if (cap && !(d->obx = calloc(cap, sizeof *d->obx)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	cJSON_ArrayForEach(rec, items) {
		const cJSON *fin = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(rec, "obFin"), "M");
		const cJSON *ren = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(rec, "obRen"), "M");
		const char *key = ddb_attr_s(rec, d->key), *body = ddb_attr_s(rec, "event");
		cJSON *evj = body ? cJSON_Parse(body) : NULL;

		if (!key) {
			cJSON_Delete(evj);
			continue;
		}
		if (cJSON_GetObjectItemCaseSensitive(evj, "idempRun")) {
			if (fin)
				rc = clear_ev(d, key, TYPE_FIN, ddb_attr_n(fin, "t"), err);
			if (rc == IK_OK && ren)
				rc = clear_ev(d, key, TYPE_REN, ddb_attr_n(ren, "t"), err);
		} else {
			/* An item's events in their order: finished, re-notified. */
			if (fin && make_ev(rec, d->key, TYPE_FIN, fin, evj, &d->obx[d->obx_n++]) < 0)
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			if (rc == IK_OK && ren &&
			    make_ev(rec, d->key, TYPE_REN, ren, evj, &d->obx[d->obx_n++]) < 0)
				rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		}
		cJSON_Delete(evj);
		if (rc != IK_OK)
			return rc;
	}
	return IK_OK;
}

/* The events of the items found[0..nf) names (the oldest max of them)
 * into the read-ahead, read again consistently; *partial set when some
 * were left for later. */
static int
take_found(struct ddb *d, cJSON **found, size_t nf, size_t max, int *partial,
           ik_err *err)
{
	cJSON *items = NULL;
	int rc;

	*partial = 0;
	if (!nf)
		return IK_OK;
	qsort(found, nf, sizeof *found, by_at);
	if ((rc = fresh_items(d, found, nf < max ? nf : max, &items, partial, err)) == IK_OK)
		rc = take_items(d, items, err);
	*partial |= nf > max;
	cJSON_Delete(items);
	return rc;
}

/* Fills the read-ahead: the oldest AHEAD_MAX items of the index (each
 * shard's oldest, merged), read again consistently. */
static int
read_ahead(struct ddb *d, ik_err *err)
{
	struct par p[DDB_OPEN_SHARDS];
	cJSON *reqs[DDB_OPEN_SHARDS], *it;
	cJSON **found = NULL;
	size_t nf = 0, cap = 0;
	int rc = IK_OK, shard, partial;

	ddb_outbox_close(d);
	for (shard = 0; shard < DDB_OPEN_SHARDS; shard++)
		reqs[shard] = pend_req(d, shard, AHEAD_MAX, "#k, #obp, #oba");
	rc = par_calls(d, "Query", "ValidationException", reqs, p, DDB_OPEN_SHARDS, err);
	for (shard = 0; shard < DDB_OPEN_SHARDS; shard++)
		cJSON_Delete(reqs[shard]);
	for (shard = 0; shard < DDB_OPEN_SHARDS && rc == IK_OK; shard++)
		if ((rc = pend_answer(d, p[shard].rc, &p[shard].resp, &p[shard].err)) != IK_OK)
			*err = p[shard].err;
	if (rc != IK_OK)
		goto out;
	for (shard = 0; shard < DDB_OPEN_SHARDS; shard++) {
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p[shard].resp, "Items")) {
			if (nf == cap) {
				cJSON **t = realloc(found, (cap = cap ? cap * 2 : 16) * sizeof *t);
				if (!t) {
					rc = ik_errf(err, IK_SOFTWARE, "out of memory");
					goto out;
				}
				found = t;
			}
			found[nf++] = it;
		}
	}
	rc = take_found(d, found, nf, AHEAD_MAX, &partial, err);
out:
	par_free(p, DDB_OPEN_SHARDS);
	free(found);
	if (rc != IK_OK)
		ddb_outbox_close(d);
	return rc;
}

/* Fills the read-ahead from the table's stream: IK_EMPTY when the index is
 * to be read instead.  What the stream showed with no event waiting now
 * (checkpointed already, or a write that carried none) is done at once. */
static int
read_stream(struct ddb *d, ik_err *err)
{
	cJSON *images = NULL, **found = NULL, *it;
	size_t nf = 0, i = 0;
	int rc, partial = 0;

	if ((rc = ddb_stream_read(d, &images, err)) != IK_OK)
		return rc;
	/* An item the stream showed more than once is read once. */
	nf = (size_t)cJSON_GetArraySize(images);
	if (nf && !(found = calloc(nf, sizeof *found))) {
		cJSON_Delete(images);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	cJSON_ArrayForEach(it, images) {
		const char *k = ddb_attr_s(it, d->key);
		size_t j;

		for (j = 0; j < i && strcmp(ddb_attr_s(found[j], d->key), k) != 0; j++)
			;
		if (j == i)
			found[i++] = it;
	}
	/* Every item it showed: the stream is read on past them. */
	rc = take_found(d, found, i, i, &partial, err);
	free(found);
	cJSON_Delete(images);
	if (rc == IK_OK && partial) {
		/* Items not read now: the index has them; the stream again
		 * from the checkpoint. */
		ddb_outbox_close(d);
		ddb_stream_lost(d);
	} else if (rc == IK_OK && d->obx_n == 0) {
		ddb_stream_drained(d);
		if (ddb_stream_commit(d, d->obx_holder, ik_now_ms(), err) != IK_OK) {
			ik_log(IK_LOG_DEBUG, "outbox: the stream's position not written now",
			       "error", err->msg, NULL);
			ik_errclear(err);
		}
	} else if (rc != IK_OK) {
		ddb_outbox_close(d);
	}
	return rc;
}

/* Where the events read came from, for an operator (and the tests). */
static void
read_said(struct ddb *d, const char *from)
{
	char n[24];

	if (!d->obx_n)
		return;
	snprintf(n, sizeof n, "%zu", d->obx_n);
	ik_log(IK_LOG_DEBUG, "outbox events read", "from", from, "events", n, NULL);
}

/* Fills the read-ahead, from the stream or by a sweep of the index
 * (store_dynamodb_stream.c says when). */
static int
fill(struct ddb *d, ik_err *err)
{
	int64_t from;
	size_t i;
	int rc;

	if (!ddb_stream_sweep_due(d) || !d->obs) {
		rc = read_stream(d, err);
		if (rc != IK_EMPTY) {
			read_said(d, "stream");
			return rc;
		}
	}
	from = ddb_stream_sweep_from(d);
	if ((rc = read_ahead(d, err)) == IK_OK) {
		for (i = 0; i < d->obx_n && d->obx[i].at >= from; i++)
			;
		ddb_stream_swept(d, i < d->obx_n);
		read_said(d, "index");
	}
	return rc;
}

int
ddb_outbox_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
                ik_err *err)
{
	struct ddb *d = st->impl;
	int rc;

	*n = 0;
	if (max == 0)
		return IK_OK;
	/* Fewer than a batch left (the end of what was read ahead, or what a
	 * batch left behind): read the index afresh, those first again, so no
	 * batch is cut short by the read-ahead's end.  Read from the stream,
	 * the rest goes out first: the stream is read on from where it was. */
	if ((d->obx_n == 0 || (d->obx_n < max && ddb_stream_sweep_due(d))) &&
	    (rc = fill(d, err)) != IK_OK)
		return rc;
	for (; *n < max && *n < d->obx_n; (*n)++)
		if (ik_outbox_ev_copy(&ev[*n], &d->obx[*n]) < 0) {
			for (size_t i = 0; i < *n; i++)
				ik_outbox_ev_free(&ev[i]);
			*n = 0;
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		}
	return IK_OK;
}

/* The read-ahead without the events checkpointed (by eventId). */
static void
ahead_drop(struct ddb *d, const struct ik_outbox_ev *ev, size_t n)
{
	size_t i, j, k = 0;

	for (i = 0; i < d->obx_n; i++) {
		for (j = 0; j < n && strcmp(d->obx[i].id, ev[j].id) != 0; j++)
			;
		if (j < n)
			ik_outbox_ev_free(&d->obx[i]);
		else
			d->obx[k++] = d->obx[i];
	}
	d->obx_n = k;
}

/* ---- the checkpoint ---------------------------------------------------------
 * Where the endpoint keeps transactions (DynamoDB, DynamoDB Local), a
 * batch's checkpoint is one TransactWriteItems: the lease's check and the
 * events' updates, all or nothing, so a relay that lost its lease
 * checkpoints nothing, exactly, and a batch costs one request, not one per
 * event (each write counts twice in a transaction's capacity).  When the
 * transaction is refused for an item (a re-notification behind its
 * finished event, an event checkpointed already, a write on the item at
 * the same moment), or the endpoint keeps none (dynalite), the per-item
 * checkpoint below does the batch: the lease read, then the updates at
 * once, each item's own refusal judged alone. */

/* The per-item checkpoint of ev[0..n). */
static int
ack_items(struct ddb *d, const char *holder, const struct ik_outbox_ev *ev, size_t n,
          int64_t now_ms, ik_err *err)
{
	struct par *p;
	cJSON **reqs;
	size_t i;
	int rc;

	if ((rc = lease_held(d, holder, now_ms, err)) != IK_OK)
		return rc;
	p = calloc(n, sizeof *p);
	reqs = calloc(n, sizeof *reqs);
	if (!p || !reqs) {
		free(p);
		free(reqs);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	for (i = 0; i < n; i++)
		reqs[i] = clear_req(d, ev[i].charge_id, strcmp(ev[i].type, TYPE_FIN) == 0, 0,
		                    ev[i].seq);
	rc = par_calls(d, "UpdateItem", "ConditionalCheckFailedException", reqs, p, n, err);
	for (i = 0; i < n; i++)
		cJSON_Delete(reqs[i]);
	for (i = 0; i < n && rc == IK_OK; i++) {
		rc = clear_more(d, ev[i].charge_id, strcmp(ev[i].type, TYPE_FIN) == 0, ev[i].seq,
		                p[i].rc, &p[i].err);
		if (rc != IK_OK)
			*err = p[i].err;
	}
	par_free(p, n);
	free(p);
	free(reqs);
	return rc;
}

/* The transaction's item for r (a request on the table, consumed). */
static void
tx_add(cJSON *items, const char *kind, cJSON *r)
{
	cJSON *it = cJSON_CreateObject();

	cJSON_AddItemToObject(it, kind, r);
	cJSON_AddItemToArray(items, it);
}

/* The transactional checkpoint of ev[0..n) (n < TX_MAX).  IK_OK, IK_LEASE_LOST
 * (nothing done), IK_EMPTY when the per-item checkpoint must do it
 * (nothing done), or an error (done or not: the batch is sent again). */
static int
ack_tx(struct ddb *d, const char *holder, const struct ik_outbox_ev *ev, size_t n,
       int64_t now_ms, ik_err *err)
{
	cJSON *req = cJSON_CreateObject(), *items, *r, *v, *resp = NULL, *why;
	struct ik_aws_error ae;
	const char *code;
	size_t i;
	int rc;

	items = cJSON_AddArrayToObject(req, "TransactItems");
	r = ddb_new_req(d, DDB_RELAY_KEY);
	cJSON_AddStringToObject(r, "ConditionExpression", "#rh = :h AND #ru > :now");
	ddb_add_names(d, r, "#rh #ru");
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":h", ddb_av_s(holder));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(now_ms));
	tx_add(items, "ConditionCheck", r);
	for (i = 0; i < n; i++)
		tx_add(items, "Update", clear_req(d, ev[i].charge_id,
		       strcmp(ev[i].type, TYPE_FIN) == 0, 0, ev[i].seq));
	rc = ik_aws_call(d->aws, DDB_TARGET_PREFIX "TransactWriteItems", req, &resp, &ae, err);
	cJSON_Delete(req);
	if (rc == IK_AWS_ERROR && strcmp(ae.type, "TransactionCanceledException") == 0) {
		/* The reasons in the items' order, the lease's first. */
		why = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(resp,
		    "CancellationReasons"), 0);
		code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(why, "Code"));
		rc = code && strcmp(code, "ConditionalCheckFailed") == 0 ? IK_LEASE_LOST : IK_EMPTY;
		ik_errclear(err);
	} else if (rc == IK_AWS_ERROR || rc == IK_CONFIG) {
		/* No transactions here (dynalite: UnknownOperationException), or a
		 * role without ConditionCheckItem (a relay deployed before this
		 * checkpoint, AccessDenied): the per-item checkpoint from now on,
		 * which needs no more than it had (bad credentials fail there). */
		ik_log(rc == IK_CONFIG ? IK_LOG_WARN : IK_LOG_DEBUG, "outbox checkpoint item by "
		       "item: no transaction here", "error", err->msg, NULL);
		d->obx_no_tx = 1;
		rc = IK_EMPTY;
		ik_errclear(err);
	}
	cJSON_Delete(resp);
	return rc;
}

int
ddb_outbox_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev,
               size_t n, int64_t now_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	size_t i, k;
	int rc = IK_OK;

	/* Bounded: each turn checkpoints a chunk or ends. */
	for (i = 0; i < n && rc == IK_OK; i += k) {
		k = n - i < TX_MAX - 1 ? n - i : TX_MAX - 1;
		rc = d->obx_no_tx ? IK_EMPTY : ack_tx(d, holder, ev + i, k, now_ms, err);
		if (rc == IK_EMPTY)
			rc = ack_items(d, holder, ev + i, k, now_ms, err);
	}
	/* A checkpoint refused or failed part way: read afresh.  Every event
	 * read so far checkpointed: so is the stream's part (a position not
	 * written now is written with the next; the events are checkpointed
	 * on their items all the same). */
	if (rc != IK_OK) {
		ddb_outbox_close(d);
		return rc;
	}
	ahead_drop(d, ev, n);
	if (d->obx_n == 0) {
		ddb_stream_drained(d);
		if (ddb_stream_commit(d, holder, now_ms, err) != IK_OK) {
			ik_log(IK_LOG_DEBUG, "outbox: the stream's position not written now",
			       "error", err->msg, NULL);
			ik_errclear(err);
		}
	}
	return IK_OK;
}

/* Nothing published is kept on DynamoDB (the checkpoint removed it). */
int
ddb_outbox_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n,
                 ik_err *err)
{
	*n = 0;
	return IK_OK;
}

/* The lag gauge: every shard of the index walked, only the events'
 * times returned; its cost grows with the events waiting, not with the
 * table. */
int
ddb_outbox_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out,
                 ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *req, *resp = NULL, *it;
	int64_t oldest = 0, at;
	int rc = IK_OK, shard;

	memset(out, 0, sizeof *out);
	for (shard = 0; shard < DDB_OPEN_SHARDS && rc == IK_OK; shard++) {
		req = pend_req(d, shard, 0, "#obf.#obt, #obr.#obt, #oba");
		do {
			cJSON_Delete(resp);
			resp = NULL;
			if ((rc = query_pend(d, req, &resp, err)) != IK_OK)
				break;
			cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Items")) {
				out->waiting += !!cJSON_GetObjectItemCaseSensitive(it, "obFin") +
				                !!cJSON_GetObjectItemCaseSensitive(it, "obRen");
				at = ddb_attr_n(it, "obAt");
				if (at && (!oldest || at < oldest))
					oldest = at;
			}
		} while (ddb_next_page(req, resp));
		cJSON_Delete(req);
	}
	cJSON_Delete(resp);
	out->oldest_ms = out->waiting && now_ms > oldest ? now_ms - oldest : 0;
	return rc;
}
