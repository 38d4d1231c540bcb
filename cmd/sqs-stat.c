/* sqs-stat: the approximate message counts of a queue, as one JSON line
 * (GetQueueAttributes on SQS, one query on the SQLite queue).  For
 * operators and tests: "deleted" and "in flight" look alike to a receive.
 *
 * --resolve answers what the shell drivers must not work out again: the
 * queue URL every command would use, the DLQ sqs-ack would fill, and the
 * state directory, resolved by the same C code (queue.h, util.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/util.h"
#include "open/open_queue.h"
#include "queue/queue.h"

static const char usage[] =
	"usage: sqs-stat [--queue URL] [--dlq URL] [--resolve]\n";
static const char options[] =
	"  -q, --queue URL   sqlite:PATH#NAME or an SQS queue URL (default $IDEMKIT_QUEUE,\n"
	"                    else sqlite:$IDEMKIT_STATE_DIR/queue.db#charges)\n"
	"  -D, --dlq URL     the dead-letter queue: alone, the queue counted; for\n"
	"                    --resolve, the DLQ (default $IDEMKIT_DLQ, else for\n"
	"                    sqlite:PATH#NAME the queue sqlite:PATH#NAME-dlq)\n"
	"  -r, --resolve     no counts: print queue, dlq and stateDir, each NAME TAB VALUE\n"
	"                    on its own line, as every command resolves them\n"
	"  -h, --help        this help\n"
	"  -V, --version     print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the counts (or with --resolve, the names) were\n"
	    "written" },
	{ IK_USAGE, "bad command line, or --queue and --dlq without\n"
	    "--resolve" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the queue is busy or unreachable" },
	{ IK_CONFIG, "bad queue URL or credentials, or no such queue" },
	{ -1, NULL },
};

static int
resolve(struct ik_queue *q, const char *dlq_opt)
{
	ik_err err = { 0 };
	char *dlq, *dir;

	if (!(dlq = ik_queue_dlq_url(dlq_opt, q->url, &err)))
		return ik_fail(&err);
	if (!(dir = ik_state_dir(0, &err))) {
		free(dlq);
		return ik_fail(&err);
	}
	printf("queue\t%s\ndlq\t%s\nstateDir\t%s\n", q->url, dlq, dir);
	free(dlq);
	free(dir);
	return ik_finish(IK_OK);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "dlq", required_argument, NULL, 'D' },
		{ "resolve", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_queue *q = NULL;
	struct ik_qstats st = { 0 };
	const char *url = NULL, *dlq = NULL;
	ik_err err = { 0 };
	int ch, rc, resolving = 0;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:D:rhV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': url = optarg; break;
		case 'D': dlq = optarg; break;
		case 'r': resolving = 1; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	/* Without --resolve, --dlq names the queue to count: an operator's
	 * look at the dead letters, which need no --queue. */
	if (dlq && !resolving) {
		if (url) {
			ik_warnx("--queue and --dlq name two queues: count one at a time "
			    "(--dlq URL alone counts the dead-letter queue)");
			return IK_USAGE;
		}
		url = dlq;
	}
	if ((rc = ik_queue_open(url, &q, &err)) != IK_OK)
		return ik_fail(&err);
	if (resolving) {
		rc = resolve(q, dlq);
		ik_queue_close(q);
		return rc;
	}
	rc = q->ops->stats(q, &st, &err);
	ik_queue_close(q);
	if (rc != IK_OK)
		return ik_fail(&err);
	printf("{\"visible\":%lld,\"inflight\":%lld,\"delayed\":%lld}\n",
	       (long long)st.visible, (long long)st.inflight, (long long)st.delayed);
	return ik_finish(IK_OK);
}
