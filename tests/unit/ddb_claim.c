/* ddb_claim: how the DynamoDB adapter decides a refused claim, on both
 * paths: the Item of a ConditionalCheckFailedException sent with
 * ReturnValuesOnConditionCheckFailure=ALL_OLD (real DynamoDB; dynalite
 * never sends it) and a ConsistentRead GetItem response (the fallback).
 * The fingerprint is checked first on both.  A claim that finds its own
 * token (its first write took effect, the answer was lost, the retry was
 * refused) is ACQUIRED with the recorded attempt and lease.  Run by
 * tests/dynamodb.bats. */
#include <stdio.h>
#include <string.h>

#include "core/outcome.h"
#include "store/dynamodb/store_dynamodb.h"

#define FP  "243d21ec76d04362e7f3f90d52ed9b52b45bf51641592c23ab31402081d37c46"
#define FP2 "0000000000000000000000000000000000000000000000000000000000000000"
#define NOW 1800000000000LL
#define OWNER "aaaabbbbccccddddeeeeffff00001111"

static int failed, n;
static const char *token = "t";   /* the claim's token; OWNER: our own record */

/* An item in DynamoDB JSON. */
static char *
item(char *buf, size_t sz, const char *key, const char *state, const char *fp,
     long long lease)
{
	snprintf(buf, sz,
	         "{\"%s\":{\"S\":\"CHG-1\"},\"state\":{\"S\":\"%s\"},"
	         "\"owner\":{\"S\":\"" OWNER "\"},"
	         "\"leaseUntil\":{\"N\":\"%lld\"},\"attempts\":{\"N\":\"3\"},"
	         "\"fingerprint\":{\"S\":\"%s\"},\"event\":{\"S\":\"{}\"},"
	         "\"createdAt\":{\"N\":\"1700000000000\"},\"updatedAt\":{\"N\":\"1700000001000\"},"
	         "\"expiresAt\":{\"N\":\"1702592000\"}}", key, state, lease, fp);
	return buf;
}

static void
check(const char *name, const char *json, const char *keyattr,
      enum ik_ddb_refusal want, int want_code, long long want_lease)
{
	struct ik_claim_req req = { .key = "CHG-1", .fingerprint = FP, .event = "{}",
	                            .token = token, .now_ms = NOW, .lease_ms = 60000 };
	struct ik_claim_res res;
	cJSON *resp = cJSON_Parse(json);
	enum ik_ddb_refusal got;
	int ok;

	memset(&res, 0, sizeof res);
	got = ik_ddb_claim_refused(resp, keyattr, &req, &res);
	ok = resp && got == want;
	if (ok && want == IK_DDB_DECIDED)
		ok = res.code == want_code && res.cur.key && strcmp(res.cur.key, "CHG-1") == 0 &&
		     res.cur.attempts == 3 && res.cur.created_at == 1700000000000LL &&
		     res.cur.expires_at == 1702592000LL &&
		     (want_code != IK_DUP_IN_PROGRESS || res.lease_until == want_lease) &&
		     (want_code != IK_OK || (res.attempt == 3 && res.lease_until == want_lease));
	n++;
	printf("%s %d - %s (refusal=%d code=%s)\n", ok ? "ok" : "not ok", n, name, got,
	       got == IK_DDB_DECIDED ? ik_code_name(res.code) : "-");
	failed |= !ok;
	ik_record_free(&res.cur);
	cJSON_Delete(resp);
}

