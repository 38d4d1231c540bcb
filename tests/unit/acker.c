/* acker: the acker (lib/flow/acker.c) driven against the embedded SQLite queue
 * in the directory given as argv[1]: batched deletes held until their
 * batch completes (a whole group on this queue), the DLQ send-then-delete,
 * with the first-sent time, the backoff and lease visibilities, a stale
 * receipt inside a batch, LEASE_SHORT, a line that is no message.  Prints
 * one line per failed check; run by tests/sqs-ack.bats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/envelope.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/acker.h"
#include "open/open_queue.h"
#include "queue/queue.h"

#define FINISHED "{\"claim\":{\"outcome\":\"ACQUIRED\",\"chargeId\":\"CHG-1\"}," \
	"\"debit\":{\"outcome\":\"OK\"},\"notify\":{\"outcome\":\"OK\"}," \
	"\"done\":{\"outcome\":\"OK\",\"state\":\"DONE\"}}"

static int failed;

#define CHECK(cond, ...) do { if (!(cond)) { failed = 1; printf("FAIL %d: ", __LINE__); \
	printf(__VA_ARGS__); putchar('\n'); } } while (0)

static struct ik_queue *
open_q(const char *url)
{
	struct ik_queue *q;
	ik_err err = { 0 };

	if (ik_queue_open(url, &q, &err) != IK_OK) {
		printf("FAIL open %s: %s\n", url, err.msg);
		exit(1);
	}
	return q;
}

/* Send n bodies and receive them into envelopes with results merged in. */
static size_t
recv_envs(struct ik_queue *q, size_t n, const char *results, cJSON **envs)
{
	struct ik_qmsg m[IK_QUEUE_BATCH];
	ik_err err = { 0 };
	size_t got = 0, k;

	for (size_t i = 0; i < n; i++) {
		char body[32];
		struct ik_qsend s = { .body = body };
		snprintf(body, sizeof body, "{\"chargeId\":\"C%zu\"}", i);
		if (q->ops->send(q, &s, &err) != IK_OK)
			printf("FAIL send: %s\n", err.msg), exit(1);
		free(s.message_id);
	}
	while (got < n) {
		if (q->ops->receive(q, IK_QUEUE_BATCH, 0, 60, m, &k, &err) != IK_OK || k == 0)
			printf("FAIL receive: %s\n", err.msg), exit(1);
		for (size_t i = 0; i < k; i++, got++) {
			cJSON *r = cJSON_Parse(results), *e = ik_env_new(m[i].body);
			cJSON_AddStringToObject(e, "queue", q->url);
			cJSON_AddStringToObject(e, "messageId", m[i].message_id);
			cJSON_AddStringToObject(e, "receipt", m[i].receipt);
			cJSON_AddNumberToObject(e, "receiveCount", (double)m[i].receive_count);
			cJSON_AddNumberToObject(e, "sentAt", (double)m[i].sent_at);
			for (cJSON *c = r->child; c; c = c->next)
				cJSON_AddItemToObject(e, c->string, cJSON_Duplicate(c, 1));
			cJSON_Delete(r);
			envs[got] = e;
			ik_qmsg_free(&m[i]);
		}
	}
	return got;
}

static const char *
ack_str(const cJSON *env, const char *field)
{
	return cJSON_GetStringValue(cJSON_GetObjectItem(ik_env_result(env, "ack"), field));
}

