/* step.c: the one-shot / stream loop; see step.h. */
#include <errno.h>
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
#include "step.h"
#include "util.h"

/* Runs the step on one line; *env gets the envelope to write. */
static int
one(const struct ik_step *st, const char *line, size_t len, cJSON **env)
{
	ik_err err = { 0 };
	cJSON *r;
	int rc = ik_env_parse(line, len, env, &err);

	if (!*env)
		return rc;
	if (rc == IK_OK)
		return st->fn(*env, st->ctx);
	/* Malformed envelope: record it so it travels on to the DLQ intact. */
	if ((r = ik_env_set_result(*env, st->name, rc)))
		cJSON_AddStringToObject(r, "error", err.msg);
	ik_log(IK_LOG_WARN, "malformed envelope", "step", st->name,
	    "outcome", ik_code_name(rc), "error", err.msg, NULL);
	return rc;
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

static int
oneshot(const struct ik_step *st)
{
	struct ik_buf line = { 0 }, extra = { 0 };
	cJSON *env = NULL;
	int r, rc;

	while ((r = ik_read_line(stdin, &line)) == 1 && line.len == 0)
		;
	if (r < 0) {
		ik_warnx("stdin: %s", strerror(errno));
		rc = IK_SOFTWARE;
		goto out;
	}
	if (r == 0) {
		ik_warnx("stdin: no envelope or event");
		rc = IK_DATAERR;
		goto out;
	}
	while ((r = ik_read_line(stdin, &extra)) == 1)
		if (extra.len) {
			ik_warnx("stdin: more than one envelope; use --stream");
			rc = IK_USAGE;
			goto out;
		}
	rc = one(st, line.p, line.len, &env);
	if (env && emit(env) < 0 && rc == IK_OK)
		rc = IK_SOFTWARE;
out:
	ik_buf_free(&line);
	ik_buf_free(&extra);
	return ik_finish(rc);
}

/* The stream reader: fd 0 into our own buffer, so that whether more input
 * is available is a poll() away (stdio would hide what it has buffered). */
struct rd {
	char *p;
	size_t len, cap, off;   /* bytes [off, len) not yet consumed */
	size_t lines;           /* complete lines in [off, len) */
	int eof;
};

/* Reads once (blocking unless poll said readable); -1 with errno on error. */
static int
rd_fill(struct rd *r)
{
	ssize_t n;

	if (r->off && r->off == r->len)
		r->off = r->len = 0;
	if (r->cap - r->len < 16384) {
		size_t cap;
		char *p;
		if (r->off) {   /* compact before growing */
			memmove(r->p, r->p + r->off, r->len - r->off);
			r->len -= r->off;
			r->off = 0;
		}
		cap = r->cap - r->len < 16384 ? (r->cap ? r->cap * 2 : 65536) : r->cap;
		if (cap != r->cap) {
			if (!(p = realloc(r->p, cap)))
				return errno = ENOMEM, -1;
			r->p = p;
			r->cap = cap;
		}
	}
	n = read(STDIN_FILENO, r->p + r->len, r->cap - r->len);
	if (n < 0)
		return -1;
	if (n == 0) {
		/* A last line without its newline still counts: terminate it
		 * now, before any line is handed out (this may move r->p). */
		r->eof = 1;
		if (r->len > r->off && r->p[r->len - 1] != '\n') {
			if (r->len == r->cap) {
				char *p = realloc(r->p, r->cap + 1);
				if (!p)
					return errno = ENOMEM, -1;
				r->p = p;
				r->cap++;
			}
			r->p[r->len++] = '\n';
			r->lines++;
		}
		return 0;
	}
	for (char *q = r->p + r->len, *e = q + n; (q = memchr(q, '\n', (size_t)(e - q))); q++)
		r->lines++;
	r->len += (size_t)n;
	return 0;
}

/* Waits for at least one line (or EOF), then takes whatever else is
 * already there, up to max lines, without waiting. */
static int
rd_gather(struct rd *r, size_t max)
{
	struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };

	while (!r->lines && !r->eof) {
		if (ik_stop_signal)
			return 0;
		if (rd_fill(r) < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
	}
	while (r->lines < max && !r->eof && !ik_stop_signal &&
	    poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP)))
		if (rd_fill(r) < 0 && errno != EINTR)
			return -1;
	return 0;
}

/* The next complete line (without its newline, NUL-terminated in place),
 * or NULL.  Valid until the next rd_fill. */
static char *
rd_line(struct rd *r, size_t *len)
{
	char *b = r->p + r->off, *nl;

	if (!r->lines || !(nl = memchr(b, '\n', r->len - r->off)))
		return NULL;
	r->lines--;
	*nl = '\0';
	*len = (size_t)(nl - b);
	r->off += *len + 1;
	if (*len && b[*len - 1] == '\r')
		b[--*len] = '\0';
	return b;
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
	struct rd r = { 0 };
	char *lines[IK_STEP_GROUP_MAX];
	size_t lens[IK_STEP_GROUP_MAX];
	cJSON *envs[IK_STEP_GROUP_MAX] = { 0 };
	int rc = IK_OK, group = st->begin && st->commit;
	size_t gmax = st->group_max && st->group_max < IK_STEP_GROUP_MAX ?
	    st->group_max : IK_STEP_GROUP_MAX;

	while (!ik_stop_signal) {
		size_t n = 0;
		char *line;
		size_t len;

		if (rd_gather(&r, gmax) < 0) {
			ik_warnx("stdin: %s", strerror(errno));
			rc = IK_SOFTWARE;
			break;
		}
		if (!group) {
			/* One at a time (step.h): quick lines share a write,
			 * held at most IK_STEP_HOLD_US plus one line. */
			int64_t held = 0, t0, t1;
			int flush;
			while (!ik_stop_signal && (line = rd_line(&r, &len))) {
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
			while (n < gmax && (line = rd_line(&r, &len)))
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
		if (rc != IK_OK || (r.eof && r.off == r.len))
			break;
	}
	for (size_t i = 0; i < IK_STEP_GROUP_MAX; i++)
		cJSON_Delete(envs[i]);
	free(r.p);
	if (ik_stop_signal && rc == IK_OK)
		rc = 128 + ik_stop_signal;
	return ik_finish(rc);
}

int
ik_step_run(const struct ik_step *st)
{
	return st->stream ? stream(st) : oneshot(st);
}
