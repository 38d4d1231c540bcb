/* sqs-recv: receive messages from the queue, one envelope per line.
 *
 * Nothing received is lost: a message is only ever received (and so made
 * invisible) by this process when it is then written out; one that could
 * not be written (stdout closed) is made visible again at once.  A signal
 * ends a long poll early where the backend allows (SQLite) and otherwise
 * when the poll returns; what it brought is written out, then the exit
 * status is 128+signal.
 *
 * With --acked FILE (the growing output of the pipeline's sqs-ack, one
 * envelope per message finished) it knows what it handed out and has not
 * seen finished yet -- in flight, by receipt, with the time it was received
 * -- and which copies sqs-ack left and when they are visible again (by
 * messageId, from ack.visibility).  From that:
 *  - --window N: at most N in flight, and --max-age DUR: none older than
 *    DUR.  A slow bank then slows the receiver instead of piling claimed
 *    messages up in the pipes, where their visibility timeouts and leases
 *    would run out: the count alone lets a 100-deep window wait 100 bank
 *    calls, the age bounds the wait itself.
 *  - --settle DUR: a receive that brings nothing is not the end while a
 *    message is still in flight or a copy left is due back within DUR; so
 *    a drain ends when every message it saw was settled or is due later.
 *
 * On SQS several receives are outstanding at once (--inflight, see
 * receive_loop); the window counts what they may bring as held.
 *
 * With --tee FILE each envelope is also appended to FILE once it was
 * written out (flushed): what the pipeline received, kept where the death
 * of a later step cannot take it, so a driver can tell what reached no
 * sqs-ack.  A message given back is never in it.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/envelope.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "open/open_queue.h"
#include "queue/queue.h"

static const char usage[] =
	"usage: sqs-recv [--queue URL] [--max N] [--wait SECS] [--visibility SECS]\n"
	"                [--follow | --drain] [--acked FILE [--window N] [--max-age DUR]\n"
	"                [--settle DUR]] [--inflight N] [--tee FILE]\n";
static const char options[] =
	"  -q, --queue URL        sqlite:PATH#NAME or an SQS queue URL (default $IDEMKIT_QUEUE,\n"
	"                         else sqlite:$IDEMKIT_STATE_DIR/queue.db#charges)\n"
	"  -n, --max N            at most N messages per receive, 1..10 (default 1)\n"
	"  -w, --wait SECS        long-poll up to SECS, 0..20 (default 0; 20 with --follow)\n"
	"  -v, --visibility SECS  keep received messages invisible for SECS, 0..43200\n"
	"                         (default: the queue's own visibility timeout)\n"
	"  -f, --follow           keep receiving until a signal\n"
	"  -d, --drain            keep receiving until a receive brings nothing\n"
	"  -a, --acked FILE       the pipeline's sqs-ack output: one line per message done\n"
	"  -W, --window N         hold at most N messages not yet acked (with --acked)\n"
	"  -A, --max-age DUR      receive nothing while one not yet acked is older than\n"
	"                         DUR (with --acked)\n"
	"  -S, --settle DUR       when a receive brings nothing, go on while a message is\n"
	"                         in flight or a copy left is due back within DUR\n"
	"  -i, --inflight N       with --follow or --drain on SQS: up to N receives\n"
	"                         outstanding, 1..16 (default 8)\n"
	"  -T, --tee FILE         also append each envelope to FILE once it is written out\n"
	"  -h, --help             this help\n"
	"  -V, --version          print the version\n";
static const struct ik_exit codes[] = {
	{ IK_OK, "at least one message was received and written" },
	{ IK_EMPTY, "nothing arrived (without --follow)" },
	{ IK_USAGE, "bad command line" },
	{ IK_SOFTWARE, "internal error, or stdout could not be written" },
	{ IK_TEMPFAIL, "the queue is busy, unreachable or throttled" },
	{ IK_CONFIG, "bad queue URL or credentials, or no such queue" },
	{ -1, NULL },
};

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

/* Make msgs[0..n) visible again at once: received, never written. */
static void
give_back(struct ik_queue *q, struct ik_qmsg *msgs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ik_err err = { 0 };
		if (q->ops->change_visibility(q, msgs[i].receipt, 0, &err) != IK_OK)
			ik_warnx("%s", err.msg);
	}
}

/* --tee FILE: NULL without it. */
static FILE *tee;

