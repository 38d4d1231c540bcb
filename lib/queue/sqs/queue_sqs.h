/* queue_sqs.h: the SQS adapter's pure parts, exposed for its fuzz target
 * (tests/fuzz/fuzz_sqs_response.c), and its constructor, for the factory
 * (open_queue.c).  Commands use queue.h only. */
#ifndef IK_QUEUE_SQS_H
#define IK_QUEUE_SQS_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "queue/queue.h"

/* The adapter's constructor. */
int ik_queue_sqs_open(const char *url, struct ik_queue *q, ik_err *err);

/* One element of a ReceiveMessage response's "Messages" as a message
 * (missing strings become ""; Binary attributes are not carried).  0, or
 * -1 on ENOMEM; m is to be freed with ik_qmsg_free either way. */
int ik_sqs_msg_from_json(const cJSON *j, struct ik_qmsg *m);

/* Fill res[0..n) from a batch response's Successful / Failed lists, by
 * each entry's Id, which must be exactly the decimal index the request
 * gave it: an unknown, malformed or missing Id is applied to no entry, and
 * an entry answered more than once is not a success (IK_SOFTWARE).  An
 * entry no answer names keeps IK_SOFTWARE ("no result").  ok is called
 * once for each successful entry. */
void ik_sqs_batch_results(const cJSON *resp, size_t n, struct ik_qresult *res,
                          void (*ok)(const cJSON *entry, size_t i, void *arg),
                          void *arg);

#endif
