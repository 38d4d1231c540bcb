/* store_dynamodb.h: the DynamoDB adapter's pure parts, exposed for its unit
 * test (tests/unit/ddb_claim.c), its constructor (for the factory,
 * open_store.c), and what its parts share: store_dynamodb.c (the port's
 * table, opening and closing: it calls the parts), store_dynamodb_write.c
 * (the conditional writes, in flight, and the outbox's part in them),
 * store_dynamodb_list.c (listing and stats on the open index),
 * store_dynamodb_init.c (the table's schema), store_dynamodb_outbox.c (the
 * relay's ops) over store_dynamodb_stream.c (the table's stream), and
 * store_dynamodb_call.c under them all (items, requests, the calls), which
 * calls none of them back.  Commands use store.h only. */
#ifndef IK_STORE_DYNAMODB_H
#define IK_STORE_DYNAMODB_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "store/store.h"

/* The adapter's constructor, for the factory (open_store.c). */
int ik_store_dynamodb_open(const char *table, struct ik_store *s, ik_err *err);

/* An item in DynamoDB JSON ({"pk":{"S":"..."},"attempts":{"N":"2"},...})
 * as a record.  0, or -1 on ENOMEM. */
int ik_ddb_record_from_item(const cJSON *item, const char *keyattr, struct ik_record *r);

enum ik_ddb_refusal {
	IK_DDB_NO_ITEM,     /* resp holds no Item: ask again (GetItem fallback) */
	IK_DDB_DECIDED,     /* res->code and res->cur are set */
	IK_DDB_CLAIMABLE,   /* the item would pass the condition now: claim again */
	IK_DDB_NOMEM,
	IK_DDB_UNKNOWN_STATE, /* a state this version does not know: never claimable */
};

/* Why a claim was refused, from a response holding "Item": the body of a
 * ConditionalCheckFailedException sent with ReturnValuesOnConditionCheck-
 * Failure=ALL_OLD, or a GetItem response, decided by the port's rule
 * (ik_claim_decide in store.h). */
enum ik_ddb_refusal ik_ddb_claim_refused(const cJSON *resp, const char *keyattr,
                                         const struct ik_claim_req *req,
                                         struct ik_claim_res *res);

/* Why a finish was refused, from a response as above (the finish is sent
 * with ALL_OLD too), decided by the port's rule (ik_finish_decide in
 * store.h): IK_OK when the item is in req->state under req->token -- our
 * own finish, retried after its answer was lost --, IK_LEASE_LOST for any
 * other item, IK_EMPTY when resp holds no Item (ask with a GetItem; after
 * it, no item is IK_LEASE_LOST), IK_SOFTWARE when out of memory. */
int ik_ddb_finish_refused(const cJSON *resp, const char *keyattr,
                          const struct ik_finish_req *req);

/* ---- shared by the adapter's parts only ------------------------------- */
/* store_dynamodb_call.c: */

#define DDB_TARGET_PREFIX "DynamoDB_20120810."

struct ik_aws;
struct ik_aws_error;
struct op;

struct ddb {
	struct ik_aws *aws;
	char *table;
	char *key;      /* the partition key attribute name */
	/* writes in flight (store_dynamodb_write.c) */
	struct op *answered, *answered_last;   /* answers to act on */
	struct op *done, *done_last;           /* finished, callback due */
	size_t active;                         /* started, callback not yet called */
	/* the outbox relay's read-ahead (store_dynamodb_outbox.c) */
	struct ik_outbox_ev *obx;
	size_t obx_n;
	int obx_no_tx;   /* the endpoint keeps no transactions */
	char *obx_holder;              /* the relay's, from its last lease */
	struct ddb_stream *obs;        /* the stream it reads (store_dynamodb_stream.c) */
};

