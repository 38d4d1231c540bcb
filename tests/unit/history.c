/* history: the record's history through the port (store.h): the entry
 * format of each op, ik_history_append's bound (the last IK_HISTORY_MAX,
 * oldest dropped) and its refusals, and the DynamoDB adapter's reading of
 * a stored List, whose claims' attempts are counted back from the item's
 * attempts (store_dynamodb.c).  Run by tests/idemp-show.bats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "store/dynamodb/store_dynamodb.h"
#include "store/store.h"

static int failed, n;

static void
ok(int cond, const char *name, const char *got)
{
	n++;
	printf("%s %d - %s\n", cond ? "ok" : "not ok", n, name);
	if (!cond) {
		printf("# got: %s\n", got ? got : "(null)");
		failed = 1;
	}
}

static void
entry(const char *name, const struct ik_hist *h, const char *want)
{
	char *got = ik_history_entry(h);

	ok(got && strcmp(got, want) == 0, name, got);
	free(got);
}

int
main(void)
{
	char *a = NULL, *t, buf[64], *got;
	cJSON *arr, *item;
	struct ik_record r;
	int i, good;

	entry("claim: at, op, attempt, leaseUntil, owner",
	      &(struct ik_hist){ .op = "claim", .at = 1000, .attempt = 2, .lease_until = 61000,
	                         .owner = "aa" },
	      "{\"at\":1000,\"op\":\"claim\",\"attempt\":2,\"leaseUntil\":61000,\"owner\":\"aa\"}");
	entry("release: at, op, owner",
	      &(struct ik_hist){ .op = "release", .at = 2000, .owner = "aa" },
	      "{\"at\":2000,\"op\":\"release\",\"owner\":\"aa\"}");
	entry("finish: state, owner, debitRef, error null when absent",
	      &(struct ik_hist){ .op = "finish", .at = 3000, .owner = "bb", .state = IK_ST_DONE,
	                         .debit_ref = "TXN-1" },
	      "{\"at\":3000,\"op\":\"finish\",\"state\":\"DONE\",\"owner\":\"bb\","
	      "\"debitRef\":\"TXN-1\",\"error\":null}");
	entry("renotified: state only, no owner",
	      &(struct ik_hist){ .op = "renotified", .at = 4000, .state = IK_ST_DONE, .owner = "x" },
	      "{\"at\":4000,\"op\":\"renotified\",\"state\":\"DONE\"}");

	/* 25 appends from nothing: the last 20, oldest first */
	for (i = 1; i <= 25; i++) {
		snprintf(buf, sizeof buf, "{\"at\":%d,\"op\":\"release\"}", i);
		t = ik_history_append(a, buf);
		free(a);
		a = t;
		if (!a)
			break;
	}
	arr = a ? cJSON_Parse(a) : NULL;
	good = cJSON_GetArraySize(arr) == IK_HISTORY_MAX;
	for (i = 0; good && i < IK_HISTORY_MAX; i++)
		good = cJSON_GetObjectItem(cJSON_GetArrayItem(arr, i), "at")->valueint == 6 + i;
	ok(good, "append: 25 entries keep the last 20 (6..25), in order", a);
	cJSON_Delete(arr);
	free(a);
	t = ik_history_append("", "{\"op\":\"claim\"}");
	ok(t && strcmp(t, "[{\"op\":\"claim\"}]") == 0, "append: \"\" is an empty history", t);
	free(t);
	t = ik_history_append("{\"op\":1}", "{\"op\":\"claim\"}");
	ok(!t, "append: an old history that is not an array -> NULL", t);
	free(t);
	t = ik_history_append("[]", "\"claim\"");
	ok(!t, "append: an entry that is not an object -> NULL", t);
	free(t);

	/* DynamoDB: a List of Maps; attempts 7 with three claims in the list:
	 * they were attempts 5, 6 and 7. */
	item = cJSON_Parse(
	    "{\"pk\":{\"S\":\"CHG-1\"},\"state\":{\"S\":\"DONE\"},\"attempts\":{\"N\":\"7\"},"
	    "\"history\":{\"L\":["
	    "{\"M\":{\"op\":{\"S\":\"claim\"},\"at\":{\"N\":\"10\"},\"leaseUntil\":{\"N\":\"70\"},"
	    "\"owner\":{\"S\":\"o1\"}}},"
	    "{\"M\":{\"at\":{\"N\":\"20\"},\"op\":{\"S\":\"release\"},\"owner\":{\"S\":\"o1\"}}},"
	    "{\"M\":{\"at\":{\"N\":\"30\"},\"op\":{\"S\":\"claim\"},\"leaseUntil\":{\"N\":\"90\"},"
	    "\"owner\":{\"S\":\"o2\"}}},"
	    "{\"M\":{\"at\":{\"N\":\"40\"},\"op\":{\"S\":\"claim\"},\"leaseUntil\":{\"N\":\"99\"},"
	    "\"owner\":{\"S\":\"o3\"}}},"
	    "{\"M\":{\"at\":{\"N\":\"50\"},\"op\":{\"S\":\"finish\"},\"state\":{\"S\":\"DONE\"},"
	    "\"owner\":{\"S\":\"o3\"},\"debitRef\":{\"S\":\"T\"}}}]}}");
	memset(&r, 0, sizeof r);
	got = item && ik_ddb_record_from_item(item, "pk", &r) == 0 ? r.history : NULL;
	ok(got && strcmp(got, "["
	   "{\"at\":10,\"op\":\"claim\",\"attempt\":5,\"leaseUntil\":70,\"owner\":\"o1\"},"
	   "{\"at\":20,\"op\":\"release\",\"owner\":\"o1\"},"
	   "{\"at\":30,\"op\":\"claim\",\"attempt\":6,\"leaseUntil\":90,\"owner\":\"o2\"},"
	   "{\"at\":40,\"op\":\"claim\",\"attempt\":7,\"leaseUntil\":99,\"owner\":\"o3\"},"
	   "{\"at\":50,\"op\":\"finish\",\"state\":\"DONE\",\"owner\":\"o3\",\"debitRef\":\"T\","
	   "\"error\":null}]") == 0,
	   "dynamodb item: the List as store.h's entries, claims' attempts counted back", got);
	ik_record_free(&r);
	cJSON_Delete(item);
	item = cJSON_Parse("{\"pk\":{\"S\":\"CHG-2\"},\"state\":{\"S\":\"DONE\"}}");
	memset(&r, 0, sizeof r);
	ok(item && ik_ddb_record_from_item(item, "pk", &r) == 0 && !r.history,
	   "dynamodb item without history (written before it): no history", r.history);
	ik_record_free(&r);
	cJSON_Delete(item);

	printf("%s\n", failed ? "FAILED" : "PASSED");
	return failed;
}
