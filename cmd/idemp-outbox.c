/* idemp-outbox: the outbox relay (outbox.h, idemkit(7) "OUTBOX").
 * Publishes the events the store wrote with each finish to the queue of
 * $IDEMKIT_OUTBOX (or --queue), at least once, each with its eventId as a
 * message attribute; checkpoints only after the queue accepted them; one
 * relay at a time per store by a lease in the store.  One NDJSON line per
 * event on stdout once checkpointed; progress on stderr on a terminal;
 * with --metrics FILE, the lag gauge for node_exporter's textfile
 * collector (lib/flow/metrics.h), every --metrics-every seconds and at exit. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/metrics.h"
#include "flow/outbox.h"
#include "open/open_queue.h"
#include "open/open_store.h"
#include "queue/queue.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-outbox [--once | --follow] [--stats] [--store URL] [--queue URL]\n"
	"                    [--lease DUR] [--poll DUR] [--retention DUR] [--batch N]\n"
	"                    [--metrics FILE [--metrics-every SECS]]\n";
static const char options[] =
	"  -1, --once           publish what waits now, then exit (the default)\n"
	"  -f, --follow         keep publishing until a signal; wait for the lease\n"
	"      --stats          print the lag gauge (events waiting, oldest age) and exit\n"
	"  -S, --store URL      the store (default $IDEMKIT_STORE), one of\n"
	"                       @STORES@\n"
	"  -q, --queue URL      where events go (default $IDEMKIT_OUTBOX)\n"
	"  -l, --lease DUR      the relay lease (default 30s)\n"
	"  -p, --poll DUR       idle wait between reads with --follow (default 200ms)\n"
	"  -r, --retention DUR  published events kept this long, then purged\n"
	"                       (default $IDEMKIT_OUTBOX_RETENTION, else 7d)\n"
	"  -b, --batch N        events per round, sent in calls of 10 and checkpointed\n"
	"                       together, 1-100 (default 99 on DynamoDB, else 10)\n"
	"  -m, --metrics FILE   replace FILE (atomically) with the relay's Prometheus\n"
	"                       metrics at exit, and with --follow periodically\n"
	"      --metrics-every S  that period, in seconds (default 60)\n"
	"  -h, --help           this help\n"
	"  -V, --version        print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "events were published (or purged); --follow:\n"
	    "stopped" },
	{ IK_EMPTY, "no event waited" },
	{ IK_DUP_IN_PROGRESS, "another relay holds the lease (--once)" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the store or the queue is busy or unreachable" },
	{ IK_CONFIG, "no IDEMKIT_OUTBOX, an unusable store or queue, or\n"
	    "a store that keeps no outbox" },
	{ -1, NULL },
};

struct ctx {
	int tty;
	const char *crash;     /* $IDEMKIT_TEST_RELAY_CRASH: tests only */
	/* --metrics */
	const char *metrics;
	int64_t every_ms, next_ms;    /* next_ms: ik_mono_ms() of the next write */
	struct ik_store *store;       /* NULL: not open */
	const struct ik_relay *relay; /* NULL: not started */
	int64_t written;              /* relay->published at the last write */
	int64_t last_ok_ms;           /* since the last write; 0: none */
	int lease_held;
};

static const char *const point_names[] = {
	[IK_RELAY_BEFORE_PUBLISH] = "before-publish",
	[IK_RELAY_AFTER_PUBLISH] = "after-publish",
	[IK_RELAY_AFTER_CHECKPOINT] = "after-checkpoint",
	[IK_RELAY_BEFORE_PURGE] = "before-purge",
};

