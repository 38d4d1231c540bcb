/* queue_sqs.c: a standard SQS queue through the JSON protocol (aws.h does
 * credentials, region, endpoint, signing and retries).
 *
 * Rules:
 *  - one ik_aws handle per queue, opened with the queue: no credentials is
 *    IK_CONFIG before any message is touched;
 *  - service errors are judged here, from the SQS error name: a queue that
 *    does not exist is IK_CONFIG, a receipt handle SQS refuses IK_DATAERR,
 *    one that expired or whose message is no longer in flight
 *    IK_LEASE_LOST, any other refused request IK_DATAERR;
 *  - batch calls report each entry (Successful / Failed lists);
 *  - a long poll is made of polls of at most 8 s, and 2 s under the
 *    request timeout aws.h resolved (ik_aws_timeout_ms), so it also
 *    notices a stop request between polls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "core/outcome.h"
#include "core/util.h"
#include "queue/queue.h"
#include "queue/sqs/queue_sqs.h"

#define POLL_MAX_S 8

struct scall;

struct sqsq {
	struct ik_aws *aws;
	char *url;
	int poll_s;            /* the longest WaitTimeSeconds per request */
	struct scall *calls;   /* in flight (ik_aws_submit), and to poll again */
};

/* One op in flight: what its callback needs. */
struct scall {
	struct ik_queue *q;
	struct ik_qop *op;
	int again;             /* a long poll that brought nothing yet: poll on */
	struct scall *prev, *next;
};

/* The outcome for an SQS error name (the short __type or the
 * x-amzn-query-error code). */
static int
sqs_code(const char *type, const char *message)
{
	if (strstr(type, "QueueDoesNotExist") || strstr(type, "NonExistentQueue"))
		return IK_CONFIG;
	if (strstr(type, "MessageNotInflight") ||
	    (message && strstr(message, "has expired")))
		return IK_LEASE_LOST;
	if (strstr(type, "ReceiptHandleIsInvalid"))
		return IK_DATAERR;
	return IK_DATAERR;
}

/* What an ik_aws answer means for the queue: rc as ik_aws_call returns
 * it, judged from the SQS error name when it is the caller's to judge. */
static int
judge(const struct sqsq *s, const char *action, int rc, const struct ik_aws_error *ae,
      ik_err *err)
{
	if (rc == IK_AWS_ERROR) {
		const char *type = ae->query[0] ? ae->query : ae->type;
		int code = sqs_code(type, ae->message);
		if (code == IK_CONFIG)
			return ik_errf(err, IK_CONFIG, "sqs %s: queue %s does not exist (%s)",
			               action, s->url, type);
		if (err)
			err->code = code;   /* keep aws's message, our code */
		return code;
	}
	return rc;
}

static int
call(struct sqsq *s, const char *action, const cJSON *req, cJSON **resp, ik_err *err)
{
	struct ik_aws_error ae;
	char target[64];
	int rc;

	snprintf(target, sizeof target, "AmazonSQS.%s", action);
	memset(&ae, 0, sizeof ae);
	*resp = NULL;
	rc = ik_aws_call(s->aws, target, req, resp, &ae, err);
	if (rc == IK_AWS_ERROR) {
		cJSON_Delete(*resp);   /* the error body: ae has what we need */
		*resp = NULL;
	}
	return judge(s, action, rc, &ae, err);
}

static cJSON *
request(struct sqsq *s)
{
	cJSON *r = cJSON_CreateObject();

	if (r && !cJSON_AddStringToObject(r, "QueueUrl", s->url)) {
		cJSON_Delete(r);
		r = NULL;
	}
	return r;
}

