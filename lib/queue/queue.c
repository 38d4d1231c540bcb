/* queue.c: the queue port (queue.h): what both adapters share, freeing
 * messages and the calls in flight.  Picking an adapter from a URL, the
 * default URLs and the DLQ rule are open_queue.c's. */
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "queue/queue.h"

void
ik_qmsg_free(struct ik_qmsg *m)
{
	if (!m)
		return;
	free(m->body);
	free(m->message_id);
	free(m->receipt);
	for (size_t i = 0; i < m->nattrs; i++) {
		free(m->attrs[i].name);
		free(m->attrs[i].value);
	}
	free(m->attrs);
	memset(m, 0, sizeof *m);
}

int
ik_qsend_check(const struct ik_qsend *m, ik_err *err)
{
	size_t bytes;

	if (!m->body || !*m->body)
		return ik_errf(err, IK_DATAERR, "empty message body");
	bytes = strlen(m->body);
	for (size_t i = 0; i < m->nattrs; i++)
		bytes += strlen(m->attrs[i].name) + strlen("String") + strlen(m->attrs[i].value);
	if (bytes > IK_QUEUE_MAX_BYTES)
		return ik_errf(err, IK_DATAERR, "message of %zu bytes (body and attributes): "
		    "the largest a queue takes is %d (256 KiB, SQS's limit)", bytes,
		    IK_QUEUE_MAX_BYTES);
	if (m->delay_s < 0 || m->delay_s > IK_QUEUE_MAX_DELAY)
		return ik_errf(err, IK_DATAERR, "delay %d: expected 0..%d", m->delay_s,
		               IK_QUEUE_MAX_DELAY);
	return IK_OK;
}

void
ik_queue_close(struct ik_queue *q)
{
	if (!q)
		return;
	if (q->ops)
		q->ops->close(q);
	free(q->url);
	free(q);
}

/* ---- calls in flight ---- */

int
ik_queue_inflight(const struct ik_queue *q)
{
	return q->ops->submit != NULL;
}

void
ik_queue_done(struct ik_queue *q, struct ik_qop *op)
{
	op->next = NULL;
	if (q->done_last)
		q->done_last->next = op;
	else
		q->done = op;
	q->done_last = op;
}

/* The call op names, to its end, with the adapter's blocking operation. */
static int
run_now(struct ik_queue *q, struct ik_qop *op)
{
	const struct ik_queue_ops *o = q->ops;

	switch (op->kind) {
	case IK_QOP_RECEIVE:
		return o->receive(q, op->max, op->wait_s, op->visibility_s, op->msgs, &op->got,
		                  &op->err);
	case IK_QOP_DEL:
		return o->del(q, op->receipts[0], &op->err);
	case IK_QOP_DEL_BATCH:
		return o->del_batch(q, op->receipts, op->n, op->res, &op->err);
	case IK_QOP_CHVIS:
		return o->change_visibility(q, op->receipts[0], op->visibility_s, &op->err);
	case IK_QOP_SEND:
		return o->send(q, op->msg, &op->err);
	}
	return ik_errf(&op->err, IK_SOFTWARE, "queue: unknown call %d", (int)op->kind);
}

void
ik_queue_submit(struct ik_queue *q, struct ik_qop *op)
{
	ik_errclear(&op->err);
	op->got = 0;
	q->pending++;
	if (q->ops->submit) {
		if ((op->rc = q->ops->submit(q, op, &op->err)) == IK_OK)
			return;
	} else {
		op->rc = run_now(q, op);
	}
	ik_queue_done(q, op);
}

struct ik_qop *
ik_queue_reap(struct ik_queue *q, int timeout_ms)
{
	struct ik_qop *op;
	ik_err err = { 0 };

	if (!q->done && q->pending && q->ops->run)
		q->ops->run(q, timeout_ms, &err);   /* an error came with each call */
	if (!(op = q->done))
		return NULL;
	if (!(q->done = op->next))
		q->done_last = NULL;
	op->next = NULL;
	q->pending--;
	return op;
}
