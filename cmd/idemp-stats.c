/* idemp-stats: how the store stands, for the operator and the monitoring:
 * records per state, IN_PROGRESS records whose lease ended ("stuck") and
 * the oldest, the DEBITED_NOTIFICATION_FAILED backlog and its oldest.  One
 * call to the store's stats op, which counts from indexes the writes keep,
 * never by reading every record; a store without it is refused (78). */
#include <getopt.h>
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/outcome.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-stats [--json] [--store URL]\n";
static const char options[] =
	"  -j, --json         one JSON object (the default when stdout is not a terminal)\n"
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the counts were written" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the store is busy or unreachable" },
	{ IK_CONFIG, "the store cannot be used as configured, there is\n"
	    "no store where it looked, or it cannot count" },
	{ -1, NULL },
};

/* An age as "3d04h", "1h02m", "5m07s" or "42s". */
static const char *
age(int64_t ms, char buf[32])
{
	long long s = ms / 1000;

	if (s >= 86400)
		snprintf(buf, 32, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
	else if (s >= 3600)
		snprintf(buf, 32, "%lldh%02lldm", s / 3600, s % 3600 / 60);
	else if (s >= 60)
		snprintf(buf, 32, "%lldm%02llds", s / 60, s % 60);
	else
		snprintf(buf, 32, "%llds", s);
	return buf;
}

static void
human(const char *url, const struct ik_store_stats *st)
{
	char a[32];

	printf("store        %s\n", url);
	printf("IN_PROGRESS  %lld\n", (long long)st->in_progress);
	printf("DONE         %s%lld%s\n", st->done_approx ? "~" : "", (long long)st->done,
	       st->done_approx ? " (estimate)" : "");
	printf("FAILED       %lld\n", (long long)st->failed);
	printf("DEBITED_NOTIFICATION_FAILED %lld\n", (long long)st->dnf);
	if (st->stuck)
		printf("stuck        %lld IN_PROGRESS with an ended lease, oldest %s\n",
		       (long long)st->stuck, age(st->oldest_stuck_ms, a));
	else
		printf("stuck        none\n");
	if (st->dnf)
		printf("DNF backlog  %lld to re-notify, oldest %s\n", (long long)st->dnf,
		       age(st->oldest_dnf_ms, a));
	else
		printf("DNF backlog  none\n");
}

static void
json(const struct ik_store_stats *st)
{
	printf("{\"states\":{\"IN_PROGRESS\":%lld,\"DONE\":%lld,\"FAILED\":%lld,"
	       "\"DEBITED_NOTIFICATION_FAILED\":%lld},\"stuck\":%lld,\"oldestStuckMs\":%lld,"
	       "\"dnfBacklog\":%lld,\"oldestDnfMs\":%lld}\n",
	       (long long)st->in_progress, (long long)st->done, (long long)st->failed,
	       (long long)st->dnf, (long long)st->stuck, (long long)st->oldest_stuck_ms,
	       (long long)st->dnf, (long long)st->oldest_dnf_ms);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_store_stats st;
	struct ik_store *s;
	const char *url = NULL;
	ik_err err = { 0 };
	int ch, rc, as_json = !isatty(STDOUT_FILENO);

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "jS:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'j': as_json = 1; break;
		case 'S': url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc)
		return ik_usage(usage);
	if (ik_store_open_existing(url, &s, &err) != IK_OK)
		return ik_fail(&err);
	if (!s->ops->stats)
		rc = ik_errf(&err, IK_CONFIG, "%s: this store cannot count its records "
		             "without reading every one; no stats", s->ops->name);
	else
		rc = s->ops->stats(s, ik_now_ms(), &st, &err);
	if (rc == IK_OK) {
		if (as_json)
			json(&st);
		else
			human(s->url, &st);
	}
	ik_store_close(s);
	if (rc != IK_OK)
		return ik_fail(&err);
	return ik_finish(IK_OK);
}