static int
oom(ik_err *err)
{
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

static const char *
str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t
num_str(const cJSON *o, const char *k)
{
	const char *v = str(o, k);
	return v ? strtoll(v, NULL, 10) : 0;
}

int
ik_sqs_msg_from_json(const cJSON *j, struct ik_qmsg *m)
{
	const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(j, "Attributes");
	const cJSON *mattrs = cJSON_GetObjectItemCaseSensitive(j, "MessageAttributes");
	const cJSON *it;
	size_t n = 0;

	memset(m, 0, sizeof *m);
	m->body = strdup(str(j, "Body") ? str(j, "Body") : "");
	m->message_id = strdup(str(j, "MessageId") ? str(j, "MessageId") : "");
	m->receipt = strdup(str(j, "ReceiptHandle") ? str(j, "ReceiptHandle") : "");
	m->receive_count = num_str(attrs, "ApproximateReceiveCount");
	m->sent_at = num_str(attrs, "SentTimestamp");
	if (!m->body || !m->message_id || !m->receipt)
		return -1;
	if (cJSON_IsObject(mattrs) && cJSON_GetArraySize(mattrs) > 0) {
		m->attrs = calloc((size_t)cJSON_GetArraySize(mattrs), sizeof *m->attrs);
		if (!m->attrs)
			return -1;
		cJSON_ArrayForEach(it, mattrs) {
			const char *v = str(it, "StringValue");
			if (!v)
				continue;   /* Binary attributes are not carried */
			m->attrs[n].name = strdup(it->string);
			m->attrs[n].value = strdup(v);
			m->nattrs = ++n;
			if (!m->attrs[n - 1].name || !m->attrs[n - 1].value)
				return -1;
		}
	}
	return 0;
}

/* A ReceiveMessage request, or NULL on ENOMEM. */
static cJSON *
receive_request(struct sqsq *s, int max, int wait_s, int visibility_s)
{
	static const char *const names[] = { "ApproximateReceiveCount", "SentTimestamp" };
	static const char *const all[] = { "All" };
	cJSON *req = request(s);

	if (!req ||
	    !cJSON_AddNumberToObject(req, "MaxNumberOfMessages", max) ||
	    !cJSON_AddNumberToObject(req, "WaitTimeSeconds", wait_s) ||
	    (visibility_s >= 0 &&
	     !cJSON_AddNumberToObject(req, "VisibilityTimeout", visibility_s)) ||
	    /* both spellings: older endpoints know only AttributeNames */
	    !cJSON_AddItemToObject(req, "AttributeNames", cJSON_CreateStringArray(names, 2)) ||
	    !cJSON_AddItemToObject(req, "MessageSystemAttributeNames",
	                           cJSON_CreateStringArray(names, 2)) ||
	    !cJSON_AddItemToObject(req, "MessageAttributeNames", cJSON_CreateStringArray(all, 1))) {
		cJSON_Delete(req);
		return NULL;
	}
	return req;
}

/* The messages of a ReceiveMessage response into msgs (room for max). */
static int
receive_result(const cJSON *resp, int max, struct ik_qmsg *msgs, size_t *n, ik_err *err)
{
	const cJSON *it;

	*n = 0;
	cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, "Messages")) {
		if (*n >= (size_t)max)
			break;
		if (ik_sqs_msg_from_json(it, &msgs[*n]) < 0) {
			for (size_t i = 0; i <= *n; i++)
				ik_qmsg_free(&msgs[i]);
			*n = 0;
			/* the messages come back after their visibility timeout */
			return oom(err);
		}
		(*n)++;
	}
	return IK_OK;
}

static int
poll_once(struct ik_queue *q, int max, int wait_s, int visibility_s,
          struct ik_qmsg *msgs, size_t *n, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req, *resp = NULL;
	int rc;

	*n = 0;
	if (max < 1 || max > IK_QUEUE_BATCH)
		return ik_errf(err, IK_USAGE, "receive: at most %d messages", IK_QUEUE_BATCH);
	if (!(req = receive_request(s, max, wait_s, visibility_s)))
		return oom(err);
	rc = call(s, "ReceiveMessage", req, &resp, err);
	cJSON_Delete(req);
	if (rc == IK_OK)
		rc = receive_result(resp, max, msgs, n, err);
	cJSON_Delete(resp);
	return rc;
}

/* The WaitTimeSeconds of the next poll of a long poll ending at deadline. */
static int
poll_wait(const struct sqsq *s, int64_t deadline)
{
	int64_t left = deadline - ik_mono_ms();
	int w = left <= 0 ? 0 : (int)((left + 999) / 1000);

	return w > s->poll_s ? s->poll_s : w;
}

static int
s_receive(struct ik_queue *q, int max, int wait_s, int visibility_s,
          struct ik_qmsg *msgs, size_t *n, ik_err *err)
{
	struct sqsq *s = q->impl;
	int64_t deadline = ik_mono_ms() + (int64_t)wait_s * 1000;
	int rc;

