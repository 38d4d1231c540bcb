/* settle.h: what an envelope's results call for in the store, in one
 * place: idemp-done records it, and a step that cannot write an answered
 * envelope records it itself (step.h's settle; DESIGN.md "No step drops an
 * answered envelope").
 */
#ifndef IK_SETTLE_H
#define IK_SETTLE_H

#include <cjson/cJSON.h>

#include "store/store.h"

/* The state the envelope's results call for, or IK_ST_NONE when there is
 * nothing to record yet.  Once the debit said OK the money moved: whatever
 * the notification did -- failed, could not be configured, crashed, ran out
 * of lease, never ran -- the record ends DEBITED_NOTIFICATION_FAILED (the
 * re-notify job sends it later), never IN_PROGRESS for a second debit. */
enum ik_state ik_settle_state(const cJSON *env);

/* Why the record is what it is, for lastError (NULL: nothing to say). */
const char *ik_settle_last_error(const cJSON *env);

/* Whether the bank answered the envelope's debit as a replay of one it
 * had made already (charge-debit's debit.replayed): for the finish's
 * history entry (store.h). */
int ik_settle_bank_replayed(const cJSON *env);

/* step.h's settle over a struct ik_store_lazy (lazy): records env's
 * answers in the store instead of passing them on, fenced by the claim's
 * token.  A claim we hold whose debit was never sent (no debit result yet,
 * or LEASE_SHORT) is released, so a retry may claim it at once; a finished
 * debit is finished as idemp-done would (DNF after a good debit, FAILED
 * after a decline); anything else (not our claim, a transient debit whose
 * fate the bank has not told) is left to the lease.  Returns the outcome
 * of the write (IK_OK, IK_LEASE_LOST, an error, logged) or IK_EMPTY when
 * there was nothing to record. */
int ik_settle(cJSON *env, void *lazy);

#endif