/* Write msgs[0..n) out, and each to --tee once it is out; from the first
 * one that could not be written on, make them visible again.  A tee that
 * fails stops the receiving as stdout does: what was received could no
 * longer be accounted for.  0 or -1. */
static int
emit(struct ik_queue *q, struct ik_qmsg *msgs, size_t n)
{
	size_t i;
	int rc = 0;

	for (i = 0; i < n; i++) {
		cJSON *env = envelope(q, &msgs[i]);
		int w = env ? ik_env_write(stdout, env) : -1;
		if (w < 0 || fflush(stdout) == EOF) {
			cJSON_Delete(env);
			ik_warnx("stdout: cannot write the envelope; returning %zu message(s) "
			         "to the queue", n - i);
			rc = -1;
			break;
		}
		if (tee && (ik_env_write(tee, env) < 0 || fflush(tee) == EOF)) {
			cJSON_Delete(env);
			ik_warnx("--tee: %s; returning %zu message(s) to the queue",
			         strerror(errno), n - i - 1);
			i++;
			rc = -1;
			break;
		}
		cJSON_Delete(env);
		ik_log(IK_LOG_DEBUG, "received", "step", "recv", "messageId", msgs[i].message_id,
		       NULL);
	}
	give_back(q, msgs + i, n - i);
	return rc;
}

/* The --acked bookkeeping (see the header comment). */
#define ACK_RING 256
#define RATE_SPAN_MS 10000   /* the ack rate is measured over this much */
struct flight {
	char *receipt;
	int64_t at;        /* monotonic ms when received */
};
struct due {
	char *id;          /* messageId */
	int64_t at;        /* monotonic ms when visible again; 0: settled */
};
struct window {
	int fd;
	long size;                  /* 0: no count bound */
	int64_t max_age;            /* ms; < 0: no age bound */
	struct ik_buf part;         /* a line not yet complete */
	struct flight *fl;          /* in flight, oldest first */
	size_t nfl, capfl;
	struct due *du;
	size_t ndu, capdu;
	int64_t first;              /* monotonic ms of the first hand-out */
	int64_t acks[ACK_RING];     /* monotonic ms of the latest acks */
	size_t nacks;
	int started;
	int64_t progress;           /* monotonic ms a message last settled (or the start) */
	const char *held;           /* why the last room() was 0, NULL: it was not */
	size_t held_nacks;          /* nacks when that was logged */
};

static int
grow(void **p, size_t *cap, size_t n, size_t size)
{
	void *q;
	size_t c = *cap ? *cap * 2 : 64;

	if (n < *cap)
		return 0;
	if (!(q = realloc(*p, c * size)))
		return -1;
	*p = q;
	*cap = c;
	return 0;
}

static int
hand_out(struct window *w, const char *receipt)
{
	if (grow((void **)&w->fl, &w->capfl, w->nfl, sizeof *w->fl) < 0 ||
	    !(w->fl[w->nfl].receipt = ik_strdup(receipt)))
		return -1;
	w->fl[w->nfl++].at = ik_mono_ms();
	if (!w->first)
		w->first = w->fl[w->nfl - 1].at;
	return 0;
}

static int
settled(const char *action)
{
	return strcmp(action, "delete") == 0 || strcmp(action, "delete-audit") == 0 ||
	    strcmp(action, "dlq") == 0;
}

/* One finished envelope: no longer in flight; its copy settled, or due
 * back at `at` + ack.visibility. */
