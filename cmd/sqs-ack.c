/* sqs-ack: do with each message what its envelope's verdict says.
 *
 * The decision is not made here: ik_env_verdict picks the deciding
 * outcome and the table in lib/outcome.c says what it means for the
 * message (delete, delete with an audit line, leave for the lease, leave
 * with a backoff, leave, or DLQ then delete).  This file only carries the
 * action out and records it as the envelope's "ack" result.
 *
 * Rules:
 *  - DLQ = the original body, unchanged, sent to the DLQ with the reason
 *    and the source in message attributes; the message is deleted only
 *    after that send succeeded (a failed send leaves it: TEMPFAIL);
 *  - in --stream mode deletes are batched (up to 10); a partial batch is
 *    sent as soon as the input goes quiet, so batching adds no latency;
 *    envelopes come out in input order, each with its own entry's result;
 *  - a line without a receipt is not a message: DATAERR, nothing acked.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "envelope.h"
#include "event.h"
#include "lines.h"
#include "log.h"
#include "outcome.h"
#include "queue.h"
#include "util.h"

static const char usage[] =
	"usage: sqs-ack [--queue URL] [--dlq URL] [--stream] [--backoff-base SECS]\n"
	"               [--backoff-cap SECS] < envelope\n"
	"       sqs-ack --actions\n";
static const char options[] =
	"  -q, --queue URL         the queue the message came from (default: the\n"
	"                          envelope's \"queue\", else $IDEMKIT_QUEUE, else the\n"
	"                          embedded default)\n"
	"  -D, --dlq URL           dead-letter queue (default $IDEMKIT_DLQ, else for\n"
	"                          sqlite:PATH#NAME the queue sqlite:PATH#NAME-dlq)\n"
	"  -s, --stream            many envelopes in, one out per line; deletes batched\n"
	"  -b, --backoff-base SECS TEMPFAIL backoff: visibility = min(2^receiveCount *\n"
	"                          base, cap) (default 2; $IDEMKIT_BACKOFF_BASE)\n"
	"  -c, --backoff-cap SECS  (default 900; $IDEMKIT_BACKOFF_CAP)\n"
	"  -A, --actions           print the action table (code, outcome, action, meaning)\n"
	"  -h, --help              this help\n"
	"  -V, --version           print the version\n";
static const int codes[] = { 0, 13, 64, 65, 70, 75, 78, -1 };

#define PENDING_MAX 64     /* envelopes held back while a delete batch fills */

struct item {
	cJSON *env;
	cJSON *ack;            /* env's "ack" result, once decided */
	int del;               /* waiting in the delete batch */
	int audit;             /* DUP_DONE: an audit line once deleted */
	int dlq;               /* already sent to the DLQ: the delete completes it */
	int code;
};

struct acker {
	const char *queue_opt, *dlq_opt;
	struct ik_queue *q, *dlq;
	ik_err q_err;          /* why q could not be opened */
	int64_t base_s, cap_s;
	struct item items[PENDING_MAX];
	size_t n, ndel;
	int stream;
	int fatal;             /* configuration is broken: stop */
};

static int stream_mode;

static const char *const steps[] = { "claim", "debit", "notify", "done" };

/* ---- the envelope's facts ---- */

/* The error text of the step that decided the verdict, or "". */
static const char *
deciding_error(const cJSON *env, int verdict, const char *why, const char **step)
{
	for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		cJSON *r = ik_env_result(env, steps[i]);
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
		if (r && (strcmp(why, steps[i]) == 0 || ik_env_step_code(env, steps[i]) == verdict) &&
		    cJSON_IsString(e)) {
			*step = steps[i];
			return e->valuestring;
		}
	}
	*step = why;
	return "";
}

static void
charge_id(const cJSON *env, char out[IK_CHARGE_ID_MAX + 1])
{
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "chargeId");

	if (cJSON_IsString(c) && strlen(c->valuestring) <= IK_CHARGE_ID_MAX)
		snprintf(out, IK_CHARGE_ID_MAX + 1, "%s", c->valuestring);
	else
		ik_event_peek_id(ik_env_body(env), out);
}

