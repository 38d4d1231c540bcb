/* bank-sim: core-banking and notification-gateway simulator for the demo,
 * the tests and staging.  Runs until SIGTERM/SIGINT; see bank-sim(1). */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "banksim.h"
#include "cli/cli.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

static const char USAGE[] =
	"usage: bank-sim [--listen ADDR] [--port N] [--port-file FILE] [--db FILE]\n"
	"                [--token-file FILE] [--hmac-key-file FILE]\n"
	"                [--tls-cert FILE --tls-key FILE] [--tls-client-ca FILE]\n"
	"                [--oauth-client-id ID --oauth-client-secret-file FILE]\n"
	"                [--oauth-expires-in N] [--decline ACCOUNTS]\n"
	"                [--latency DURATION] [--error-rate F] [--error-status N]\n"
	"                [--seed N] [--hang] [--notify-fail-rate F] [--notify-fail]\n"
	"                [--notify-fail-status N] [--notify-hang] [--max-conns N]\n";

static const char OPTIONS[] =
	"  --listen ADDR          numeric address to bind (default 127.0.0.1)\n"
	"  --port N               port; 0 (default) picks a free one\n"
	"  --port-file FILE       write the chosen port to FILE\n"
	"  --db FILE              SQLite ledger (default STATE_DIR/bank-sim.db)\n"
	"  --token-file FILE      require 'Authorization: Bearer <token in FILE>'\n"
	"  --hmac-key-file FILE   require X-Idemkit-Signature on POSTed debits and\n"
	"                         notifications, HMAC-SHA256 keyed with FILE\n"
	"  --tls-cert FILE, --tls-key FILE  serve HTTPS with these PEM files\n"
	"  --tls-client-ca FILE   require client certificates signed by this PEM CA\n"
	"  --oauth-client-id ID, --oauth-client-secret-file FILE\n"
	"                         OAuth2 client credentials: POST /oauth/token issues\n"
	"                         the bearer tokens every endpoint but /health wants\n"
	"  --oauth-expires-in N   lifetime in seconds of what it issues (default 3600)\n"
	"  --decline ACCOUNTS     comma-separated accounts answered 402\n"
	"  --latency DURATION     delay before each POST answer (e.g. 200ms)\n"
	"  --error-rate F         fraction (0..1) of debits answered --error-status\n"
	"  --error-status N       status of injected debit errors (default 503)\n"
	"  --seed N               seed for the injected rates (default random)\n"
	"  --hang                 never answer a debit (until the client gives up)\n"
	"  --notify-fail-rate F   fraction (0..1) of notifications answered\n"
	"                         --notify-fail-status\n"
	"  --notify-fail          every notification answered --notify-fail-status\n"
	"  --notify-fail-status N status of injected notification failures (default 503)\n"
	"  --notify-hang          never answer a notification\n"
	"  --max-conns N          concurrent connections (default 256)\n"
	"  --help, --version\n";

static const struct ik_exit CODES[] = {
	{ IK_OK, "stopped by a signal, as asked" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error (out of memory)" },
	{ IK_CONFIG, "cannot listen; an unreadable token, key or\n"
	    "certificate file; the ledger not writable" },
	{ -1, NULL },
};

static int
parse_rate(const char *s, double *out)
{
	char *end;
	double d = strtod(s, &end);
	if (end == s || *end || !(d >= 0 && d <= 1))
		return -1;
	*out = d;
	return 0;
}

static int
write_port_file(const char *path, int port, ik_err *err)
{
	char tmp[4096];
	FILE *f;

	if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp)
		return ik_errf(err, IK_CONFIG, "port file name too long");
	if (!(f = fopen(tmp, "w")))
		return ik_errf(err, IK_CONFIG, "%s: cannot create", path);
	fprintf(f, "%d\n", port);
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		unlink(tmp);
		return ik_errf(err, IK_CONFIG, "%s: cannot write", path);
	}
	return IK_OK;
}

