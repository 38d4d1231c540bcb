/* sqs_batch: a batch answer's entries are applied by their Id only when
 * the Id is exactly one the request gave (ik_sqs_batch_results): an
 * unknown, malformed or missing Id changes no entry, an entry answered
 * twice is no success, and ok is called once per success.  Prints one line
 * per failed check, then "ok"; run by tests/sqs-ack.bats. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/outcome.h"
#include "queue/sqs/queue_sqs.h"

#define N 3

static int failed;

#define CHECK(cond, ...) do { if (!(cond)) { failed = 1; printf("FAIL %d: ", __LINE__); \
	printf(__VA_ARGS__); putchar('\n'); } } while (0)

static int calls[N];

static void
ok_entry(const cJSON *entry, size_t i, void *arg)
{
	(void)entry, (void)arg;
	calls[i]++;
}

/* The results of answer for a batch of N entries (Ids "0".."2"). */
static void
results(const char *answer, struct ik_qresult res[N])
{
	cJSON *resp = cJSON_Parse(answer);

	memset(calls, 0, sizeof calls);
	if (!resp) {
		printf("FAIL: test JSON does not parse: %s\n", answer);
		failed = 1;
	}
	ik_sqs_batch_results(resp, N, res, ok_entry, NULL);
	cJSON_Delete(resp);
}

int
main(void)
{
	struct ik_qresult res[N];

	/* each entry by its own Id, in any order */
	results("{\"Successful\":[{\"Id\":\"2\"},{\"Id\":\"0\"}],\"Failed\":[{\"Id\":\"1\","
	    "\"Code\":\"ReceiptHandleIsInvalid\",\"SenderFault\":true}]}", res);
	CHECK(res[0].code == IK_OK && res[2].code == IK_OK, "0 and 2 succeeded");
	CHECK(res[1].code != IK_OK && strstr(res[1].msg, "ReceiptHandleIsInvalid"),
	    "1 failed with its code: %s", res[1].msg);
	CHECK(calls[0] == 1 && calls[1] == 0 && calls[2] == 1, "ok once per success");

	/* Ids of no entry of ours: none applied, every entry without a result */
	results("{\"Successful\":[{\"Id\":\"1x\"},{\"Id\":\"01\"},{\"Id\":\"+2\"},{\"Id\":\" 0\"},"
	    "{\"Id\":\"-0\"},{\"Id\":\"3\"},{\"Id\":\"\"},{\"Id\":2},{}],"
	    "\"Failed\":[{\"Id\":\"0 \",\"Code\":\"X\",\"SenderFault\":true}]}", res);
	for (int i = 0; i < N; i++) {
		CHECK(res[i].code == IK_SOFTWARE && strstr(res[i].msg, "no result"),
		    "entry %d: no answer names it, got %s %s", i, ik_code_name(res[i].code),
		    res[i].msg);
		CHECK(calls[i] == 0, "entry %d: ok not called", i);
	}

	/* answered twice: in both lists, or twice in one: no success */
	results("{\"Successful\":[{\"Id\":\"0\"},{\"Id\":\"1\"},{\"Id\":\"1\"},{\"Id\":\"2\"}],"
	    "\"Failed\":[{\"Id\":\"0\",\"Code\":\"X\",\"SenderFault\":true}]}", res);
	CHECK(res[0].code != IK_OK, "0 in both lists is not a success");
	CHECK(res[1].code != IK_OK && strstr(res[1].msg, "more than once"),
	    "1 twice is not a success: %s", res[1].msg);
	CHECK(res[2].code == IK_OK, "2 once succeeded");
	CHECK(calls[0] == 1 && calls[1] == 1 && calls[2] == 1, "ok at most once per entry");

	puts(failed ? "FAILED" : "ok");
	return failed;
}