static void
at(enum ik_relay_point p, const struct ik_outbox_ev *ev, size_t n, void *arg)
{
	struct ctx *c = arg;

	/* The crash tests' kill -9 at one boundary, in the relay itself so it
	 * lands exactly there (tests/outbox.bats); "POINT:TERM" a stop
	 * signal there instead, which lets the round end as a stop does;
	 * "POINT:STOP" a pause there, until the test's SIGCONT (it writes
	 * meanwhile: an event waiting when the purge runs). */
	if (c->crash) {
		size_t len = strlen(point_names[p]);

		if (strcmp(c->crash, point_names[p]) == 0) {
			fflush(stdout);
			raise(SIGKILL);
		}
		if (strncmp(c->crash, point_names[p], len) == 0 &&
		    strcmp(c->crash + len, ":TERM") == 0)
			raise(SIGTERM);
		if (strncmp(c->crash, point_names[p], len) == 0 &&
		    strcmp(c->crash + len, ":STOP") == 0)
			raise(SIGSTOP);
	}
	if (p != IK_RELAY_AFTER_CHECKPOINT)
		return;
	for (size_t i = 0; i < n; i++)
		printf("{\"eventId\":\"%s\",\"chargeId\":\"%s\",\"type\":\"%s\",\"seq\":%lld}\n",
		    ev[i].id, ev[i].charge_id, ev[i].type, (long long)ev[i].seq);
	fflush(stdout);
}

/* The metrics file now: a store or file that fails costs a warning, never
 * the relay's outcome (as charge-worker's --metrics). */
static void
write_metrics(struct ctx *c)
{
	struct ik_outbox_stats st;
	struct ik_metrics_outbox m = { .last_ok_ms = c->last_ok_ms, .lease_held = c->lease_held };
	ik_err err = { 0 };
	int64_t published = c->relay ? c->relay->published : 0;

	if (!c->metrics)
		return;
	if (c->store && c->store->ops->outbox_stats &&
	    c->store->ops->outbox_stats(c->store, ik_now_ms(), &st, &err) == IK_OK)
		m.st = &st;
	else if (c->store)
		ik_log(IK_LOG_WARN, "no outbox counts in the metrics", "error",
		    err.msg[0] ? err.msg : "this store keeps no outbox", NULL);
	m.published = published - c->written;
	if (ik_metrics_write_outbox(c->metrics, &m, &err) != IK_OK) {
		ik_log(IK_LOG_WARN, "the metrics file was not written", "error", err.msg, NULL);
		return;
	}
	c->written = published;
	c->last_ok_ms = 0;
	c->next_ms = ik_mono_ms() + c->every_ms;
}

/* After every round of the relay: what the file says, written when due. */
static void
round_done(int rc, int lease_held, void *arg)
{
	struct ctx *c = arg;

	if (rc == IK_OK)
		c->last_ok_ms = ik_now_ms();
	c->lease_held = lease_held;
	if (c->metrics && c->relay && c->relay->follow && ik_mono_ms() >= c->next_ms)
		write_metrics(c);
}