	for (;;) {
		int w = poll_wait(s, deadline);

		rc = poll_once(q, max, w, visibility_s, msgs, n, err);
		if (rc != IK_OK || *n > 0 || w == 0 || (q->stop && *q->stop) ||
		    ik_mono_ms() >= deadline)
			return rc;
	}
}

static cJSON *
del_request(struct sqsq *s, const char *receipt)
{
	cJSON *req = request(s);

	if (!req || !cJSON_AddStringToObject(req, "ReceiptHandle", receipt)) {
		cJSON_Delete(req);
		return NULL;
	}
	return req;
}

static int
s_del(struct ik_queue *q, const char *receipt, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req = del_request(s, receipt), *resp = NULL;
	int rc;

	if (!req)
		return oom(err);
	rc = call(s, "DeleteMessage", req, &resp, err);
	cJSON_Delete(req);
	cJSON_Delete(resp);
	return rc;
}

/* The entry an answer's Id names: the index < n whose decimal text (as
 * batch_entry wrote it) it is exactly, else n.  "7x", "07", "+7", " 7" or
 * a number past the batch name no entry of ours: their answer is applied
 * to no message rather than to the wrong one. */
static size_t
entry_index(const char *id, size_t n)
{
	char want[24];
	long long i;

	if (!id || ik_parse_int(id, 0, (long long)n - 1, &i) < 0)
		return n;
	snprintf(want, sizeof want, "%lld", i);
	return strcmp(want, id) == 0 ? (size_t)i : n;
}

void
ik_sqs_batch_results(const cJSON *resp, size_t n, struct ik_qresult *res,
              void (*ok)(const cJSON *entry, size_t i, void *arg), void *arg)
{
	static const char *const lists[] = { "Successful", "Failed" };
	unsigned char *seen = n ? calloc(n, 1) : NULL;
	const cJSON *it;

	for (size_t i = 0; i < n; i++) {
		res[i].code = IK_SOFTWARE;
		snprintf(res[i].msg, sizeof res[i].msg, "%s", seen ? "no result for this entry" :
		    "out of memory reading the batch's results");
	}
	if (!seen)
		return;
	for (size_t l = 0; l < 2; l++)
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(resp, lists[l])) {
			const char *code = str(it, "Code"), *m = str(it, "Message");
			const cJSON *sf = cJSON_GetObjectItemCaseSensitive(it, "SenderFault");
			size_t i = entry_index(str(it, "Id"), n);

			if (i >= n)
				continue;
			if (seen[i]++) {
				/* answered twice (both lists, or one twice): which
				 * is true is unknown, so not a success -- a delete
				 * is left and comes back, a send is sent again */
				res[i].code = IK_SOFTWARE;
				snprintf(res[i].msg, sizeof res[i].msg,
				    "the service answered this entry more than once");
			} else if (l == 0) {
				res[i].code = IK_OK;
				res[i].msg[0] = '\0';
				if (ok)
					ok(it, i, arg);
			} else {
				/* a failure not the sender's is the service's: retry later */
				res[i].code = cJSON_IsFalse(sf) ? IK_TEMPFAIL :
				    sqs_code(code ? code : "", m);
				snprintf(res[i].msg, sizeof res[i].msg, "%s: %.400s",
				    code ? code : "Failed", m ? m : "");
			}
		}
	free(seen);
}

/* A new entry of a batch request, its Id the index (batch results name
 * entries by Id); NULL on ENOMEM. */
static cJSON *
batch_entry(cJSON *entries, size_t i)
{
	cJSON *e = cJSON_CreateObject();
	char id[24];

	snprintf(id, sizeof id, "%zu", i);
	if (!e || !cJSON_AddItemToArray(entries, e)) {
		cJSON_Delete(e);
		return NULL;
	}
	return cJSON_AddStringToObject(e, "Id", id) ? e : NULL;
}

static cJSON *
del_batch_request(struct sqsq *s, const char *const *receipts, size_t n)
{
	cJSON *req = request(s), *entries;

	if (!req || !(entries = cJSON_AddArrayToObject(req, "Entries")))
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		cJSON *e = batch_entry(entries, i);
		if (!e || !cJSON_AddStringToObject(e, "ReceiptHandle", receipts[i]))
			goto nomem;
	}
	return req;