int
main(int argc, char **argv)
{
	enum { O_LISTEN = 256, O_PORT, O_PORTFILE, O_DB, O_TOKEN, O_HMAC, O_CERT,
	       O_KEY, O_CLIENTCA, O_OID, O_OSECRET, O_OTTL, O_DECLINE, O_LATENCY, O_ERATE, O_ESTATUS, O_SEED, O_HANG,
	       O_NRATE, O_NFAIL, O_NSTATUS, O_NHANG, O_MAXC, O_HELP, O_VERSION };
	static const struct option lopts[] = {
		{ "listen", required_argument, NULL, O_LISTEN },
		{ "port", required_argument, NULL, O_PORT },
		{ "port-file", required_argument, NULL, O_PORTFILE },
		{ "db", required_argument, NULL, O_DB },
		{ "token-file", required_argument, NULL, O_TOKEN },
		{ "hmac-key-file", required_argument, NULL, O_HMAC },
		{ "tls-cert", required_argument, NULL, O_CERT },
		{ "tls-key", required_argument, NULL, O_KEY },
		{ "tls-client-ca", required_argument, NULL, O_CLIENTCA },
		{ "oauth-client-id", required_argument, NULL, O_OID },
		{ "oauth-client-secret-file", required_argument, NULL, O_OSECRET },
		{ "oauth-expires-in", required_argument, NULL, O_OTTL },
		{ "decline", required_argument, NULL, O_DECLINE },
		{ "latency", required_argument, NULL, O_LATENCY },
		{ "error-rate", required_argument, NULL, O_ERATE },
		{ "error-status", required_argument, NULL, O_ESTATUS },
		{ "seed", required_argument, NULL, O_SEED },
		{ "hang", no_argument, NULL, O_HANG },
		{ "notify-fail-rate", required_argument, NULL, O_NRATE },
		{ "notify-fail", no_argument, NULL, O_NFAIL },
		{ "notify-fail-status", required_argument, NULL, O_NSTATUS },
		{ "notify-hang", no_argument, NULL, O_NHANG },
		{ "max-conns", required_argument, NULL, O_MAXC },
		{ "help", no_argument, NULL, O_HELP },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_banksim_cfg cfg = { .listen = "127.0.0.1" };
	const char *port_file = NULL;
	char *db = NULL, *dir;
	struct ik_banksim *b;
	sigset_t block, old;
	long long n;
	ik_err e;
	int c, rc;

	ik_cli_init(argv[0]);
	while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
		switch (c) {
		case O_LISTEN: cfg.listen = optarg; break;
		case O_PORT:
			if (ik_opt_int("--port", optarg, 0, 65535, &n) < 0)
				return ik_usage(USAGE);
			cfg.port = (int)n;
			break;
		case O_PORTFILE: port_file = optarg; break;
		case O_DB: cfg.db_path = optarg; break;
		case O_TOKEN: cfg.token_file = optarg; break;
		case O_HMAC: cfg.hmac_key_file = optarg; break;
		case O_CERT: cfg.tls_cert = optarg; break;
		case O_KEY: cfg.tls_key = optarg; break;
		case O_CLIENTCA: cfg.tls_client_ca = optarg; break;
		case O_OID: cfg.oauth_client_id = optarg; break;
		case O_OSECRET: cfg.oauth_client_secret_file = optarg; break;
		case O_OTTL:
			if (ik_opt_int("--oauth-expires-in", optarg, 0, 86400 * 366, &n) < 0)
				return ik_usage(USAGE);
			cfg.oauth_expires_in = n;
			break;
		case O_DECLINE:
			if (ik_banksim_set_decline(&cfg.faults, optarg) < 0) {
				ik_warnx("out of memory");
				return IK_SOFTWARE;
			}
			break;
		case O_LATENCY:
			if (ik_opt_duration("--latency", optarg, 0, INT64_MAX, &cfg.faults.latency_ms) < 0)
				return ik_usage(USAGE);
			break;
		case O_ERATE:
			if (parse_rate(optarg, &cfg.faults.error_rate) < 0)
				return ik_usage(USAGE);
			break;
		case O_ESTATUS:
			if (ik_opt_int("--error-status", optarg, 100, 599, &n) < 0)
				return ik_usage(USAGE);
			cfg.faults.error_status = (int)n;
			break;
		case O_SEED:
			if (ik_opt_int("--seed", optarg, 0, (long long)1 << 53, &n) < 0)
				return ik_usage(USAGE);
			cfg.faults.seed = (uint64_t)n;
			break;
		case O_HANG: cfg.faults.hang = 1; break;
		case O_NRATE:
			if (parse_rate(optarg, &cfg.faults.notify_fail_rate) < 0)
				return ik_usage(USAGE);
			break;
		case O_NFAIL: cfg.faults.notify_fail_rate = 1; break;
		case O_NSTATUS:
			if (ik_opt_int("--notify-fail-status", optarg, 100, 599, &n) < 0)
				return ik_usage(USAGE);
			cfg.faults.notify_fail_status = (int)n;
			break;
		case O_NHANG: cfg.faults.notify_hang = 1; break;
		case O_MAXC:
			if (ik_opt_int("--max-conns", optarg, 1, 100000, &n) < 0)
				return ik_usage(USAGE);
			cfg.max_conns = (unsigned)n;
			break;
		case O_HELP: return ik_help(USAGE, OPTIONS, CODES);
		case O_VERSION: return ik_version();
		default: return ik_usage(USAGE);
		}
	}
	if (optind != argc)
		return ik_usage(USAGE);

	if (!cfg.db_path) {
		if (!(dir = ik_state_dir(1, &e)))
			return ik_fail(&e);
		if (!(db = malloc(strlen(dir) + sizeof "/bank-sim.db"))) {
			free(dir);
			ik_warnx("out of memory");
			return IK_SOFTWARE;
		}
		strcat(strcpy(db, dir), "/bank-sim.db");
		free(dir);
		cfg.db_path = db;
	}

	/* Only this thread takes the stop signals: the server's threads
	 * inherit the blocked mask, and sigsuspend below is woken for sure. */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &block, &old);

	rc = ik_banksim_start(&cfg, &b, &e);
	ik_banksim_faults_free(&cfg.faults);
	if (rc != IK_OK) {
		free(db);
		return ik_fail(&e);
	}
	if (port_file && (rc = write_port_file(port_file, ik_banksim_port(b), &e)) != IK_OK) {
		ik_banksim_stop(b);
		free(db);
		return ik_fail(&e);
	}
	printf("listening %s\n", ik_banksim_url(b));
	if (fflush(stdout) == EOF)
		ik_log(IK_LOG_WARN, "stdout not writable", NULL);
	ik_log(IK_LOG_INFO, "listening", "url", ik_banksim_url(b), "db", cfg.db_path, NULL);

	while (!ik_stop_signal)
		sigsuspend(&old);

	ik_log(IK_LOG_INFO, "stopping", NULL);
	ik_banksim_stop(b);
	if (port_file)
		unlink(port_file);
	free(db);
	/* Asked to stop is how a server ends: that is success. */
	return ik_finish(IK_OK);
}