/* An item's S or N attribute; NULL or 0 when absent. */
const char *ddb_attr_s(const cJSON *item, const char *name);
int64_t ddb_attr_n(const cJSON *item, const char *name);
/* Attribute values {"S":s}, {"N":"n"}. */
cJSON *ddb_av_s(const char *s);
cJSON *ddb_av_n(int64_t n);
/* A request on the table, with Key when key is not NULL. */
cJSON *ddb_new_req(struct ddb *d, const char *key);
/* ExpressionAttributeNames for exactly the placeholders exprs uses
 * (DynamoDB refuses unused ones); "#k" is the key attribute. */
void ddb_add_names(struct ddb *d, cJSON *req, const char *exprs);
/* Append to the message in err and set its code. */
int ddb_errsuffix(ik_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* What a DynamoDB call's answer is to the caller: IK_AWS_ERROR only for
 * the error type pass (may be NULL); any other AWS error becomes a code
 * (and *resp is freed). */
int ddb_answer(struct ddb *d, const char *pass, int rc, cJSON **resp,
               const struct ik_aws_error *ae, ik_err *err);
/* One blocking call of op ("GetItem"), answered as ddb_answer says. */
int ddb_call(struct ddb *d, const char *op, cJSON *req, const char *pass,
             cJSON **resp, ik_err *err);
/* The consistent GetItem of key. */
cJSON *ddb_get_req(struct ddb *d, const char *key);
/* DescribeTable; IK_AWS_ERROR when there is no table. */
int ddb_describe(struct ddb *d, cJSON **resp, ik_err *err);
/* Pages on from resp's LastEvaluatedKey into req; 0 when there is none. */
int ddb_next_page(cJSON *req, cJSON *resp);

/* The open index: idemkit-open, HASH openState (S), RANGE updatedAt (N),
 * all attributes projected.  Only unfinished records carry openState, so
 * the index holds what recovery and stats need and nothing of the DONE
 * records a 30-day retention piles up.  openState is "STATE#n", n = a hash
 * of the key modulo DDB_OPEN_SHARDS: one index partition key per state
 * would take every claim's write, and DynamoDB throttles the table's writes
 * when an index partition is over its limit (1 000 writes/s).  Shards are
 * part of the schema: a reader queries all DDB_OPEN_SHARDS of a state. */
#define DDB_OPEN_INDEX "idemkit-open"
#define DDB_OPEN_SHARDS 8
const char *ddb_open_key(char buf[64], enum ik_state st, const char *key);
/* The shard of key, 0 to DDB_OPEN_SHARDS - 1 (the outbox index's too). */
unsigned ddb_shard(const char *key);

/* The port's ops, by part. */
int ddb_init(struct ik_store *st, ik_err *err);                  /* _init.c */
int ddb_list(struct ik_store *st, const struct ik_list_filter *f, /* _list.c */
             ik_record_cb cb, void *arg, ik_err *err);
int ddb_stats(struct ik_store *st, int64_t now_ms, struct ik_store_stats *out,
              ik_err *err);
int ddb_claim(struct ik_store *st, const struct ik_claim_req *req, /* _write.c */
              struct ik_claim_res *res, ik_err *err);
int ddb_claim_start(struct ik_store *st, const struct ik_claim_req *req,
                    struct ik_claim_res *res, ik_store_cb cb, void *arg, ik_err *err);
int ddb_finish(struct ik_store *st, const struct ik_finish_req *req, ik_err *err);
int ddb_finish_start(struct ik_store *st, const struct ik_finish_req *req,
                     ik_store_cb cb, void *arg, ik_err *err);
int ddb_renew(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
              int64_t lease_ms, ik_err *err);
int ddb_renotified(struct ik_store *st, const char *key, int64_t now_ms, ik_err *err);
int ddb_release(struct ik_store *st, const char *key, const char *token, int64_t now_ms,
                ik_err *err);
int ddb_run(struct ik_store *st, int fd, int *readable, int timeout_ms, ik_err *err);
size_t ddb_active(struct ik_store *st);
/* The blocking conditional update r (consumed) with cond and upd:
 * IK_OK, IK_LEASE_LOST, or an error. */
int ddb_cond_update(struct ddb *d, cJSON *r, const char *cond, const char *upd,
                    ik_err *err);
int ddb_note(struct ik_store *st, const char *key, const char *token, const char *reason,
             ik_err *err);
/* Frees the ops whose answers were never acted on (a closing store: the
 * calls still in flight die with the client). */
void ddb_ops_drop(struct ddb *d);

/* The outbox (store_dynamodb_outbox.c).  idemkit-outbox: HASH obPend (S,
 * the item's shard), RANGE obAt (N), all attributes projected, only on
 * the items with an event not yet published. */
#define DDB_OUTBOX_INDEX "idemkit-outbox"
/* A relay's batch: its checkpoint is one transaction of at most 100 items,
 * the lease's check and 99 events. */
#define DDB_OUTBOX_BATCH 99
/* The clause a finish's (a re-notification's) UpdateExpression SETs, its
 * values added to vals: the event, inside that write; "" when the outbox
 * is off (store_dynamodb_write.c). */
const char *ddb_outbox_finish(cJSON *vals, const struct ik_finish_req *req);
const char *ddb_outbox_renotified(cJSON *vals, const char *key, int64_t now_ms);
int ddb_outbox_lease(struct ik_store *st, const char *holder, int64_t now_ms,
                     int64_t lease_ms, int64_t *until, ik_err *err);
int ddb_outbox_read(struct ik_store *st, size_t max, struct ik_outbox_ev *ev, size_t *n,
                    ik_err *err);
int ddb_outbox_ack(struct ik_store *st, const char *holder, const struct ik_outbox_ev *ev,
                   size_t n, int64_t now_ms, ik_err *err);
int ddb_outbox_purge(struct ik_store *st, int64_t before_ms, size_t batch, int64_t *n,
                     ik_err *err);
/* Drops the relay's read-ahead (a lease not simply renewed, a failed
 * checkpoint, a closing store); the stream is read again from what was
 * checkpointed. */
void ddb_outbox_close(struct ddb *d);
/* The relay's lease item's key: no chargeId can be it ('#' is outside
 * their alphabet). */
#define DDB_RELAY_KEY "idemkit#outbox-relay"

/* The relay's reading of the table's stream (store_dynamodb_stream.c).
 * ddb_stream_read: *images, the new images of the items the stream shows
 * with an event waiting since the last read (the caller frees it); IK_EMPTY
 * (*images NULL) when the index is to be read instead: there is no stream,
 * it cannot be read now, or a sweep is due (ddb_stream_sweep_due).
 * ddb_stream_sweep_from: the wall-clock time the sweep under way began.
 * ddb_stream_swept: a pass of the sweep read the index; more: it found an
 * event older than the sweep's start (it goes on until it finds none).  ddb_stream_lost: the stream's reading
 * missed something (an item read throttled): sweep.  ddb_stream_drained:
 * every event read so far is checkpointed, so is what was read of the
 * stream; ddb_stream_commit writes that on the lease item, under holder's
 * lease (IK_OK, IK_LEASE_LOST or an error).  ddb_stream_rewind: back to
 * what was checkpointed.  ddb_stream_reload: the positions read again from
 * the lease item, the index swept (a lease taken afresh). */
int ddb_stream_read(struct ddb *d, cJSON **images, ik_err *err);
int ddb_stream_sweep_due(struct ddb *d);
int64_t ddb_stream_sweep_from(struct ddb *d);
void ddb_stream_swept(struct ddb *d, int more);
void ddb_stream_lost(struct ddb *d);
void ddb_stream_drained(struct ddb *d);
int ddb_stream_commit(struct ddb *d, const char *holder, int64_t now_ms, ik_err *err);
void ddb_stream_rewind(struct ddb *d);
void ddb_stream_reload(struct ddb *d);
void ddb_stream_free(struct ddb *d);
int ddb_outbox_stats(struct ik_store *st, int64_t now_ms, struct ik_outbox_stats *out,
                     ik_err *err);

#endif
