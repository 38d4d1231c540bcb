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

#endif