int
main(void)
{
	char it[1024], body[1400];
	const char *ccf = "{\"__type\":\"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException\","
	                  "\"message\":\"The conditional request failed\",\"Item\":%s}";
	const char *get = "{\"Item\":%s}";
	const char *paths[2][2] = { { "ALL_OLD", NULL }, { "GetItem", NULL } };
	int p;

	paths[0][1] = ccf;
	paths[1][1] = get;
	for (p = 0; p < 2; p++) {
		char name[128];
#define CASE(label, st, fp, lease, want, code) do { \
	snprintf(body, sizeof body, paths[p][1], item(it, sizeof it, "pk", st, fp, lease)); \
	snprintf(name, sizeof name, "%s: %s", paths[p][0], label); \
	check(name, body, "pk", want, code, lease); } while (0)
		CASE("DONE -> DUP_DONE", "DONE", FP, 0, IK_DDB_DECIDED, IK_DUP_DONE);
		CASE("DEBITED_NOTIFICATION_FAILED -> DUP_DONE", "DEBITED_NOTIFICATION_FAILED", FP, 0,
		     IK_DDB_DECIDED, IK_DUP_DONE);
		CASE("FAILED -> DUP_FAILED", "FAILED", FP, 0, IK_DDB_DECIDED, IK_DUP_FAILED);
		CASE("live IN_PROGRESS -> DUP_IN_PROGRESS with the holder's lease", "IN_PROGRESS",
		     FP, NOW + 5000, IK_DDB_DECIDED, IK_DUP_IN_PROGRESS);
		CASE("DONE, other fingerprint -> PAYLOAD_MISMATCH first", "DONE", FP2, 0,
		     IK_DDB_DECIDED, IK_PAYLOAD_MISMATCH);
		CASE("FAILED, other fingerprint -> PAYLOAD_MISMATCH first", "FAILED", FP2, 0,
		     IK_DDB_DECIDED, IK_PAYLOAD_MISMATCH);
		CASE("live IN_PROGRESS, other fingerprint -> PAYLOAD_MISMATCH", "IN_PROGRESS", FP2,
		     NOW + 5000, IK_DDB_DECIDED, IK_PAYLOAD_MISMATCH);
		CASE("expired IN_PROGRESS, other fingerprint -> PAYLOAD_MISMATCH", "IN_PROGRESS", FP2,
		     NOW - 1, IK_DDB_DECIDED, IK_PAYLOAD_MISMATCH);
		CASE("expired IN_PROGRESS, same fingerprint -> claim again", "IN_PROGRESS", FP,
		     NOW - 1, IK_DDB_CLAIMABLE, 0);
		token = OWNER;
		CASE("live IN_PROGRESS, our own token (answer lost, retried) -> ACQUIRED, "
		     "recorded attempt and lease", "IN_PROGRESS", FP, NOW + 60000,
		     IK_DDB_DECIDED, IK_OK);
		CASE("our own token, other fingerprint -> PAYLOAD_MISMATCH still first",
		     "IN_PROGRESS", FP2, NOW + 60000, IK_DDB_DECIDED, IK_PAYLOAD_MISMATCH);
		CASE("our own token on a DONE record -> DUP_DONE (finished since)", "DONE", FP, 0,
		     IK_DDB_DECIDED, IK_DUP_DONE);
		token = "t";
	}
	/* a record without a fingerprint can never be ours */
	snprintf(body, sizeof body, get,
	         "{\"pk\":{\"S\":\"CHG-1\"},\"state\":{\"S\":\"DONE\"},\"attempts\":{\"N\":\"3\"},"
	         "\"createdAt\":{\"N\":\"1700000000000\"},\"expiresAt\":{\"N\":\"1702592000\"}}");
	check("GetItem: no fingerprint -> PAYLOAD_MISMATCH", body, "pk", IK_DDB_DECIDED,
	      IK_PAYLOAD_MISMATCH, 0);
	snprintf(body, sizeof body, ccf, item(it, sizeof it, "id", "DONE", FP, 0));
	check("ALL_OLD: custom key attribute (IDEMKIT_DYNAMODB_KEY=id)", body, "id",
	      IK_DDB_DECIDED, IK_DUP_DONE, 0);
	check("ALL_OLD not sent (dynalite) -> GetItem fallback",
	      "{\"__type\":\"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException\","
	      "\"message\":\"The conditional request failed\"}", "pk", IK_DDB_NO_ITEM, 0, 0);
	check("GetItem: no item (expired by TTL meanwhile) -> claim again path", "{}", "pk",
	      IK_DDB_NO_ITEM, 0, 0);
	check("GetItem: empty Item", "{\"Item\":{}}", "pk", IK_DDB_NO_ITEM, 0, 0);
	printf("%s\n", failed ? "FAILED" : "PASSED");
	return failed;
}
