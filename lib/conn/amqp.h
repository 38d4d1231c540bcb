/* amqp.h: one AMQP 0-9-1 connection (librabbitmq, loaded on first use by
 * amqp_dl.h) with one channel, for the RabbitMQ queue (lib/queue/amqp/).
 * librabbitmq is called from amqp.c only.
 *
 * Rules: the password is a secret: it comes from IDEMKIT_AMQP_PASSWORD or
 * the file named by IDEMKIT_AMQP_PASSWORD_FILE, never from the URL (one
 * there is IK_CONFIG), is never part of a message ("amqp HOST:PORT/VHOST"
 * names the broker) and is wiped after the login.  Every error is
 * classified here, once: unreachable, cut, timed out or a broker closing
 * for shutdown is IK_TEMPFAIL; a refused login, a vhost or queue refused,
 * a queue declared with other arguments IK_CONFIG.  After an error the
 * connection is dropped (closed without a word: its state is unknown) and
 * the next call connects again.  Every wait is bounded by timeout_ms.
 */
#ifndef IK_CONN_AMQP_H
#define IK_CONN_AMQP_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

struct ik_amqp_url {
	int tls;                 /* amqps:// */
	char *host, *vhost, *user;
	int port;
	char *queue;             /* #QUEUE */
	char *params;            /* after '?', "" when none */
	char label[400];         /* "amqp HOST:PORT/VHOST", for messages */
};

/* url: amqp[s]://USER@HOST[:PORT][/VHOST]#QUEUE[?params].  IK_OK or
 * IK_CONFIG with what was expected. */
int ik_amqp_url_parse(const char *url, struct ik_amqp_url *u, ik_err *err);
void ik_amqp_url_free(struct ik_amqp_url *u);

struct ik_amqp {
	const struct ik_amqp_url *u;     /* borrowed */
	void *c;                         /* amqp_connection_state_t, NULL: none */
	int64_t timeout_ms;              /* IDEMKIT_AMQP_TIMEOUT, default 10 s */
	int heartbeat_s;                 /* asked of the broker at login, 0: none;
	                                  * serviced only inside ik_amqp_input */
	int prefetch;                    /* the last basic.qos sent, 0: none */
	int confirm;                     /* the channel is in confirm mode */
	uint64_t seq;                    /* last publish's sequence number */
	unsigned long gen;               /* connections made so far: the one
	                                  * a delivery tag belongs to (logs) */
};

/* A queue's declaration: durable, and what RabbitMQ is told. */
struct ik_amqp_qdecl {
	int quorum;                      /* x-queue-type=quorum */
	int64_t delivery_limit;          /* x-delivery-limit, < 0: none */
	const char *dlx_key;             /* dead-letter to the default exchange, key */
	int64_t message_ttl_ms;          /* x-message-ttl, 0: none */
	int64_t expires_ms;              /* x-expires, 0: none */
	/* x-dead-letter-strategy=at-least-once (quorum, RabbitMQ 3.10+: the
	 * message leaves only once its target confirmed it) and the
	 * x-overflow=reject-publish it needs */
	int dl_at_least_once;
};

/* A message to publish, or one received (malloc'd strings then). */
struct ik_amqp_msg {
	char *body;
	size_t len;
	char *message_id;
	int64_t sent_at;                 /* epoch ms, header x-idemkit-sent-at */
	int64_t delivery_count;          /* received: x-delivery-count, else 0 */
	char **names, **values;          /* string headers (message attributes) */
	size_t nattrs;
	uint64_t tag;                    /* received: the delivery tag */
	int redelivered;                 /* received: the broker's flag */
};
void ik_amqp_msg_free(struct ik_amqp_msg *m);

/* IK_OK when a password is configured (not read), else IK_CONFIG. */
int ik_amqp_has_password(ik_err *err);

/* Connects when not connected: socket, login, channel 1. */
int ik_amqp_ensure(struct ik_amqp *a, ik_err *err);
/* polite: connection.close first; else the socket is just closed. */
void ik_amqp_close(struct ik_amqp *a, int polite);
/* The connection's socket, or -1. */
int ik_amqp_fd(struct ik_amqp *a);

/* queue.declare; passive: only checks it exists.  *ready (may be NULL)
 * gets its count of ready messages. */
int ik_amqp_declare(struct ik_amqp *a, const char *name, int passive,
                    const struct ik_amqp_qdecl *d, int64_t *ready, ik_err *err);

/* Publishes n messages to queue (default exchange, persistent, mandatory)
 * and waits for the broker's confirm of each: codes[i] IK_OK when
 * confirmed, IK_TEMPFAIL when nacked or returned.  The call's own result:
 * IK_OK, or an error after which nothing can be said of unconfirmed ones
 * (their codes[] say IK_TEMPFAIL). */
int ik_amqp_publish(struct ik_amqp *a, const char *queue, const struct ik_amqp_msg *m,
                    size_t n, int *codes, ik_err *err);

/* Receiving, never waited for: what the broker sends comes through
 * ik_amqp_input.  get_start sends one basic.get (manual ack): its
 * delivery, or its "empty", follows.  consume starts a consumer (manual
 * ack, nowait) under tag with a per-consumer prefetch of prefetch
 * (basic.qos sent first when it differs from the last); cancel ends one
 * (nowait: a delivery may still come after it). */
int ik_amqp_get_start(struct ik_amqp *a, const char *queue, ik_err *err);
int ik_amqp_consume(struct ik_amqp *a, const char *queue, const char *tag, int prefetch,
                    ik_err *err);
int ik_amqp_cancel(struct ik_amqp *a, const char *tag, ik_err *err);
int ik_amqp_ack(struct ik_amqp *a, uint64_t tag, ik_err *err);
/* basic.reject, requeue. */
int ik_amqp_requeue(struct ik_amqp *a, uint64_t tag, ik_err *err);
/* A delivery to consumer ctag, or a basic.get's (ctag NULL); m NULL: a
 * basic.get found the queue empty.  m is the callee's (ik_amqp_msg_free). */
typedef void ik_amqp_deliver_fn(void *arg, const char *ctag, struct ik_amqp_msg *m);

/* Reads, without waiting, all that came (a socket that polled readable,
 * or a timer: the heartbeats are sent and checked here): each delivery to
 * fn; a close from the broker, a cut or a missed heartbeat is an error
 * and the connection is dropped.  Afterwards nothing is left buffered.
 * IK_OK while the connection stays up. */
int ik_amqp_input(struct ik_amqp *a, ik_amqp_deliver_fn *fn, void *arg, ik_err *err);

#endif
