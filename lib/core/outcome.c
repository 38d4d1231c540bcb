/* outcome.c: the table behind outcome.h.  man/idemkit.7 prints the same rows;
 * tests/outcome.bats checks that the page and this table agree. */
#include <string.h>

#include "core/outcome.h"

static const struct ik_outcome table[] = {
	{ IK_OK, "OK",
	  "the step did its job (claim ACQUIRED, debited, notified, recorded, acked)",
	  IK_ACT_DELETE, "after a finished record: delete" },
	{ IK_EMPTY, "EMPTY",
	  "nothing to do (no message received; no record matched)",
	  IK_ACT_NONE, "-" },
	{ IK_DUP_DONE, "DUP_DONE",
	  "key already DONE or DEBITED_NOTIFICATION_FAILED",
	  IK_ACT_DELETE_AUDIT, "delete, audit line" },
	{ IK_DUP_IN_PROGRESS, "DUP_IN_PROGRESS",
	  "another holder's lease is live",
	  IK_ACT_LEAVE_LEASE, "leave; backoff from receiveCount (base 1s), at most the lease remaining" },
	{ IK_DUP_FAILED, "DUP_FAILED",
	  "key previously FAILED",
	  IK_ACT_DLQ, "DLQ, then delete" },
	{ IK_LEASE_LOST, "LEASE_LOST",
	  "this token no longer owns the record",
	  IK_ACT_LEAVE, "leave" },
	{ IK_PAYLOAD_MISMATCH, "PAYLOAD_MISMATCH",
	  "same chargeId, different fingerprint",
	  IK_ACT_DLQ, "DLQ, then delete" },
	{ IK_LEASE_SHORT, "LEASE_SHORT",
	  "the claim's lease has less time left than the bank call needs; nothing was sent",
	  IK_ACT_LEAVE_BACKOFF, "(claim released) leave; backoff from the claim's attempt, else receiveCount" },
	{ IK_STALE_EVENT, "STALE_EVENT",
	  "no record, and the message was first sent longer ago than records are kept: its record may have expired",
	  IK_ACT_DLQ, "(record FAILED) DLQ, then delete" },
	{ IK_RUN_FAILED, "RUN_FAILED",
	  "idemp-run: the command ran and failed (non-zero exit or a signal); its claim was released or recorded FAILED",
	  IK_ACT_NONE, "-" },
	{ IK_DECLINED, "DECLINED",
	  "core banking refused the debit permanently",
	  IK_ACT_DLQ, "(record FAILED) DLQ, then delete" },
	{ IK_NOTIFY_FAILED, "NOTIFY_FAILED",
	  "notification failed after its retries",
	  IK_ACT_DELETE, "(record DEBITED_NOTIFICATION_FAILED) delete" },
	{ IK_USAGE, "USAGE",
	  "bad command line",
	  IK_ACT_NONE, "-" },
	{ IK_DATAERR, "DATAERR",
	  "malformed envelope or event",
	  IK_ACT_DLQ, "DLQ, then delete" },
	{ IK_SOFTWARE, "SOFTWARE",
	  "internal error",
	  IK_ACT_LEAVE, "leave" },
	{ IK_TEMPFAIL, "TEMPFAIL",
	  "transient: store, queue or bank unreachable, throttled, timed out",
	  IK_ACT_LEAVE_BACKOFF, "leave; backoff from the claim's attempt, else receiveCount" },
	{ IK_CONFIG, "CONFIG",
	  "missing or invalid configuration or credentials",
	  IK_ACT_LEAVE, "leave" },
};

const struct ik_outcome *
ik_outcomes(int *n)
{
	*n = (int)(sizeof table / sizeof table[0]);
	return table;
}

const struct ik_outcome *
ik_outcome_by_code(int code)
{
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (table[i].code == code)
			return &table[i];
	return NULL;
}

const struct ik_outcome *
ik_outcome_by_name(const char *name)
{
	if (!name)
		return NULL;
	if (strcmp(name, "ACQUIRED") == 0)  /* the claim step's name for OK */
		return &table[0];
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

const char *
ik_code_name(int code)
{
	const struct ik_outcome *o = ik_outcome_by_code(code);
	return o ? o->name : "UNKNOWN";
}

const char *
ik_action_name(enum ik_action a)
{
	switch (a) {
	case IK_ACT_NONE:          return "none";
	case IK_ACT_DELETE:        return "delete";
	case IK_ACT_DELETE_AUDIT:  return "delete-audit";
	case IK_ACT_LEAVE_LEASE:   return "leave-lease";
	case IK_ACT_LEAVE:         return "leave";
	case IK_ACT_LEAVE_BACKOFF: return "leave-backoff";
	case IK_ACT_DLQ:           return "dlq";
	}
	return "none";
}
