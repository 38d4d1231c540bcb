/* idemp-run: run any command at most once at a time, and once to DONE, per
 * key, across hosts (DESIGN.md "Any command once per key").
 *
 * The same claim as a charge's (one conditional write with a lease and a
 * fencing token), then the command in its own process group with
 * IDEMP_KEY, IDEMP_TOKEN and IDEMP_ATTEMPT, then the same fenced finish.
 * While it runs, a heartbeat thread renews the lease about every third of
 * its length (the store port's renew: a conditional write on key and
 * token).  The main thread never touches the store meanwhile: it watches
 * the command, the signals and the clock, so a store call that hangs
 * cannot stop it from killing the command in time.  The lease is measured
 * on the monotonic clock from the moment the last granted claim or renewal
 * was SENT (the store set it no earlier), so our view of its end is never
 * later than the store's.  SIGTERM goes to the group GRACE before that
 * end less a margin, SIGKILL at it: two holders never run at once while
 * idemp-run lives.  A paused or killed idemp-run cannot do this; the
 * command fences its own effects with `idemp-run --check` (idemp-run(1)).
 *
 * A command stopped by us (a lost lease, a signal) or exiting 75 has its
 * claim released: what it did is unknown, so the next run does it again
 * under the same key (at least once in the crash window, as a charge).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli/cli.h"
#include "core/event.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/pool.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

extern char **environ;

static const char usage[] =
	"usage: idemp-run --key KEY [options] -- COMMAND [ARG...]\n"
	"       idemp-run --each [-P N] [options] -- COMMAND [ARG...] < keys\n"
	"       idemp-run --check [--key KEY] [--store URL]\n";
static const char options[] =
	"  -k, --key KEY          the run's key: 1-128 of [A-Za-z0-9._:-]\n"
	"  -f, --fingerprint TEXT what the run means: the same key with another TEXT\n"
	"                         is PAYLOAD_MISMATCH (default: empty)\n"
	"  -l, --lease DUR        the claim's lease, renewed every third of it while\n"
	"                         the command runs (default 120s; $IDEMKIT_LEASE)\n"
	"  -g, --grace DUR        SIGTERM to SIGKILL when the lease cannot be kept\n"
	"                         (default a tenth of the lease, at most 10s)\n"
	"  -w, --wait[=DUR]       a live holder: wait for it to finish, then answer as\n"
	"                         the record says (default 24h)\n"
	"  -F, --on-failure WHAT  a failed command: release (default: a later run\n"
	"                         retries) or record (FAILED, until idemp-forget)\n"
	"  -e, --each             one key per line on stdin; {} in the command and\n"
	"                         --fingerprint is the key; summary on stderr\n"
	"  -P, --jobs N           with --each: N keys at once (default 1, at most 256)\n"
	"  -c, --check            exit 0 if this run's claim still holds KEY, else 13\n"
	"                         (from inside the command: $IDEMP_KEY, $IDEMP_TOKEN)\n"
	"  -S, --store URL        the store (default $IDEMKIT_STORE), one of\n"
	"                         @STORES@\n"
	"  -h, --help             this help\n"
	"  -V, --version          print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "the command ran, exited 0 and DONE was recorded" },
	{ IK_EMPTY, "--each read no key" },
	{ IK_DUP_DONE, "the key is DONE; nothing ran" },
	{ IK_DUP_IN_PROGRESS, "another holder's lease is live; nothing ran" },
	{ IK_DUP_FAILED, "the key is FAILED; nothing ran" },
	{ IK_LEASE_LOST, "the lease could not be kept (the command was\n"
	    "stopped), or another holder took the key" },
	{ IK_PAYLOAD_MISMATCH, "the key was claimed with another fingerprint;\n"
	    "nothing ran" },
	{ IK_RUN_FAILED, "the command failed; its claim was released or\n"
	    "FAILED recorded" },
	{ IK_USAGE, "bad command line" },
	{ IK_DATAERR, "the key breaks the rule" },
	{ IK_SOFTWARE, "internal error" },
	{ IK_TEMPFAIL, "the store is unreachable, or the command exited 75" },
	{ IK_CONFIG, "the store is misconfigured, or the command cannot\n"
	    "be executed" },
	{ -1, NULL },
};

#define WAIT_DEFAULT_MS (24LL * 3600000)
#define FINISH_TRIES 10

struct opts {
	const char *url, *key, *fingerprint;
	int64_t lease_ms, grace_ms, wait_ms;   /* wait_ms < 0: no --wait */
	int64_t retention_ms;
	int record_failure, each, check;
	long long jobs;
	char **cmd;                            /* NULL-terminated */
};

