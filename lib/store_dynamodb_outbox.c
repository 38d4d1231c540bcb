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
 * The relay reads the index (eventually consistent, like every index
 * read), then the items it found with one consistent BatchGetItem, so an
 * event checkpointed a moment ago is not sent again; an item holds at
 * most a finished and a re-notified event, in that order.  The checkpoint
 * removes the event from its item, conditioned on the event's time (a
 * newer one, after an idemp-forget and a new claim, stays).  What was
 * published is not kept, so the purge has nothing to delete.
 * The relay's lease is one more item of the table, key RELAY_KEY (no
 * chargeId can be it: '#' is outside their alphabet), taken by one
 * conditional UpdateItem.  The checkpoint of a batch is made only after
 * a consistent read found the lease ours and live: a checkpoint only ever
 * records events the queue accepted, so one made by a relay whose lease
 * just ended is true all the same (the new holder sends them again,
 * under the same eventIds, at worst).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws.h"
#include "log.h"
#include "outbox.h"
#include "outcome.h"
#include "queue.h"
#include "store.h"
#include "store_dynamodb.h"
#include "util.h"

#define RELAY_KEY "idemkit#outbox-relay"
#define TYPE_FIN "charge.finished"
#define TYPE_REN "charge.renotified"

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

/* The n requests of op (a literal) at once, each answered into p[i] as
 * ddb_answer says (pass as there); p[i].resp is the caller's to free.
 * IK_OK when every one was sent and answered (each with its own rc),
 * else the error that kept one from being sent or the answers lost. */
#define par_calls(d, op, pass, reqs, p, n, err) \
	par_send((d), DDB_TARGET_PREFIX op, (pass), (reqs), (p), (n), (err))
static int
par_send(struct ddb *d, const char *target, const char *pass, cJSON *const *reqs,
         struct par *p, size_t n, ik_err *err)
{
	size_t i, sent = 0, done;
	int rc = IK_OK;

