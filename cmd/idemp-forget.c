/* idemp-forget: delete FAILED records so declined charges can be retried
 * after a fix (then re-drive the DLQ).  Only FAILED: a declined debit moved
 * no money; a record that may have moved money is never forgotten. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-forget [--store URL] [CHARGEID ...]\n";
static const char options[] =
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n"
	"With no CHARGEID, chargeIds are read from stdin, one per line; \"-\" reads\n"
	"stdin in its place.\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "every chargeId's FAILED record was deleted" },
	{ IK_EMPTY, "a chargeId had no record, or one not FAILED" },
	{ IK_USAGE, "bad command line, or an empty chargeId" },
	{ IK_SOFTWARE, "internal error" },
	{ IK_TEMPFAIL, "the store is busy or unreachable, or the record's\n"
	    "outbox event is not yet published" },
	{ IK_CONFIG, "the store cannot be used as configured" },
	{ -1, NULL },
};

static int
forget(const char *key, void *store)
{
	struct ik_store *s = store;
	struct ik_record r;
	ik_err err = { 0 };
	int rc = s->ops->forget_failed(s, key, &err);

	if (rc == IK_OK) {
		printf("%s: forgotten (was FAILED)\n", key);
		ik_log(IK_LOG_AUDIT, "forgot a FAILED record", "chargeId", key, NULL);
		return IK_OK;
	}
	if (rc != IK_EMPTY)
		return ik_fail(&err);
	rc = s->ops->get(s, key, &r, &err);
	if (rc == IK_OK) {
		ik_warnk(key, "state is %s; only FAILED records can be forgotten",
		    ik_state_name(r.state));
		ik_record_free(&r);
	} else if (rc == IK_EMPTY) {
		ik_warnk(key, "no record");
	} else {
		return ik_fail(&err);
	}
	return IK_EMPTY;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_store *s;
	const char *url = NULL;
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "S:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'S': url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if ((rc = ik_keys_check(argc - optind, argv + optind)) != IK_OK)
		return rc;
	if (ik_store_open(url, &s, &err) != IK_OK)
		return ik_fail(&err);
	rc = ik_each_key(argc - optind, argv + optind, forget, s);
	ik_store_close(s);
	return ik_finish(rc);
}