/* ---- signals ------------------------------------------------------------
 * The supervising loop sleeps in poll on a self-pipe: SIGCHLD and the stop
 * signals write to it, the heartbeat too when the lease is lost. */
static int wake_fd[2] = { -1, -1 };
static volatile sig_atomic_t stops;      /* stop signals received */

static void
poke(void)
{
	int e = errno;
	ssize_t n;

	if (wake_fd[1] >= 0)
		n = write(wake_fd[1], "", 1);   /* full pipe: a wake is pending anyway */
	(void)n;
	errno = e;
}

static void
on_stop(int sig)
{
	ik_stop_signal = sig;
	stops++;
	poke();
}

static void
on_chld(int sig)
{
	poke();
}

static int
wake_open(ik_err *err)
{
	struct sigaction sa;

	/* once: an --each worker runs many keys */
	if (wake_fd[0] < 0 && ik_cloexec_pipe(wake_fd, 1) < 0)
		return ik_errf(err, IK_SOFTWARE, "pipe: %s", strerror(errno));
	memset(&sa, 0, sizeof sa);
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_stop;   /* no SA_RESTART, as ik_cli_init */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	return IK_OK;
}

static void
wake_drain(void)
{
	char buf[64];

	while (read(wake_fd[0], buf, sizeof buf) > 0)
		;
}

/* ---- the run's identity ------------------------------------------------- */

/* s with every "{}" replaced by key; NULL when out of memory. */
static char *
subst(const char *s, const char *key)
{
	struct ik_buf b = { 0 };
	const char *p;
	int bad = ik_buf_addstr(&b, "");

	while (key && (p = strstr(s, "{}"))) {
		bad |= ik_buf_add(&b, s, (size_t)(p - s));
		bad |= ik_buf_addstr(&b, key);
		s = p + 2;
	}
	bad |= ik_buf_addstr(&b, s);
	if (bad) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

static void
free_argv(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

/* The command for key (--each: {} replaced), NULL when out of memory. */
static char **
command_for(char **cmd, const char *key)
{
	size_t n = 0;
	char **v;

	while (cmd[n])
		n++;
	if (!(v = calloc(n + 1, sizeof *v)))
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!(v[i] = subst(cmd[i], key))) {
			free_argv(v);
			return NULL;
		}
	return v;
}

/* The fingerprint: SHA-256 of "idemp-run|" TEXT, hex; no --fingerprint is
 * the empty TEXT.  The prefix keeps a run's key from matching a charge's
 * record (that is PAYLOAD_MISMATCH, never a run). */
static void
fingerprint_of(const char *text, char out[65])
{
	crypto_hash_sha256_state st;
	unsigned char h[crypto_hash_sha256_BYTES];

	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, (const unsigned char *)"idemp-run|", 10);
	if (text)
		crypto_hash_sha256_update(&st, (const unsigned char *)text, strlen(text));
	crypto_hash_sha256_final(&st, h);
	ik_hex(h, sizeof h, out);
}

/* The record's event: {"idempRun":{"key":K,"fingerprint":TEXT|null,
 * "command":[ARG...]}} (idemkit(7)); NULL when out of memory. */
static char *
event_for(const char *key, const char *fp, char **argv)
{
	cJSON *o = cJSON_CreateObject(), *r = cJSON_AddObjectToObject(o, "idempRun"), *a;
	char *s = NULL;

	if (r && cJSON_AddStringToObject(r, "key", key) &&
	    (fp ? cJSON_AddStringToObject(r, "fingerprint", fp) :
	     cJSON_AddNullToObject(r, "fingerprint")) &&
	    (a = cJSON_AddArrayToObject(r, "command"))) {
		for (size_t i = 0; argv[i]; i++)
			cJSON_AddItemToArray(a, cJSON_CreateString(argv[i]));
		s = cJSON_PrintUnformatted(o);
	}
	cJSON_Delete(o);
	return s;
}

/* environ with IDEMP_KEY, IDEMP_TOKEN, IDEMP_ATTEMPT (and IDEMKIT_STORE
 * when --store named one, so the command's own --check asks the same
 * store) set to ours, every entry a copy (free_argv); built before fork,
 * since the child may only exec.  NULL when out of memory. */