static int
lease_visibility(const cJSON *env, int64_t *vis)
{
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"),
	                                                  "leaseUntil");
	int64_t left;

	if (!cJSON_IsNumber(l))
		return -1;
	left = (int64_t)l->valuedouble - ik_now_ms();
	*vis = left <= 0 ? 0 : (left + 999) / 1000;
	if (*vis > IK_QUEUE_MAX_VISIBILITY)
		*vis = IK_QUEUE_MAX_VISIBILITY;
	return 0;
}

static int64_t
backoff_visibility(const struct acker *a, const cJSON *env)
{
	int64_t rc = ik_env_int(env, "receiveCount", 1), v = a->base_s;

	for (int64_t i = 0; i < rc && v < a->cap_s; i++)
		v *= 2;
	if (v > a->cap_s)
		v = a->cap_s;
	return v > IK_QUEUE_MAX_VISIBILITY ? IK_QUEUE_MAX_VISIBILITY : v;
}

/* ---- queues ---- */

static void flush_deletes(struct acker *a);

static struct ik_queue *
queue_for(struct acker *a, const cJSON *env, ik_err *err)
{
	const char *url = a->queue_opt ? a->queue_opt : ik_env_str(env, "queue");

	if (a->q && (!url || strcmp(a->q->url, url) == 0))
		return a->q;
	if (a->ndel > 0)
		flush_deletes(a);   /* they belong to the queue being closed */
	ik_queue_close(a->q);
	a->q = NULL;
	if (ik_queue_open(url, &a->q, err) != IK_OK) {
		if (err->code == IK_CONFIG) {
			a->fatal = 1;
			a->q_err = *err;
		}
		return NULL;
	}
	a->q->stop = NULL;   /* an ack in progress is finished, not abandoned */
	return a->q;
}

static struct ik_queue *
dlq_for(struct acker *a, struct ik_queue *q, ik_err *err)
{
	char *url;

	if (a->dlq)
		return a->dlq;
	if (!(url = ik_queue_dlq_url(a->dlq_opt, q->url, err)))
		return NULL;
	if (ik_queue_open(url, &a->dlq, err) != IK_OK)
		a->dlq = NULL;
	free(url);
	return a->dlq;
}

static void
add_attr(struct ik_qattr *at, size_t *n, const char *k, const char *v)
{
	if (v && *v)
		at[(*n)++] = (struct ik_qattr){ (char *)k, (char *)v };
}

/* Send the body to the DLQ with why and where it came from. */
static int
to_dlq(struct acker *a, struct ik_queue *q, const cJSON *env, int verdict,
       const char *why, cJSON *ack, ik_err *err)
{
	struct ik_queue *dlq = dlq_for(a, q, err);
	char count[24], id[IK_CHARGE_ID_MAX + 1], errtext[1024];
	const char *step, *e = deciding_error(env, verdict, why, &step);
	struct ik_qattr at[8];
	struct ik_qsend m = { .body = ik_env_body(env), .attrs = at };
	const char *mid = ik_env_str(env, "messageId");
	int rc;

	if (!dlq)
		return err->code;
	snprintf(count, sizeof count, "%lld", (long long)ik_env_int(env, "receiveCount", 0));
	snprintf(errtext, sizeof errtext, "%s", e);
	charge_id(env, id);
	/* SQS refuses empty attribute values: only what is there */
#define ATTR(k, v) add_attr(at, &m.nattrs, k, v)
	ATTR("idemkit.reason", ik_code_name(verdict));
	ATTR("idemkit.error", errtext);
	ATTR("idemkit.step", step);
	ATTR("idemkit.sourceQueue", q->url);
	ATTR("idemkit.messageId", mid);
	ATTR("idemkit.receiveCount", count);
	ATTR("idemkit.chargeId", id);
#undef ATTR
	if (!*m.body)   /* no queue takes an empty body; keep it in sight instead */
		return ik_errf(err, IK_DATAERR, "empty body: not sent to the DLQ");
	rc = dlq->ops->send(dlq, &m, err);
	if (rc == IK_OK) {
		cJSON_AddStringToObject(ack, "dlq", dlq->url);
		cJSON_AddStringToObject(ack, "dlqMessageId", m.message_id);
		ik_log(IK_LOG_AUDIT, "sent to the DLQ", "step", "ack", "chargeId", id[0] ? id : NULL,
		       "messageId", mid, "outcome", ik_code_name(verdict), "dlq", dlq->url,
		       "error", errtext[0] ? errtext : NULL, NULL);
	} else {
		ik_errwrap(err, "DLQ %s", dlq->url);
	}
	free(m.message_id);
	return rc;
}

