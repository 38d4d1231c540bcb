/* sqs-send: send one message per input line, in batches of up to 10.
 *
 * The line is the body, verbatim.  With --from-envelope each line is an
 * envelope (from sqs-recv, e.g. on the DLQ): its body is sent, and only
 * once that send succeeded is the message deleted from the queue the
 * envelope came from.  That is the re-drive: a crash in between leaves a
 * copy in both queues (a duplicate the idempotency store absorbs), never
 * none.  The re-driven copy keeps when the first copy was sent
 * (idemkit.firstSentAt, envelope.h), so idemp-claim can tell a charge
 * that has circulated longer than its record lives.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "open/open_queue.h"
#include "queue/queue.h"

static const char usage[] =
	"usage: sqs-send [--queue URL] [--delay SECS] [--attr K=V]... [--from-envelope] < bodies\n";
static const char options[] =
	"  -q, --queue URL        sqlite:PATH#NAME or an SQS queue URL (default $IDEMKIT_QUEUE,\n"
	"                         else sqlite:$IDEMKIT_STATE_DIR/queue.db#charges)\n"
	"  -d, --delay SECS       deliver no sooner than SECS from now, 0..900 (default 0)\n"
	"  -a, --attr K=V         a string message attribute; repeatable, at most 10\n"
	"  -e, --from-envelope    lines are envelopes: send the body, then delete the\n"
	"                         message from the envelope's queue (re-drive)\n"
	"  -h, --help             this help\n"
	"  -V, --version          print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "every line was sent" },
	{ IK_USAGE, "bad command line" },
	{ IK_DATAERR, "a line was empty, not an envelope, or refused by\n"
	    "the queue; the other lines were sent" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the queue is busy, unreachable or throttled" },
	{ IK_CONFIG, "bad queue URL or credentials, or no such queue" },
	{ -1, NULL },
};

#define BATCH_BYTES (192 * 1024)   /* under SQS's 256 KiB per batch request */
#define MAX_ATTRS 10

struct pending {
	char *body;
	char *src_queue;       /* --from-envelope: where to delete it */
	char *src_receipt;
	char *src_id;
	char first_sent[24];   /* --from-envelope: IK_ATTR_FIRST_SENT_AT, or "" */
	long long lineno;
};

struct sender {
	struct ik_queue *q;
	struct ik_queue *src;              /* the source queue, re-drive */
	struct ik_qattr attrs[MAX_ATTRS];
	size_t nattrs;
	int delay;
	int from_env;
	struct pending p[IK_QUEUE_BATCH];
	size_t n, bytes;
	long long sent;
	int worst;                         /* the exit code so far */
	int fatal;                         /* stop reading: the queue is unusable */
};

static void
note(struct sender *s, int code)
{
	/* a transient or configuration failure outranks a bad line */
	if (code == IK_OK)
		return;
	if (s->worst == IK_OK || s->worst == IK_DATAERR)
		s->worst = code;
	if (code == IK_CONFIG || code == IK_SOFTWARE)
		s->fatal = 1;
}

static void
clear(struct sender *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->p[i].body);
		free(s->p[i].src_queue);
		free(s->p[i].src_receipt);
		free(s->p[i].src_id);
	}
	memset(s->p, 0, sizeof s->p);
	s->n = s->bytes = 0;
}