static char **
child_env(const char *key, const char *token, int64_t attempt, const char *url)
{
	static const char *const ours[] = { "IDEMP_KEY=", "IDEMP_TOKEN=", "IDEMP_ATTEMPT=",
	                                    "IDEMKIT_STORE=" };
	char num[24], **env;
	const char *vals[4];
	size_t n = 0, k = 0, j;

	snprintf(num, sizeof num, "%lld", (long long)attempt);
	vals[0] = key, vals[1] = token, vals[2] = num, vals[3] = url;
	while (environ[n])
		n++;
	if (!(env = calloc(n + 5, sizeof *env)))
		return NULL;
	for (size_t i = 0; i < n; i++) {
		for (j = 0; j < 4; j++)
			if (vals[j] && strncmp(environ[i], ours[j], strlen(ours[j])) == 0)
				break;
		if (j == 4 && !(env[k++] = strdup(environ[i])))
			goto nomem;
	}
	for (j = 0; j < 4; j++) {
		struct ik_buf b = { 0 };
		if (!vals[j])
			continue;
		if (ik_buf_addstr(&b, ours[j]) < 0 || ik_buf_addstr(&b, vals[j]) < 0) {
			free(b.p);
			goto nomem;
		}
		env[k++] = b.p;
	}
	return env;
nomem:
	free_argv(env);
	return NULL;
}

/* ---- the heartbeat ------------------------------------------------------ */

struct hb {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct ik_store *s;
	const char *key, *token;
	int64_t lease_ms;
	/* under mu */
	int stop, lost;
	int64_t ok_sent;      /* monotonic ms the last granted claim or renewal was sent */
	int64_t renewals;
};

static void
mono_deadline(int64_t ms, struct timespec *ts)
{
	ts->tv_sec = (time_t)(ms / 1000);
	ts->tv_nsec = (long)(ms % 1000) * 1000000L;
}

/* Renews every third of the lease; after a failure, again every twelfth
 * (at least 50 ms) until one succeeds or the main thread gives up on the
 * command.  Ends on stop or on a refusal (another holder). */
static void *
heartbeat(void *arg)
{
	struct hb *h = arg;
	int64_t every = h->lease_ms / 3, retry = h->lease_ms / 12 < 50 ? 50 : h->lease_ms / 12;
	int64_t next, sent, wall, failing = 0;
	struct timespec ts;
	ik_err err;
	int rc;

	pthread_mutex_lock(&h->mu);
	next = h->ok_sent + every;
	while (!h->stop) {
		if (ik_mono_ms() < next) {
			mono_deadline(next, &ts);
			pthread_cond_timedwait(&h->cv, &h->mu, &ts);
			continue;
		}
		pthread_mutex_unlock(&h->mu);
		memset(&err, 0, sizeof err);
		sent = ik_mono_ms();
		wall = ik_now_ms();
		rc = h->s->ops->renew(h->s, h->key, h->token, wall, h->lease_ms, &err);
		/* sentAt + lease is no later than the lease the store wrote */
		if (rc == IK_OK)
			ik_log(IK_LOG_DEBUG, "lease renewed", "key", h->key, IK_LOG_NUM("sentAt", wall),
			    IK_LOG_NUM("leaseMs", h->lease_ms), NULL);
		if (rc == IK_OK && failing)
			ik_log(IK_LOG_INFO, "lease renewed again", "key", h->key,
			    IK_LOG_NUM("failedRenewals", failing), NULL);
		else if (rc != IK_OK && rc != IK_LEASE_LOST && !failing)
			ik_log(IK_LOG_WARN, "lease renewal failed; retrying", "key", h->key,
			    "error", err.msg, NULL);
		pthread_mutex_lock(&h->mu);
		if (rc == IK_LEASE_LOST) {
			h->lost = 1;
			break;
		}
		if (rc == IK_OK) {
			h->ok_sent = sent;
			h->renewals++;
			next = sent + every;
			failing = 0;
		} else {
			failing++;
			next = ik_mono_ms() + retry;
		}
	}
	pthread_mutex_unlock(&h->mu);
	poke();
	return NULL;
}

/* ---- one run ------------------------------------------------------------ */

struct run {
	const struct opts *o;
	struct ik_store *s;
	const char *key;
	char fp[65];
	char token[IK_TOKEN_HEX];
	int64_t attempt, claim_sent, claim_wall;   /* when the claim was sent */
	char **argv;
	pid_t pid;
	int status;               /* waitpid's */
	int64_t started, ended;   /* monotonic ms */
	int lost, stopped_us;     /* the lease was refused; we signalled the command */
	int64_t renewals;
};

