/* store_dynamodb.h: the DynamoDB adapter's pure parts, exposed for its unit
 * test (tests/unit/ddb_claim.c).  Commands use store.h only. */
#ifndef IK_STORE_DYNAMODB_H
#define IK_STORE_DYNAMODB_H

#include <cjson/cJSON.h>

#include "store.h"

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

#endif