/* ---- recording the result ---- */

static void
finish_item(struct item *it, int code, const char *msg)
{
	cJSON *r = it->ack;
	char id[IK_CHARGE_ID_MAX + 1];

	/* ik_env_set_result replaces "ack" and returns a new object: copy ours */
	it->code = code;
	it->ack = ik_env_set_result(it->env, "ack", code);
	if (it->ack && r)
		for (cJSON *c = r->child; c; c = c->next)
			if (strcmp(c->string, "outcome") != 0)
				cJSON_AddItemToObject(it->ack, c->string, cJSON_Duplicate(c, 1));
	cJSON_Delete(r);
	if (it->ack && msg && *msg)
		cJSON_AddStringToObject(it->ack, "error", msg);
	/* When the message was settled (epoch ms): with claim.leaseUntil it
	 * gives claim-to-ack latency (make bench).  Last, so that scripts
	 * matching the fields before it are not disturbed. */
	if (it->ack)
		cJSON_AddNumberToObject(it->ack, "at", (double)ik_now_ms());
	if (code == IK_OK && it->audit) {
		charge_id(it->env, id);
		ik_log(IK_LOG_AUDIT, "duplicate of a finished charge deleted", "step", "ack",
		       "chargeId", id[0] ? id : NULL, "messageId", ik_env_str(it->env, "messageId"),
		       "outcome", "DUP_DONE", NULL);
	}
	if (code != IK_OK && stream_mode)   /* one-shot: the error line says it */
		ik_log(IK_LOG_WARN, "ack failed", "step", "ack",
		       "messageId", ik_env_str(it->env, "messageId"),
		       "action", cJSON_GetStringValue(cJSON_GetObjectItem(it->ack, "action")),
		       "outcome", ik_code_name(code), "error", msg, NULL);
}

/* Run the pending delete batch and fill in those items. */
static void
flush_deletes(struct acker *a)
{
	const char *receipts[IK_QUEUE_BATCH];
	struct ik_qresult res[IK_QUEUE_BATCH];
	size_t idx[IK_QUEUE_BATCH], k = 0;
	ik_err err = { 0 };
	int rc;

	for (size_t i = 0; i < a->n; i++)
		if (a->items[i].del) {
			idx[k] = i;
			receipts[k++] = ik_env_str(a->items[i].env, "receipt");
		}
	if (k == 0)
		return;
	if (k == 1) {
		rc = a->q->ops->del(a->q, receipts[0], &err);
		res[0].code = rc;
		snprintf(res[0].msg, sizeof res[0].msg, "%s", rc == IK_OK ? "" : err.msg);
		rc = IK_OK;
	} else {
		rc = a->q->ops->del_batch(a->q, receipts, k, res, &err);
	}
	for (size_t j = 0; j < k; j++) {
		struct item *it = &a->items[idx[j]];
		it->del = 0;
		if (rc != IK_OK)
			finish_item(it, rc, err.msg);
		else
			finish_item(it, res[j].code, res[j].msg);
		if (it->code != IK_OK && it->dlq && it->ack)
			/* in the DLQ and still here: a duplicate there, never a loss */
			cJSON_AddBoolToObject(it->ack, "dlqSentNotDeleted", 1);
	}
	a->ndel = 0;
}

