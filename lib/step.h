/* step.h: the loop every envelope step shares (DESIGN.md "two modes").
 *
 * one-shot: stdin holds one envelope (or bare event); the step runs, the
 *   envelope is written to stdout with the step's result, and the exit
 *   code is the step's outcome.  More than one line is a usage error,
 *   refused before anything is done.
 * stream (--stream): one envelope out per line in, flushed per line, the
 *   outcome only in the envelope; the exit code is 0 unless the loop
 *   itself failed (stdout closed, a signal: 128+sig).
 *
 * The step function gets an envelope that parsed (a line that claimed to be
 * an envelope but is malformed is recorded as DATAERR under the step's own
 * name by the loop, never passed to fn).  It adds its own result and
 * returns its outcome; when it has nothing to do for this envelope it
 * leaves the envelope untouched and returns ik_env_outcome(env).
 */
#ifndef IK_STEP_H
#define IK_STEP_H

#include <cjson/cJSON.h>

#include "err.h"

typedef int (*ik_step_fn)(cJSON *env, void *ctx);

struct ik_step {
	const char *name;     /* "claim", "debit", "notify", "done": the result key */
	ik_step_fn fn;
	void *ctx;
	int stream;
};

/* Runs the loop over stdin/stdout; returns the exit code for main. */
int ik_step_run(const struct ik_step *st);

#endif
