/* open_queue.h: the queue port's factory (queue.h is the port): a queue
 * opened from its URL, and the DLQ rule.  The only code that names the
 * adapters (open_queue.c). */
#ifndef IK_QUEUE_OPEN_H
#define IK_QUEUE_OPEN_H

#include "core/err.h"
#include "queue/queue.h"

/* url: as above, or NULL for $IDEMKIT_QUEUE, else
 * sqlite:STATE_DIR/queue.db#charges.  IK_OK, IK_CONFIG (malformed URL,
 * with a message that says what was expected), or IK_TEMPFAIL. */
int ik_queue_open(const char *url, struct ik_queue **out, ik_err *err);

/* The dead-letter queue URL for a queue: dlq when given, else $IDEMKIT_DLQ,
 * else for sqlite:PATH#NAME the queue sqlite:PATH#NAME-dlq; NULL (with
 * IK_CONFIG in err) for an SQS queue with no DLQ configured.  malloc'd. */
char *ik_queue_dlq_url(const char *dlq, const char *queue_url, ik_err *err);

#endif