nomem:
	cJSON_Delete(req);
	return NULL;
}

static int
s_del_batch(struct ik_queue *q, const char *const *receipts, size_t n,
            struct ik_qresult *res, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req = del_batch_request(s, receipts, n), *resp = NULL;
	int rc;

	if (!req)
		return oom(err);
	rc = call(s, "DeleteMessageBatch", req, &resp, err);
	cJSON_Delete(req);
	if (rc == IK_OK)
		ik_sqs_batch_results(resp, n, res, NULL, NULL);
	cJSON_Delete(resp);
	return rc;
}

static cJSON *
chvis_request(struct sqsq *s, const char *receipt, int visibility_s)
{
	cJSON *req = request(s);

	if (!req || !cJSON_AddStringToObject(req, "ReceiptHandle", receipt) ||
	    !cJSON_AddNumberToObject(req, "VisibilityTimeout", visibility_s)) {
		cJSON_Delete(req);
		return NULL;
	}
	return req;
}

static int
s_chvis(struct ik_queue *q, const char *receipt, int visibility_s, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req = chvis_request(s, receipt, visibility_s), *resp = NULL;
	int rc;

	if (!req)
		return oom(err);
	rc = call(s, "ChangeMessageVisibility", req, &resp, err);
	cJSON_Delete(req);
	cJSON_Delete(resp);
	return rc;
}

/* Body, delay and attributes of one message into o. */
static int
add_message(cJSON *o, const struct ik_qsend *m, const char *body_key)
{
	cJSON *attrs;

	if (!cJSON_AddStringToObject(o, body_key, m->body) ||
	    (m->delay_s > 0 && !cJSON_AddNumberToObject(o, "DelaySeconds", m->delay_s)))
		return -1;
	if (m->nattrs == 0)
		return 0;
	if (!(attrs = cJSON_AddObjectToObject(o, "MessageAttributes")))
		return -1;
	for (size_t i = 0; i < m->nattrs; i++) {
		cJSON *a = cJSON_AddObjectToObject(attrs, m->attrs[i].name);
		if (!a || !cJSON_AddStringToObject(a, "DataType", "String") ||
		    !cJSON_AddStringToObject(a, "StringValue", m->attrs[i].value))
			return -1;
	}
	return 0;
}

static cJSON *
send_request(struct sqsq *s, const struct ik_qsend *m)
{
	cJSON *req = request(s);

	if (!req || add_message(req, m, "MessageBody") < 0) {
		cJSON_Delete(req);
		return NULL;
	}
	return req;
}

static int
send_result(const cJSON *resp, struct ik_qsend *m, ik_err *err)
{
	const char *id = str(resp, "MessageId");

	return (m->message_id = strdup(id ? id : "")) ? IK_OK : oom(err);
}

static int
s_send(struct ik_queue *q, struct ik_qsend *m, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req = send_request(s, m), *resp = NULL;
	int rc;

	if (!req)
		return oom(err);
	rc = call(s, "SendMessage", req, &resp, err);
	cJSON_Delete(req);
	if (rc == IK_OK)
		rc = send_result(resp, m, err);
	cJSON_Delete(resp);
	return rc;
}

static void
sent_ok(const cJSON *entry, size_t i, void *arg)
{
	struct ik_qsend *m = arg;
	const char *id = str(entry, "MessageId");

	m[i].message_id = strdup(id ? id : "");
}

static int
s_send_batch(struct ik_queue *q, struct ik_qsend *m, size_t n,
             struct ik_qresult *res, ik_err *err)
{
	struct sqsq *s = q->impl;
	cJSON *req = request(s), *resp = NULL, *entries;
	int rc;

	if (!req || !(entries = cJSON_AddArrayToObject(req, "Entries")))
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		cJSON *e = batch_entry(entries, i);
		if (!e || add_message(e, &m[i], "MessageBody") < 0)
			goto nomem;
	}
	rc = call(s, "SendMessageBatch", req, &resp, err);
	cJSON_Delete(req);
	if (rc == IK_OK) {
		ik_sqs_batch_results(resp, n, res, sent_ok, m);
		for (size_t i = 0; i < n; i++)
			if (res[i].code == IK_OK && !m[i].message_id) {
				res[i].code = IK_SOFTWARE;
				snprintf(res[i].msg, sizeof res[i].msg, "out of memory");
			}
	}
	cJSON_Delete(resp);
	return rc;
