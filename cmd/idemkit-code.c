/* idemkit-code: explain exit codes from the one table in lib/outcome.c, for
 * a person at 3 a.m. ("what does 11 mean?") and for shell drivers.
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

#include "cli.h"
#include "envelope.h"
#include "outcome.h"
#include "util.h"

static const char usage[] =
	"usage: idemkit-code [--json] [CODE|NAME ...]\n"
	"       idemkit-code --duration DUR\n"
	"       idemkit-code --tally < acked-envelopes\n";
static const char options[] =
	"  -j, --json        one JSON object per code: code, name, meaning, action\n"
	"  -d, --duration D  print duration D (30, 30s, 500ms, 5m, 2h, 30d) in\n"
	"                    milliseconds; 64 when it is not a duration\n"
	"  -t, --tally       count sqs-ack's output envelopes: NAME COUNT per\n"
	"                    verdict in the table, then RECEIVED (lines) and\n"
	"                    ACK_FAILED (the ack itself did not succeed)\n"
	"  -h, --help        this help\n"
	"  -V, --version     print the version\n"
	"With no CODE, the whole table.  Output: CODE NAME ACTION MEANING, tab-separated.\n";
static const int codes[] = { 0, 1, 64, 70, -1 };

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

/* Count the envelopes sqs-ack wrote by their ack.verdict.  A line that is
 * no envelope, or has no verdict, counts as received and as ACK_FAILED. */
static int
tally(void)
{
	int n;
	const struct ik_outcome *t = ik_outcomes(&n);
	long long *count = calloc((size_t)n, sizeof *count), received = 0, failed = 0;
	struct ik_buf line = { 0 };
	int r;

	if (!count) {
		ik_warnx("out of memory");
		return IK_SOFTWARE;
	}
	while ((r = ik_read_line(stdin, &line)) == 1) {
		ik_err err = { 0 };
		cJSON *env = NULL;
		const cJSON *ack;
		const struct ik_outcome *v;

		if (!line.len)
			continue;
		received++;
		ik_env_parse(line.p, line.len, &env, &err);
		ack = env ? ik_env_result(env, "ack") : NULL;
		v = ik_outcome_by_name(cJSON_GetStringValue(
		    cJSON_GetObjectItemCaseSensitive(ack, "verdict")));
		if (v)
			count[v - t]++;
		if (!v || ik_env_step_code(env, "ack") != IK_OK)
			failed++;
		cJSON_Delete(env);
	}
	ik_buf_free(&line);
	if (r < 0) {
		free(count);
		ik_warnx("stdin: %s", strerror(errno));
		return IK_SOFTWARE;
	}
	for (int i = 0; i < n; i++)
		printf("%s\t%lld\n", t[i].name, count[i]);
	printf("RECEIVED\t%lld\nACK_FAILED\t%lld\n", received, failed);
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