static int
stats(struct ik_store *s, ik_err *err)
{
	struct ik_outbox_stats st;
	int rc;

	if (!s->ops->outbox_stats)
		return ik_errf(err, IK_CONFIG, "%s: this store keeps no outbox (yet)", s->ops->name);
	if ((rc = s->ops->outbox_stats(s, ik_now_ms(), &st, err)))
		return rc;
	printf("{\"waiting\":%lld,\"oldestWaitingMs\":%lld,\"published\":%lld%s}\n",
	    (long long)st.waiting, (long long)st.oldest_ms, (long long)st.published,
	    st.waiting_capped ? ",\"waitingCapped\":true" : "");
	return IK_OK;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "once", no_argument, NULL, '1' },
		{ "follow", no_argument, NULL, 'f' },
		{ "stats", no_argument, NULL, 's' },
		{ "store", required_argument, NULL, 'S' },
		{ "queue", required_argument, NULL, 'q' },
		{ "lease", required_argument, NULL, 'l' },
		{ "poll", required_argument, NULL, 'p' },
		{ "retention", required_argument, NULL, 'r' },
		{ "batch", required_argument, NULL, 'b' },
		{ "metrics", required_argument, NULL, 'm' },
		{ "metrics-every", required_argument, NULL, 'M' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c = { .tty = isatty(STDERR_FILENO), .crash = getenv("IDEMKIT_TEST_RELAY_CRASH"),
	                 .every_ms = 60000 };
	struct ik_relay r = { .lease_ms = IK_OUTBOX_LEASE_DEFAULT_MS, .poll_ms = 200,
	                      .retention_ms = IK_OUTBOX_RETENTION_DEFAULT_MS,
	                      .at = at, .round = round_done, .arg = &c };
	const char *store_url = NULL, *queue_url = ik_outbox_url(), *ret;
	struct ik_store *s = NULL;
	struct ik_queue *q = NULL;
	ik_err err = { 0 };
	long long secs, n;
	int ch, rc, once = 0, want_stats = 0;

	ik_cli_init(argv[0]);
	/* The variable first, so --retention overrides it. */
	if ((ret = getenv("IDEMKIT_OUTBOX_RETENTION")) && *ret &&
	    ik_parse_duration(ret, &r.retention_ms) < 0) {
		ik_warnx("IDEMKIT_OUTBOX_RETENTION: \"%s\" is not a duration", ret);
		return IK_CONFIG;
	}
	while ((ch = getopt_long(argc, argv, "1fS:q:l:p:r:b:m:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case '1': once = 1; break;
		case 'f': r.follow = 1; break;
		case 's': want_stats = 1; break;
		case 'S': store_url = optarg; break;
		case 'q': queue_url = optarg; break;
		case 'l':
			if (ik_opt_duration("--lease", optarg, 1000, IK_LEASE_MAX_MS, &r.lease_ms))
				return IK_USAGE;
			break;
		case 'p':
			if (ik_opt_duration("--poll", optarg, 1, 60000, &r.poll_ms))
				return IK_USAGE;
			break;
		case 'r':
			if (ik_opt_duration("--retention", optarg, 0, IK_RETENTION_MAX_MS,
			    &r.retention_ms))
				return IK_USAGE;
			break;
		case 'b':
			if (ik_parse_int(optarg, 1, IK_OUTBOX_BATCH_MAX, &n) < 0) {
				ik_warnx("--batch: want 1-%d events, got \"%.64s\"",
				    IK_OUTBOX_BATCH_MAX, optarg);
				return IK_USAGE;
			}
			r.batch = (size_t)n;
			break;
		case 'm': c.metrics = optarg; break;
		case 'M':
			if (ik_parse_int(optarg, 1, 86400, &secs) < 0) {
				ik_warnx("--metrics-every: want whole seconds, 1-86400, got \"%.64s\"",
				    optarg);
				return IK_USAGE;
			}
			c.every_ms = secs * 1000;
			break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || (once && r.follow) ||
	    (want_stats && (once || r.follow || c.metrics)) || (c.metrics && !*c.metrics))
		return ik_usage(usage);
	if (!want_stats && !queue_url) {
		ik_warnx("no queue: set IDEMKIT_OUTBOX to the queue URL events go to, or --queue");
		write_metrics(&c);
		return IK_CONFIG;
	}
	if (ik_store_open(store_url, &s, &err) != IK_OK) {
		write_metrics(&c);
		return ik_fail(&err);
	}
	c.store = s;
	if (want_stats) {
		rc = stats(s, &err);
		ik_store_close(s);
		return rc ? ik_fail(&err) : ik_finish(IK_OK);
	}
	if (c.metrics && s->ops->outbox_stats) {
		/* The gauge's own settings are checked before the relay starts:
		 * a --follow relay would otherwise only warn at every write. */
		struct ik_outbox_stats st;

		if (s->ops->outbox_stats(s, ik_now_ms(), &st, &err) == IK_CONFIG) {
			ik_store_close(s);
			return ik_fail(&err);
		}
		ik_errclear(&err);
	}
	if ((rc = ik_queue_open(queue_url, &q, &err)) != IK_OK) {
		write_metrics(&c);
		ik_store_close(s);
		return ik_fail(&err);
	}
	q->stop = &ik_stop_signal;
	r.store = s;
	r.queue = q;
	c.relay = &r;
	c.next_ms = ik_mono_ms();   /* --follow: the first round writes it */
	rc = ik_relay_run(&r, &err);
	/* The relay ended its lease on the way out. */
	c.lease_held = 0;
	write_metrics(&c);
	if (c.tty)
		fprintf(stderr, "idemp-outbox: %lld published, %lld purged\n",
		    (long long)r.published, (long long)r.purged);
	ik_queue_close(q);
	ik_store_close(s);
	if (rc != IK_OK && rc != IK_EMPTY)
		return ik_fail(&err);
	if (ik_stop_signal)
		return ik_finish(128 + ik_stop_signal);
	return ik_finish(rc);
}
