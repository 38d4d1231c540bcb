/* queue_sqs.c: interim, until lib/aws (branch aws) is merged: an SQS queue
 * URL is refused with a clear IK_CONFIG instead of failing to link. */
#include "outcome.h"
#include "queue.h"

int
ik_queue_sqs_open(const char *url, struct ik_queue *q, ik_err *err)
{
	(void)q;
	return ik_errf(err, IK_CONFIG, "queue URL '%s': SQS support is not built in yet", url);
}