	memset(p, 0, n * sizeof *p);
	for (i = 0; i < n && rc == IK_OK; i++)
		if ((rc = ik_aws_submit(d->aws, target, reqs[i], par_answered, &p[i], err)) == IK_OK)
			sent++;
	for (;;) {
		for (done = 0, i = 0; i < sent; i++)
			done += p[i].done;
		if (done == sent)
			break;
		if (ik_aws_run(d->aws, NULL, 0, -1, err) != IK_OK)
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

/* ---- the writes' part: inside the finish's and the re-notification's
 * own UpdateItem (store_dynamodb_write.c) ---------------------------------- */

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

/* ---- the relay's lease --------------------------------------------------- */

int
ddb_outbox_lease(struct ik_store *st, const char *holder, int64_t now_ms, int64_t lease_ms,
                 int64_t *until, ik_err *err)
{
	struct ddb *d = st->impl;
	cJSON *r = ddb_new_req(d, RELAY_KEY), *v, *resp = NULL, *item;
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
	rc = ddb_call(d, "UpdateItem", r, "ConditionalCheckFailedException", &resp, err);
	cJSON_Delete(r);
	*until = now_ms + lease_ms;
	if (rc != IK_AWS_ERROR) {
		cJSON_Delete(resp);
		return rc;
	}
	ik_errclear(err);
	/* Another's live lease: its end, from ALL_OLD or a read (dynalite). */
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	if (!cJSON_IsObject(item) || !item->child) {
		cJSON_Delete(resp);
		resp = NULL;
		r = ddb_get_req(d, RELAY_KEY);
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
	cJSON *r = ddb_get_req(d, RELAY_KEY), *resp = NULL, *item;
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

/* The consistent items of the keys found in the index (up to max): what
 * the index said may be a moment old. */
static int
fresh_items(struct ddb *d, cJSON **found, size_t n, cJSON **resp, cJSON **items,
            ik_err *err)
{
	cJSON *r = cJSON_CreateObject(), *t, *keys, *k;
	int rc;

	t = cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "RequestItems"), d->table);
	keys = cJSON_AddArrayToObject(t, "Keys");
	cJSON_AddTrueToObject(t, "ConsistentRead");
	for (size_t i = 0; i < n; i++) {
		k = cJSON_CreateObject();
		cJSON_AddItemToObject(k, d->key, ddb_av_s(ddb_attr_s(found[i], d->key)));
		cJSON_AddItemToArray(keys, k);
	}
	rc = ddb_call(d, "BatchGetItem", r, NULL, resp, err);
	cJSON_Delete(r);
	if (rc != IK_OK)
		return rc;
	/* Keys left unprocessed (throttling) wait for the next read. */
	*items = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(*resp,
	    "Responses"), d->table);
	if (*items && cJSON_GetArraySize(*items) > 1) {
		/* BatchGetItem answers in no order: oldest first again. */
		size_t m = (size_t)cJSON_GetArraySize(*items), i = 0;
		cJSON **a = calloc(m, sizeof *a), *it;
		if (!a)
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		cJSON_ArrayForEach(it, *items)
			a[i++] = it;
		qsort(a, m, sizeof *a, by_at);
		for (i = 0; i < m; i++)
			cJSON_DetachItemViaPointer(*items, a[i]);
		for (i = 0; i < m; i++)
			cJSON_AddItemToArray(*items, a[i]);
		free(a);
	}
	return IK_OK;
}

int
ddb_outbox_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
                ik_err *err)
{
	struct ddb *d = st->impl;
	struct par p[DDB_OPEN_SHARDS];
	cJSON *reqs[DDB_OPEN_SHARDS], *it, *fresh = NULL, *items = NULL;
	cJSON **found = NULL, *rec;
	size_t nf = 0, cap = 0, i;
	int rc = IK_OK, shard;

	*n = 0;
	if (max == 0)
		return IK_OK;
	/* The oldest max of each shard, merged: the oldest max of all. */
	for (shard = 0; shard < DDB_OPEN_SHARDS; shard++)
		reqs[shard] = pend_req(d, shard, max, "#k, #obp, #oba");
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
	if (!nf)
		goto out;
	qsort(found, nf, sizeof *found, by_at);
	if ((rc = fresh_items(d, found, nf < max ? nf : max, &fresh, &items, err)) != IK_OK)
		goto out;
	cJSON_ArrayForEach(rec, items) {
		const cJSON *fin = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(rec, "obFin"), "M");
		const cJSON *ren = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(rec, "obRen"), "M");
		const char *key = ddb_attr_s(rec, d->key), *body = ddb_attr_s(rec, "event");
		cJSON *evj = body ? cJSON_Parse(body) : NULL;

		if (!key)
			continue;
		/* idemp-run's records are no charge: their events are dropped,
		 * never published (as the other stores write none). */
		if (cJSON_GetObjectItemCaseSensitive(evj, "idempRun")) {
			if (fin)
				rc = clear_ev(d, key, TYPE_FIN, ddb_attr_n(fin, "t"), err);
			if (rc == IK_OK && ren)
				rc = clear_ev(d, key, TYPE_REN, ddb_attr_n(ren, "t"), err);
			cJSON_Delete(evj);
			if (rc != IK_OK)
				goto out;
			continue;
		}
		if (fin && *n < max && make_ev(rec, d->key, TYPE_FIN, fin, evj, &ev[(*n)++]) < 0)
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		if (rc == IK_OK && ren && *n < max &&
		    make_ev(rec, d->key, TYPE_REN, ren, evj, &ev[(*n)++]) < 0)
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		cJSON_Delete(evj);
		if (rc != IK_OK)
			goto out;
	}
out:
	par_free(p, DDB_OPEN_SHARDS);
	cJSON_Delete(fresh);
	free(found);
	if (rc != IK_OK) {
		for (i = 0; i < *n; i++)
			ik_outbox_ev_free(&ev[i]);
		*n = 0;
	}
	return rc;
}

int
ddb_outbox_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev,
               size_t n, int64_t now_ms, ik_err *err)
{
	struct ddb *d = st->impl;
	struct par p[IK_QUEUE_BATCH];
	cJSON *reqs[IK_QUEUE_BATCH] = { 0 };
	size_t i;
	int rc;

	if (n > IK_QUEUE_BATCH)
		return ik_errf(err, IK_SOFTWARE, "dynamodb outbox: a checkpoint of %zu events", n);
	if ((rc = lease_held(d, holder, now_ms, err)) != IK_OK)
		return rc;
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
	return rc;
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
