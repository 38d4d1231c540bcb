/* acker.h: carry out an envelope's verdict on its message (sqs-ack).
 *
 * The decision is not made here: ik_env_verdict picks the deciding
 * outcome and the table in outcome.c says what it means for the message
 * (delete, delete with an audit line, leave for a while, leave with a
 * backoff, leave, or DLQ then delete).  The acker carries the action out
 * and records it as the envelope's "ack" result.
 *
 * Rules:
 *  - a message to be left (any leave action: TEMPFAIL, DUP_IN_PROGRESS,
 *    a debit or a claim refused as CONFIG...) on the last delivery the
 *    queue's redrive policy allows (ik_queue.max_receive) goes to the DLQ
 *    instead, with its reason (the queue's own redrive would move it at
 *    the next receive without one); IK_ACKER_CONFIG_RUN CONFIG refusals
 *    in a row halt (below);
 *  - DLQ = the original body, unchanged, sent to the DLQ with the reason
 *    and the source in message attributes; the message is deleted only
 *    after that send succeeded (a failed send leaves it: TEMPFAIL);
 *  - a line without a receipt is not a message: DATAERR, nothing acked;
 *  - outside a batch every action is complete when ik_acker_ack returns;
 *    inside one (ik_acker_begin .. ik_acker_flush) every action that needs
 *    the queue (DLQ copy, delete, visibility change) is held and carried
 *    out at the flush, and a held envelope's "ack" result is filled in
 *    then: it must stay alive and unwritten until ik_acker_flush returned;
 *  - at the flush the DLQ copies go first, then the deletes (a DLQ copy's
 *    message among them only once its copy is there) and the visibility
 *    changes; on SQS each of these phases keeps up to 16 calls in flight
 *    (queue.h), and a call's result, or each entry's, is applied to the
 *    envelopes of that call only;
 *  - an ack once started is finished, never abandoned for a signal.
 *
 * A delete batch is IK_QUEUE_BATCH (SQS's limit per call) on SQS; the
 * SQLite queue deletes a whole group (up to IK_ACKER_GROUP_MAX, what
 * sqs-ack's step has ready) in one transaction: one durable commit for all.
 */
#ifndef IK_ACKER_H
#define IK_ACKER_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/err.h"

/* DUP_IN_PROGRESS: visibility = min(2^receiveCount * this, lease left): every
 * look counts, unlike the leave-backoff (below). */
#define IK_ACKER_DUP_BASE_S 1
/* Debits refused as CONFIG (a status in neither of the bank's lists) in a
 * row, none answered between, after which the acker halts (78): the
 * configuration refuses every charge.  Fewer, among good debits, are those
 * charges' own, dead-lettered with their reason on their last delivery. */
#define IK_ACKER_CONFIG_RUN 3
/* The progress file is rewritten at most this often. */
#define IK_ACKER_PROGRESS_MS 250

/* The most deletes held at once: sqs-ack's group_max. */
#define IK_ACKER_GROUP_MAX 512

struct ik_acker_opts {
	const char *queue;     /* NULL: the envelope's "queue", else $IDEMKIT_QUEUE */
	const char *dlq;       /* NULL: ik_queue_dlq_url's default */
	/* leave-backoff (TEMPFAIL, LEASE_SHORT): min(2^n * base, cap), n the
	 * ACQUIRED claim's attempt, else the receiveCount */
	int64_t backoff_base_s, backoff_cap_s;
	int log_failures;      /* a warning log line for each failed ack (stream mode) */
	const char *progress;  /* NULL, or the counts file (below) */
};

struct ik_acker;

/* IK_OK, or IK_SOFTWARE (out of memory).  The strings in o must outlive
 * the acker. */
int ik_acker_open(const struct ik_acker_opts *o, struct ik_acker **out, ik_err *err);
/* Flushes what is held, closes the queues. */
void ik_acker_close(struct ik_acker *a);

/* Decide and act on env; env gets its "ack" result.  Returns the ack's
 * outcome, which for a delete held in a batch is IK_OK until the flush
 * says otherwise (read it from env's "ack" then). */
int ik_acker_ack(struct ik_acker *a, cJSON *env);

/* Hold deletes from now on (step.h's group hooks: 0). */
int ik_acker_begin(void *acker);
/* Send the held deletes, fill in their envelopes' results and stop
 * holding.  Always 0: a failed batch is each entry's own failure,
 * recorded in its envelope, so there is nothing to redo. */
int ik_acker_flush(void *acker);

/* Non-zero once a queue's configuration turned out to be broken, or the
 * bank (or the store) refused IK_ACKER_CONFIG_RUN charges in a row as
 * CONFIG (every further envelope would fail the same way): the exit code
 * to stop with. */
int ik_acker_halted(void *acker);

/* Progress (o.progress): the acker counts the envelopes it finished, as
 * idemkit-code --tally does (NAME TAB COUNT per verdict in the table, then
 * RECEIVED and ACK_FAILED), with LEFT (lines not settled) for UNSETTLED,
 * and replaces the file (a temporary file, then rename) with them at most
 * every IK_ACKER_PROGRESS_MS and at close.  The counts start from the
 * file's, so the one-shot acks of one loop, a process each, add up.  A
 * file that cannot be written is no error: it is for a person to look at.
 * tick (step.h's tick hook) writes counts that are due and returns how
 * many ms until the next are (-1: none pending). */
int ik_acker_tick(void *acker);

#endif
