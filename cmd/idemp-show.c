/* idemp-show: what the store knows of one or more chargeIds, for a person
 * (default) or a machine (--json, one object per line).  Answers the 3 a.m.
 * questions: debited or not, when, how many attempts, who holds it now,
 * and the record's history as a timeline.  A record idemp-run made (its
 * event is {"idempRun":...}) is shown as a command run once, not as a
 * charge: what ran, whether it did, its result. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/utf8.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-show [--json] [--store URL] [CHARGEID ...]\n";
static const char options[] =
	"  -j, --json         one JSON object per record instead of the human view\n"
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n"
	"With no CHARGEID, chargeIds are read from stdin, one per line; \"-\" reads\n"
	"stdin in its place.\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "every chargeId has a record" },
	{ IK_EMPTY, "at least one chargeId has no record" },
	{ IK_USAGE, "bad command line, or an empty chargeId" },
	{ IK_SOFTWARE, "internal error" },
	{ IK_TEMPFAIL, "the store is busy or unreachable" },
	{ IK_CONFIG, "the store cannot be used as configured, or there\n"
	    "is no store where it looked" },
	{ -1, NULL },
};

/* ms as UTC ISO 8601 with milliseconds into buf; the times come from the
 * store: a year gmtime cannot hold is shown raw. */
static const char *
iso(char buf[48], int64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	size_t n;

	if (ms < 0 || !gmtime_r(&t, &tm) || !(n = strftime(buf, 48, "%Y-%m-%dT%H:%M:%S", &tm)))
		snprintf(buf, 48, "%lld", (long long)ms);
	else
		snprintf(buf + n, 48 - n, ".%03dZ", (int)(ms % 1000));
	return buf;
}

/* A time beside now, past and future in one form: "(0h06m17s ago)",
 * "(in 29d23h53m41s)" -- days once there is one, so a retention of 30
 * days reads as one. */
static void
when(const char *label, int64_t ms, int64_t now)
{
	char buf[48], d[64];
	int64_t s = (now - ms) / 1000, a = s < 0 ? -s : s;

	if (ms <= 0) {
		printf("  %-12s -\n", label);
		return;
	}
	iso(buf, ms);
	if (a >= 86400)
		snprintf(d, sizeof d, "%lldd%02lldh%02lldm%02llds", (long long)(a / 86400),
		    (long long)(a / 3600 % 24), (long long)(a / 60 % 60), (long long)(a % 60));
	else
		snprintf(d, sizeof d, "%lldh%02lldm%02llds", (long long)(a / 3600),
		    (long long)(a / 60 % 60), (long long)(a % 60));
	printf("  %-12s %s (%s%s%s)\n", label, buf, s < 0 ? "in " : "", d, s < 0 ? "" : " ago");
}

/* The record's history (store.h), one line per transition, oldest first:
 * its time, the op, then what it set, and who: the host and pid the owner
 * token names (store.h's "@HOST:PID") with its first 8 hex digits, enough
 * to tell the holders of one record apart; a token without them (from
 * before, or from elsewhere) by those digits alone. */
/* Whether word holds a byte a terminal would act on (a control byte) or
 * one that is not UTF-8: never written raw to an operator's terminal. */
static int
unprintable(const char *word)
{
	for (const unsigned char *b = (const unsigned char *)word; *b; b++)
		if (*b < 0x20 || *b == 0x7f)
			return 1;
	return !ik_utf8_valid(word, strlen(word));
}

/* A stored text (the bank's reference, an error, a state) as written to
 * the operator: as it is, or, when it holds a control byte or a byte not
 * UTF-8, each such byte (and every byte past ASCII) as \xNN and a
 * backslash as \\, so an escape sequence from a bank's answer is shown,
 * never acted on; "-" for none. */
static const char *
shown(const char *s, char *buf, size_t cap)
{
	size_t n = 0;

	if (!s)
		return "-";
	if (!unprintable(s))
		return s;
	for (const unsigned char *b = (const unsigned char *)s; *b && n + 5 < cap; b++)
		if (*b < 0x20 || *b >= 0x7f)
			n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", *b);
		else if (*b == '\\')
			n += (size_t)snprintf(buf + n, cap - n, "\\\\");
		else
			buf[n++] = (char)*b;
	buf[n] = '\0';
	return buf;
}
#define SHOWN_MAX 4096
#define SHOW(s, buf) shown((s), (buf), sizeof (buf))