/* Delete the re-driven messages whose send succeeded from their queue. */
static void
delete_sources(struct sender *s, const struct ik_qresult *sent)
{
	const char *receipts[IK_QUEUE_BATCH];
	size_t idx[IK_QUEUE_BATCH], k = 0;
	struct ik_qresult res[IK_QUEUE_BATCH];
	ik_err err = { 0 };
	int rc;

	for (size_t i = 0; i < s->n; i++) {
		if (sent[i].code != IK_OK)
			continue;
		/* one source queue per process: the envelopes of one sqs-recv */
		if (!s->src || strcmp(s->src->url, s->p[i].src_queue) != 0) {
			ik_queue_close(s->src);
			s->src = NULL;
			if ((rc = ik_queue_open(s->p[i].src_queue, &s->src, &err)) != IK_OK) {
				ik_warnx("line %lld: sent but not deleted from %s: %s",
				         s->p[i].lineno, s->p[i].src_queue, err.msg);
				note(s, rc);
				continue;
			}
		}
		idx[k] = i;
		receipts[k++] = s->p[i].src_receipt;
	}
	if (k == 0 || !s->src)
		return;
	if ((rc = s->src->ops->del_batch(s->src, receipts, k, res, &err)) != IK_OK) {
		ik_warnx("sent %zu message(s) but could not delete them from %s: %s",
		         k, s->src->url, err.msg);
		note(s, rc);
		return;
	}
	for (size_t j = 0; j < k; j++)
		if (res[j].code != IK_OK) {
			ik_warnx("line %lld: sent but not deleted from %s: %s",
			         s->p[idx[j]].lineno, s->src->url, res[j].msg);
			note(s, res[j].code);
		}
}

/* {"messageId":"…"[,"source":"…"]} on stdout. */
static void
print_sent(const char *id, const char *source)
{
	cJSON *o = cJSON_CreateObject();
	char *txt;

	if (!o || !cJSON_AddStringToObject(o, "messageId", id) ||
	    (source && !cJSON_AddStringToObject(o, "source", source)) ||
	    !(txt = cJSON_PrintUnformatted(o))) {
		cJSON_Delete(o);
		ik_warnx("out of memory");
		return;
	}
	puts(txt);
	free(txt);
	cJSON_Delete(o);
}

static int
flush(struct sender *s)
{
	struct ik_qsend m[IK_QUEUE_BATCH];
	struct ik_qresult res[IK_QUEUE_BATCH];
	struct ik_qattr at[IK_QUEUE_BATCH][MAX_ATTRS + 1];
	ik_err err = { 0 };
	int rc;

	if (s->n == 0)
		return 0;
	memset(m, 0, sizeof m);
	for (size_t i = 0; i < s->n; i++) {
		size_t k = s->nattrs;
		memcpy(at[i], s->attrs, k * sizeof at[i][0]);
		if (s->p[i].first_sent[0])
			at[i][k++] = (struct ik_qattr){ IK_ATTR_FIRST_SENT_AT, s->p[i].first_sent };
		m[i] = (struct ik_qsend){ .body = s->p[i].body, .delay_s = s->delay,
		                          .attrs = at[i], .nattrs = k };
	}
	rc = s->q->ops->send_batch(s->q, m, s->n, res, &err);
	if (rc != IK_OK) {
		ik_warnx("lines %lld-%lld not sent: %s", s->p[0].lineno, s->p[s->n - 1].lineno,
		         err.msg);
		note(s, rc);
		s->fatal = 1;   /* stop here: the lines after would fail the same way */
		clear(s);
		return -1;
	}
	for (size_t i = 0; i < s->n; i++) {
		if (res[i].code != IK_OK) {
			ik_warnx("line %lld not sent: %s", s->p[i].lineno, res[i].msg);
			note(s, res[i].code);
			continue;
		}
		s->sent++;
		print_sent(m[i].message_id, s->from_env ? s->p[i].src_id : NULL);
	}
	if (s->from_env)
		delete_sources(s, res);
	for (size_t i = 0; i < s->n; i++)
		free(m[i].message_id);
	clear(s);
	if (fflush(stdout) == EOF) {
		ik_warnx("stdout: %s", strerror(errno));
		note(s, IK_SOFTWARE);
		return -1;
	}
	return 0;
}

static int
has_attr(const struct sender *s, const char *name)
{
	for (size_t i = 0; i < s->nattrs; i++)
		if (strcmp(s->attrs[i].name, name) == 0)
			return 1;
	return 0;
}

