/* step.h: the loop every envelope step shares (DESIGN.md "two modes").
 *
 * one-shot: stdin holds one envelope (or bare event); the step runs, the
 *   envelope is written to stdout with the step's result, and the exit
 *   code is the step's outcome.  More than one line is a usage error,
 *   refused before anything is done.
 * stream (--stream): one envelope out per line in, in order (but see
 *   start/wait/reap below: in flight, the order is the answers'), the outcome
 *   only in the envelope; the exit code is 0 unless the loop itself failed
 *   (stdout closed, a signal: 128+sig).  Input is read from fd 0 directly
 *   (not stdio), so "what is available now" is known without blocking.
 *   Without group hooks each envelope is written as soon as it is done and
 *   flushed when no further line is already read, or IK_STEP_HOLD_US
 *   (2 ms) after the oldest unflushed one was started: a slow line (a
 *   network wait) goes out at once, quick ones share a write.  With them (begin/commit, e.g. idemp-claim, idemp-done), the
 *   lines already available on stdin -- never waiting for more, so a lone
 *   line goes through at once, and at most IK_STEP_GROUP_MAX -- form a
 *   group: begin, fn on each, commit (one durable commit for all), and only
 *   then are they written and flushed.  When commit fails (it rolled the
 *   group back), each line of the group is redone alone, exactly as without
 *   hooks, so a group never changes an outcome, only what a commit costs.
 *   Output is always flushed before the loop blocks on input.  At a
 *   stop signal no more is read, and the lines already read are run and
 *   written first (idemp-done records what they say).  sqs-ack's
 *   hooks are its delete batches (group_max = one batch), so its
 *   envelopes are written when their batch completed.
 *
 * The step function gets an envelope that parsed (a line that claimed to be
 * an envelope but is malformed is recorded as DATAERR under the step's own
 * name by the loop, never passed to fn).  It adds its own result and
 * returns its outcome; when it has nothing to do for this envelope it
 * leaves the envelope untouched and returns ik_env_outcome(env).
 */
#ifndef IK_STEP_H
#define IK_STEP_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/err.h"

typedef int (*ik_step_fn)(cJSON *env, void *ctx);

#define IK_STEP_GROUP_MAX 512
#define IK_STEP_HOLD_US 2000
/* A line held to be run again (hold below; idemp-claim's in-flight path
 * the same): the first wait and the most a wait grows to. */
#define IK_STEP_RETRY_FIRST_MS 20
#define IK_STEP_RETRY_MAX_MS 500

struct ik_step {
	const char *name;     /* "claim", "debit", "notify", "done": the result key */
	ik_step_fn fn;
	void *ctx;
	int stream;
	/* Optional group commit (stream mode only).  begin returns 0 when a
	 * group is open (fn's writes until commit share one transaction), else
	 * the lines are run one at a time.  commit returns 0 when the group is
	 * durable; non-zero when it was rolled back (the loop then redoes each
	 * line alone). */
	int (*begin)(void *group_ctx);
	int (*commit)(void *group_ctx);
	void *group_ctx;
	/* At most this many lines a group (0: IK_STEP_GROUP_MAX); sqs-ack
	 * uses IK_ACKER_GROUP_MAX (one SQLite transaction, or batches of 10
	 * on SQS, a group). */
	size_t group_max;
	/* Optional, stream mode: asked after each line or group was written;
	 * non-zero ends the loop with that exit code (the step found its
	 * configuration broken, so every further line would fail the same
	 * way). */
	int (*halt)(void *group_ctx);
	/* Optional, stream mode: asked before the loop waits for input, and
	 * again whenever the wait it allowed ended first; returns how many ms
	 * the loop may wait for input before asking again, or -1 for as long
	 * as it takes.  sqs-ack's progress counts are written at most every
	 * 250 ms, and the last of them must not wait for a next line. */
	int (*tick)(void *group_ctx);
	/* Optional, stream mode: envelopes in flight (charge-debit,
	 * charge-notify), instead of fn one at a time.  start takes env: 1
	 * when it finished at once (the loop writes it), 0 when it is now in
	 * flight.  wait moves what is in flight on, returning when one
	 * finished, or fd (when >= 0: stdin, asked only while there is room
	 * for more) is readable (*readable set), or a timer of its own
	 * fired, or timeout_ms passed (-1: no limit of the loop's; the hook
	 * still comes back within its own timers, at most a second); 0, or -1
	 * after a message (the loop then ends, 70).  reap
	 * hands back the finished envelopes, one per call, NULL when there is
	 * none.  At most inflight (0: 1) envelopes are started and not yet
	 * reaped; lines are read while requests are in flight, and each
	 * envelope is written as soon as it is reaped, so envelopes may leave
	 * in another order than they came (idemkit(7)); written envelopes are
	 * flushed when nothing is in flight any more, or IK_STEP_HOLD_US after
	 * the first unflushed one (answers that come close together share a
	 * write, and the next step wakes once for them).  At end of input or a
	 * stop signal nothing more is started, what is in flight is finished
	 * and written before the loop ends, and the lines read and never
	 * started are written on as they came (the next step records what
	 * they say).  A halt ends the starting too, never the writing. */
	size_t inflight;
	int (*start)(cJSON *env, void *ctx);
	int (*wait)(void *ctx, int fd, int *readable, int timeout_ms);
	cJSON *(*reap)(void *ctx);
	/* Optional, every mode: stdout failed (the next step is gone), so
	 * env, answered, cannot be passed on; settle records what it says
	 * another way (settle.h's ik_settle: the store) before it is freed.
	 * No envelope is dropped: those written since the last successful
	 * flush (a failed flush loses them all) and every later one go
	 * here, and the loop ends as at a stop signal (nothing more is
	 * started, what is in flight is finished), 70.  Without it (the
	 * step's work is itself the record: idemp-done, sqs-ack) they are
	 * freed. */
	int (*settle)(cJSON *env, void *settle_ctx);
	/* Optional, stream mode with the group hooks: asked for each envelope
	 * a group answered, before it is written: how many ms the loop may
	 * hold its line to run it again, 0 to write it now.  A held line
	 * takes no group's room while it waits, is run again in a later group
	 * (as the line it came as) after IK_STEP_RETRY_FIRST_MS, doubling to
	 * IK_STEP_RETRY_MAX_MS, and asked about again; it is written with its
	 * last answer once the hook says 0 or the time the hook gave (never
	 * longer than the first answer's) ran out, so envelopes may leave in
	 * another order than they came.  At most IK_STEP_GROUP_MAX are held
	 * (more are written at once).  At end of input the held lines are
	 * still run to their end; at a stop signal or a failed stdout they are
	 * written (or settled) at once with their last answer.  The hook is
	 * asked about every envelope the group path answers, also then (it
	 * may take out what its step left in env for it).  idemp-claim: a copy
	 * whose original is in flight in this same pipeline waits here for
	 * the original's finish. */
	int64_t (*hold)(cJSON *env, void *ctx);
	void *settle_ctx;
};

/* Runs the loop over stdin/stdout; returns the exit code for main. */
int ik_step_run(const struct ik_step *st);

#endif