static void
finished(struct window *w, const char *line, size_t len, int64_t at)
{
	ik_err err = { 0 };
	cJSON *env = NULL;
	const cJSON *ack, *vis;
	const char *receipt, *id, *action;
	size_t i;

	ik_env_parse(line, len, &env, &err);
	if (!env)
		return;
	if ((receipt = ik_env_str(env, "receipt")))
		for (i = 0; i < w->nfl; i++)
			if (strcmp(w->fl[i].receipt, receipt) == 0) {
				free(w->fl[i].receipt);
				memmove(&w->fl[i], &w->fl[i + 1], (w->nfl - i - 1) * sizeof *w->fl);
				w->nfl--;
				w->acks[w->nacks++ % ACK_RING] = ik_mono_ms();
				break;
			}
	ack = ik_env_result(env, "ack");
	id = ik_env_str(env, "messageId");
	action = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ack, "action"));
	vis = cJSON_GetObjectItemCaseSensitive(ack, "visibility");
	if (id && action) {
		for (i = 0; i < w->ndu && strcmp(w->du[i].id, id) != 0; i++)
			;
		if (i == w->ndu && strncmp(action, "leave", 5) == 0 && cJSON_IsNumber(vis)) {
			if (grow((void **)&w->du, &w->capdu, w->ndu, sizeof *w->du) < 0 ||
			    !(w->du[w->ndu].id = ik_strdup(id)))
				goto out;
			w->ndu++;
		}
		if (settled(action) && ik_env_step_code(env, "ack") == IK_OK)
			w->progress = ik_mono_ms();
		if (i < w->ndu) {
			if (settled(action) && ik_env_step_code(env, "ack") == IK_OK)
				w->du[i].at = 0;
			else if (cJSON_IsNumber(vis))
				w->du[i].at = at + (int64_t)(vis->valuedouble * 1000);
		}
	}
out:
	cJSON_Delete(env);
}

static void
count_acked(struct window *w)
{
	char buf[8192];
	ssize_t n;
	int64_t at = ik_mono_ms();

	if (!w->started) {
		/* Lines already in the file were written at its mtime at the
		 * latest: a copy they left is due back no later than that. */
		struct stat st;
		w->started = 1;
		if (fstat(w->fd, &st) == 0)
			at -= ik_now_ms() - ((int64_t)st.st_mtim.tv_sec * 1000 +
			    st.st_mtim.tv_nsec / 1000000);
	}
	while ((n = read(w->fd, buf, sizeof buf)) > 0) {
		const char *p = buf, *e = buf + n, *nl;
		while ((nl = memchr(p, '\n', (size_t)(e - p)))) {
			if (ik_buf_add(&w->part, p, (size_t)(nl - p)) == 0 && w->part.len)
				finished(w, w->part.p, w->part.len, at);
			ik_buf_reset(&w->part);
			p = nl + 1;
		}
		ik_buf_add(&w->part, p, (size_t)(e - p));
	}
}

/* How many messages the next receive may take (0: none now), with
 * `pending` more already asked for by the receives in flight (each may
 * bring as many as it asked for, so they count as held).  The count bound
 * is --window.  The age bound is --max-age twice over: nothing while the
 * oldest in flight is older, and no more in flight than the pipeline
 * finishes in that time at the rate it has been acking (Little's law: in
 * flight = rate x wait), so a message received now is not made to wait
 * longer than --max-age behind the others; that bound takes what fits.
 * Before any ack one batch goes. */
/* room() says 0: "held" at debug level, once per reason and per acks
 * read (the operator sees why nothing is received; the tests wait for the
 * line instead of a fixed sleep). */
static int
hold(struct window *w, const char *why)
{
	if (w->held != why || w->held_nacks != w->nacks) {
		ik_log(IK_LOG_DEBUG, "held", "step", "recv", "reason", why,
		       IK_LOG_NUM("inFlight", (int64_t)w->nfl),
		       IK_LOG_NUM("acked", (int64_t)w->nacks), NULL);
		w->held = why;
		w->held_nacks = w->nacks;
	}
	return 0;
}

static int
room(struct window *w, int max, size_t pending)
{
	int64_t now = ik_mono_ms(), span, allowed;
	size_t n = 0;
	long left = max;

	/* One in flight for twice --max-age was lost by a step or is past
	 * any use of the bound: it must not stop the receiving for good. */
	while (w->max_age >= 0 && w->nfl && now - w->fl[0].at > 2 * w->max_age + 1000) {
		ik_log(IK_LOG_WARN, "in flight for twice --max-age; no longer waited for",
		    "step", "recv", NULL);
		free(w->fl[0].receipt);
		memmove(&w->fl[0], &w->fl[1], (w->nfl - 1) * sizeof *w->fl);
		w->nfl--;
	}

	if (w->size && (long)(w->nfl + pending) + max > w->size)
		return hold(w, "window");   /* room for a whole batch */
	if (w->max_age >= 0) {
		if (w->nfl && now - w->fl[0].at >= w->max_age)
			return hold(w, "max-age");
		span = w->first && now - w->first < RATE_SPAN_MS ? now - w->first : RATE_SPAN_MS;
		for (size_t i = 0; i < w->nacks && i < ACK_RING; i++)
			n += w->acks[i] > now - span;
		allowed = w->nacks ? (int64_t)n * w->max_age / (span > 0 ? span : 1) : max;
		if (allowed < 1)
			allowed = 1;
		if (allowed - (int64_t)(w->nfl + pending) < left)
			left = (long)(allowed - (int64_t)(w->nfl + pending));
	}
	if (left <= 0)
		return hold(w, w->nacks ? "ack rate" : "first batch");
	w->held = NULL;
	return left < max ? (int)left : max;
}