static double
ack_num(const cJSON *env, const char *field)
{
	const cJSON *v = cJSON_GetObjectItem(ik_env_result(env, "ack"), field);
	return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static int64_t
visible(struct ik_queue *q)
{
	struct ik_qstats st = { 0 };
	ik_err err = { 0 };

	q->ops->stats(q, &st, &err);
	return st.visible + st.inflight + st.delayed;
}

int
main(int argc, char **argv)
{
	char url[4096], dlq_url[4096];
	struct ik_acker_opts o = { .backoff_base_s = 1, .backoff_cap_s = 900 };
	struct ik_acker *a;
	struct ik_queue *q, *dlq;
	cJSON *envs[16], *bare;
	ik_err err = { 0 };
	int rc;

	if (argc != 2)
		return fprintf(stderr, "usage: acker DIR\n"), 2;
	snprintf(url, sizeof url, "sqlite:%s/q.db#t", argv[1]);
	snprintf(dlq_url, sizeof dlq_url, "sqlite:%s/q.db#t-dlq", argv[1]);
	q = open_q(url);
	dlq = open_q(dlq_url);
	if (ik_acker_open(&o, &a, &err) != IK_OK)
		return printf("FAIL acker: %s\n", err.msg), 1;

	/* 12 finished charges in one group: the SQLite queue takes them all
	 * in one transaction (SQS's 10 per call is sqs-ack.bats'), none
	 * settled before the flush. */
	recv_envs(q, 12, FINISHED, envs);
	ik_acker_begin(a);
	for (int i = 0; i < 11; i++)
		CHECK(ik_acker_ack(a, envs[i]) == IK_OK, "held delete %d", i);
	CHECK(!ik_env_result(envs[0], "ack"), "a held delete has no result yet");
	CHECK(!ik_env_result(envs[10], "ack"), "the 11th is held with the first 10");
	CHECK(visible(q) == 12, "nothing deleted before the flush, %lld left", (long long)visible(q));
	ik_acker_ack(a, envs[11]);
	ik_acker_flush(a);
	for (int i = 0; i < 12; i++) {
		CHECK(ik_env_step_code(envs[i], "ack") == IK_OK, "entry %d OK", i);
		CHECK(strcmp(ack_str(envs[i], "action"), "delete") == 0, "entry %d delete", i);
		cJSON_Delete(envs[i]);
	}
	CHECK(visible(q) == 0, "all 12 deleted");

	/* DLQ then delete; a TEMPFAIL at the claim (no attempt to count the
	 * tries by) backs off 1s * 2^receiveCount; a stale receipt in a batch
	 * fails that entry alone. */
	recv_envs(q, 3, "{\"claim\":{\"outcome\":\"DUP_FAILED\",\"error\":\"declined\"}}", envs);
	cJSON_ReplaceItemInObject(envs[1], "claim",
	    cJSON_Parse("{\"outcome\":\"TEMPFAIL\"}"));
	cJSON_ReplaceItemInObject(envs[1], "receiveCount", cJSON_CreateNumber(3));
	cJSON_ReplaceItemInObject(envs[2], "receipt", cJSON_CreateString("1:1:stale"));
	ik_acker_begin(a);
	for (int i = 0; i < 3; i++)
		ik_acker_ack(a, envs[i]);
	ik_acker_flush(a);
	CHECK(ik_env_step_code(envs[0], "ack") == IK_OK, "DLQ then delete");
	CHECK(strcmp(ack_str(envs[0], "dlq"), dlq_url) == 0, "DLQ url %s", ack_str(envs[0], "dlq"));
	CHECK(visible(dlq) == 2, "both DLQ entries sent (the stale one too)");
	{
		struct ik_qmsg m[2];
		size_t k = 0;
		char want[24];
		dlq->ops->receive(dlq, 2, 0, 60, m, &k, &err);
		snprintf(want, sizeof want, "%lld", (long long)ik_env_first_sent_at(envs[0]));
		for (size_t i = 0; i < k; i++) {
			const char *got = NULL;
			for (size_t j = 0; j < m[i].nattrs; j++)
				if (strcmp(m[i].attrs[j].name, IK_ATTR_FIRST_SENT_AT) == 0)
					got = m[i].attrs[j].value;
			CHECK(got && (i > 0 || strcmp(got, want) == 0),
			      "DLQ copy %zu carries the first-sent time: %s", i, got ? got : "none");
			ik_qmsg_free(&m[i]);
		}
		CHECK(k == 2, "received %zu from the DLQ", k);
	}
	CHECK(ik_env_step_code(envs[1], "ack") == IK_OK && ack_num(envs[1], "visibility") == 8,
	      "backoff visibility %g", ack_num(envs[1], "visibility"));
	rc = ik_env_step_code(envs[2], "ack");
	CHECK(rc != IK_OK && cJSON_IsTrue(cJSON_GetObjectItem(ik_env_result(envs[2], "ack"),
	      "dlqSentNotDeleted")), "stale receipt: %s, sent to the DLQ but not deleted",
	      ik_code_name(rc));
	for (int i = 0; i < 3; i++)
		cJSON_Delete(envs[i]);

	/* DUP_IN_PROGRESS comes back soon (1 s * 2^receiveCount), never after
	 * the holder's lease (here 30 s) ends. */
	recv_envs(q, 2, "{\"claim\":{\"outcome\":\"DUP_IN_PROGRESS\"}}", envs);
	for (int i = 0; i < 2; i++)
		cJSON_AddNumberToObject(ik_env_result(envs[i], "claim"), "leaseUntil",
		                        (double)(ik_now_ms() + 30000));
	cJSON_ReplaceItemInObject(envs[1], "receiveCount", cJSON_CreateNumber(6));
	for (int i = 0; i < 2; i++)
		CHECK(ik_acker_ack(a, envs[i]) == IK_OK, "leave %d", i);
	CHECK(ack_num(envs[0], "visibility") == 2, "first look: 2 s, got %g",
	      ack_num(envs[0], "visibility"));
	CHECK(ack_num(envs[1], "visibility") == 30, "6th: 64 s capped at the lease, got %g",
	      ack_num(envs[1], "visibility"));
	for (int i = 0; i < 2; i++)
		cJSON_Delete(envs[i]);

	/* LEASE_SHORT from the debit: the claim was released; back off. */
	recv_envs(q, 1, "{\"claim\":{\"outcome\":\"ACQUIRED\"},"
	    "\"debit\":{\"outcome\":\"LEASE_SHORT\"}}", envs);
	CHECK(ik_acker_ack(a, envs[0]) == IK_OK &&
	      strcmp(ack_str(envs[0], "action"), "leave-backoff") == 0 &&
	      ack_num(envs[0], "visibility") == 2, "LEASE_SHORT: leave-backoff, 2 s, got %g",
	      ack_num(envs[0], "visibility"));
	cJSON_Delete(envs[0]);

	/* Not a message: nothing to ack, DATAERR. */
	bare = ik_env_new("{\"chargeId\":\"CHG-1\"}");
	CHECK(ik_acker_ack(a, bare) == IK_DATAERR && strcmp(ack_str(bare, "action"), "none") == 0,
	      "no receipt");
	cJSON_Delete(bare);
	CHECK(ik_acker_halted(a) == 0, "not halted");

	ik_acker_close(a);
	ik_queue_close(q);
	ik_queue_close(dlq);
	if (!failed)
		puts("ok");
	return failed;
}
