/* step.c: the one-shot / stream loop; see step.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/envelope.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/step.h"
#include "core/util.h"

/* Parses line into *env (NULL only out of memory): IK_OK when the step is
 * to run on it, else a malformed envelope's code, recorded in it under the
 * step's name so it travels on to the DLQ intact. */
static int
parse(const struct ik_step *st, const char *line, size_t len, cJSON **env)
{
	ik_err err = { 0 };
	cJSON *r;
	int rc = ik_env_parse(line, len, env, &err);

	if (!*env || rc == IK_OK)
		return rc;
	if ((r = ik_env_set_result(*env, st->name, rc)))
		cJSON_AddStringToObject(r, "error", err.msg);
	ik_log(IK_LOG_WARN, "malformed envelope", "step", st->name,
	    "outcome", ik_code_name(rc), "error", err.msg, NULL);
	return rc;
}

/* Runs the step on one line; *env gets the envelope to write. */
static int
one(const struct ik_step *st, const char *line, size_t len, cJSON **env)
{
	int rc = parse(st, line, len, env);

	return rc == IK_OK && *env ? st->fn(*env, st->ctx) : rc;
}

/* Output.  An envelope written is kept until a flush of stdout succeeded:
 * when stdout fails (the next step is gone, a full disk), whatever a failed
 * write or flush may have lost -- every envelope written since the last
 * good flush -- and every later one is settled another way (step.h), never
 * dropped. */
struct out {
	const struct ik_step *st;
	struct ik_buf held;       /* cJSON *, written and not yet flushed */
	int broken;
	size_t lost;              /* settled with an error: not recorded */
};

static cJSON **
held(struct out *o, size_t *n)
{
	*n = o->held.len / sizeof(cJSON *);
	return (cJSON **)(void *)o->held.p;
}

static void
settle(struct out *o, cJSON *env)
{
	int rc = o->st->settle ? o->st->settle(env, o->st->settle_ctx) : IK_OK;

	/* LEASE_LOST: another claim holds it now, whose record will say */
	if (rc != IK_OK && rc != IK_EMPTY && rc != IK_LEASE_LOST)
		o->lost++;
	cJSON_Delete(env);
}

/* stdout failed: say so once, settle what it may have lost. */
static void
broke(struct out *o)
{
	cJSON **e;
	size_t n;

	if (!o->broken)
		ik_warnx("stdout: %s; the envelopes not passed on are recorded in the "
		    "store", strerror(errno ? errno : EIO));
	o->broken = 1;
	e = held(o, &n);
	for (size_t i = 0; i < n; i++)
		settle(o, e[i]);
	ik_buf_reset(&o->held);
}

/* Flushes stdout: 0, or -1 when it failed (what it held is settled). */
static int
out_flush(struct out *o)
{
	cJSON **e;
	size_t n;

	if (o->broken)
		return -1;
	if (fflush(stdout) == EOF) {
		broke(o);
		return -1;
	}
	e = held(o, &n);
	for (size_t i = 0; i < n; i++)
		cJSON_Delete(e[i]);
	ik_buf_reset(&o->held);
	return 0;
}

/* Writes env (taking it), unflushed: 0, or -1 once stdout failed (env is
 * then settled). */
static int
out_put(struct out *o, cJSON *env)
{
	if (o->broken) {
		settle(o, env);
		return -1;
	}
	if (ik_buf_add(&o->held, &env, sizeof env) < 0) {
		/* No room to keep it: flush what is kept, then this one alone. */
		if (out_flush(o) < 0 || ik_env_write(stdout, env) < 0 || fflush(stdout) == EOF) {
			broke(o);
			settle(o, env);
			return -1;
		}
		cJSON_Delete(env);
		return 0;
	}
	if (ik_env_write(stdout, env) < 0) {
		broke(o);
		return -1;
	}
	return 0;
}

/* Flushes (settling what is still kept when that fails); the loop's exit
 * code from rc: a failed stdout is 70, unless a stop signal came and every
 * envelope it kept from the next step was recorded in the store: that is
 * the stop of a whole process group, which ends the next step too. */
