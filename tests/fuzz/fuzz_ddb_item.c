/* libFuzzer target: the DynamoDB adapter's pure parts on any response
 * body: an item read as a record (ik_ddb_record_from_item, then shown as
 * JSON the way idemp-show and idemp-list do) and the decision on a refused
 * claim (ik_ddb_claim_refused, the ALL_OLD and GetItem paths).  It checks
 * the promises: the fingerprint decides first, DONE/DNF is DUP_DONE,
 * FAILED is DUP_FAILED, a live lease is DUP_IN_PROGRESS with the holder's
 * lease, and nothing is left allocated when the answer is "ask again". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/outcome.h"
#include "store/dynamodb/store_dynamodb.h"

#define FP "243d21ec76d04362e7f3f90d52ed9b52b45bf51641592c23ab31402081d37c46"
#define NOW 1800000000000LL

static void
show(const struct ik_record *r)
{
	cJSON *o = ik_record_json(r, NOW);
	const cJSON *left;
	char *s;

	if (!o)
		return;
	/* no remaining lease unless it ends in the future, and never more
	 * than what is left of it */
	left = cJSON_GetObjectItemCaseSensitive(o, "leaseRemainingMs");
	if (!cJSON_IsNumber(left) || left->valuedouble < 0 ||
	    (r->lease_until <= NOW && left->valuedouble != 0) ||
	    (r->lease_until > NOW && left->valuedouble > (double)r->lease_until - NOW + 1))
		abort();
	if ((s = cJSON_PrintUnformatted(o)))
		free(s);
	cJSON_Delete(o);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ik_claim_req req = { .key = "CHG-1", .fingerprint = FP, .event = "{}",
	                            .token = "t", .now_ms = NOW, .lease_ms = 60000 };
	struct ik_claim_res res;
	struct ik_record r;
	const cJSON *item;
	enum ik_ddb_refusal why;
	cJSON *resp = cJSON_ParseWithLength((const char *)data, size);

	if (!resp)
		return 0;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	if (ik_ddb_record_from_item(item ? item : resp, "pk", &r) == 0) {
		show(&r);
		ik_record_free(&r);
	}

	memset(&res, 0, sizeof res);
	why = ik_ddb_claim_refused(resp, "pk", &req, &res);
	switch (why) {
	case IK_DDB_DECIDED:
		if (!res.cur.fingerprint || strcmp(res.cur.fingerprint, FP) != 0) {
			if (res.code != IK_PAYLOAD_MISMATCH)
				abort();
		} else if (res.cur.state == IK_ST_DONE || res.cur.state == IK_ST_DNF) {
			if (res.code != IK_DUP_DONE)
				abort();
		} else if (res.cur.state == IK_ST_FAILED) {
			if (res.code != IK_DUP_FAILED)
				abort();
		} else if (res.cur.state == IK_ST_IN_PROGRESS && res.cur.owner &&
		           strcmp(res.cur.owner, req.token) == 0) {
			/* our own claim, whose answer was lost: ACQUIRED again */
			if (res.code != IK_OK || res.attempt != res.cur.attempts)
				abort();
		} else if (res.cur.state == IK_ST_IN_PROGRESS) {
			if (res.code != IK_DUP_IN_PROGRESS || res.lease_until != res.cur.lease_until ||
			    res.cur.lease_until < NOW)
				abort();
		} else {
			abort();
		}
		show(&res.cur);
		break;
	case IK_DDB_NO_ITEM:
	case IK_DDB_CLAIMABLE:
		if (res.cur.key || res.cur.fingerprint || res.cur.event)
			abort();
		break;
	case IK_DDB_UNKNOWN_STATE:
		/* never claimable, and only for a state this version does not
		 * know on a record whose payload matches */
		if (res.cur.state != IK_ST_NONE || !res.cur.fingerprint ||
		    strcmp(res.cur.fingerprint, FP) != 0)
			abort();
		break;
	case IK_DDB_NOMEM:
		break;
	default:
		abort();
	}
	ik_record_free(&res.cur);
	cJSON_Delete(resp);
	return 0;
}
