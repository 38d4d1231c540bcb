/* idemp-init: create or migrate the idempotency store, idempotently, and
 * purge records past their retention.  SQLite: the schema and its
 * migrations.  PostgreSQL: versioned migrations, each in its own
 * transaction, under an advisory lock (safe from many hosts at once), then
 * the purge in small batches.  DynamoDB: the table (on-demand billing, HASH
 * key on the key attribute, TTL on expiresAt), or, when it exists, a check
 * of its key schema.  Run it at each deployment and from cron (the purge);
 * running it again on a ready store changes nothing else.  A retention
 * ($IDEMKIT_RETENTION) not longer than the lease ($IDEMKIT_LEASE) is
 * refused before the store is touched, as idemp-claim refuses it. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/outcome.h"
#include "open/open_store.h"
#include "store/store.h"

static const char usage[] =
	"usage: idemp-init [--store URL]\n";
static const char options[] =
	"  -S, --store URL    the store (default $IDEMKIT_STORE), one of\n"
	"                     @STORES@\n"
	"  -h, --help         this help\n"
	"  -V, --version      print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the store is ready" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error" },
	{ IK_TEMPFAIL, "the store is busy, unreachable or throttled, or\n"
	    "the table did not become ACTIVE in time" },
	{ IK_CONFIG, "bad store URL, table, schema, credentials or TLS" },
	{ -1, NULL },
};

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
	int64_t lease_ms, retention_ms;
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
	if (optind < argc)
		return ik_usage(usage);
	if ((rc = ik_store_lease(NULL, &lease_ms)) != IK_OK)
		return rc;
	if (ik_store_retention(lease_ms, &retention_ms, &err) != IK_OK)
		return ik_fail(&err);
	if ((rc = ik_store_open(url, &s, &err)) != IK_OK)
		return ik_fail(&err);
	rc = s->ops->init(s, &err);
	if (rc == IK_OK) {
		ik_log(IK_LOG_INFO, "store ready", "store", s->url, NULL);
		printf("%s\n", s->url);
	}
	ik_store_close(s);
	if (rc != IK_OK)
		return ik_fail(&err);
	return ik_finish(IK_OK);
}
