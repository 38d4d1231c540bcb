/* event.h: ChargeDueEvent v1 (DESIGN.md), parsed and validated from the raw
 * message body, with one precise reason per broken rule, and its fingerprint.
 *
 * Money is integer minor units: the amount's raw JSON text is checked, so
 * 2500.0, 1e3, -5 and "2500" are all refused, never rounded.
 */
#ifndef IK_EVENT_H
#define IK_EVENT_H

#include <stddef.h>

#include "core/err.h"

#define IK_CHARGE_ID_MAX   128
#define IK_ACCOUNT_ID_MAX  64
#define IK_CHARGE_TYPE_MAX 40
#define IK_AMOUNT_MAX      1000000000000LL

struct ik_event {
	char charge_id[IK_CHARGE_ID_MAX + 1];
	char account_id[IK_ACCOUNT_ID_MAX + 1];
	long long amount;
	char currency[4];
	char charge_type[IK_CHARGE_TYPE_MAX + 1];
	char due_date[11];         /* "" when absent */
	char fingerprint[65];      /* hex SHA-256 of accountId|amount|currency|chargeType */
};

/* The identifier rule (chargeId, accountId; idemp-run's keys): 1 to max
 * characters of [A-Za-z0-9._:-].  IK_OK, or IK_DATAERR with err naming
 * name and the first character that breaks it. */
int ik_id_check(const char *name, const char *s, size_t max, ik_err *err);

/* IK_OK, or IK_DATAERR with err naming the field and the rule. */
int ik_event_parse(const char *body, size_t len, struct ik_event *ev, ik_err *err);

/* Best effort: the chargeId of a body that may be invalid, for logs and
 * DLQ attributes; "" when there is none that passes the alphabet check. */
void ik_event_peek_id(const char *body, char out[IK_CHARGE_ID_MAX + 1]);

#endif