/* Queue one input line; flushes first when the batch is full. */
static int
add(struct sender *s, const char *line, size_t len, long long lineno)
{
	struct pending *p;
	cJSON *env = NULL;
	ik_err err = { 0 };
	const char *body = line;

	if (s->from_env) {
		if (ik_env_parse(line, len, &env, &err) != IK_OK || !env ||
		    !ik_env_str(env, "receipt") || !ik_env_str(env, "queue")) {
			ik_warnx("line %lld: not an envelope from sqs-recv (no queue and "
			         "receipt)%s%s", lineno, err.msg[0] ? ": " : "", err.msg);
			cJSON_Delete(env);
			note(s, IK_DATAERR);
			return 0;
		}
		body = ik_env_body(env);
		len = strlen(body);
	}
	if (len == 0) {
		ik_warnx("line %lld: empty body, not sent", lineno);
		cJSON_Delete(env);
		note(s, IK_DATAERR);
		return 0;
	}
	if (s->n == IK_QUEUE_BATCH || (s->n > 0 && s->bytes + len > BATCH_BYTES))
		if (flush(s) < 0 && s->fatal) {
			cJSON_Delete(env);
			return -1;
		}
	p = &s->p[s->n];
	p->lineno = lineno;
	p->body = strndup(body, len);
	if (env) {
		p->src_queue = ik_strdup(ik_env_str(env, "queue"));
		p->src_receipt = ik_strdup(ik_env_str(env, "receipt"));
		p->src_id = ik_strdup(ik_env_str(env, "messageId"));
		if (!has_attr(s, IK_ATTR_FIRST_SENT_AT) && ik_env_first_sent_at(env) > 0)
			snprintf(p->first_sent, sizeof p->first_sent, "%lld",
			         (long long)ik_env_first_sent_at(env));
	}
	cJSON_Delete(env);
	s->n++;
	s->bytes += len;
	if (!p->body || (s->from_env && (!p->src_queue || !p->src_receipt))) {
		ik_warnx("out of memory");
		note(s, IK_SOFTWARE);
		return -1;
	}
	return 0;
}

static int
parse_attr(struct sender *s, char *kv)
{
	char *eq = strchr(kv, '=');

	if (!eq || eq == kv || !eq[1]) {
		ik_warnx("--attr: \"%s\" is not NAME=VALUE with both non-empty", kv);
		return -1;
	}
	if (s->nattrs == MAX_ATTRS) {
		ik_warnx("--attr: at most %d attributes", MAX_ATTRS);
		return -1;
	}
	*eq = '\0';
	s->attrs[s->nattrs].name = kv;
	s->attrs[s->nattrs++].value = eq + 1;
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "delay", required_argument, NULL, 'd' },
		{ "attr", required_argument, NULL, 'a' },
		{ "from-envelope", no_argument, NULL, 'e' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	static struct sender s;
	struct ik_lines in;
	const char *url = NULL;
	long long n, lineno = 0;
	ik_err err = { 0 };
	char *line;
	size_t len;
	int ch, r;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:d:a:ehV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': url = optarg; break;
		case 'd':
			if (ik_opt_int("--delay", optarg, 0, IK_QUEUE_MAX_DELAY, &n) < 0)
				return IK_USAGE;
			s.delay = (int)n;
			break;
		case 'a': if (parse_attr(&s, optarg) < 0) return IK_USAGE; break;
		case 'e': s.from_env = 1; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if (ik_queue_open(url, &s.q, &err) != IK_OK)
		return ik_fail(&err);

	ik_lines_init(&in, 0);
	while (!s.fatal && !ik_stop_signal) {
		r = ik_lines_next(&in, &line, &len);
		if (r == 0)
			break;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			ik_warnx("stdin: %s", strerror(errno));
			note(&s, IK_SOFTWARE);
			break;
		}
		lineno++;
		if (add(&s, line, len, lineno) < 0)
			break;
	}
	if (!s.fatal)
		flush(&s);   /* a signal too: what was read is sent */
	clear(&s);
	ik_lines_free(&in);
	ik_queue_close(s.src);
	ik_queue_close(s.q);
	ik_log(IK_LOG_DEBUG, "sent", "step", "send", IK_LOG_NUM("count", s.sent), NULL);
	if (ik_stop_signal)
		return ik_finish(128 + ik_stop_signal);
	return ik_finish(s.worst);
}