static void
timeline(const struct ik_record *r, int run)
{
	cJSON *h = r->history ? cJSON_Parse(r->history) : NULL, *e;
	char at[48], lease[48], b1[SHOWN_MAX], b2[SHOWN_MAX], b3[SHOWN_MAX], tok[9], host[64];
	const char *op, *ow, *st, *sep;
	long pid;
	int local;

	if (!cJSON_IsArray(h) || !h->child) {
		printf("  %-12s -\n", "history");
		cJSON_Delete(h);
		return;
	}
	printf("  %-12s UTC, oldest first (at most the last %d transitions)\n", "history",
	    IK_HISTORY_MAX);
	cJSON_ArrayForEach(e, h) {
		op = ik_env_str(e, "op");
		ow = ik_env_str(e, "owner");
		st = ik_env_str(e, "state");
		sep = " ";
		printf("    %s  %-10s", iso(at, ik_env_int(e, "at", -1)), op ? SHOW(op, b1) : "?");
		if (op && strcmp(op, "claim") == 0) {
			printf(" attempt %lld, lease until %s", (long long)ik_env_int(e, "attempt", -1),
			    iso(lease, ik_env_int(e, "leaseUntil", -1)));
			sep = ", ";
		}
		if (st) {
			printf("%s%s", sep, SHOW(st, b1));
			sep = ", ";
		}
		if (op && strcmp(op, "finish") == 0) {
			/* A replay: the bank had made this debit already and
			 * its first answer was lost (a crash window). */
			printf("%s%s %s%s, error %s", sep, run ? "result" : "bank ref",
			    SHOW(ik_env_str(e, "debitRef"), b2),
			    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "bankReplayed")) ?
			    " (replayed by the bank)" : "",
			    SHOW(ik_env_str(e, "error"), b3));
			sep = ", ";
		}
		if (ow && ik_owner_holder(ow, tok, host, &pid, &local))
			printf("%sby %s pid %ld (token %s)", sep, SHOW(host, b1), pid, SHOW(tok, b2));
		else if (ow)
			printf("%sowner %.8s", sep, SHOW(ow, b1));
		printf("\n");
	}
	cJSON_Delete(h);
}

static const char *
debited(const struct ik_record *r)
{
	switch (r->state) {
	case IK_ST_DONE: return "yes";
	case IK_ST_DNF: return "yes (customer not notified)";
	case IK_ST_FAILED: return "no (declined)";
	default:
		/* A noted reason (idemp-done's note) means the run did not die:
		 * it met the bank's TEMPFAIL or CONFIG and left the message. */
		if (r->last_error)
			return "unknown: the last run left it after the bank's answer "
			    "(last error); the bank's ledger for this chargeId decides";
		return "unknown: a claim is in progress or died mid-way; "
		    "the bank's ledger for this chargeId decides";
	}
}

/* Who holds (or last held) the claim, from its owner token (store.h):
 * host, pid, short token, and on this host whether a process with that
 * pid still runs -- a lease held by a run that exited (a bank outage
 * left it) is not a worker at work, and not a dead one either. */
static void
holder(const char *label, const char *owner, const char *tail)
{
	char tok[9], host[64], buf[SHOWN_MAX], tb[48];
	long pid;
	int local;

	if (!ik_owner_holder(owner, tok, host, &pid, &local)) {
		printf("  %-12s %s %s%s\n", "lease", label, owner ? SHOW(owner, buf) : "?", tail);
		return;
	}
	printf("  %-12s %s %s pid %ld (token %s)%s\n", "lease", label, SHOW(host, buf), pid,
	    SHOW(tok, tb), tail);
	if (local)
		printf("  %-12s %s\n", "holder", kill((pid_t)pid, 0) == 0 || errno == EPERM ?
		    "running on this host (a process with that pid is alive)" :
		    "exited: no process with that pid on this host");
	else
		printf("  %-12s on another host: not checked from here\n", "holder");
}

/* What idemp-run says it did, by the record's state (idemp-run(1)). */
static const char *
ran(const struct ik_record *r, int64_t now)
{
	switch (r->state) {
	case IK_ST_DONE: return "yes: it exited 0 and that was recorded (later runs: DUP_DONE)";
	case IK_ST_FAILED: return "yes, and failed (last error); later runs answer DUP_FAILED "
	    "until idemp-forget";
	case IK_ST_IN_PROGRESS:
		if (r->lease_until > now)
			return "running: a run holds the claim (below)";
		return "not to the end: the last run failed and released its claim, or died "
		    "(history); the next run runs it";
	default: return ik_state_name(r->state);
	}
}

/* The idempRun object of an idemp-run record's event, in *root (the
 * caller's to free), else NULL: a charge. */
