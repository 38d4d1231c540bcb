/* idemkit-code: explain exit codes from the one table in
 * lib/core/outcome.c, for a person at 3 a.m. ("what does 11 mean?") and
 * for shell drivers.
 *
 * The drivers also ask it what they must not work out again in shell:
 * --duration parses a duration as every command does (ik_parse_duration),
 * --tally counts sqs-ack's output by verdict, so a driver's summary comes
 * from what was decided for each message, in one place. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/lines.h"
#include "core/outcome.h"
#include "core/util.h"

static const char usage[] =
	"usage: idemkit-code [--json] [CODE|NAME ...]\n"
	"       idemkit-code --duration DUR\n"
	"       idemkit-code --tally < acked-envelopes\n";
static const char options[] =
	"  -j, --json        one JSON object per code: code, name, meaning, action\n"
	"  -d, --duration D  print duration D (30, 30s, 500ms, 5m, 2h, 30d) in\n"
	"                    milliseconds; 64 when it is not a duration\n"
	"  -t, --tally       count sqs-ack's output envelopes: NAME COUNT per\n"
	"                    verdict in the table, then RECEIVED (lines),\n"
	"                    ACK_FAILED (the ack itself did not succeed),\n"
	"                    STRANDED (lines no sqs-ack wrote: received, then\n"
	"                    lost with a step) and UNSETTLED (messages no line\n"
	"                    of which was deleted)\n"
	"  -h, --help        this help\n"
	"  -V, --version     print the version\n"
	"With no CODE, the whole table.  Output: CODE NAME ACTION MEANING, tab-separated.\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "every argument was a known code or name" },
	{ IK_EMPTY, "at least one argument is not a code or name" },
	{ IK_USAGE, "bad command line, or not a duration" },
	{ IK_SOFTWARE, "standard input could not be read (--tally)" },
	{ -1, NULL },
};

static void
print(const struct ik_outcome *o, int json)
{
	if (json)
		printf("{\"code\":%d,\"name\":\"%s\",\"action\":\"%s\",\"meaning\":\"%s\","
		    "\"queue\":\"%s\"}\n", o->code, o->name, ik_action_name(o->action),
		    o->meaning, o->action_text);
	else
		printf("%d\t%s\t%s\t%s\n", o->code, o->name, ik_action_name(o->action), o->meaning);
}

struct seen {
	char *id;          /* messageId; NULL when the line had none */
	int settled;       /* sqs-ack deleted it (after the DLQ, if so) */
};

static int
by_id(const void *a, const void *b)
{
	const struct seen *x = a, *y = b;

	if (!x->id || !y->id)
		return !x->id - !y->id;
	return strcmp(x->id, y->id);
}

/* Messages (by messageId) none of whose lines says they were settled. */
static long long
unsettled(struct seen *s, size_t n)
{
	long long count = 0;
	size_t i = 0, j;

	if (n)   /* (qsort's array must not be NULL, even for none) */
		qsort(s, n, sizeof *s, by_id);
	while (i < n) {
		int ok = s[i].settled;
		for (j = i + 1; j < n && s[i].id && s[j].id && strcmp(s[i].id, s[j].id) == 0; j++)
			ok |= s[j].settled;
		count += !ok;
		i = j;
	}
	return count;
}

/* Count the envelopes sqs-ack wrote by their ack.verdict.  A line with no
 * ack result at all (what sqs-recv handed out and no sqs-ack wrote, or a
 * line cut short) counts as received and as STRANDED; one with an ack
 * result and no verdict, as received and as ACK_FAILED.  A message seen
 * more than once (left, then received again) is UNSETTLED unless one of
 * its lines was settled. */
static int
tally(void)
{
	int n;
	const struct ik_outcome *t = ik_outcomes(&n);
	long long *count = calloc((size_t)n, sizeof *count), received = 0, failed = 0,
	    replayed = 0, stranded = 0;
	struct ik_lines in;
	char *line;
	size_t len;
	struct seen *seen = NULL;
	size_t nseen = 0, capseen = 0;
	int r;

	if (!count) {
		ik_warnx("out of memory");
		return IK_SOFTWARE;
	}
	ik_lines_init(&in, STDIN_FILENO);
	while ((r = ik_lines_next(&in, &line, &len)) == 1) {
		ik_err err = { 0 };
		cJSON *env = NULL;
		const struct ik_outcome *v = NULL;
		int settled = 0;

		if (!len)
			continue;
		received++;
		ik_env_parse(line, len, &env, &err);
		if (env)
			settled = ik_env_settled(env, &v);
		if (v)
			count[v - t]++;
		if (!env || !ik_env_result(env, "ack"))
			stranded++;
		else if (!v || ik_env_step_code(env, "ack") != IK_OK)
			failed++;
		/* the bank answered our debit as a replay: a crash window was hit */
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "debit"),
		    "replayed")))
			replayed++;
		if (nseen == capseen) {
			struct seen *p = realloc(seen, (capseen = capseen ? capseen * 2 : 256) * sizeof *p);
			if (!p) {
				cJSON_Delete(env);
				r = -1;
				errno = ENOMEM;
				break;
			}
			seen = p;
		}
		seen[nseen].id = ik_strdup(env ? ik_env_str(env, "messageId") : NULL);
		seen[nseen++].settled = settled;
		cJSON_Delete(env);
	}
	ik_lines_free(&in);
	if (r < 0) {
		for (size_t i = 0; i < nseen; i++)
			free(seen[i].id);
		free(seen);
		free(count);
		ik_warnx("stdin: %s", strerror(errno));
		return IK_SOFTWARE;
	}
	for (int i = 0; i < n; i++)
		printf("%s\t%lld\n", t[i].name, count[i]);
	printf("BANK_REPLAYED\t%lld\nRECEIVED\t%lld\nACK_FAILED\t%lld\nSTRANDED\t%lld\n"
	    "UNSETTLED\t%lld\n", replayed, received, failed, stranded, unsettled(seen, nseen));
	for (size_t i = 0; i < nseen; i++)
		free(seen[i].id);
	free(seen);
	free(count);
	return ik_finish(IK_OK);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "duration", required_argument, NULL, 'd' },
		{ "tally", no_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const struct ik_outcome *t;
	int ch, n, json = 0, rc = IK_OK;
	int64_t ms;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "jd:thV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'j': json = 1; break;
		case 'd':
			if (optind != argc)
				return ik_usage(usage);
			if (ik_parse_duration(optarg, &ms) < 0) {
				ik_warnx("--duration: \"%s\" is not a duration (30, 30s, 500ms, 5m, 2h, 30d)",
				    optarg);
				return IK_USAGE;
			}
			printf("%" PRId64 "\n", ms);
			return ik_finish(IK_OK);
		case 't':
			if (optind != argc)
				return ik_usage(usage);
			return tally();
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind == argc) {
		t = ik_outcomes(&n);
		for (int i = 0; i < n; i++)
			print(&t[i], json);
		return ik_finish(IK_OK);
	}
	for (int i = optind; i < argc; i++) {
		long long c;
		const struct ik_outcome *o = ik_parse_int(argv[i], 0, 255, &c) == 0 ?
		    ik_outcome_by_code((int)c) : ik_outcome_by_name(argv[i]);
		if (o) {
			print(o, json);
		} else if (ik_parse_int(argv[i], 129, 255, &c) == 0) {
			printf("%lld\tSIGNAL\tleave\tstopped by signal %lld\n", c, c - 128);
		} else {
			ik_warnx("%s: not an idemkit exit code or name", argv[i]);
			rc = IK_EMPTY;
		}
	}
	return ik_finish(rc);
}
