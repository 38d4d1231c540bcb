/* queue_amqp.h: the RabbitMQ (AMQP 0-9-1) queue adapter, opened by the
 * factory (open_queue.c) from amqp[s]://USER@HOST[:PORT][/VHOST]#QUEUE
 * [?maxReceiveCount=N&dlq=NAME&visibility=SECS].  idemkit(7) "RabbitMQ"
 * says how SQS's promises are kept. */
#ifndef IK_QUEUE_AMQP_H
#define IK_QUEUE_AMQP_H

#include "core/err.h"
#include "queue/queue.h"

int ik_queue_amqp_open(const char *url, struct ik_queue *q, ik_err *err);

#endif
