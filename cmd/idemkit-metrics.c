/* idemkit-metrics: writes a run's Prometheus metrics file for
 * node_exporter's textfile collector (lib/flow/metrics.h): the summary line of
 * charge-worker or charge-recover on stdin, the store's stats gauges and
 * the DLQ's counts.  The scripts call it at the end of a run (--metrics
 * FILE), so no shell formats the exposition; --clock gives them the start
 * time on the same clock.  A store or DLQ that cannot answer costs its
 * gauges (their *_up gauge says 0), never the file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/metrics.h"
#include "open/open_queue.h"
#include "open/open_store.h"
#include "queue/queue.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemkit-metrics --file FILE --job NAME --started MS --status N\n"
	"                       [--store URL] [--queue URL] [--dlq URL] < summary\n"
	"       idemkit-metrics --clock\n";
static const char options[] =
	"  -f, --file FILE     the .prom file to replace (atomically)\n"
	"  -j, --job NAME      the idemkit_job label: worker, recover-renotify, ...\n"
	"  -s, --started MS    when the run started, epoch ms (from --clock)\n"
	"  -x, --status N      the run's exit status (0 and 1 count as a success)\n"
	"  -S, --store URL     the store to count (default $IDEMKIT_STORE), one of\n"
	"                      @STORES@\n"
	"  -q, --queue URL     the queue whose DLQ to count (default $IDEMKIT_QUEUE)\n"
	"      --dlq URL       the DLQ to count (default $IDEMKIT_DLQ, else the queue's)\n"
	"  -c, --clock         print the time now, epoch ms, and exit\n"
	"  -h, --help          this help\n"
	"  -V, --version       print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the file was replaced" },
	{ IK_USAGE, "bad command line" },
	{ IK_DATAERR, "no summary line on stdin, or one of neither command" },
	{ IK_SOFTWARE, "internal error" },
	{ IK_TEMPFAIL, "the disk is full or failed; the previous file\n"
	    "is still there" },
	{ IK_CONFIG, "the directory does not exist or cannot be written" },
	{ -1, NULL },
};

/* The last line of stdin that is a summary object. */
static cJSON *
read_summary(void)
{
	struct ik_lines in;
	cJSON *o, *best = NULL;
	char *line;
	size_t len;

	ik_lines_init(&in, STDIN_FILENO);
	while (ik_lines_next(&in, &line, &len) == 1) {
		o = cJSON_ParseWithLength(line, len);
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "summary"))) {
			cJSON_Delete(best);
			best = o;
		} else {
			cJSON_Delete(o);
		}
	}
	ik_lines_free(&in);
	return best;
}

static int
store_stats(const char *url, int64_t now, struct ik_store_stats *st)
{
	struct ik_store *s;
	ik_err err = { 0 };
	int rc;

	if ((rc = ik_store_open(url, &s, &err)) != IK_OK)
		goto out;
	rc = s->ops->stats ? s->ops->stats(s, now, st, &err)
	                   : ik_errf(&err, IK_CONFIG, "%s: no stats", s->ops->name);
	ik_store_close(s);
out:
	if (rc != IK_OK)
		ik_log(IK_LOG_WARN, "no store stats in the metrics", "error", err.msg, NULL);
	return rc;
}

static int
dlq_stats(const char *queue, const char *dlq, struct ik_qstats *st)
{
	struct ik_queue *q = NULL;
	ik_err err = { 0 };
	char *url = NULL;
	int rc;

	if (!dlq) {
		if ((rc = ik_queue_open(queue, &q, &err)) != IK_OK)
			goto out;
		url = ik_queue_dlq_url(NULL, q->url, &err);
		ik_queue_close(q);
		q = NULL;
		if (!url) {
			rc = err.code;
			goto out;
		}
		dlq = url;
	}
	if ((rc = ik_queue_open(dlq, &q, &err)) == IK_OK) {
		rc = q->ops->stats(q, st, &err);
		ik_queue_close(q);
	}
out:
	free(url);
	if (rc != IK_OK)
		ik_log(IK_LOG_WARN, "no DLQ counts in the metrics", "error", err.msg, NULL);
	return rc;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "file", required_argument, NULL, 'f' },
		{ "job", required_argument, NULL, 'j' },
		{ "started", required_argument, NULL, 's' },
		{ "status", required_argument, NULL, 'x' },
		{ "store", required_argument, NULL, 'S' },
		{ "queue", required_argument, NULL, 'q' },
		{ "dlq", required_argument, NULL, 'D' },
		{ "clock", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_metrics_run r = { 0 };
	struct ik_store_stats st;
	struct ik_qstats qs;
	const char *file = NULL, *store = NULL, *queue = NULL, *dlq = NULL;
	long long started = -1, status = -1;
	ik_err err = { 0 };
	cJSON *summary;
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "f:j:s:x:S:q:chV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'f': file = optarg; break;
		case 'j':
			if (!*optarg || strlen(optarg) > 64 ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(optarg)) {
				ik_warnx("--job: want 1-64 characters of [a-z0-9_-], got \"%.64s\"", optarg);
				return IK_USAGE;
			}
			r.job = optarg;
			break;
		case 's':
			if (ik_parse_int(optarg, 0, INT64_MAX, &started) < 0) {
				ik_warnx("--started: want epoch milliseconds, got \"%.64s\"", optarg);
				return IK_USAGE;
			}
			break;
		case 'x':
			if (ik_parse_int(optarg, 0, 255, &status) < 0) {
				ik_warnx("--status: want an exit status 0-255, got \"%.64s\"", optarg);
				return IK_USAGE;
			}
			break;
		case 'S': store = optarg; break;
		case 'q': queue = optarg; break;
		case 'D': dlq = optarg; break;
		case 'c':
			printf("%lld\n", (long long)ik_now_ms());
			return ik_finish(IK_OK);
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || !file || !*file || !r.job || started < 0 || status < 0)
		return ik_usage(usage);
	if (!(summary = read_summary())) {
		ik_warnx("no {\"summary\":true,...} line on standard input");
		return IK_DATAERR;
	}
	r.summary = summary;
	r.exit_status = (int)status;
	r.start_ms = started;
	r.end_ms = ik_now_ms();
	if (store_stats(store, r.end_ms, &st) == IK_OK)
		r.stats = &st;
	if (dlq_stats(queue, dlq, &qs) == IK_OK)
		r.dlq = &qs;
	rc = ik_metrics_write(file, &r, &err);
	cJSON_Delete(summary);
	if (rc != IK_OK)
		return ik_fail(&err);
	return ik_finish(IK_OK);
}