nomem:
	cJSON_Delete(req);
	return oom(err);
}

static int
s_stats(struct ik_queue *q, struct ik_qstats *st, ik_err *err)
{
	static const char *const names[] = {
		"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
		"ApproximateNumberOfMessagesDelayed",
	};
	struct sqsq *s = q->impl;
	cJSON *req = request(s), *resp = NULL, *a;
	int rc;

	if (!req || !cJSON_AddItemToObject(req, "AttributeNames",
	                                   cJSON_CreateStringArray(names, 3))) {
		cJSON_Delete(req);
		return oom(err);
	}
	rc = call(s, "GetQueueAttributes", req, &resp, err);
	cJSON_Delete(req);
	if (rc == IK_OK) {
		a = cJSON_GetObjectItemCaseSensitive(resp, "Attributes");
		st->visible = num_str(a, names[0]);
		st->inflight = num_str(a, names[1]);
		st->delayed = num_str(a, names[2]);
	}
	cJSON_Delete(resp);
	return rc;
}

/* ---- calls in flight ----
 * Each op is one ik_aws_submit (a long poll one per poll), judged by the
 * same code as the blocking calls; its callback fills the op's outputs and
 * hands it to the port.  A long poll that brought nothing and has time
 * left is polled again by s_run, after ik_aws_run returned (never from
 * inside a callback). */

/* ik_aws_submit keeps a pointer into the target until the call is over
 * (its messages name the operation): static strings, never a buffer. */
#define OP(name) "AmazonSQS." name
static const char *const op_target[] = {
	[IK_QOP_RECEIVE] = OP("ReceiveMessage"),
	[IK_QOP_DEL] = OP("DeleteMessage"),
	[IK_QOP_DEL_BATCH] = OP("DeleteMessageBatch"),
	[IK_QOP_CHVIS] = OP("ChangeMessageVisibility"),
	[IK_QOP_SEND] = OP("SendMessage"),
};
#undef OP
#define op_action(k) (op_target[k] + strlen("AmazonSQS."))

static void
unlink_call(struct sqsq *s, struct scall *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		s->calls = c->next;
	if (c->next)
		c->next->prev = c->prev;
}

static void
call_done(struct sqsq *s, struct scall *c)
{
	unlink_call(s, c);
	ik_queue_done(c->q, c->op);
	free(c);
}

static void
answered(void *arg, int rc, cJSON *resp, const struct ik_aws_error *aerr, const ik_err *err)
{
	struct scall *c = arg;
	struct ik_qop *op = c->op;
	struct ik_queue *q = c->q;
	struct sqsq *s = q->impl;

	if (rc != IK_OK && err)
		op->err = *err;
	op->rc = judge(s, op_action(op->kind), rc, aerr, &op->err);
	if (op->rc == IK_OK) {
		switch (op->kind) {
		case IK_QOP_RECEIVE:
			op->rc = receive_result(resp, op->max, op->msgs, &op->got, &op->err);
			break;
		case IK_QOP_DEL_BATCH:
			ik_sqs_batch_results(resp, op->n, op->res, NULL, NULL);
			break;
		case IK_QOP_SEND:
			op->rc = send_result(resp, op->msg, &op->err);
			break;
		case IK_QOP_DEL:
		case IK_QOP_CHVIS:
			break;
		}
	}
	cJSON_Delete(resp);
	if (op->kind == IK_QOP_RECEIVE && op->rc == IK_OK && op->got == 0 &&
	    poll_wait(s, op->deadline) > 0 && !(q->stop && *q->stop)) {
		c->again = 1;
		return;
	}
	call_done(s, c);
}

