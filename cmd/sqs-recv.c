/* sqs-recv: receive messages from the queue, one envelope per line.
 *
 * Nothing received is lost: a message is only ever received (and so made
 * invisible) by this process when it is then written out; one that could
 * not be written (stdout closed) is made visible again at once.  A signal
 * ends a long poll early where the backend allows (SQLite) and otherwise
 * when the poll returns; what it brought is written out, then the exit
 * status is 128+signal.
 *
 * With --window N --acked FILE (what charge-worker --stream uses) it holds
 * at most N messages that FILE, the growing output of the pipeline's
 * sqs-ack, has not yet accounted for: a slow bank then slows the receiver
 * instead of piling claimed messages up in the pipes, where their
 * visibility timeouts and leases would run out.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "envelope.h"
#include "log.h"
#include "outcome.h"
#include "queue.h"
#include "util.h"

static const char usage[] =
	"usage: sqs-recv [--queue URL] [--max N] [--wait SECS] [--visibility SECS]\n"
	"                [--follow | --drain] [--window N --acked FILE]\n";
static const char options[] =
	"  -q, --queue URL        sqlite:PATH#NAME or an SQS queue URL (default $IDEMKIT_QUEUE,\n"
	"                         else sqlite:$IDEMKIT_STATE_DIR/queue.db#charges)\n"
	"  -n, --max N            at most N messages per receive, 1..10 (default 1)\n"
	"  -w, --wait SECS        long-poll up to SECS, 0..20 (default 0; 20 with --follow)\n"
	"  -v, --visibility SECS  keep received messages invisible for SECS, 0..43200\n"
	"                         (default: the queue's own visibility timeout)\n"
	"  -f, --follow           keep receiving until a signal\n"
	"  -d, --drain            keep receiving until a receive brings nothing\n"
	"  -W, --window N         hold at most N messages not yet acked (with --acked)\n"
	"  -a, --acked FILE       the pipeline's sqs-ack output: one line per message done\n"
	"  -h, --help             this help\n"
	"  -V, --version          print the version\n";
static const int codes[] = { 0, 1, 64, 70, 75, 78, -1 };

static cJSON *
envelope(const struct ik_queue *q, const struct ik_qmsg *m)
{
	cJSON *env = ik_env_new(m->body), *a;

	if (!env ||
	    !cJSON_AddStringToObject(env, "queue", q->url) ||
	    !cJSON_AddStringToObject(env, "messageId", m->message_id) ||
	    !cJSON_AddStringToObject(env, "receipt", m->receipt) ||
	    !cJSON_AddNumberToObject(env, "receiveCount", (double)m->receive_count) ||
	    !cJSON_AddNumberToObject(env, "sentAt", (double)m->sent_at))
		goto fail;
	if (m->nattrs) {
		if (!(a = cJSON_AddObjectToObject(env, "attributes")))
			goto fail;
		for (size_t i = 0; i < m->nattrs; i++)
			if (!cJSON_AddStringToObject(a, m->attrs[i].name, m->attrs[i].value))
				goto fail;
	}
	return env;
fail:
	cJSON_Delete(env);
	return NULL;
}

/* Write msgs[0..n) out; from the first one that could not be written on,
 * make them visible again.  0 or -1. */
static int
emit(struct ik_queue *q, struct ik_qmsg *msgs, size_t n)
{
	size_t i;
	int rc = 0;

	for (i = 0; i < n; i++) {
		cJSON *env = envelope(q, &msgs[i]);
		int w = env ? ik_env_write(stdout, env) : -1;
		cJSON_Delete(env);
		if (w < 0 || fflush(stdout) == EOF) {
			ik_warnx("stdout: cannot write the envelope; returning %zu message(s) "
			         "to the queue", n - i);
			rc = -1;
			break;
		}
		ik_log(IK_LOG_DEBUG, "received", "step", "recv", "messageId", msgs[i].message_id,
		       NULL);
	}
	for (; i < n; i++) {
		ik_err err = { 0 };
		if (q->ops->change_visibility(q, msgs[i].receipt, 0, &err) != IK_OK)
			ik_warnx("%s", err.msg);
	}
	return rc;
}

