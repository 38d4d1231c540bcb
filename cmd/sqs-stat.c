/* sqs-stat: the approximate message counts of a queue, as one JSON line
 * (GetQueueAttributes on SQS, one query on the SQLite queue).  For
 * operators and tests: "deleted" and "in flight" look alike to a receive. */
#include <getopt.h>
#include <stdio.h>

#include "cli.h"
#include "outcome.h"
#include "queue.h"

static const char usage[] =
	"usage: sqs-stat [--queue URL]\n";
static const char options[] =
	"  -q, --queue URL   sqlite:PATH#NAME or an SQS queue URL (default $IDEMKIT_QUEUE,\n"
	"                    else sqlite:$IDEMKIT_STATE_DIR/queue.db#charges)\n"
	"  -h, --help        this help\n"
	"  -V, --version     print the version\n";
static const int codes[] = { 0, 64, 70, 75, 78, -1 };

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_queue *q = NULL;
	struct ik_qstats st = { 0 };
	const char *url = NULL;
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if ((rc = ik_queue_open(url, &q, &err)) != IK_OK)
		return ik_fail(&err);
	rc = q->ops->stats(q, &st, &err);
	ik_queue_close(q);
	if (rc != IK_OK)
		return ik_fail(&err);
	printf("{\"visible\":%lld,\"inflight\":%lld,\"delayed\":%lld}\n",
	       (long long)st.visible, (long long)st.inflight, (long long)st.delayed);
	return ik_finish(IK_OK);
}
