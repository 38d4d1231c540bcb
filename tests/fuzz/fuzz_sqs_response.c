/* libFuzzer target: the SQS adapter's response parsing on any body: the
 * messages of a ReceiveMessage response (ik_sqs_msg_from_json) and the
 * per-entry results of a batch response (ik_sqs_batch_results).  Checks:
 * a parsed message has its strings and only string attributes, all
 * allocated (no leak after ik_qmsg_free); every batch entry ends with a
 * code from the contract and a bounded message; success only for an Id
 * that is one of ours. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/outcome.h"
#include "queue/sqs/queue_sqs.h"

#define N 10

static void
ok_entry(const cJSON *entry, size_t i, void *arg)
{
	size_t *calls = arg;

	if (i >= N || !entry)
		abort();
	(*calls)++;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *resp = cJSON_ParseWithLength((const char *)data, size);
	const cJSON *it;
	struct ik_qresult res[N];
	size_t calls = 0, oks = 0;

	if (!resp)
		return 0;
	cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Messages")) {
		struct ik_qmsg m;

		if (ik_sqs_msg_from_json(it, &m) == 0) {
			if (!m.body || !m.message_id || !m.receipt)
				abort();
			for (size_t i = 0; i < m.nattrs; i++)
				if (!m.attrs[i].name || !m.attrs[i].value)
					abort();
		}
		ik_qmsg_free(&m);
	}
	ik_sqs_batch_results(resp, N, res, ok_entry, &calls);
	for (size_t i = 0; i < N; i++) {
		if (!ik_outcome_by_code(res[i].code) || !memchr(res[i].msg, '\0', sizeof res[i].msg))
			abort();
		oks += res[i].code == IK_OK;
	}
	if (oks > calls)
		abort();
	cJSON_Delete(resp);
	return 0;
}