/* The claim, waiting with --wait while a live holder has the key: IK_OK
 * with res filled, or an error; a stop signal while waiting is
 * DUP_IN_PROGRESS (nothing was claimed). */
static int
claim(struct run *r, char *event, struct ik_claim_res *res, ik_err *err)
{
	const struct opts *o = r->o;
	int64_t until = ik_mono_ms() + (o->wait_ms > 0 ? o->wait_ms : 0), d, left;
	int rc;

	for (int64_t n = 0;; n++) {   /* bounded by --wait's end */
		struct ik_claim_req req = {
			.key = r->key, .fingerprint = r->fp, .event = event, .token = r->token,
			.now_ms = ik_now_ms(), .lease_ms = o->lease_ms,
		};
		req.expires_at = (req.now_ms + o->retention_ms) / 1000;
		r->claim_sent = ik_mono_ms();
		r->claim_wall = req.now_ms;
		if ((rc = r->s->ops->claim(r->s, &req, res, err)) != IK_OK)
			return rc;
		if (res->code != IK_DUP_IN_PROGRESS || o->wait_ms < 0)
			return IK_OK;
		left = until - ik_mono_ms();
		if (left <= 0)
			return IK_OK;
		if (n == 0)
			ik_log(IK_LOG_INFO, "waiting for the holder", "key", r->key,
			    IK_LOG_NUM("waitMs", left), NULL);
		ik_record_free(&res->cur);
		/* half fixed, half jitter: never a tight loop of claims */
		d = ik_backoff_ceil(100, 2000, n) / 2 + ik_backoff_jitter(100, 2000, n) / 2;
		if (ik_sleep_ms(d < left ? d : left) < 0) {
			res->code = IK_DUP_IN_PROGRESS;
			return IK_OK;
		}
	}
}

/* Starts the command in its own process group; IK_OK, or IK_CONFIG when it
 * cannot be executed (it never ran). */