/* Write the held envelopes out in order.  0, or -1 when stdout failed. */
static int
flush(struct acker *a)
{
	int rc = 0;

	flush_deletes(a);
	for (size_t i = 0; i < a->n; i++) {
		if (rc == 0 && ik_env_write(stdout, a->items[i].env) < 0)
			rc = -1;
		cJSON_Delete(a->items[i].env);
	}
	a->n = 0;
	if (rc == 0 && fflush(stdout) == EOF)
		rc = -1;
	if (rc < 0)
		ik_warnx("stdout: %s", strerror(errno));
	return rc;
}

/* Decide and act on one envelope (item it); deletes may be left pending. */
static void
ack_one(struct acker *a, struct item *it)
{
	cJSON *env = it->env;
	const char *why = "", *receipt = ik_env_str(env, "receipt");
	int verdict = ik_env_verdict(env, &why);
	const struct ik_outcome *o = ik_outcome_by_code(verdict);
	enum ik_action act = o ? o->action : IK_ACT_LEAVE;
	struct ik_queue *q;
	int64_t vis = -1;
	ik_err err = { 0 };
	int rc = IK_OK;

	it->ack = cJSON_CreateObject();
	cJSON_AddStringToObject(it->ack, "action", ik_action_name(act));
	cJSON_AddStringToObject(it->ack, "verdict", ik_code_name(verdict));
	if (why && *why)
		cJSON_AddStringToObject(it->ack, "why", why);
	if (!receipt || !*receipt) {
		cJSON_Delete(it->ack);
		it->ack = cJSON_CreateObject();
		cJSON_AddStringToObject(it->ack, "action", "none");
		finish_item(it, IK_DATAERR, "not an envelope from sqs-recv (no receipt): "
		            "nothing to ack");
		return;
	}
	if (!(q = queue_for(a, env, &err))) {
		finish_item(it, err.code, err.msg);
		return;
	}
	switch (act) {
	case IK_ACT_DLQ:
		if ((rc = to_dlq(a, q, env, verdict, why, it->ack, &err)) != IK_OK)
			break;   /* not in the DLQ: leave it, it comes back */
		it->dlq = 1;
		/* fall through */
	case IK_ACT_DELETE:
	case IK_ACT_DELETE_AUDIT:
		it->audit = act == IK_ACT_DELETE_AUDIT;
		it->del = 1;
		a->ndel++;
		if (!a->stream)
			flush_deletes(a);
		return;
	case IK_ACT_LEAVE_LEASE:
		if (lease_visibility(env, &vis) == 0) {
			rc = q->ops->change_visibility(q, receipt, (int)vis, &err);
			break;
		}
		/* no lease to wait for: back off instead */
		/* fall through */
	case IK_ACT_LEAVE_BACKOFF:
		vis = backoff_visibility(a, env);
		rc = q->ops->change_visibility(q, receipt, (int)vis, &err);
		break;
	case IK_ACT_LEAVE:
	case IK_ACT_NONE:
		break;
	}
	if (vis >= 0)
		cJSON_AddNumberToObject(it->ack, "visibility", (double)vis);
	finish_item(it, rc, rc == IK_OK ? NULL : err.msg);
}

/* The next line as a held item.  1, 0 at EOF, -1 on error or signal. */
static int
take(struct acker *a, struct ik_lines *in, int *rc)
{
	struct item *it;
	ik_err err = { 0 };
	char *line;
	size_t len;
	int r;

	do {
		if (ik_stop_signal)
			return -1;
		r = ik_lines_next(in, &line, &len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ik_warnx("stdin: %s", strerror(errno));
			*rc = IK_SOFTWARE;
			return -1;
		}
	} while (r != 0 && (r < 0 || len == 0));
	if (r == 0)
		return 0;
	it = &a->items[a->n];
	memset(it, 0, sizeof *it);
	ik_env_parse(line, len, &it->env, &err);
	if (!it->env) {
		ik_warnx("out of memory");
		*rc = IK_SOFTWARE;
		return -1;
	}
	a->n++;
	return 1;
}

