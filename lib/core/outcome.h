/* outcome.h: the exit-code contract, the single source of codes, names,
 * meanings and queue actions (DESIGN.md "Exit-code contract").
 *
 * Codes are API: never renumber, never reuse.  A new outcome gets a new
 * number, a row in outcome.c, a line in man/idemkit.7 and a test.
 */
#ifndef IK_OUTCOME_H
#define IK_OUTCOME_H

enum ik_code {
	IK_OK               = 0,
	IK_EMPTY            = 1,
	IK_DUP_DONE         = 10,
	IK_DUP_IN_PROGRESS  = 11,
	IK_DUP_FAILED       = 12,
	IK_LEASE_LOST       = 13,
	IK_PAYLOAD_MISMATCH = 14,
	IK_LEASE_SHORT      = 15,
	IK_STALE_EVENT      = 16,
	IK_RUN_FAILED       = 17,
	IK_DECLINED         = 20,
	IK_NOTIFY_FAILED    = 21,
	IK_USAGE            = 64,
	IK_DATAERR          = 65,
	IK_SOFTWARE         = 70,
	IK_TEMPFAIL         = 75,
	IK_CONFIG           = 78,
};

/* What sqs-ack does with the message once the envelope's verdict is known. */
enum ik_action {
	IK_ACT_NONE,          /* not a message outcome (usage, empty) */
	IK_ACT_DELETE,        /* finished: delete */
	IK_ACT_DELETE_AUDIT,  /* duplicate of a finished charge: delete, audit line */
	IK_ACT_LEAVE_LEASE,   /* leave; visible again when the holder's lease ends */
	IK_ACT_LEAVE,         /* leave as is */
	IK_ACT_LEAVE_BACKOFF, /* leave; visibility from a backoff on receiveCount */
	IK_ACT_DLQ,           /* send the body to the DLQ, then delete */
};

struct ik_outcome {
	int code;
	const char *name;     /* e.g. "DUP_IN_PROGRESS" */
	const char *meaning;
	enum ik_action action;
	const char *action_text;
};

/* The whole table, in code order; *n gets its length. */
const struct ik_outcome *ik_outcomes(int *n);
/* NULL when the code or name is not in the table. */
const struct ik_outcome *ik_outcome_by_code(int code);
const struct ik_outcome *ik_outcome_by_name(const char *name);
/* Name for a code; "UNKNOWN" for a code outside the table. */
const char *ik_code_name(int code);
const char *ik_action_name(enum ik_action a);

#endif
