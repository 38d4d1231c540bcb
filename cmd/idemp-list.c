/* idemp-list: records matching a filter, one JSON object per line, for cron
 * recovery jobs (re-notify DEBITED_NOTIFICATION_FAILED, re-drive IN_PROGRESS
 * records whose lease ran out long ago). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/outcome.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-list [--state STATE] [--expired] [--older-than DUR]\n"
	"                  [--format record|event|envelope] [--store URL]\n";
static const char options[] =
	"  -t, --state STATE      only IN_PROGRESS, DONE, FAILED or\n"
	"                         DEBITED_NOTIFICATION_FAILED records\n"
	"  -e, --expired          only IN_PROGRESS records whose lease has ended\n"
	"  -o, --older-than DUR   only records last updated more than DUR ago (e.g. 15m)\n"
	"  -f, --format F         record (default): the record as JSON;\n"
	"                         event: the stored event body on one line, for\n"
	"                         sqs-send (re-drive);\n"
	"                         envelope: an envelope of the stored event with the\n"
	"                         debit as recorded (OK only for DONE and\n"
	"                         DEBITED_NOTIFICATION_FAILED), for charge-notify\n"
	"  -S, --store URL        the store (default $IDEMKIT_STORE), one of\n"
	"                         @STORES@\n"
	"  -h, --help             this help\n"
	"  -V, --version          print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "at least one record matched" },
	{ IK_EMPTY, "nothing matched" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the store is busy or unreachable" },
	{ IK_CONFIG, "the store cannot be used as configured, or there\n"
	    "is no store where it looked" },
	{ -1, NULL },
};

enum format { F_RECORD, F_EVENT, F_ENVELOPE };

struct out {
	enum format format;
	int64_t now_ms;
};

/* An envelope to re-notify a debited charge: the stored event as its body
 * and the debit as the record says it went.  Only DONE and
 * DEBITED_NOTIFICATION_FAILED prove the money moved (debit OK); FAILED is
 * the bank's refusal (debit DECLINED, its error); IN_PROGRESS proves
 * nothing, so it carries no debit at all.  An envelope saying OK for any
 * other state would have charge-notify tell a declined customer they were
 * charged. */
static cJSON *
as_envelope(const struct ik_record *r)
{
	cJSON *env = ik_env_new(r->event), *d;

	if (!env)
		return NULL;
	switch (r->state) {
	case IK_ST_DONE:
	case IK_ST_DNF:
		if ((d = ik_env_set_result(env, "debit", IK_OK)) && r->debit_ref)
			cJSON_AddStringToObject(d, "ref", r->debit_ref);
		break;
	case IK_ST_FAILED:
		if ((d = ik_env_set_result(env, "debit", IK_DECLINED)) && r->last_error)
			cJSON_AddStringToObject(d, "error", r->last_error);
		break;
	default:
		break;
	}
	if ((d = cJSON_AddObjectToObject(env, "recovery"))) {
		cJSON_AddStringToObject(d, "chargeId", r->key);
		cJSON_AddStringToObject(d, "state", ik_state_name(r->state));
		cJSON_AddNumberToObject(d, "attempts", (double)r->attempts);
	}
	return env;
}

static int
print(const struct ik_record *r, void *arg)
{
	struct out *o_ = arg;
	cJSON *o;
	char *line;
	int stop;

	if (o_->format == F_EVENT) {
		if (!r->event)
			return 0;
		/* One event per line whatever its formatting: a stored event is
		 * valid JSON, where a raw line break can only be whitespace
		 * between tokens, so a space means the same. */
		for (const char *c = r->event; *c; c++)
			if (putchar(*c == '\n' || *c == '\r' ? ' ' : *c) == EOF)
				return 1;
		return putchar('\n') == EOF;
	}
	o = o_->format == F_ENVELOPE ? as_envelope(r) : ik_record_json(r, o_->now_ms);
	line = o ? cJSON_PrintUnformatted(o) : NULL;
	stop = !line;

	if (line && printf("%s\n", line) < 0)
		stop = 1;   /* stdout is gone; ik_finish reports it */
	free(line);
	cJSON_Delete(o);
	return stop;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "state", required_argument, NULL, 't' },
		{ "expired", no_argument, NULL, 'e' },
		{ "older-than", required_argument, NULL, 'o' },
		{ "format", required_argument, NULL, 'f' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_list_filter f = { 0 };
	struct out out = { F_RECORD, 0 };
	struct ik_store *s;
	const char *url = NULL;
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "t:eo:f:S:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 't':
			if ((f.state = ik_state_parse(optarg)) == IK_ST_NONE) {
				ik_warnx("--state: \"%s\" is not IN_PROGRESS, DONE, FAILED or "
				    "DEBITED_NOTIFICATION_FAILED", optarg);
				return IK_USAGE;
			}
			break;
		case 'e': f.expired = 1; break;
		case 'o':
			if (ik_parse_duration(optarg, &f.older_than_ms) < 0 || !f.older_than_ms) {
				ik_warnx("--older-than: \"%s\" is not a duration (e.g. 15m, 2h)", optarg);
				return IK_USAGE;
			}
			break;
		case 'f':
			if (strcmp(optarg, "record") == 0)
				out.format = F_RECORD;
			else if (strcmp(optarg, "event") == 0)
				out.format = F_EVENT;
			else if (strcmp(optarg, "envelope") == 0)
				out.format = F_ENVELOPE;
			else {
				ik_warnx("--format: \"%s\" is not record, event or envelope", optarg);
				return IK_USAGE;
			}
			break;
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
	f.now_ms = out.now_ms = ik_now_ms();
	rc = s->ops->list(s, &f, print, &out, &err);
	if (rc != IK_OK && rc != IK_EMPTY)
		ik_fail(&err);
	ik_store_close(s);
	return ik_finish(rc);
}
