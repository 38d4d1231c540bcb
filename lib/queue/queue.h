/* queue.h: the queue port (DESIGN.md "Backends and configuration").
 *
 * Commands talk to this port only.  Each adapter (queue_sqlite.c,
 * queue_sqs.c) fills a struct ik_queue_ops and knows nothing of the
 * others; ik_queue_open (open_queue.h) picks one from the URL:
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

#include "core/err.h"

#define IK_QUEUE_BATCH 10           /* SQS's limit per batch call */
#define IK_QUEUE_MAX_VISIBILITY 43200
#define IK_QUEUE_MAX_DELAY 900
#define IK_QUEUE_MAX_WAIT 20
/* SQS's largest message, 256 KiB: the body plus each attribute's name,
 * type ("String") and value.  The embedded queue refuses what SQS would,
 * so a message that passes a test on it is one SQS takes. */
#define IK_QUEUE_MAX_BYTES 262144
/* The redrive policy a queue has unless told otherwise: a message is
 * delivered at most this many times, then dead-lettered (the embedded
 * queue's default maxReceiveCount; on SQS, what sqs-ack assumes the
 * queue's RedrivePolicy allows at least).  Ten deliveries, with sqs-ack's
 * backoff of 2^receiveCount x 2 s capped at 15 min, outlast about 45
 * minutes of an outage before a message is dead-lettered. */
#define IK_QUEUE_DEFAULT_MAX_RECEIVE 10

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

/* What SQS would refuse of a message before any call: an empty body, more
 * than IK_QUEUE_MAX_BYTES of body and attributes, a delay out of range
 * (IK_DATAERR, why in err); IK_OK.  For the adapters that do not ask a
 * server that checks it (so a message that passes a test on the embedded
 * queue is one SQS takes). */
int ik_qsend_check(const struct ik_qsend *m, ik_err *err);

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
struct ik_qop;

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
	/* Optional, calls in flight (below); both NULL when the adapter keeps
	 * one call at a time.  submit: IK_OK when op is started (the adapter
	 * then hands it to ik_queue_done exactly once, from a later run),
	 * else nothing was started.  run: moves the calls on, waiting up to
	 * timeout_ms (-1: until one finishes) when none has; IK_OK, or an
	 * error after which every call it had was handed to ik_queue_done. */
	int (*submit)(struct ik_queue *q, struct ik_qop *op, ik_err *err);
	int (*run)(struct ik_queue *q, int timeout_ms, ik_err *err);
};

struct ik_queue {
	const struct ik_queue_ops *ops;
	void *impl;
	char *url;                       /* canonical: what envelopes carry */
	/* The redrive policy's maxReceiveCount: a message is delivered at
	 * most this many times, then the queue dead-letters it; 0: none. */
	int64_t max_receive;
	volatile sig_atomic_t *stop;     /* set by the caller; may be NULL */
	struct ik_qop *done, *done_last; /* the port's: finished, not reaped */
	size_t pending;                  /* submitted and not yet reaped */
};

/* ---- calls in flight (issue 16) ----
 * One queue call as an object, so that many can be outstanding on one
 * queue from one thread.  ik_queue_submit starts it (on an adapter without
 * submit it runs it at once, so a caller writes one loop for every
 * backend); ik_queue_reap hands each op back exactly once, with rc, err
 * and its outputs set, in the order the calls finished, never in the order
 * they were started.  The op and what it points to belong to the caller
 * and must stay alive until it was reaped.  Entry results of a batch are
 * res[i] for receipts[i] of that op only. */
enum ik_qop_kind {
	IK_QOP_RECEIVE,     /* receive(max, wait_s, visibility_s) into msgs */
	IK_QOP_DEL,         /* del(receipts[0]) */
	IK_QOP_DEL_BATCH,   /* del_batch(receipts, n) into res */
	IK_QOP_CHVIS,       /* change_visibility(receipts[0], visibility_s) */
	IK_QOP_SEND,        /* send(msg): msg->message_id set on success */
};

struct ik_qop {
	enum ik_qop_kind kind;
	int max, wait_s, visibility_s;
	struct ik_qmsg *msgs;            /* RECEIVE: room for max */
	size_t got;                      /* RECEIVE, out: how many */
	const char *const *receipts;     /* DEL_BATCH: n; DEL, CHVIS: one */
	size_t n;
	struct ik_qresult *res;          /* DEL_BATCH: n, out */
	struct ik_qsend *msg;            /* SEND */
	int rc;                          /* out: the call's own result */
	ik_err err;                      /* out, when rc != IK_OK */
	void *arg;                       /* the caller's */
	struct ik_qop *next;             /* the port's */
	int64_t deadline;                /* the adapter's (a long poll's end) */
};

/* 1 when the adapter keeps calls in flight (else ik_queue_submit runs each
 * call to its end before it returns). */
int ik_queue_inflight(const struct ik_queue *q);
/* Starts op; it is reaped later whatever happens (a call that could not be
 * started comes back with its error). */
void ik_queue_submit(struct ik_queue *q, struct ik_qop *op);
/* A finished op, or NULL when none finished within timeout_ms (-1: as long
 * as it takes; NULL at once when none is pending).  A stop signal does not
 * cut a call short: it is still reaped. */
struct ik_qop *ik_queue_reap(struct ik_queue *q, int timeout_ms);
/* For adapters: op has finished (rc, err and the outputs are set). */
void ik_queue_done(struct ik_queue *q, struct ik_qop *op);

/* Closes q (opened by ik_queue_open, open_queue.h). */
void ik_queue_close(struct ik_queue *q);

#endif