/* 1 when a message handed out less than settle ago is still in flight:
 * what unsettled() waits for first, which its ack will settle or turn into
 * a copy due back. */
static int
awaiting(const struct window *w, int64_t settle)
{
	return w->nfl && ik_mono_ms() - w->fl[w->nfl - 1].at <= settle;
}

/* 1 while a receive that brought nothing is not the end: something handed
 * out less than settle ago is still in flight, or a copy left is due back
 * within settle (or was due a moment ago: another worker may have it, so
 * only grace_ms past).  One never acked (a step lost it) is given up on
 * after settle, so a drain always ends.  Copies left are waited for only
 * while the drain makes progress (a message settled less than settle ago):
 * during an outage every look leaves the copy again, and with a short
 * backoff it would always be due back soon; the drain then ends, 75, and
 * leaves them to the next run. */
static int
unsettled(struct window *w, int64_t settle, int64_t grace_ms)
{
	int64_t now = ik_mono_ms();

	count_acked(w);
	if (awaiting(w, settle))
		return 1;
	if (now - w->progress > settle)
		return 0;
	for (size_t i = 0; i < w->ndu; i++)
		if (w->du[i].at && w->du[i].at >= now - grace_ms && w->du[i].at <= now + settle)
			return 1;
	return 0;
}

/* How long a drain that does not long-poll sleeps before it looks for the
 * copies due back again: until the next is due, 10 to 200 ms. */
static int64_t
due_sleep(const struct window *w)
{
	int64_t now = ik_mono_ms(), ms = 200;

	for (size_t i = 0; i < w->ndu; i++)
		if (w->du[i].at > now && w->du[i].at - now < ms)
			ms = w->du[i].at - now;
	return ms < 10 ? 10 : ms;
}

/* 1 when the reader of stdout went away: nothing more can be delivered,
 * so nothing more may be received. */
static int
reader_gone(void)
{
	struct pollfd out = { .fd = STDOUT_FILENO, .events = 0 };

	return poll(&out, 1, 0) > 0 && (out.revents & (POLLERR | POLLHUP));
}

/* Waits until nothing handed out less than settle ago is in flight, a
 * stop signal, or the reader of stdout gone (nothing more could be handed
 * out: a drain whose pipeline died would otherwise wait out --settle, a
 * lease, waking every few milliseconds): the acks read every few
 * milliseconds.  Long-polling a queue
 * found empty meanwhile only delayed the end of a drain by up to --wait
 * after its last ack (a second of every cron drain), and found no more:
 * the copies a step leaves are known from its ack. */
static void
wait_acks(struct window *w, int64_t settle)
{
	while (!ik_stop_signal && awaiting(w, settle) && !reader_gone()) {
		ik_sleep_ms(5);
		count_acked(w);
	}
}

static void
window_free(struct window *w)
{
	for (size_t i = 0; i < w->nfl; i++)
		free(w->fl[i].receipt);
	for (size_t i = 0; i < w->ndu; i++)
		free(w->du[i].id);
	free(w->fl);
	free(w->du);
	ik_buf_free(&w->part);
	if (w->fd >= 0)
		close(w->fd);
}

/* ---- the receive loop ----
 * Up to `inflight` receives outstanding (SQS; one elsewhere), each started
 * while the window has room for what it may bring on top of what those in
 * flight may bring, each written out as soon as it is in, in the order
 * they finish.  An empty receive means what it meant with one at a time,
 * and no sooner: it starts no further receive, the others are waited for
 * (and written), and only when none of them brought anything either is
 * the queue taken to be empty (--settle may still go on); when one did,
 * receiving goes on.  A stop, an error or a reader gone starts nothing
 * more: what is in flight is finished and written first. */
#define RECV_INFLIGHT_MAX 16
#define RECV_INFLIGHT_DEFAULT 8   /* measured: see man/sqs-recv.1 */

