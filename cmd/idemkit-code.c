/* idemkit-code: explain exit codes from the one table in lib/outcome.c, for
 * a person at 3 a.m. ("what does 11 mean?") and for shell drivers. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "outcome.h"
#include "util.h"

static const char usage[] =
	"usage: idemkit-code [--json] [CODE|NAME ...]\n";
static const char options[] =
	"  -j, --json      one JSON object per code: code, name, meaning, action\n"
	"  -h, --help      this help\n"
	"  -V, --version   print the version\n"
	"With no CODE, the whole table.  Output: CODE NAME ACTION MEANING, tab-separated.\n";
static const int codes[] = { 0, 1, 64, -1 };

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

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const struct ik_outcome *t;
	int ch, n, json = 0, rc = IK_OK;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "jhV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'j': json = 1; break;
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
