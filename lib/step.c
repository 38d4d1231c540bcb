/* step.c: the one-shot / stream loop; see step.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "envelope.h"
#include "lines.h"
#include "log.h"
#include "outcome.h"
#include "step.h"
#include "util.h"

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

static int
emit(cJSON *env)
{
	int rc = ik_env_write(stdout, env);
	cJSON_Delete(env);
	if (rc < 0 || fflush(stdout) == EOF)
		return -1;   /* ik_finish reports it, once */
	return 0;
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
		ik_warnx("stdin: no envelope or event");
		rc = IK_DATAERR;
	} else if (r == 2) {
		ik_warnx("stdin: more than one envelope; use --stream");
		rc = IK_USAGE;
	} else {
		rc = one(st, first.p, first.len, &env);
		if (env && emit(env) < 0 && rc == IK_OK)
			rc = IK_SOFTWARE;
	}
	ik_lines_free(&in);
	ik_buf_free(&first);
	return ik_finish(rc);
}

/* Waits for at least one line (or EOF), then takes whatever else is
 * already there, up to max lines, without waiting. */
static int
gather(const struct ik_step *st, struct ik_lines *r, size_t max)
{
	int ms;

	while (!r->lines && !r->eof) {
		if (ik_stop_signal)
			return 0;
		if (st->tick && (ms = st->tick(st->group_ctx)) >= 0 && !ik_lines_wait(r, ms))
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

/* Writes the envelopes (freeing them), flushed when flush is set; -1 when
 * stdout failed. */
static int
put(cJSON **envs, size_t n, int flush)
{
	int rc = 0;

	for (size_t i = 0; i < n; i++) {
		if (!rc && ik_env_write(stdout, envs[i]) < 0)
			rc = -1;
		cJSON_Delete(envs[i]);
		envs[i] = NULL;
	}
	if (rc < 0 || (flush && fflush(stdout) == EOF)) {
		ik_warnx("stdout: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static int
emit_all(cJSON **envs, size_t n)
{
	return put(envs, n, 1);
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

static int
stream(const struct ik_step *st)
{
	struct ik_lines r;
	char *lines[IK_STEP_GROUP_MAX];
	size_t lens[IK_STEP_GROUP_MAX];
	cJSON *envs[IK_STEP_GROUP_MAX] = { 0 };
	int rc = IK_OK, group = st->begin && st->commit;
	size_t gmax = st->group_max && st->group_max < IK_STEP_GROUP_MAX ?
	    st->group_max : IK_STEP_GROUP_MAX;

	ik_lines_init(&r, STDIN_FILENO);
	while (!ik_stop_signal) {
		size_t n = 0;
		char *line;
		size_t len;

		if (gather(st, &r, gmax) < 0) {
			ik_warnx("stdin: %s", strerror(errno));
			rc = IK_SOFTWARE;
			break;
		}
		if (!group) {
			/* One at a time (step.h): quick lines share a write,
			 * held at most IK_STEP_HOLD_US plus one line. */
			int64_t held = 0, t0, t1;
			int flush;
			while (!ik_stop_signal && (line = ik_lines_take(&r, &len))) {
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
				flush = !r.lines || t1 - held >= IK_STEP_HOLD_US;
				if (put(envs, 1, flush) < 0) {
					rc = IK_SOFTWARE;
					break;
				}
				if (flush)
					held = 0;
				if (st->halt && (rc = st->halt(st->group_ctx)) != IK_OK)
					break;
			}
		} else {
			while (n < gmax && (line = ik_lines_take(&r, &len)))
				if (len) {
					lines[n] = line;
					lens[n++] = len;
				}
			if (n && (run_group(st, lines, lens, n, envs,
			    n > 1 && st->begin(st->group_ctx) == 0) < 0 || emit_all(envs, n) < 0))
				rc = IK_SOFTWARE;
			else if (n && st->halt)
				rc = st->halt(st->group_ctx);
		}
		if (rc != IK_OK || (r.eof && !r.lines))
			break;
	}
	for (size_t i = 0; i < IK_STEP_GROUP_MAX; i++)
		cJSON_Delete(envs[i]);
	ik_lines_free(&r);
	if (ik_stop_signal && rc == IK_OK)
		rc = 128 + ik_stop_signal;
	return ik_finish(rc);
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

/* The in-flight loop (step.h: start, wait, reap). */
static int
stream_inflight(const struct ik_step *st)
{
	struct ik_lines r;
	size_t max = st->inflight ? st->inflight : 1, busy = 0;
	int rc = IK_OK, ended = 0, unflushed = 0, readable, k, wait_ms;
	int64_t held = 0, now;
	cJSON *env;
	char *line;
	size_t len;

	ik_lines_init(&r, STDIN_FILENO);
	for (;;) {
		if (ik_stop_signal)
			ended = 1;    /* receive no more; finish what is in flight */
		while ((env = st->reap(st->ctx))) {
			busy--;
			unflushed = 1;
			if (rc == IK_OK && put(&env, 1, 0) < 0)
				rc = IK_SOFTWARE;
			else if (rc == IK_OK && st->halt && (rc = st->halt(st->group_ctx)) != IK_OK)
				ended = 1;
			cJSON_Delete(env);   /* NULL after put */
		}
		while (rc == IK_OK && !ended && busy < max && (line = ik_lines_take(&r, &len))) {
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
				if (put(&env, 1, 0) < 0)
					rc = IK_SOFTWARE;
				else if (st->halt && (rc = st->halt(st->group_ctx)) != IK_OK)
					ended = 1;
			}
		}
		if (rc != IK_OK)
			ended = 1;
		/* Flushed when nothing is left in flight, else at most
		 * IK_STEP_HOLD_US after the first envelope written. */
		wait_ms = -1;
		if (unflushed) {
			now = mono_us();
			if (!held)
				held = now;
			if (busy && rc == IK_OK && now - held < IK_STEP_HOLD_US) {
				wait_ms = (int)((IK_STEP_HOLD_US - (now - held) + 999) / 1000);
			} else {
				if (rc == IK_OK && fflush(stdout) == EOF) {
					ik_warnx("stdout: %s", strerror(errno));
					rc = IK_SOFTWARE;
					ended = 1;
				}
				unflushed = 0;
				held = 0;
			}
		}
		if (!busy && (ended || (r.eof && !r.lines)))
			break;
		if (!busy) {          /* nothing in flight: wait for input */
			if (gather(st, &r, max) < 0) {
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
	ik_lines_free(&r);
	if (ik_stop_signal && rc == IK_OK)
		rc = 128 + ik_stop_signal;
	return ik_finish(rc);
}

int
ik_step_run(const struct ik_step *st)
{
	if (!st->stream)
		return oneshot(st);
	return st->start ? stream_inflight(st) : stream(st);
}
