/* ik_json_print and ik_log against cJSON's own printer: byte for byte on
 * numbers at every boundary of the fast path, every byte value in strings
 * and keys, nested containers, raw items and a whole envelope.  Prints
 * "ok" last when every comparison held. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/json.h"
#include "core/log.h"

static int fails;

static void
same(const cJSON *it, const char *what)
{
	char *a = cJSON_PrintUnformatted(it), *b = ik_json_print(it);

	if (!a || !b || strcmp(a, b) != 0) {
		printf("differs (%s): cJSON %s, ours %s\n", what, a ? a : "(null)", b ? b : "(null)");
		fails++;
	}
	free(a);
	free(b);
}

static void
num(double d)
{
	cJSON *n = cJSON_CreateNumber(d);
	char what[64];

	snprintf(what, sizeof what, "%.17g", d);
	same(n, what);
	cJSON_Delete(n);
}

/* The log line for these fields, as the cJSON object ik_log once built
 * printed it (ts left out: it is the clock). */
static void
log_same(void)
{
	char bytes[256], path[] = "/tmp/ik-json-log.XXXXXX", line[4096], *want, *got;
	int fd = mkstemp(path), saved = dup(2);
	cJSON *o = cJSON_CreateObject();
	FILE *f;

	for (int i = 1; i < 256; i++)
		bytes[i - 1] = (char)i;
	bytes[255] = '\0';
	fflush(stderr);
	dup2(fd, 2);
	ik_log(IK_LOG_AUDIT, "odd \"msg\"\n", "k\t1", bytes, "skipped", NULL,
	       IK_LOG_NUM("n", INT64_C(1795000000123)), IK_LOG_NUM("neg", -7),
	       IK_LOG_NUM("big", INT64_C(4000000000000000000)), IK_LOG_NUM(NULL, 5), NULL);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	cJSON_AddStringToObject(o, "level", "audit");
	cJSON_AddStringToObject(o, "prog", ik_prog());
	cJSON_AddStringToObject(o, "msg", "odd \"msg\"\n");
	cJSON_AddStringToObject(o, "k\t1", bytes);
	cJSON_AddNumberToObject(o, "n", 1795000000123.0);
	cJSON_AddNumberToObject(o, "neg", -7);
	cJSON_AddNumberToObject(o, "big", 4000000000000000000.0);
	want = cJSON_PrintUnformatted(o);
	f = fopen(path, "r");
	line[0] = '\0';
	got = f && fgets(line, sizeof line, f) ? strchr(line, ',') : NULL;
	if (got)
		got[strcspn(got, "\n")] = '\0';
	if (!got || strncmp(line, "{\"ts\":1", 7) != 0 || strcmp(got + 1, want + 1) != 0) {
		printf("log line differs:\n ours  %s\n cJSON %s\n", line, want);
		fails++;
	}
	if (f)
		fclose(f);
	unlink(path);
	close(fd);
	free(want);
	cJSON_Delete(o);
}

int
main(void)
{
	static const double nums[] = {
		0, 1, -1, 7, 2500, INT_MAX, (double)INT_MAX + 1, INT_MIN, (double)INT_MIN - 1,
		1795000000123.0, -1795000000123.0, 999999999999999.0, -999999999999999.0,
		1e15, -1e15, 1e15 + 1, 9007199254740992.0, 9007199254740993.0, 1e16, 1e300,
		-1e300, 0.5, -0.5, 0.1, 1.0 / 3, 25.75, 123456789.125, DBL_MIN, DBL_MAX, 5e-324,
		1e-7, 4000000000000000000.0,
	};
	char bytes[256];
	cJSON *o, *a, *e;

	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
		num(nums[i]);
	num(-0.0);
	num(NAN);
	num(INFINITY);
	num(-INFINITY);
	srand(16);
	for (int i = 0; i < 20000; i++) {
		double d = (double)rand() * rand() * (rand() % 2 ? 1 : -1);
		num(d);
		num(d / (1 + rand() % 1000));
		num(ldexp((double)rand(), rand() % 80 - 40));
	}
	for (int i = 1; i < 256; i++)
		bytes[i - 1] = (char)i;
	bytes[255] = '\0';
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, bytes, bytes);
	cJSON_AddStringToObject(o, "", "");
	cJSON_AddItemToObject(o, "nullstr", cJSON_CreateStringReference(NULL));
	cJSON_AddNullToObject(o, "n");
	cJSON_AddTrueToObject(o, "t");
	cJSON_AddFalseToObject(o, "f");
	cJSON_AddRawToObject(o, "raw", "{\"x\": [1, 2]}");
	cJSON_AddItemToObject(o, "eo", cJSON_CreateObject());
	cJSON_AddItemToObject(o, "ea", cJSON_CreateArray());
	a = cJSON_AddArrayToObject(o, "a");
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(nums[i]));
	cJSON_AddItemToArray(a, cJSON_Duplicate(o, 0));
	same(o, "object");
	cJSON_Delete(o);
	e = cJSON_Parse("{\"v\":1,\"queue\":\"sqlite:/tmp/q.db#charges\",\"messageId\":\"m-1\","
	                "\"receipt\":\"m-1.00ff\",\"receiveCount\":2,\"sentAt\":1795000000123,"
	                "\"body\":\"{\\\"chargeId\\\":\\\"C-1\\\",\\\"amount\\\":2500}\","
	                "\"claim\":{\"outcome\":\"ACQUIRED\",\"leaseUntil\":1795000120123,"
	                "\"attempt\":1},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-\\u00e9\"},"
	                "\"ack\":{\"outcome\":\"OK\",\"at\":1795000000999}}");
	same(e, "envelope");
	cJSON_Delete(e);
	ik_log_init("json_print");
	log_same();
	if (fails)
		return 1;
	puts("ok");
	return 0;
}
