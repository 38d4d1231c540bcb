/* step.c: the one-shot / stream loop; see step.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

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

static int
stream(const struct ik_step *st)
{
	struct ik_buf line = { 0 };
	int r, rc = IK_OK;

	while (!ik_stop_signal) {
		cJSON *env = NULL;
		r = ik_read_line(stdin, &line);
		if (r == 0)
			break;
		if (r < 0) {
			if (errno == EINTR) {
				clearerr(stdin);
				continue;
			}
			ik_warnx("stdin: %s", strerror(errno));
			rc = IK_SOFTWARE;
			break;
		}
		if (line.len == 0)
			continue;
		one(st, line.p, line.len, &env);
		if (!env) {
			ik_warnx("out of memory");
			rc = IK_SOFTWARE;
			break;
		}
		if (emit(env) < 0) {
			rc = IK_SOFTWARE;
			break;
		}
	}
	ik_buf_free(&line);
	if (ik_stop_signal && rc == IK_OK)
		rc = 128 + ik_stop_signal;
	return ik_finish(rc);
}

int
ik_step_run(const struct ik_step *st)
{
	return st->stream ? stream(st) : oneshot(st);
}