static int
spawn(struct run *r, char **env, int quiet_stdin, ik_err *err)
{
	sigset_t all, old;
	int ep[2], e = 0;
	ssize_t n;
	pid_t p;

	if (ik_cloexec_pipe(ep, 0) < 0)
		return ik_errf(err, IK_SOFTWARE, "pipe: %s", strerror(errno));
	/* No handler of ours may run in the child before it resets them. */
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	p = fork();
	if (p == 0) {
		int fd;
		setpgid(0, 0);
		signal(SIGPIPE, SIG_DFL);   /* ignored signals stay ignored across exec */
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGCHLD, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		if (quiet_stdin && (fd = open("/dev/null", O_RDONLY)) >= 0) {
			dup2(fd, STDIN_FILENO);
			close(fd);
		}
		environ = env;
		execvp(r->argv[0], r->argv);
		e = errno;
		n = write(ep[1], &e, sizeof e);
		_exit(127);
	}
	if (p > 0)
		setpgid(p, p);   /* either side may run first; after exec it fails: fine */
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(ep[1]);
	if (p < 0) {
		close(ep[0]);
		return ik_errf(err, IK_TEMPFAIL, "fork: %s", strerror(errno));
	}
	r->started = ik_mono_ms();
	while ((n = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR)
		;
	close(ep[0]);
	if (n == (ssize_t)sizeof e) {
		while (waitpid(p, NULL, 0) < 0 && errno == EINTR)
			;
		return ik_errf(err, IK_CONFIG, "%.200s: %s", r->argv[0], strerror(e));
	}
	r->pid = p;
	return IK_OK;
}

/* Watches the command until it ends: forwards stop signals to its group,
 * and when the lease is refused or cannot be proved kept, sends SIGTERM,
 * then SIGKILL before the lease ends.  The margin covers the reaping and,
 * on stores that run the lease on the workers' clocks, their skew. */
static void
supervise(struct run *r, struct hb *h)
{
	int64_t lease = r->o->lease_ms, grace = r->o->grace_ms, now, ok, kill_by, kill_at = 0;
	int64_t margin = lease / 10 > 5000 ? 5000 : lease / 10;
	sig_atomic_t forwarded = 0;   /* the ones before we ran were never passed on */
	int term_sent = 0, kill_sent = 0, lost, t;
	struct pollfd pfd = { .fd = wake_fd[0], .events = POLLIN };

	for (;;) {   /* ends when the command does; it is killed by the lease's end */
		if (waitpid(r->pid, &r->status, WNOHANG) == r->pid)
			break;
		now = ik_mono_ms();
		pthread_mutex_lock(&h->mu);
		ok = h->ok_sent;
		lost = h->lost;
		pthread_mutex_unlock(&h->mu);
		kill_by = ok + lease - margin;
		if (!term_sent && (lost || now >= kill_by - grace)) {
			ik_log(IK_LOG_ERROR, lost ? "lease taken by another holder or released: stopping the command"
			    : "no lease renewal succeeded in time: stopping the command",
			    "key", r->key, IK_LOG_NUM("pid", r->pid), NULL);
			kill(-r->pid, SIGTERM);
			term_sent = r->stopped_us = 1;
			kill_at = lost || kill_by < now + grace ? now + grace : kill_by;
			if (!lost && kill_at > kill_by)
				kill_at = kill_by;
		}
		if (term_sent && !kill_sent && now >= kill_at) {
			kill(-r->pid, SIGKILL);
			kill_sent = 1;
		}
		if (stops != forwarded) {
			forwarded = stops;
			kill(-r->pid, ik_stop_signal);
			r->stopped_us = 1;
		}
		t = !term_sent ? (int)(kill_by - grace - now) : !kill_sent ? (int)(kill_at - now) : 1000;
		if (t > 1000)
			t = 1000;
		if (t < 0)
			t = 0;
		poll(&pfd, 1, t);
		wake_drain();
	}
	r->ended = ik_mono_ms();
	/* What the leader left in its group had its SIGTERM, or the stop
	 * passed on: no more time.  The claim is given up next (released, or
	 * lost), so nothing of this run may outlive it: the next run of the
	 * key would meet it. */
	if ((term_sent || forwarded) && !kill_sent)
		kill(-r->pid, SIGKILL);
}

/* The fenced finish, retried while the store is unreachable for up to a
 * lease (the record is still ours unless another claim took it). */
static int
finish(struct run *r, enum ik_state st, const char *ref, const char *why, ik_err *err)
{
	int64_t until = ik_mono_ms() + r->o->lease_ms;
	int rc = IK_TEMPFAIL;

	for (int n = 0; n < FINISH_TRIES; n++) {
		struct ik_finish_req req = { .key = r->key, .token = r->token, .state = st,
		    .debit_ref = ref, .last_error = why, .now_ms = ik_now_ms() };
		memset(err, 0, sizeof *err);
		rc = r->s->ops->finish(r->s, &req, err);
		if (rc != IK_TEMPFAIL || ik_mono_ms() >= until)
			break;
		if (ik_sleep_ms(ik_backoff_jitter(100, 2000, n)) < 0 && n > 2)
			break;
	}
	return rc;
}

/* Ends our lease now so a later run need not wait for it; a failure only
 * costs that wait. */
static void
release(struct run *r)
{
	ik_err err = { 0 };
	int rc = r->s->ops->release(r->s, r->key, r->token, ik_now_ms(), &err);

	if (rc != IK_OK && rc != IK_LEASE_LOST)
		ik_log(IK_LOG_WARN, "claim not released; it ends with its lease", "key", r->key,
		    "error", err.msg, NULL);
}

/* What the command did, as the record and the log say it: the exit
 * status or signal, the duration and the renewals. */
static void
describe(const struct run *r, char ref[128], char why[96])
{
	int sig = WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0;
	int code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;

	snprintf(ref, 128, "%s=%d durationMs=%lld renewals=%lld", sig ? "signal" : "exit",
	    sig ? sig : code, (long long)(r->ended - r->started), (long long)r->renewals);
	if (sig)
		snprintf(why, 96, "the command was killed by signal %d", sig);
	else
		snprintf(why, 96, "the command exited %d", code);
}

/* After the command ended: the record and the exit code. */
static int
conclude(struct run *r)
{
	char ref[128], why[96];
	ik_err err = { 0 };
	int rc, exited0, exited75;

	describe(r, ref, why);
	exited0 = WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0;
	exited75 = WIFEXITED(r->status) && WEXITSTATUS(r->status) == IK_TEMPFAIL;
	if (r->lost) {
		ik_log(IK_LOG_ERROR, "lease lost: another holder has the key; nothing recorded",
		    "key", r->key, "result", ref, NULL);
		return IK_LEASE_LOST;
	}
	if (r->stopped_us) {
		/* Whatever it answered, it was stopped: its work is unknown. */
		release(r);
		ik_log(IK_LOG_WARN, "command stopped; claim released", "key", r->key,
		    "result", ref, NULL);
		return ik_stop_signal && stops ? 128 + ik_stop_signal : IK_LEASE_LOST;
	}
	if (exited0) {
		rc = finish(r, IK_ST_DONE, ref, NULL, &err);
		if (rc == IK_OK)
			ik_log(IK_LOG_INFO, "ran", "key", r->key, "outcome", "DONE", "result", ref,
			    IK_LOG_NUM("attempt", r->attempt), NULL);
		else if (rc == IK_LEASE_LOST)
			ik_log(IK_LOG_ERROR, "the command succeeded but another holder has the key: "
			    "DONE not recorded", "key", r->key, "result", ref, NULL);
		else
			ik_log(IK_LOG_ERROR, "the command succeeded but DONE could not be recorded; "
			    "the next run after the lease runs it again", "key", r->key,
			    "result", ref, "error", err.msg, NULL);
		return rc;
	}
	if (exited75 || !r->o->record_failure) {
		release(r);
		ik_log(IK_LOG_WARN, "command failed; claim released for a later run", "key", r->key,
		    "result", ref, NULL);
		return exited75 ? IK_TEMPFAIL : IK_RUN_FAILED;
	}
	rc = finish(r, IK_ST_FAILED, ref, why, &err);
	if (rc == IK_OK) {
		ik_log(IK_LOG_WARN, "command failed; recorded FAILED", "key", r->key, "result", ref,
		    NULL);
		return IK_RUN_FAILED;
	}
	ik_log(IK_LOG_ERROR, "command failed; FAILED not recorded", "key", r->key, "result", ref,
	    "error", err.msg, NULL);
	return rc;
}

/* Runs the command under the claim: spawn, heartbeat, supervise, record. */
static int
hold_and_run(struct run *r, int quiet_stdin)
{
	struct hb h = { .s = r->s, .key = r->key, .token = r->token,
	                .lease_ms = r->o->lease_ms, .ok_sent = r->claim_sent };
	pthread_condattr_t ca;
	pthread_t th;
	sigset_t all, old;
	ik_err err = { 0 };
	char **env;
	int rc;

	if (!(env = child_env(r->key, r->token, r->attempt, r->o->url)))
		rc = ik_errf(&err, IK_SOFTWARE, "out of memory");
	else
		rc = spawn(r, env, quiet_stdin, &err);
	free_argv(env);
	if (rc != IK_OK) {
		release(r);
		return ik_fail(&err);
	}
	pthread_mutex_init(&h.mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h.cv, &ca);
	pthread_condattr_destroy(&ca);
	/* The signals are the main thread's. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&th, NULL, heartbeat, &h);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		/* Without renewals the lease cannot be kept: stop at once. */
		ik_warnx("heartbeat thread: %s", strerror(rc));
		h.lost = 1;
	}
	supervise(r, &h);
	if (rc == 0) {
		pthread_mutex_lock(&h.mu);
		h.stop = 1;
		pthread_cond_signal(&h.cv);
		pthread_mutex_unlock(&h.mu);
		pthread_join(th, NULL);
		r->lost = h.lost;
	} else {
		r->stopped_us = 1;
	}
	r->renewals = h.renewals;
	pthread_cond_destroy(&h.cv);
	pthread_mutex_destroy(&h.mu);
	return conclude(r);
}

