/* sqs-ack: do with each message what its envelope's verdict says.
 *
 * The acker (lib/flow/acker.c) carries the verdict out; this file runs it on
 * the step loop (lib/core/step.c), whose groups of already-available lines are
 * its delete batches: a group is begun, acked, flushed (on SQS the DLQ
 * copies, then a DeleteMessageBatch per 10 and the visibility changes, each
 * phase's calls in flight together; one transaction for the whole group on
 * the SQLite queue) and only then written, so a partial batch goes out
 * as soon as the input is quiet and envelopes keep their input order.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/outcome.h"
#include "core/step.h"
#include "core/util.h"
#include "flow/acker.h"
#include "queue/queue.h"

static const char usage[] =
	"usage: sqs-ack [--queue URL] [--dlq URL] [--stream] [--backoff-base SECS]\n"
	"               [--backoff-cap SECS] [--progress FILE] < envelope\n"
	"       sqs-ack --actions\n";
static const char options[] =
	"  -q, --queue URL         the queue the message came from (default: the\n"
	"                          envelope's \"queue\", else $IDEMKIT_QUEUE, else the\n"
	"                          embedded default)\n"
	"  -D, --dlq URL           dead-letter queue (default $IDEMKIT_DLQ, else for\n"
	"                          sqlite:PATH#NAME the queue sqlite:PATH#NAME-dlq)\n"
	"  -s, --stream            many envelopes in, one out per line; deletes batched\n"
	"  -b, --backoff-base SECS TEMPFAIL backoff: visibility = min(2^n * base, cap),\n"
	"                          n the claim's attempt, else receiveCount (default\n"
	"                          2; $IDEMKIT_BACKOFF_BASE)\n"
	"  -c, --backoff-cap SECS  (default 900; $IDEMKIT_BACKOFF_CAP)\n"
	"  -p, --progress FILE     keep counts of the outcomes in FILE, rewritten at\n"
	"                          most every 250 ms (default $IDEMKIT_PROGRESS)\n"
	"  -A, --actions           print the action table (code, outcome, action, meaning)\n"
	"  -h, --help              this help\n"
	"  -V, --version           print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the action was carried out" },
	{ IK_EMPTY, "no envelope or event on stdin: nothing to do" },
	{ IK_LEASE_LOST, "the receipt is stale: the message was received\n"
	    "again since" },
	{ IK_USAGE, "bad command line, or two envelopes without --stream" },
	{ IK_DATAERR, "not an envelope with a receipt, or a receipt the\n"
	    "queue refuses" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the queue or the DLQ is busy or unreachable; the\n"
	    "message was left" },
	{ IK_CONFIG, "bad queue URL, credentials or DLQ; the message\n"
	    "was left" },
	{ -1, NULL },
};

static int stream_mode;

static int
ack(cJSON *env, void *acker)
{
	int rc = ik_acker_ack(acker, env);

	if (rc != IK_OK && !stream_mode) {   /* stream: the acker logs it */
		const char *e = cJSON_GetStringValue(cJSON_GetObjectItem(ik_env_result(env, "ack"),
		                                                         "error"));
		ik_warnx("%s", e ? e : ik_code_name(rc));
	}
	return rc;
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

/* A seconds option from 1s to the longest visibility. */
static int
opt_secs(const char *name, const char *v, int64_t *out)
{
	int64_t ms;

	if (!v)
		return 0;
	if (ik_opt_duration(name, v, 1000, IK_QUEUE_MAX_VISIBILITY * 1000LL, &ms) < 0)
		return -1;
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
		{ "progress", required_argument, NULL, 'p' },
		{ "actions", no_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_acker_opts o = { .backoff_base_s = 2, .backoff_cap_s = 900,
	    .progress = getenv("IDEMKIT_PROGRESS") };
	struct ik_acker *a;
	struct ik_step st = { .name = "ack", .fn = ack, .begin = ik_acker_begin,
	    .commit = ik_acker_flush, .halt = ik_acker_halted, .tick = ik_acker_tick,
	    .group_max = IK_ACKER_GROUP_MAX };
	const char *base = getenv("IDEMKIT_BACKOFF_BASE"), *cap = getenv("IDEMKIT_BACKOFF_CAP");
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:D:sb:c:p:AhV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': o.queue = optarg; break;
		case 'D': o.dlq = optarg; break;
		case 's': st.stream = 1; break;
		case 'b': base = optarg; break;
		case 'c': cap = optarg; break;
		case 'p': o.progress = optarg; break;
		case 'A': return actions();
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if (opt_secs("--backoff-base", base, &o.backoff_base_s) < 0 ||
	    opt_secs("--backoff-cap", cap, &o.backoff_cap_s) < 0)
		return IK_USAGE;
	stream_mode = o.log_failures = st.stream;
	if (ik_acker_open(&o, &a, &err) != IK_OK)
		return ik_fail(&err);
	st.ctx = st.group_ctx = a;
	rc = ik_step_run(&st);
	ik_acker_close(a);
	return rc;
}