/* Sends op's request; IK_OK when it is in flight. */
static int
send_call(struct sqsq *s, struct scall *c)
{
	struct ik_qop *op = c->op;
	cJSON *req = NULL;
	int rc;

	switch (op->kind) {
	case IK_QOP_RECEIVE:
		req = receive_request(s, op->max, poll_wait(s, op->deadline), op->visibility_s);
		break;
	case IK_QOP_DEL:
		req = del_request(s, op->receipts[0]);
		break;
	case IK_QOP_DEL_BATCH:
		req = del_batch_request(s, op->receipts, op->n);
		break;
	case IK_QOP_CHVIS:
		req = chvis_request(s, op->receipts[0], op->visibility_s);
		break;
	case IK_QOP_SEND:
		req = send_request(s, op->msg);
		break;
	}
	if (!req)
		return oom(&op->err);
	rc = ik_aws_submit(s->aws, op_target[op->kind], req, answered, c, &op->err);
	cJSON_Delete(req);
	return rc;
}

static int
s_submit(struct ik_queue *q, struct ik_qop *op, ik_err *err)
{
	struct sqsq *s = q->impl;
	struct scall *c;
	int rc;

	if ((op->kind == IK_QOP_RECEIVE && (op->max < 1 || op->max > IK_QUEUE_BATCH)) ||
	    (op->kind == IK_QOP_DEL_BATCH && (op->n < 1 || op->n > IK_QUEUE_BATCH)))
		return ik_errf(err, IK_USAGE, "%s: 1 to %d entries", op_action(op->kind),
		               IK_QUEUE_BATCH);
	if (!(c = calloc(1, sizeof *c)))
		return oom(err);
	c->q = q;
	c->op = op;
	if (op->kind == IK_QOP_RECEIVE)
		op->deadline = ik_mono_ms() + (int64_t)op->wait_s * 1000;
	if ((rc = send_call(s, c)) != IK_OK) {
		if (err != &op->err && err)
			*err = op->err;
		free(c);
		return rc;
	}
	c->next = s->calls;
	if (s->calls)
		s->calls->prev = c;
	s->calls = c;
	return IK_OK;
}

static int
s_run(struct ik_queue *q, int timeout_ms, ik_err *err)
{
	struct sqsq *s = q->impl;
	struct scall *c, *next;
	int rc = ik_aws_run(s->aws, NULL, 0, timeout_ms, err);

	for (c = s->calls; c; c = next) {
		next = c->next;
		if (rc != IK_OK) {
			/* the multi handle broke: its calls are lost */
			c->op->rc = rc;
			c->op->err = *err;
			call_done(s, c);
		} else if (c->again) {
			c->again = 0;
			if ((c->op->rc = send_call(s, c)) != IK_OK)
				call_done(s, c);
		}
	}
	return rc;
}

static void
s_close(struct ik_queue *q)
{
	struct sqsq *s = q->impl;

	if (s) {
		ik_aws_close(s->aws);
		while (s->calls) {   /* a caller that closed with calls unreaped */
			struct scall *c = s->calls;
			s->calls = c->next;
			free(c);
		}
		free(s->url);
		free(s);
	}
	q->impl = NULL;
}

static const struct ik_queue_ops sqs_ops = {
	.name = "sqs",
	.receive = s_receive,
	.del = s_del,
	.del_batch = s_del_batch,
	.change_visibility = s_chvis,
	.send = s_send,
	.send_batch = s_send_batch,
	.stats = s_stats,
	.close = s_close,
	.submit = s_submit,
	.run = s_run,
};

int
ik_queue_sqs_open(const char *url, struct ik_queue *q, ik_err *err)
{
	struct sqsq *s = calloc(1, sizeof *s);
	long t;
	int rc;

	if (!s || !(s->url = strdup(url))) {
		free(s);
		return oom(err);
	}
	if ((rc = ik_aws_open("sqs", &s->aws, err)) != IK_OK) {
		free(s->url);
		free(s);
		return rc;
	}
	/* leave the response 2 s of the request timeout */
	t = ik_aws_timeout_ms(s->aws) / 1000 - 2;
	s->poll_s = t < POLL_MAX_S ? (t > 0 ? (int)t : 0) : POLL_MAX_S;
	/* The queue's own RedrivePolicy is not read (a call more per open):
	 * sqs-ack assumes the default, and sqs-ack(1) asks for a policy of at
	 * least that many receives, so the copy sqs-ack sends, with its
	 * reason, comes first. */
	q->max_receive = IK_QUEUE_DEFAULT_MAX_RECEIVE;
	q->ops = &sqs_ops;
	q->impl = s;
	return IK_OK;
}