static int
oneshot(struct acker *a, struct ik_lines *in)
{
	int rc = IK_OK, r = take(a, in, &rc), code;
	char *extra;
	size_t len;

	if (r <= 0) {
		if (r == 0) {
			ik_warnx("stdin: no envelope");
			rc = IK_DATAERR;
		}
		return ik_finish(ik_stop_signal ? 128 + ik_stop_signal : rc);
	}
	while ((r = ik_lines_next(in, &extra, &len)) == 1)
		if (len) {
			ik_warnx("stdin: more than one envelope; use --stream");
			return ik_finish(IK_USAGE);
		}
	ack_one(a, &a->items[0]);
	flush_deletes(a);
	code = a->items[0].code;
	if (code != IK_OK) {
		const char *e = cJSON_GetStringValue(cJSON_GetObjectItem(a->items[0].ack, "error"));
		ik_warnx("%s", e ? e : ik_code_name(code));
	}
	if (flush(a) < 0 && code == IK_OK)
		code = IK_SOFTWARE;
	return ik_finish(code);
}

static int
stream(struct acker *a, struct ik_lines *in)
{
	int rc = IK_OK, r;

	while (!a->fatal) {
		/* input quiet: do not sit on a partial batch */
		if (a->n > 0 && !ik_lines_ready(in) && flush(a) < 0) {
			rc = IK_SOFTWARE;
			break;
		}
		if ((r = take(a, in, &rc)) <= 0)
			break;
		ack_one(a, &a->items[a->n - 1]);
		if ((a->ndel == 0 || a->ndel >= IK_QUEUE_BATCH || a->n == PENDING_MAX) &&
		    flush(a) < 0) {
			rc = IK_SOFTWARE;
			break;
		}
	}
	if (flush(a) < 0 && rc == IK_OK)
		rc = IK_SOFTWARE;
	if (a->fatal && rc == IK_OK)
		rc = a->q_err.code ? a->q_err.code : IK_CONFIG;
	if (ik_stop_signal && rc == IK_OK)
		rc = 128 + ik_stop_signal;
	return ik_finish(rc);
}

/* The rows of the one table that are message outcomes, for the man page
 * and the tests: CODE TAB NAME TAB ACTION TAB TEXT. */
static int
actions(void)
{
	int n;
	const struct ik_outcome *t = ik_outcomes(&n);

	for (int i = 0; i < n; i++)
		if (t[i].action != IK_ACT_NONE)
			printf("%d\t%s\t%s\t%s\n", t[i].code, t[i].name,
			       ik_action_name(t[i].action), t[i].action_text);
	return ik_finish(IK_OK);
}

static int
opt_secs(const char *name, const char *v, int64_t *out)
{
	int64_t ms;

	if (!v)
		return 0;
	if (ik_parse_duration(v, &ms) < 0 || ms < 1000 || ms > IK_QUEUE_MAX_VISIBILITY * 1000LL) {
		ik_warnx("%s: \"%s\" is not a duration from 1s to 12h", name, v);
		return -1;
	}
	*out = (ms + 999) / 1000;
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "dlq", required_argument, NULL, 'D' },
		{ "stream", no_argument, NULL, 's' },
		{ "backoff-base", required_argument, NULL, 'b' },
		{ "backoff-cap", required_argument, NULL, 'c' },
		{ "actions", no_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	static struct acker a = { .base_s = 2, .cap_s = 900 };
	const char *base = getenv("IDEMKIT_BACKOFF_BASE"), *cap = getenv("IDEMKIT_BACKOFF_CAP");
	struct ik_lines in;
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:D:sb:c:AhV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': a.queue_opt = optarg; break;
		case 'D': a.dlq_opt = optarg; break;
		case 's': a.stream = 1; break;
		case 'b': base = optarg; break;
		case 'c': cap = optarg; break;
		case 'A': return actions();
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if (opt_secs("--backoff-base", base, &a.base_s) < 0 ||
	    opt_secs("--backoff-cap", cap, &a.cap_s) < 0)
		return IK_USAGE;
	stream_mode = a.stream;
	ik_lines_init(&in, 0);
	rc = a.stream ? stream(&a, &in) : oneshot(&a, &in);
	ik_lines_free(&in);
	ik_queue_close(a.q);
	ik_queue_close(a.dlq);
	return rc;
}