static void
pause_ms(int64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* The --window / --acked flow control: lines counted in a growing file. */
struct window {
	int fd;
	long size;
	long held;        /* received and written, not yet seen in the file */
};

static void
count_acked(struct window *w)
{
	char buf[8192];
	ssize_t n;

	while ((n = read(w->fd, buf, sizeof buf)) > 0)
		for (ssize_t i = 0; i < n; i++)
			w->held -= buf[i] == '\n';
	if (w->held < 0)
		w->held = 0;
}

/* Waits until max more messages fit in the window.  0, or -1 when a
 * signal came or the reader of stdout went away (nothing more can be
 * delivered, so nothing more may be received). */
static int
wait_window(struct window *w, int max)
{
	for (;;) {
		struct pollfd out = { .fd = STDOUT_FILENO, .events = 0 };

		count_acked(w);
		if (w->held + max <= w->size)
			return 0;
		if (ik_stop_signal)
			return -1;
		if (poll(&out, 1, 0) > 0 && (out.revents & (POLLERR | POLLHUP)))
			return -1;
		pause_ms(5);
	}
}

static int
opt_int(const char *name, const char *v, long long min, long long max, int *out)
{
	long long n;

	if (ik_parse_int(v, min, max, &n) < 0) {
		ik_warnx("--%s: \"%s\" is not an integer in %lld..%lld", name, v, min, max);
		return -1;
	}
	*out = (int)n;
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "queue", required_argument, NULL, 'q' },
		{ "max", required_argument, NULL, 'n' },
		{ "wait", required_argument, NULL, 'w' },
		{ "visibility", required_argument, NULL, 'v' },
		{ "follow", no_argument, NULL, 'f' },
		{ "drain", no_argument, NULL, 'd' },
		{ "window", required_argument, NULL, 'W' },
		{ "acked", required_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_qmsg msgs[IK_QUEUE_BATCH];
	struct ik_queue *q = NULL;
	const char *url = NULL;
	int max = 1, wait = -1, vis = -1, follow = 0, drain = 0, got = 0, ch, rc;
	int64_t backoff = 0;
	struct window win = { .fd = -1 };
	const char *acked = NULL;
	int size = 0;
	ik_err err = { 0 };

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:n:w:v:fdW:a:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': url = optarg; break;
		case 'n': if (opt_int("max", optarg, 1, IK_QUEUE_BATCH, &max) < 0) return IK_USAGE; break;
		case 'w': if (opt_int("wait", optarg, 0, IK_QUEUE_MAX_WAIT, &wait) < 0) return IK_USAGE; break;
		case 'v': if (opt_int("visibility", optarg, 0, IK_QUEUE_MAX_VISIBILITY, &vis) < 0) return IK_USAGE; break;
		case 'f': follow = 1; break;
		case 'd': drain = 1; break;
		case 'W': if (opt_int("window", optarg, 1, 100000, &size) < 0) return IK_USAGE; break;
		case 'a': acked = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || (follow && drain) || !size != !acked)
		return ik_usage(usage);
	if (acked) {
		if ((win.fd = open(acked, O_RDONLY | O_CLOEXEC)) < 0) {
			ik_warnx("--acked %s: %s", acked, strerror(errno));
			return IK_USAGE;
		}
		win.size = size < max ? max : size;
	}
	if (wait < 0)
		wait = follow ? IK_QUEUE_MAX_WAIT : 0;

	if ((rc = ik_queue_open(url, &q, &err)) != IK_OK)
		return ik_fail(&err);
	q->stop = &ik_stop_signal;
	for (;;) {
		size_t n = 0;

		if (win.fd >= 0 && wait_window(&win, max) < 0)
			break;
		rc = q->ops->receive(q, max, wait, vis, msgs, &n, &err);
		if (rc == IK_OK) {
			backoff = 0;
			got += n > 0;
			win.held += (long)n;
			int w = emit(q, msgs, n);
			for (size_t i = 0; i < n; i++)
				ik_qmsg_free(&msgs[i]);
			if (w < 0) {
				rc = IK_SOFTWARE;
				break;
			}
		} else if (follow && rc == IK_TEMPFAIL && !ik_stop_signal) {
			/* a consumer outlives a network blip; aws.h already retried */
			ik_log(IK_LOG_WARN, "receive failed; retrying", "step", "recv",
			       "error", err.msg, NULL);
			backoff = backoff ? (backoff * 2 > 30000 ? 30000 : backoff * 2) : 1000;
			pause_ms(backoff);
			continue;
		} else {
			ik_fail(&err);
			break;
		}
		if (ik_stop_signal || !(follow || (drain && n > 0)))
			break;
	}
	ik_queue_close(q);
	if (win.fd >= 0)
		close(win.fd);
	if (ik_stop_signal)
		return ik_finish(128 + ik_stop_signal);
	if (rc == IK_OK && !got)
		rc = IK_EMPTY;
	return ik_finish(rc);
}
