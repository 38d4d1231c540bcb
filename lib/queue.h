/* queue.h: the queue port (DESIGN.md "Backends and configuration").
 *
 * Commands talk to this port only.  Each adapter (queue_sqlite.c,
 * queue_sqs.c) fills a struct ik_queue_ops and knows nothing of the
 * others; ik_queue_open picks one from the URL:
 *
 *   sqlite:PATH#NAME[?maxReceiveCount=N&dlq=NAME&visibility=SECS&retention=DUR]
 *   https://sqs.REGION.amazonaws.com/ACCOUNT/NAME   (http:// for an emulator)
 *
 * Semantics every adapter keeps (they are SQS's):
 *  - a received message is invisible for the visibility timeout, then
 *    delivered again with receiveCount + 1 and a NEW receipt handle;
 *  - delete and change-visibility take the receipt handle of the latest
 *    receive; a stale handle is IK_LEASE_LOST where the backend can tell
 *    (SQS itself answers success and may not delete);
 *  - transient trouble (busy, unreachable, throttled) is IK_TEMPFAIL, bad
 *    configuration or credentials IK_CONFIG, a refused request IK_DATAERR.
 */
#ifndef IK_QUEUE_H
#define IK_QUEUE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define IK_QUEUE_BATCH 10           /* SQS's limit per batch call */
#define IK_QUEUE_MAX_VISIBILITY 43200
#define IK_QUEUE_MAX_DELAY 900
#define IK_QUEUE_MAX_WAIT 20

/* A string message attribute (name, value). */
struct ik_qattr {
	char *name;
	char *value;
};

/* A received message; strings are malloc'd (ik_qmsg_free). */
struct ik_qmsg {
	char *body;
	char *message_id;
	char *receipt;
	int64_t receive_count;
	int64_t sent_at;            /* epoch ms */
	struct ik_qattr *attrs;     /* string message attributes */
	size_t nattrs;
};
void ik_qmsg_free(struct ik_qmsg *m);

/* One message to send.  On success the adapter sets message_id (malloc'd;
 * the caller frees it). */
struct ik_qsend {
	const char *body;
	int delay_s;                     /* 0..900 */
	const struct ik_qattr *attrs;    /* may be NULL */
	size_t nattrs;
	char *message_id;                /* out */
};

/* The result of one entry of a batch call. */
struct ik_qresult {
	int code;                   /* IK_OK, or why this entry failed */
	char msg[1024];             /* as ik_err.msg */
};

/* Approximate counts (GetQueueAttributes). */
struct ik_qstats {
	int64_t visible;            /* ApproximateNumberOfMessages */
	int64_t inflight;           /* ApproximateNumberOfMessagesNotVisible */
	int64_t delayed;            /* ApproximateNumberOfMessagesDelayed */
};

struct ik_queue;

struct ik_queue_ops {
	const char *name;   /* "sqlite", "sqs" */
	/* Up to max (1..10) messages into msgs[]; *n gets how many.  Waits up
	 * to wait_s seconds for the first one (long polling), returning early
	 * when *q->stop becomes non-zero.  visibility_s < 0: the queue's
	 * default.  IK_OK (also with *n == 0) or an error code. */
	int (*receive)(struct ik_queue *q, int max, int wait_s, int visibility_s,
	               struct ik_qmsg *msgs, size_t *n, ik_err *err);
	int (*del)(struct ik_queue *q, const char *receipt, ik_err *err);
	/* n <= 10.  The call's own result is returned; res[i] says how entry
	 * i fared when it is IK_OK. */
	int (*del_batch)(struct ik_queue *q, const char *const *receipts, size_t n,
	                 struct ik_qresult *res, ik_err *err);
	int (*change_visibility)(struct ik_queue *q, const char *receipt,
	                         int visibility_s, ik_err *err);
	int (*send)(struct ik_queue *q, struct ik_qsend *m, ik_err *err);
	/* n <= 10; as del_batch. */
	int (*send_batch)(struct ik_queue *q, struct ik_qsend *m, size_t n,
	                  struct ik_qresult *res, ik_err *err);
	int (*stats)(struct ik_queue *q, struct ik_qstats *st, ik_err *err);
	void (*close)(struct ik_queue *q);
};

struct ik_queue {
	const struct ik_queue_ops *ops;
	void *impl;
	char *url;                       /* canonical: what envelopes carry */
	volatile sig_atomic_t *stop;     /* set by the caller; may be NULL */
};

/* url: as above, or NULL for $IDEMKIT_QUEUE, else
 * sqlite:STATE_DIR/queue.db#charges.  IK_OK, IK_CONFIG (malformed URL,
 * with a message that says what was expected), or IK_TEMPFAIL. */
int ik_queue_open(const char *url, struct ik_queue **out, ik_err *err);
void ik_queue_close(struct ik_queue *q);

/* The dead-letter queue URL for a queue: dlq when given, else $IDEMKIT_DLQ,
 * else for sqlite:PATH#NAME the queue sqlite:PATH#NAME-dlq; NULL (with
 * IK_CONFIG in err) for an SQS queue with no DLQ configured.  malloc'd. */
char *ik_queue_dlq_url(const char *dlq, const char *queue_url, ik_err *err);

/* Adapter constructors, for queue.c only.  params is the query string of a
 * sqlite URL ("" when none). */
int ik_queue_sqlite_open(const char *path, const char *name, const char *params,
                         struct ik_queue *q, ik_err *err);
int ik_queue_sqs_open(const char *url, struct ik_queue *q, ik_err *err);

#endif