static int
out_end(struct out *o, int rc)
{
	out_flush(o);
	ik_buf_free(&o->held);
	if (rc == IK_OK && ik_stop_signal && (!o->broken || !o->lost))
		rc = 128 + ik_stop_signal;
	if (o->broken)
		return rc == IK_OK ? IK_SOFTWARE : rc;   /* said once, by broke */
	return ik_finish(rc);
}

/* The next line on stdin that is not blank: 1, 0 at EOF, -1 (errno). */
static int
next_line(struct ik_lines *in, char **line, size_t *len)
{
	int r;

	while ((r = ik_lines_next(in, line, len)) != 0) {
		if (r < 0 && (errno != EINTR || ik_stop_signal))
			return -1;
		if (r > 0 && *len)
			return 1;
	}
	return 0;
}

static int
oneshot(const struct ik_step *st)
{
	struct ik_lines in;
	struct ik_buf first = { 0 };
	cJSON *env = NULL;
	char *line;
	size_t len;
	struct out o = { .st = st };
	int r, rc;

	ik_lines_init(&in, STDIN_FILENO);
	r = next_line(&in, &line, &len);
	if (r == 1 && ik_buf_add(&first, line, len) < 0) {   /* the next read may move it */
		errno = ENOMEM;
		r = -1;
	}
	if (r == 1 && next_line(&in, &line, &len) == 1)
		r = 2;   /* a second envelope */
	if (r < 0) {
		ik_warnx("stdin: %s", strerror(errno));
		rc = IK_SOFTWARE;
	} else if (r == 0) {
		/* Nothing came (an upstream step that received nothing, a
		 * pipe closed empty): nothing to do, EMPTY, as sqs-recv says
		 * it; DATAERR is for a line that is not an envelope. */
		ik_warnx("stdin: no envelope or event: nothing to do");
		rc = IK_EMPTY;
	} else if (r == 2) {
		ik_warnx("stdin: more than one envelope; use --stream");
		rc = IK_USAGE;
	} else {
		rc = one(st, first.p, first.len, &env);
		if (env && out_put(&o, env) == 0)
			out_flush(&o);
		ik_buf_free(&o.held);
	}
	ik_lines_free(&in);
	ik_buf_free(&first);
	/* The exit code is the outcome, unless it could not be passed on
	 * (then recorded in the store: settle). */
	if (o.broken)
		return rc == IK_OK ? IK_SOFTWARE : rc;
	return ik_finish(rc);
}

/* Waits for at least one line (or EOF), then takes whatever else is
 * already there, up to max lines, without waiting.  due_ms >= 0: a held
 * line is due then, so the wait ends by then with or without a line. */
