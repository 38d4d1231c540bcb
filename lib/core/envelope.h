/* envelope.h: the NDJSON envelope that flows from step to step (DESIGN.md
 * "The envelope").
 *
 * An envelope is a cJSON object: v, queue, messageId, receipt, receiveCount,
 * sentAt, body (the raw message body, always a string), then one result
 * object per step that ran: claim, debit, notify, done, ack.  A step reads
 * one, adds its own result and writes it on, whatever its outcome.
 *
 * A bare ChargeDueEvent (or any line that is not an envelope) is wrapped:
 * the line becomes the body, so even a poison line travels intact.
 */
#ifndef IK_ENVELOPE_H
#define IK_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "core/err.h"

/* Parse one line.  Always returns an envelope in *out (NULL only on
 * ENOMEM, with IK_SOFTWARE).  Returns IK_OK, or IK_DATAERR when the line
 * claimed to be an envelope (has "v") but is malformed: err says why, and
 * *out is a wrapped envelope carrying the line as its body. */
int ik_env_parse(const char *line, size_t len, cJSON **out, ik_err *err);

/* A new envelope around a raw body (used by sqs-recv and the wrapper). */
cJSON *ik_env_new(const char *body);

/* The envelope as one line (no newline), malloc'd; NULL on ENOMEM. */
char *ik_env_print(const cJSON *env);
/* Print plus '\n' to f; 0 or -1. */
int ik_env_write(FILE *f, const cJSON *env);

const char *ik_env_body(const cJSON *env);          /* "" if absent */
const char *ik_env_str(const cJSON *env, const char *field);  /* NULL if absent */
int64_t ik_env_int(const cJSON *env, const char *field, int64_t dflt);

/* The message attribute that carries a message's first-sent time (epoch
 * ms, decimal) through the DLQ forward and re-drives: each is a new
 * message with a new sentAt, and a record must outlive every copy. */
#define IK_ATTR_FIRST_SENT_AT "idemkit.firstSentAt"

/* When the first copy of this message was sent (epoch ms): the
 * envelope's attributes[IK_ATTR_FIRST_SENT_AT] when it is a positive
 * integer, else its sentAt; -1 when it has neither (a bare event). */
int64_t ik_env_first_sent_at(const cJSON *env);

/* The claim's lease as a later step can prove it (DESIGN.md "One
 * decision, one clock").  leaseUntil in a claim is on the clock that runs
 * the lease (the server's on PostgreSQL and Redis, the claiming worker's
 * on SQLite and DynamoDB) and is never compared with this machine's wall
 * clock.  An ACQUIRED claim carries instead:
 *   leaseMs     the lease granted, in ms;
 *   sentBootMs  this machine's boot clock (util.h ik_boot_ms) read before
 *               the claim was sent: the lease began after it, whatever
 *               clock runs it, so measuring from it gives the round trip
 *               away, never takes it;
 *   bootId      the boot that clock belongs to (util.h ik_boot_id).
 * ik_env_add_lease writes them into a claim result. */
int ik_env_add_lease(cJSON *claim, int64_t lease_ms, int64_t sent_boot_ms);
/* The ms left now on env's claim lease, on this machine's boot clock:
 * IK_OK with *left_ms (negative once it ended); IK_EMPTY when env has no
 * claim (the re-notify path: no claim to protect); IK_LEASE_SHORT with err
 * when what is left cannot be proven here -- a claim without leaseMs,
 * sentBootMs or bootId (hand-made, or from an older idemp-claim), claimed
 * on another boot or host, or a boot clock behind the claim's reading.
 * Nothing may be sent to the bank on a lease that cannot be proven. */
int ik_env_lease_left(const cJSON *env, int64_t *left_ms, ik_err *err);

/* The result object a step added, or NULL. */
cJSON *ik_env_result(const cJSON *env, const char *step);
/* Replace (or add) env[step] = a new object {"outcome": name-of-code}
 * and return it so the caller adds more fields.  The claim step writes
 * "ACQUIRED" for IK_OK.  NULL on ENOMEM. */
cJSON *ik_env_set_result(cJSON *env, const char *step, int code);
/* The code of env[step].outcome; -1 when the step has not run, IK_SOFTWARE
 * when the outcome name is unknown. */
int ik_env_step_code(const cJSON *env, const char *step);

/* The envelope's outcome so far: the code of the first step (claim, debit,
 * notify, done, in flow order) whose outcome is not OK, else IK_OK.  A step
 * that passes an envelope through untouched exits with this. */
int ik_env_outcome(const cJSON *env);

/* The verdict: the one outcome that decides what happens to the message,
 * from all the steps' results.  why gets a short static explanation.
 *   claim not OK               -> the claim's code
 *   debit TEMPFAIL             -> TEMPFAIL
 *   debit DECLINED, done OK    -> DECLINED (record FAILED: DLQ, delete)
 *   debit OK, done OK          -> OK when notify is OK, else NOTIFY_FAILED
 *                                 (whatever notify said, or none: recorded
 *                                 DEBITED_NOTIFICATION_FAILED; delete)
 *   done not OK                -> done's code (LEASE_LOST, TEMPFAIL)
 *   a step missing where one is needed -> SOFTWARE (leave: never ack an
 *   unrecorded outcome) */
int ik_env_verdict(const cJSON *env, const char **why);

struct ik_outcome;
/* What sqs-ack's "ack" result says, for the counts made of it
 * (idemkit-code --tally, sqs-ack --progress): *verdict gets the outcome
 * it acted on (NULL: none, the line was not acked); 1 when the message was
 * settled (its delete, after the DLQ if so, succeeded), else 0. */
int ik_env_settled(const cJSON *env, const struct ik_outcome **verdict);

#endif