/* One key: claim, run, finish.  The exit code.  keep (--each): the
 * store of the worker's last key, used if there is one, and kept for its
 * next when this key went well (else closed: the next opens afresh). */
static int
run_one(const struct opts *o, const char *key, int quiet_stdin, struct ik_store **keep)
{
	struct run r = { .o = o, .key = key, .s = keep ? *keep : NULL };
	struct ik_claim_res res = { 0 };
	ik_err err = { 0 };
	char *fptext = NULL, *event = NULL;
	int rc;

	if (ik_id_check("key", key, IK_CHARGE_ID_MAX, &err) != IK_OK)
		return ik_fail(&err);
	if (wake_open(&err) != IK_OK)
		return ik_fail(&err);
	if (!(r.argv = command_for(o->cmd, o->each ? key : NULL)) ||
	    (o->fingerprint && !(fptext = subst(o->fingerprint, o->each ? key : NULL))) ||
	    !(event = event_for(key, fptext, r.argv))) {
		rc = ik_errf(&err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	fingerprint_of(fptext, r.fp);
	ik_store_token(r.token);
	if (!r.s && (rc = ik_store_open(o->url, &r.s, &err)) != IK_OK)
		goto out;
	if ((rc = claim(&r, event, &res, &err)) != IK_OK)
		goto out;
	if (res.code != IK_OK) {
		rc = res.code;
		ik_record_free(&res.cur);
		if (ik_stop_signal) {   /* stopped while waiting (--wait) */
			rc = 128 + ik_stop_signal;
			goto out;
		}
		ik_log(IK_LOG_INFO, "not run", "key", key, "outcome", ik_code_name(rc),
		    IK_LOG_NUM(rc == IK_DUP_IN_PROGRESS ? "holderLeaseUntil" : NULL,
		    res.lease_until), NULL);
		goto out;
	}
	r.attempt = res.attempt;
	ik_log(IK_LOG_DEBUG, "claimed", "key", key, IK_LOG_NUM("attempt", r.attempt),
	    IK_LOG_NUM("sentAt", r.claim_wall), IK_LOG_NUM("leaseMs", o->lease_ms), NULL);
	if (ik_stop_signal) {   /* asked to stop while the claim was on its way */
		release(&r);
		rc = 128 + ik_stop_signal;
		goto out;
	}
	rc = hold_and_run(&r, quiet_stdin);
out:
	if (err.code && rc == err.code)
		ik_fail(&err);
	if (keep && (rc == IK_OK || rc == IK_DUP_DONE || rc == IK_DUP_IN_PROGRESS)) {
		*keep = r.s;
	} else {
		ik_store_close(r.s);
		if (keep)
			*keep = NULL;
	}
	free_argv(r.argv);
	free(fptext);
	free(event);
	return rc;
}

/* ---- --each ------------------------------------------------------------- */

struct tally {
	long long keys, ran, done, held, failed;
	int worst;     /* the largest code other than OK and DUP_DONE */
};

static void
count(struct tally *t, int code)
{
	t->keys++;
	if (code == IK_OK)
		t->ran++;
	else if (code == IK_DUP_DONE)
		t->done++;
	else if (code == IK_DUP_IN_PROGRESS)
		t->held++;
	else
		t->failed++;
	if (code != IK_OK && code != IK_DUP_DONE && code > t->worst)
		t->worst = code;
}

/* The keys go to at most -P workers (pool.h), each a process that keeps
 * its store's connection from key to key. */
struct each {
	const struct opts *o;
	struct ik_store *s;    /* in a worker: its kept store */
	struct tally t;        /* in the parent */
};

static int
each_work(void *arg, char *key)
{
	struct each *e = arg;

	return run_one(e->o, key, 1, &e->s);
}

static void
each_end(void *arg)
{
	ik_store_close(((struct each *)arg)->s);
}

static void
each_done(void *arg, int code)
{
	count(&((struct each *)arg)->t, code);
}

static int
each(const struct opts *o)
{
	struct each e = { .o = o };
	struct ik_pool pool = { .work = each_work, .end = each_end, .done = each_done, .arg = &e };
	struct tally *t = &e.t;
	struct ik_lines in;
	char *line;
	size_t len;
	int r;
	ik_err err = { 0 };

	if (ik_pool_init(&pool, o->jobs) < 0) {
		ik_errf(&err, IK_SOFTWARE, "out of memory");
		return ik_fail(&err);
	}
	ik_lines_init(&in, STDIN_FILENO);
	while (!ik_stop_signal && (r = ik_lines_next(&in, &line, &len)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			ik_warnx("stdin: %s", strerror(errno));
			count(t, IK_SOFTWARE);
			break;
		}
		if (!len)
			continue;
		if (ik_id_check("key", line, IK_CHARGE_ID_MAX, &err) != IK_OK) {
			ik_fail(&err);
			count(t, IK_DATAERR);
			continue;
		}
		if ((r = ik_pool_give(&pool, line)) < 0)
			break;   /* a stop signal */
		if (r != IK_OK) {
			ik_warnx("starting a worker: %s", strerror(errno));
			count(t, r);
		}
	}
	ik_pool_end(&pool);
	ik_lines_free(&in);
	ik_log(IK_LOG_AUDIT, "each: summary", IK_LOG_NUM("keys", t->keys),
	    IK_LOG_NUM("ran", t->ran), IK_LOG_NUM("alreadyDone", t->done),
	    IK_LOG_NUM("heldElsewhere", t->held), IK_LOG_NUM("failed", t->failed), NULL);
	if (ik_stop_signal)
		return 128 + ik_stop_signal;
	if (!t->keys)
		return IK_EMPTY;
	return t->worst;
}

/* ---- --check ------------------------------------------------------------ */

/* Whether token still owns key: the fencing a finish uses (owner and
 * IN_PROGRESS), read consistently.  The lease's time is not compared: on
 * postgres and redis it runs on the server's clock, and an owner whose
 * lease ran out still owns the key until another claim takes it. */
static int
check(const struct opts *o)
{
	const char *key = o->key ? o->key : getenv("IDEMP_KEY");
	/* the token is a capability: from the environment only, never argv */
	const char *token = getenv("IDEMP_TOKEN");
	struct ik_record rec = { 0 };
	struct ik_store *s;
	ik_err err = { 0 };
	int rc;

	if (!key || !*key || !token || !*token) {
		ik_warnx("--check: no key or token (--key or $IDEMP_KEY, and $IDEMP_TOKEN)");
		return ik_usage(usage);
	}
	if (ik_id_check("key", key, IK_CHARGE_ID_MAX, &err) != IK_OK)
		return ik_fail(&err);
	if ((rc = ik_store_open(o->url, &s, &err)) != IK_OK)
		return ik_fail(&err);
	rc = s->ops->get(s, key, &rec, &err);
	ik_store_close(s);
	if (rc != IK_OK && rc != IK_EMPTY)
		return ik_fail(&err);
	if (rc == IK_OK && rec.state == IK_ST_IN_PROGRESS && rec.owner &&
	    strcmp(rec.owner, token) == 0) {
		ik_record_free(&rec);
		return IK_OK;
	}
	ik_warnk(key, "this token no longer holds the key (%s)",
		    rc == IK_EMPTY ? "no record" : ik_state_name(rec.state));
	ik_record_free(&rec);
	return IK_LEASE_LOST;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "key", required_argument, NULL, 'k' },
		{ "fingerprint", required_argument, NULL, 'f' },
		{ "lease", required_argument, NULL, 'l' },
		{ "grace", required_argument, NULL, 'g' },
		{ "wait", optional_argument, NULL, 'w' },
		{ "on-failure", required_argument, NULL, 'F' },
		{ "each", no_argument, NULL, 'e' },
		{ "jobs", required_argument, NULL, 'P' },
		{ "check", no_argument, NULL, 'c' },
		{ "store", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .wait_ms = -1, .grace_ms = -1, .jobs = 1 };
	const char *lease = NULL, *grace = NULL, *jobs = NULL;
	ik_err err = { 0 };
	int ch, rc;

	ik_cli_init(argv[0]);
	/* '+': the command's own options are not ours */
	while ((ch = getopt_long(argc, argv, "+k:f:l:g:w::F:eP:cS:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'k': o.key = optarg; break;
		case 'f': o.fingerprint = optarg; break;
		case 'l': lease = optarg; break;
		case 'g': grace = optarg; break;
		case 'w':
			o.wait_ms = WAIT_DEFAULT_MS;
			if (optarg && ik_opt_duration("--wait", optarg, 0, INT64_MAX, &o.wait_ms) < 0)
				return IK_USAGE;
			break;
		case 'F':
			if (strcmp(optarg, "record") == 0)
				o.record_failure = 1;
			else if (strcmp(optarg, "release") != 0)
				return ik_usage(usage);
			break;
		case 'e': o.each = 1; break;
		case 'P': jobs = optarg; break;
		case 'c': o.check = 1; break;
		case 'S': o.url = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (o.check) {
		if (optind != argc || o.each)
			return ik_usage(usage);
		return ik_finish(check(&o));
	}
	if (optind >= argc || !!o.key == o.each || (jobs && !o.each))
		return ik_usage(usage);
	o.cmd = argv + optind;
	/* the same bounds and the same retention rule as idemp-claim's */
	if ((rc = ik_store_lease(lease, &o.lease_ms)) != IK_OK)
		return rc;
	if (ik_store_retention(o.lease_ms, &o.retention_ms, &err) != IK_OK)
		return ik_fail(&err);
	o.grace_ms = o.lease_ms / 10 > 10000 ? 10000 : o.lease_ms / 10;
	if (grace && ik_opt_duration("--grace", grace, 0, o.lease_ms / 2, &o.grace_ms) < 0)
		return IK_USAGE;
	if (jobs && ik_opt_int("--jobs", jobs, 1, IK_POOL_MAX, &o.jobs) < 0)
		return IK_USAGE;
	if (sodium_init() < 0) {
		ik_warnx("libsodium could not start");
		return IK_SOFTWARE;
	}
	return ik_finish(o.each ? each(&o) : run_one(&o, o.key, 0, NULL));
}