static int
gather(const struct ik_step *st, struct ik_lines *r, size_t max, int due_ms)
{
	int64_t end = due_ms >= 0 ? ik_mono_ms() + due_ms : 0;
	int ms;

	while (!r->lines && !r->eof) {
		if (ik_stop_signal)
			return 0;
		ms = st->tick ? st->tick(st->group_ctx) : -1;
		if (due_ms >= 0) {
			int64_t left = end - ik_mono_ms();

			if (left <= 0)
				return 0;
			if (ms < 0 || ms > left)
				ms = (int)left;
		}
		if (ms >= 0 && !ik_lines_wait(r, ms))
			continue;   /* its time came first: ask again */
		if (ik_lines_fill(r) < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
	}
	while (r->lines < max && !r->eof && !ik_stop_signal && ik_lines_ready(r))
		if (ik_lines_fill(r) < 0 && errno != EINTR)
			return -1;
	return 0;
}

static int64_t
mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Runs the lines of one group; the group is open when grouped is set.  On
 * a failed commit the envelopes are dropped and each line is redone alone
 * (the parse is in place, so the lines are still intact). */
static int
run_group(const struct ik_step *st, char **lines, size_t *lens, size_t n,
    cJSON **envs, int grouped)
{
	for (size_t i = 0; i < n; i++)
		one(st, lines[i], lens[i], &envs[i]);
	if (grouped && st->commit(st->group_ctx) != 0) {
		/* The hook logged why (once); each line is redone alone. */
		for (size_t i = 0; i < n; i++) {
			cJSON_Delete(envs[i]);
			envs[i] = NULL;
			one(st, lines[i], lens[i], &envs[i]);
		}
	}
	for (size_t i = 0; i < n; i++)
		if (!envs[i]) {
			ik_warnx("out of memory");
			return -1;
		}
	return 0;
}

/* ---- lines held to be run again (step.h's hold) ------------------------- */

#define HELD_MAX IK_STEP_GROUP_MAX

struct held {
	char *line;              /* a copy; NULL: gone (compacted away) */
	size_t len;
	int64_t retry_at, until, backoff;   /* monotonic ms */
	cJSON *env;              /* its last answer, written when it is let go */
};

struct holds {
	struct held h[HELD_MAX];
	size_t n;
};

/* ms until the first held line is due (0: now, or overdue), -1 when none
 * is held; at most a second (the loop looks again). */
static int
held_due(const struct holds *hs)
{
	int64_t now = ik_mono_ms(), due = INT64_MAX;

	if (!hs->n)
		return -1;
	for (size_t i = 0; i < hs->n; i++)
		if (hs->h[i].retry_at - now < due)
			due = hs->h[i].retry_at - now;
	return due <= 0 ? 0 : due > 1000 ? 1000 : (int)due;
}

static void
held_drop(struct held *h)
{
	free(h->line);
	h->line = NULL;
	h->env = NULL;
}

static void
held_compact(struct holds *hs)
{
	size_t k = 0;

	for (size_t i = 0; i < hs->n; i++)
		if (hs->h[i].line)
			hs->h[k++] = hs->h[i];
	hs->n = k;
}

/* Every held line let go with its last answer (a stop signal, a failed
 * stdout). */
static void
held_flush(struct holds *hs, struct out *o)
{
	for (size_t i = 0; i < hs->n; i++) {
		out_put(o, hs->h[i].env);
		held_drop(&hs->h[i]);
	}
	hs->n = 0;
}

/* env, the answer to line (src: its held entry, or NULL for a new line):
 * held to be run again, or written.  The hook is asked every time (it may
 * take what it left in env); its answer counts only while the loop runs
 * on. */
static void
held_or_out(const struct ik_step *st, struct holds *hs, struct out *o, struct held *src,
    const char *line, size_t len, cJSON *env)
{
	int64_t ms = st->hold ? st->hold(env, st->ctx) : 0, now = ik_mono_ms();
	struct held *h = src;

	if (ik_stop_signal || o->broken)
		ms = 0;
	if (h) {
		if (ms > 0 && now + ms < h->until)
			h->until = now + ms;
		h->backoff = h->backoff * 2 > IK_STEP_RETRY_MAX_MS ? IK_STEP_RETRY_MAX_MS :
		    h->backoff * 2;
		if (ms > 0 && now + h->backoff < h->until) {
			cJSON_Delete(h->env);
			h->env = env;
			h->retry_at = now + h->backoff;
			return;
		}
		cJSON_Delete(h->env);
		held_drop(h);
		out_put(o, env);
		return;
	}
	if (ms > IK_STEP_RETRY_FIRST_MS && hs->n < HELD_MAX && (h = &hs->h[hs->n]) &&
	    (h->line = malloc(len ? len : 1))) {
		memcpy(h->line, line, len);
		h->len = len;
		h->until = now + ms;
		h->backoff = IK_STEP_RETRY_FIRST_MS;
		h->retry_at = now + h->backoff;
		h->env = env;
		hs->n++;
		return;
	}
	out_put(o, env);
}

/* One line or group at a time.  At a stop signal or a failed stdout no
 * more is read, and the lines already read are finished first (idemp-done
 * records them; their envelopes are written, or settled). */
static int
stream(const struct ik_step *st)
{
	struct ik_lines r;
	struct out o = { .st = st };
	static struct holds hs;
	char *lines[IK_STEP_GROUP_MAX];
	size_t lens[IK_STEP_GROUP_MAX];
	struct held *src[IK_STEP_GROUP_MAX];
	cJSON *envs[IK_STEP_GROUP_MAX] = { 0 };
	int rc = IK_OK, group = st->begin && st->commit;
	size_t gmax = st->group_max && st->group_max < IK_STEP_GROUP_MAX ?
	    st->group_max : IK_STEP_GROUP_MAX;

	ik_lines_init(&r, STDIN_FILENO);
	for (;;) {
		size_t n = 0;
		char *line;
		size_t len;

		if (hs.n && (ik_stop_signal || o.broken))
			held_flush(&hs, &o);
		if (!ik_stop_signal && !o.broken && gather(st, &r, gmax, held_due(&hs)) < 0) {
			ik_warnx("stdin: %s", strerror(errno));
			rc = IK_SOFTWARE;
			break;
		}
		if (!group) {
			/* One at a time (step.h): quick lines share a write,
			 * held at most IK_STEP_HOLD_US plus one line. */
			int64_t held = 0, t0, t1;
			while ((line = ik_lines_take(&r, &len))) {
				if (!len)
					continue;
				t0 = mono_us();
				if (run_group(st, &line, &len, 1, envs, 0) < 0) {
					rc = IK_SOFTWARE;
					break;
				}
				t1 = mono_us();
				if (!held)
					held = t0;
				out_put(&o, envs[0]);
				envs[0] = NULL;
				if (!r.lines || t1 - held >= IK_STEP_HOLD_US) {
					out_flush(&o);
					held = 0;
				}
				if (st->halt && (rc = st->halt(st->group_ctx)) != IK_OK)
					break;
			}
		} else {
			/* The held lines that are due first, then what came; one
			 * whose time is up goes with its last answer, never tried
			 * again after it (a try past its original's lease would
			 * take the lease over). */
			int64_t now = ik_mono_ms();
			for (size_t i = 0; i < hs.n; i++)
				if (hs.h[i].until <= now) {
					out_put(&o, hs.h[i].env);
					held_drop(&hs.h[i]);
				}
			held_compact(&hs);
			for (size_t i = 0; i < hs.n && n < gmax; i++)
				if (hs.h[i].retry_at <= now) {
					src[n] = &hs.h[i];
					lines[n] = hs.h[i].line;
					lens[n++] = hs.h[i].len;
				}
			while (n < gmax && (line = ik_lines_take(&r, &len)))
				if (len) {
					src[n] = NULL;
					lines[n] = line;
					lens[n++] = len;
				}
			if (n && run_group(st, lines, lens, n, envs,
			    n > 1 && st->begin(st->group_ctx) == 0) < 0) {
				rc = IK_SOFTWARE;
			} else if (n) {
				for (size_t i = 0; i < n; i++) {
					held_or_out(st, &hs, &o, src[i], lines[i], lens[i], envs[i]);
					envs[i] = NULL;
				}
				held_compact(&hs);
				out_flush(&o);
				if (st->halt)
					rc = st->halt(st->group_ctx);
			} else if (hs.n && r.eof && !ik_stop_signal) {
				/* Only held lines left, none due yet. */
				ik_sleep_ms(held_due(&hs));
			}
		}
		if (rc != IK_OK || (!r.lines && (r.eof || ik_stop_signal || o.broken) &&
		    (!hs.n || ik_stop_signal || o.broken)))
			break;
	}
	held_flush(&hs, &o);
	for (size_t i = 0; i < IK_STEP_GROUP_MAX; i++)
		cJSON_Delete(envs[i]);
	ik_lines_free(&r);
	return out_end(&o, rc);
}

/* Parses line and starts it: 0 when it is in flight, 1 when *env is
 * finished already (a malformed line recorded, or the step done at once),
 * -1 out of memory. */
static int
start_line(const struct ik_step *st, const char *line, size_t len, cJSON **env)
{
	int rc = parse(st, line, len, env);

	if (!*env)
		return -1;
	if (rc == IK_OK)
		return st->start(*env, st->ctx) == 0 ? 0 : 1;
	return 1;
}

/* The in-flight loop (step.h: start, wait, reap).  Every envelope reaped
 * is written (or settled): a halt, a stop or a failed stdout ends the
 * starting, never what was answered. */
static int
stream_inflight(const struct ik_step *st)
{
	struct ik_lines r;
	struct out o = { .st = st };
	size_t max = st->inflight ? st->inflight : 1, busy = 0;
	int rc = IK_OK, ended = 0, unflushed = 0, readable, k, wait_ms;
	int64_t held = 0, now;
	cJSON *env;
	char *line;
	size_t len;

	ik_lines_init(&r, STDIN_FILENO);
	for (;;) {
		if (ik_stop_signal || o.broken)
			ended = 1;    /* receive no more; finish what is in flight */
		while ((env = st->reap(st->ctx))) {
			busy--;
			unflushed = 1;
			if (out_put(&o, env) == 0 && rc == IK_OK && st->halt)
				rc = st->halt(st->group_ctx);
		}
		while (rc == IK_OK && !ended && !o.broken && busy < max &&
		    (line = ik_lines_take(&r, &len))) {
			if (!len)
				continue;
			env = NULL;
			if ((k = start_line(st, line, len, &env)) < 0) {
				ik_warnx("out of memory");
				rc = IK_SOFTWARE;
			} else if (k == 0) {
				busy++;
			} else {
				unflushed = 1;
				if (out_put(&o, env) == 0 && st->halt)
					rc = st->halt(st->group_ctx);
			}
		}
		if (rc != IK_OK || o.broken)
			ended = 1;
		/* Flushed when nothing is left in flight or the loop is
		 * ending, else at most IK_STEP_HOLD_US after the first
		 * envelope written. */
		wait_ms = -1;
		if (unflushed) {
			now = mono_us();
			if (!held)
				held = now;
			if (busy && !ended && now - held < IK_STEP_HOLD_US) {
				wait_ms = (int)((IK_STEP_HOLD_US - (now - held) + 999) / 1000);
			} else {
				if (out_flush(&o) < 0)
					ended = 1;
				unflushed = 0;
				held = 0;
			}
		}
		if (!busy && (ended || (r.eof && !r.lines)))
			break;
		if (!busy) {          /* nothing in flight: wait for input */
			if (gather(st, &r, max, -1) < 0) {
				ik_warnx("stdin: %s", strerror(errno));
				rc = IK_SOFTWARE;
				ended = 1;
			}
			continue;
		}
		k = !ended && !r.eof && !r.lines && busy < max;
		readable = 0;
		if (st->wait(st->ctx, k ? STDIN_FILENO : -1, &readable, wait_ms) < 0) {
			rc = IK_SOFTWARE;
			ended = 1;
			break;    /* the transfers are gone with the loop */
		}
		if (k && readable) {
			if (ik_lines_fill(&r) < 0 && errno != EINTR) {
				ik_warnx("stdin: %s", strerror(errno));
				rc = IK_SOFTWARE;
				ended = 1;
			}
			while (!ended && !r.eof && r.lines < max && ik_lines_ready(&r))
				if (ik_lines_fill(&r) < 0 && errno != EINTR)
					break;
		}
	}
	/* What was answered before a failed wait; then the lines read and
	 * never started, passed on as they came (the next step records what
	 * they say: a debited envelope not notified is DNF), or settled. */
	while ((env = st->reap(st->ctx)))
		out_put(&o, env);
	while ((line = ik_lines_take(&r, &len)))
		if (len && (parse(st, line, len, &env), env))
			out_put(&o, env);
	ik_lines_free(&r);
	return out_end(&o, rc);
}

int
ik_step_run(const struct ik_step *st)
{
	if (!st->stream)
		return oneshot(st);
	return st->start ? stream_inflight(st) : stream(st);
}
