/* amqp_queue.h: what the RabbitMQ adapter's files share (queue_amqp.c, the
 * port's operations; amqp_holder.c, the child that holds deliveries).
 *
 * The holder owns the connection that received a delivery, for as long as
 * the delivery is held (idemkit(7) "RabbitMQ").  It answers on two
 * sockets, one request per line:
 *  - its receiver's end of a socketpair: "GET MAX VIS_MS WAIT_MS" ->
 *    {"rc":0,"m":[{"tag":N,"key":HEX,"id":..,"body":..,"sentAt":..,
 *    "count":..,"attrs":{..}}]} or {"rc":CODE,"msg":..}; "STOP" ends the
 *    wait of a GET at once (the receiver got a stop signal);
 *  - a Linux abstract unix socket "@idemkit-amqp-HOLDERID", for any process
 *    of the same user that holds a receipt: "DEL TAG KEY" and
 *    "VIS TAG KEY SECS" -> "CODE MESSAGE".
 * Receipt: "amqp1.HOLDERID.TAG.KEY", HOLDERID and KEY 32 hex digits each
 * (random), so only a holder of the receipt settles the delivery.
 */
#ifndef IK_AMQP_QUEUE_H
#define IK_AMQP_QUEUE_H

#include <stdint.h>
#include <sys/types.h>

#include "conn/amqp.h"
#include "core/err.h"

#define IK_AMQP_DEFAULT_VISIBILITY 30
#define IK_AMQP_DEFAULT_HEARTBEAT 30    /* seconds; 0: off */

struct amqp_queue {
	struct ik_amqp_url u;
	struct ik_amqp send;             /* publishing and counts, this process */
	int declared;                    /* the queues are declared on send */
	int64_t max_receive;             /* 0: no delivery limit */
	char *dlq;                       /* the DLQ's name, NULL with no limit */
	int64_t visibility_s;
	int heartbeat_s;                 /* the holder's, IDEMKIT_AMQP_HEARTBEAT */
	/* the holder of this process's receives, once forked */
	pid_t holder;
	int holder_fd;                   /* socketpair end, -1: none */
	char holder_id[33];
	/* a kept connection to the holder last settled with */
	int peer_fd;
	char peer_id[33];
};

/* Declares q's queue and its DLQ on the connection a. */
int ik_amqp_declare_queues(struct amqp_queue *s, struct ik_amqp *a, ik_err *err);

/* Forks the holder; s->holder, holder_fd and holder_id set.  IK_OK or
 * why not. */
int ik_amqp_holder_start(struct amqp_queue *s, ik_err *err);

/* The abstract socket address of holder id (sun_path[0] = 0); its length. */
struct sockaddr_un;
socklen_t ik_amqp_holder_addr(const char *id, struct sockaddr_un *sa);

#endif
