/* settle.c: see settle.h. */
#include "core/envelope.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/settle.h"
#include "open/open_store.h"

static const char *
field(const cJSON *env, const char *step, const char *name)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
	    ik_env_result(env, step), name));
}

enum ik_state
ik_settle_state(const cJSON *env)
{
	int debit = ik_env_step_code(env, "debit");

	if (debit == IK_DECLINED)
		return IK_ST_FAILED;
	if (debit != IK_OK)
		return IK_ST_NONE;
	return ik_env_step_code(env, "notify") == IK_OK ? IK_ST_DONE : IK_ST_DNF;
}

const char *
ik_settle_last_error(const cJSON *env)
{
	if (field(env, "debit", "error"))
		return field(env, "debit", "error");
	if (ik_env_step_code(env, "debit") == IK_OK && ik_env_step_code(env, "notify") < 0)
		return "no notification result: charge-notify did not run or wrote nothing";
	return field(env, "notify", "error");
}

int
ik_settle_bank_replayed(const cJSON *env)
{
	return ik_env_step_code(env, "debit") == IK_OK && cJSON_IsTrue(
	    cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "debit"), "replayed"));
}

int
ik_settle(cJSON *env, void *lazy)
{
	const char *key = field(env, "claim", "chargeId");
	const char *token = field(env, "claim", "token");
	int debit = ik_env_step_code(env, "debit"), rc;
	enum ik_state state = ik_settle_state(env);
	struct ik_store *store;
	ik_err err = { 0 };

	if (ik_env_step_code(env, "claim") != IK_OK || !key || !token)
		return IK_EMPTY;   /* not our claim: the store has nothing of ours */
	if (state == IK_ST_NONE && debit >= 0 && debit != IK_LEASE_SHORT)
		return IK_EMPTY;   /* a transient debit: the lease decides */
	if (!(store = ik_store_lazy_get(lazy, &err)))
		rc = err.code;
	else if (state == IK_ST_NONE)
		rc = store->ops->release(store, key, token, ik_now_ms(), &err);
	else
		rc = store->ops->finish(store, &(struct ik_finish_req){ .key = key,
		    .token = token, .state = state, .debit_ref = field(env, "debit", "ref"),
		    .last_error = ik_settle_last_error(env),
		    .bank_replayed = ik_settle_bank_replayed(env), .now_ms = ik_now_ms() }, &err);
	ik_log(rc == IK_OK ? IK_LOG_WARN : IK_LOG_ERROR,
	    "envelope not written: recorded in the store instead", "chargeId", key,
	    "messageId", ik_env_str(env, "messageId"),
	    "state", state == IK_ST_NONE ? "IN_PROGRESS (released)" : ik_state_name(state),
	    "outcome", ik_code_name(rc), "error", rc == IK_OK || rc == IK_LEASE_LOST ? NULL : err.msg,
	    NULL);
	return rc;
}