static const cJSON *
run_of(const struct ik_record *r, cJSON **root)
{
	const cJSON *run;

	*root = r->event ? cJSON_Parse(r->event) : NULL;
	if (!(run = cJSON_GetObjectItemCaseSensitive(*root, "idempRun")) || !cJSON_IsObject(run)) {
		cJSON_Delete(*root);
		*root = NULL;
		return NULL;
	}
	return run;
}

/* The command idemp-run ran, its words as a shell would read them back
 * (single-quoted where they hold anything but a plain word; $'...' with
 * \xNN escapes where they hold control bytes or bytes not UTF-8). */
static void
command(const cJSON *run)
{
	const cJSON *w;
	const char *sep = "", *p;

	printf("  %-12s ", "command");
	cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(run, "command")) {
		if (!(p = cJSON_GetStringValue(w)))
			continue;
		if (*p && !p[strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
		    "0123456789-_./=:,+@%")]) {
			printf("%s%s", sep, p);
		} else if (unprintable(p)) {
			printf("%s$'", sep);
			for (const unsigned char *b = (const unsigned char *)p; *b; b++)
				if (*b < 0x20 || *b >= 0x7f)
					printf("\\x%02x", *b);
				else if (*b == '\'' || *b == '\\')
					printf("\\%c", *b);
				else
					putchar(*b);
			printf("'");
		} else {
			printf("%s'", sep);
			for (; *p; p++)
				fputs(*p == '\'' ? "'\\''" : (char[]){ *p, 0 }, stdout);
			printf("'");
		}
		sep = " ";
	}
	printf("\n");
}

static void
human(const struct ik_record *r, int64_t now)
{
	char tail[96], buf[SHOWN_MAX];
	cJSON *root;
	const cJSON *run = run_of(r, &root);

	printf("%s\n", SHOW(r->key, buf));
	if (run) {
		printf("  %-12s %s\n", "kind", "idemp-run: a command run once for this key");
		command(run);
	}
	printf("  %-12s %s\n", "state", ik_state_name(r->state));
	printf("  %-12s %s\n", run ? "ran" : "debited", run ? ran(r, now) : debited(r));
	if (r->state == IK_ST_IN_PROGRESS) {
		if (r->lease_until > now) {
			snprintf(tail, sizeof tail, ", %llds left",
			    (long long)((r->lease_until - now - 1) / 1000 + 1));
			holder("held by", r->owner, tail);
		} else {
			holder("expired, last held by", r->owner, run ?
			    ": the next run may take it over" : ": the next delivery may reclaim");
		}
	}
	printf("  %-12s %lld\n", "attempts", (long long)r->attempts);
	printf("  %-12s %s\n", run ? "result" : "bank ref", SHOW(r->debit_ref, buf));
	printf("  %-12s %s\n", "last error", SHOW(r->last_error, buf));
	when("created", r->created_at, now);
	when("updated", r->updated_at, now);
	when("expires", r->expires_at <= 0 ? 0 : r->expires_at > INT64_MAX / 1000 ? INT64_MAX :
	    r->expires_at * 1000, now);
	printf("  %-12s %s\n", "fingerprint", SHOW(r->fingerprint, buf));
	timeline(r, run != NULL);
	cJSON_Delete(root);
}

struct ctx {
	struct ik_store *s;
	int json;
};

static int
show(const char *key, void *ctxp)
{
	const struct ctx *c = ctxp;
	ik_err err = { 0 };
	struct ik_record r;
	int64_t now = ik_now_ms();
	int rc = c->s->ops->get(c->s, key, &r, &err);

	if (rc == IK_EMPTY) {
		ik_warnk(key, "no record in %s", c->s->url);
		return rc;
	}
	if (rc != IK_OK)
		return ik_fail(&err);
	if (c->json) {
		cJSON *o = ik_record_json(&r, now);
		char *line = o ? cJSON_PrintUnformatted(o) : NULL;
		if (line)
			printf("%s\n", line);
		free(line);
		cJSON_Delete(o);
	} else {
		human(&r, now);
	}
	ik_record_free(&r);
	return IK_OK;
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
	struct ctx c = { 0 };
	const char *url = NULL;
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "jS:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'j': c.json = 1; break;
		case 'S': url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if ((rc = ik_keys_check(argc - optind, argv + optind)) != IK_OK)
		return rc;
	if (ik_store_open_existing(url, &c.s, &err) != IK_OK)
		return ik_fail(&err);
	rc = ik_each_key(argc - optind, argv + optind, show, &c);
	ik_store_close(c.s);
	return ik_finish(rc);
}