struct loop {
	int max, wait, vis, follow, drain, inflight;
	int64_t settle;
	struct window *win;
};

struct recv {
	struct ik_qop op;
	struct ik_qmsg msgs[IK_QUEUE_BATCH];
	int busy;
};

/* The messages op brought: handed out and written; once the reader is
 * gone (*dead), or when they cannot be handed out, made visible again at
 * once.  IK_OK or IK_SOFTWARE. */
static int
deliver(struct ik_queue *q, struct window *win, struct ik_qop *op, int *dead)
{
	int rc = IK_OK;

	for (size_t i = 0; i < op->got && win->fd >= 0; i++)
		if (hand_out(win, op->msgs[i].receipt) < 0) {
			ik_warnx("out of memory");
			rc = IK_SOFTWARE;
			break;
		}
	if (rc != IK_OK || *dead)
		give_back(q, op->msgs, op->got);
	else if (emit(q, op->msgs, op->got) < 0)
		*dead = 1, rc = IK_SOFTWARE;
	for (size_t i = 0; i < op->got; i++)
		ik_qmsg_free(&op->msgs[i]);
	return *dead ? IK_SOFTWARE : rc;
}

static int
receive_loop(struct ik_queue *q, const struct loop *l, int *got)
{
	struct recv r[RECV_INFLIGHT_MAX];
	struct window *win = l->win;
	size_t out = 0, pending = 0;
	int rc = IK_OK, quiet = 0, brought = 0, done = 0, dead = 0, gone = 0, nowait = 0;
	int64_t backoff = 0, hold = 0;

	memset(r, 0, sizeof r);
	for (;;) {
		int blocked = 0;
		struct ik_qop *op;

		/* start what there is room for */
		while (!ik_stop_signal && !done && !dead && !gone && !quiet && rc == IK_OK &&
		       out < (size_t)l->inflight && ik_mono_ms() >= hold) {
			int take = l->max, i;

			if (win->fd >= 0) {
				count_acked(win);
				if ((take = room(win, l->max, pending)) <= 0) {
					blocked = 1;
					break;
				}
			}
			for (i = 0; r[i].busy; i++)
				;
			r[i].busy = 1;
			r[i].op = (struct ik_qop){ .kind = IK_QOP_RECEIVE, .max = take,
			    .wait_s = nowait ? 0 : l->wait, .visibility_s = l->vis,
			    .msgs = r[i].msgs, .arg = &r[i] };
			nowait = 0;
			out++;
			pending += (size_t)take;
			ik_queue_submit(q, &r[i].op);
		}
		if (blocked && reader_gone())
			gone = 1;
		if (out == 0) {
			if (ik_stop_signal || done || dead || gone || rc != IK_OK)
				break;
			if (quiet) {   /* the wave after an empty receive is in */
				quiet = 0;
				if (brought) {
					brought = 0;
					continue;
				}
				/* nobody left to hand a copy to: the end */
				if (reader_gone())
					break;
				if (l->settle >= 0 &&
				    unsettled(win, l->settle, (int64_t)l->wait * 1000 + 2000)) {
					if (awaiting(win, l->settle)) {
						/* the queue was empty a moment ago and
						 * what is in flight is ours: its acks
						 * say what comes back, then one look
						 * that does not wait */
						wait_acks(win, l->settle);
						gone = reader_gone();
						nowait = 1;
					} else if (!l->wait) {
						ik_sleep_ms(due_sleep(win));
					}
					continue;
				}
				break;
			}
			/* waiting for room in the window, or a backoff */
			ik_sleep_ms(blocked ? 5 : hold - ik_mono_ms() > 0 ? hold - ik_mono_ms() : 1);
			continue;
		}
		if (!(op = ik_queue_reap(q, blocked ? 5 : 250)))
			continue;
		out--;
		pending -= (size_t)op->max;
		((struct recv *)op->arg)->busy = 0;
		if (op->rc == IK_OK) {
			backoff = 0;
			*got += op->got > 0;
			if (op->got == 0 && !l->follow)
				quiet = 1;
			else if (op->got > 0 && quiet)
				brought = 1;
			else if (op->got > 0 && !l->drain && !l->follow)
				done = 1;
			if (deliver(q, win, op, &dead) != IK_OK && rc == IK_OK)
				rc = IK_SOFTWARE;
		} else if (l->follow && op->rc == IK_TEMPFAIL && !ik_stop_signal) {
			/* a consumer outlives a network blip; aws.h already retried */
			ik_log(IK_LOG_WARN, "receive failed; retrying", "step", "recv",
			       "error", op->err.msg, NULL);
			backoff = backoff ? (backoff * 2 > 30000 ? 30000 : backoff * 2) : 1000;
			hold = ik_mono_ms() + backoff;
		} else if (rc == IK_OK) {
			rc = ik_fail(&op->err);
		}
	}
	return rc;
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
		{ "max-age", required_argument, NULL, 'A' },
		{ "settle", required_argument, NULL, 'S' },
		{ "inflight", required_argument, NULL, 'i' },
		{ "tee", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ik_queue *q = NULL;
	const char *url = NULL;
	int max = 1, wait = -1, vis = -1, follow = 0, drain = 0, got = 0, ch, rc;
	int inflight = RECV_INFLIGHT_DEFAULT;
	struct window win = { .fd = -1, .max_age = -1, .progress = ik_mono_ms() };
	const char *acked = NULL, *tee_path = NULL;
	int size = 0;
	int64_t settle = -1;
	ik_err err = { 0 };

	ik_cli_init(argv[0]);
	while ((ch = getopt_long(argc, argv, "q:n:w:v:fdW:a:A:S:i:T:hV", longopts, NULL)) != -1) {
		switch (ch) {
		case 'q': url = optarg; break;
		case 'n': if (opt_int("max", optarg, 1, IK_QUEUE_BATCH, &max) < 0) return IK_USAGE; break;
		case 'w': if (opt_int("wait", optarg, 0, IK_QUEUE_MAX_WAIT, &wait) < 0) return IK_USAGE; break;
		case 'v': if (opt_int("visibility", optarg, 0, IK_QUEUE_MAX_VISIBILITY, &vis) < 0) return IK_USAGE; break;
		case 'f': follow = 1; break;
		case 'd': drain = 1; break;
		case 'W': if (opt_int("window", optarg, 1, 100000, &size) < 0) return IK_USAGE; break;
		case 'a': acked = optarg; break;
		case 'A':
			if (ik_opt_duration("--max-age", optarg, 0, INT64_MAX / 2, &win.max_age) < 0)
				return IK_USAGE;
			break;
		case 'S':
			if (ik_opt_duration("--settle", optarg, 0, INT64_MAX / 2, &settle) < 0)
				return IK_USAGE;
			break;
		case 'i':
			if (opt_int("inflight", optarg, 1, RECV_INFLIGHT_MAX, &inflight) < 0)
				return IK_USAGE;
			break;
		case 'T': tee_path = optarg; break;
		case 'h': return ik_help(usage, options, codes);
		case 'V': return ik_version();
		default: return ik_usage(usage);
		}
	}
	if (optind != argc || (follow && drain) ||
	    (!acked && (size || win.max_age >= 0 || settle >= 0)))
		return ik_usage(usage);
	if (acked) {
		if ((win.fd = open(acked, O_RDONLY | O_CLOEXEC)) < 0) {
			ik_warnx("--acked %s: %s", acked, strerror(errno));
			return IK_USAGE;
		}
		win.size = size && size < max ? max : size;
	}
	if (wait < 0)
		wait = follow ? IK_QUEUE_MAX_WAIT : 0;
	if (tee_path && !(tee = fopen(tee_path, "ae"))) {
		ik_warnx("--tee %s: %s", tee_path, strerror(errno));
		window_free(&win);
		return IK_USAGE;
	}

	if ((rc = ik_queue_open(url, &q, &err)) != IK_OK)
		return ik_fail(&err);
	q->stop = &ik_stop_signal;
	/* one receive at a time where the adapter has no calls in flight, and
	 * for a single receive */
	if (!ik_queue_inflight(q) || !(follow || drain))
		inflight = 1;
	rc = receive_loop(q, &(struct loop){ .max = max, .wait = wait, .vis = vis,
	    .follow = follow, .drain = drain, .settle = settle, .inflight = inflight,
	    .win = &win }, &got);
	ik_queue_close(q);
	window_free(&win);
	if (tee)
		fclose(tee);
	if (ik_stop_signal)
		return ik_finish(128 + ik_stop_signal);
	if (rc == IK_OK && !got)
		rc = IK_EMPTY;
	return ik_finish(rc);
}
