/* envelope.c: NDJSON envelopes; see envelope.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/envelope.h"
#include "core/json.h"
#include "core/outcome.h"
#include "core/util.h"

cJSON *
ik_env_new(const char *body)
{
	cJSON *env = cJSON_CreateObject();

	if (!env)
		return NULL;
	if (!cJSON_AddNumberToObject(env, "v", 1) ||
	    !cJSON_AddStringToObject(env, "body", body ? body : "")) {
		cJSON_Delete(env);
		return NULL;
	}
	return env;
}

/* A copy of line[0..len) safe to hold in a C string: NUL bytes (which no
 * queue accepts and cJSON cannot carry) become U+FFFD. */
static char *
body_copy(const char *line, size_t len, int *had_nul)
{
	size_t nul = 0, j = 0;
	char *s;

	for (size_t i = 0; i < len; i++)
		nul += line[i] == '\0';
	*had_nul = nul > 0;
	if (!(s = malloc(len + 2 * nul + 1)))
		return NULL;
	for (size_t i = 0; i < len; i++) {
		if (line[i] == '\0') {
			memcpy(s + j, "\xef\xbf\xbd", 3);
			j += 3;
		} else {
			s[j++] = line[i];
		}
	}
	s[j] = '\0';
	return s;
}

int
ik_env_parse(const char *line, size_t len, cJSON **out, ik_err *err)
{
	const char *end = NULL;
	cJSON *o = NULL, *body;
	char *copy;
	int had_nul, rc = IK_OK;

	*out = NULL;
	/* An envelope (every line but the first step's) needs no copy. */
	had_nul = memchr(line, '\0', len) != NULL;
	if (!had_nul)
		o = cJSON_ParseWithLengthOpts(line, len, &end, 0);
	if (o && cJSON_IsObject(o) && cJSON_GetObjectItemCaseSensitive(o, "v")) {
		/* It says it is an envelope: hold it to that. */
		body = cJSON_GetObjectItemCaseSensitive(o, "body");
		if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "v")) ||
		    cJSON_GetObjectItemCaseSensitive(o, "v")->valuedouble != 1)
			rc = ik_errf(err, IK_DATAERR, "envelope: unsupported version \"v\" (want 1)");
		else if (!cJSON_IsString(body))
			rc = ik_errf(err, IK_DATAERR, "envelope: \"body\" missing or not a string");
		else {
			*out = o;
			return IK_OK;
		}
	}
	cJSON_Delete(o);
	/* A bare event, or anything else: the line itself is the body. */
	if (!(copy = body_copy(line, len, &had_nul)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	*out = ik_env_new(copy);
	free(copy);
	if (!*out)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (had_nul)
		rc = ik_errf(err, IK_DATAERR, "body: contains a NUL byte");
	return rc;
}

char *
ik_env_print(const cJSON *env)
{
	return ik_json_print(env);
}

int
ik_env_write(FILE *f, const cJSON *env)
{
	/* One buffer for the process's whole stream, reused: an envelope
	 * would otherwise cost a malloc and a few reallocs per step. */
	static struct ik_jbuf b;

	b.len = 0;
	b.oom = 0;
	if (ik_jbuf_json(&b, env) < 0)
		return -1;
	ik_jbuf_put(&b, "\n", 1);
	if (b.oom)
		return -1;
	return fwrite(b.p, 1, b.len, f) == b.len ? 0 : -1;
}

const char *
ik_env_body(const cJSON *env)
{
	const char *s = ik_env_str(env, "body");
	return s ? s : "";
}

const char *
ik_env_str(const cJSON *env, const char *field)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(env, field);
	return cJSON_IsString(it) ? it->valuestring : NULL;
}

int64_t
ik_env_int(const cJSON *env, const char *field, int64_t dflt)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(env, field);
	return cJSON_IsNumber(it) ? (int64_t)it->valuedouble : dflt;
}

int64_t
ik_env_first_sent_at(const cJSON *env)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(env, "attributes");
	const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, IK_ATTR_FIRST_SENT_AT));
	int64_t sent = ik_env_int(env, "sentAt", -1);
	long long t;

	/* not a time of ours: fall back to the copy's own */
	if (v && ik_parse_int(v, 1, INT64_MAX / 2, &t) == 0)
		return (int64_t)t;
	return sent > 0 ? sent : -1;
}

cJSON *
ik_env_result(const cJSON *env, const char *step)
{
	cJSON *it = cJSON_GetObjectItemCaseSensitive(env, step);
	return cJSON_IsObject(it) ? it : NULL;
}

cJSON *
ik_env_set_result(cJSON *env, const char *step, int code)
{
	cJSON *r = cJSON_CreateObject();
	const char *name = code == IK_OK && strcmp(step, "claim") == 0 ?
	    "ACQUIRED" : ik_code_name(code);

	if (!r)
		return NULL;
	if (!cJSON_AddStringToObject(r, "outcome", name)) {
		cJSON_Delete(r);
		return NULL;
	}
	if (cJSON_GetObjectItemCaseSensitive(env, step))
		cJSON_ReplaceItemInObjectCaseSensitive(env, step, r);
	else
		cJSON_AddItemToObject(env, step, r);
	return r;
}

int
ik_env_add_lease(cJSON *claim, int64_t lease_ms, int64_t sent_boot_ms)
{
	const char *boot = ik_boot_id();

	if (!cJSON_AddNumberToObject(claim, "leaseMs", (double)lease_ms) ||
	    !cJSON_AddNumberToObject(claim, "sentBootMs", (double)sent_boot_ms))
		return -1;
	/* no boot id, no proof: the steps after will not call the bank */
	if (*boot && !cJSON_AddStringToObject(claim, "bootId", boot))
		return -1;
	return 0;
}

/* A whole number of ms in [0, 2^53) from claim[name], or -1. */
static int64_t
claim_ms(const cJSON *claim, const char *name)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(claim, name);
	double d = cJSON_IsNumber(n) ? n->valuedouble : -1;

	return d >= 0 && d < 9007199254740992.0 && d == (double)(int64_t)d ? (int64_t)d : -1;
}

int
ik_env_lease_left(const cJSON *env, int64_t *left_ms, ik_err *err)
{
	const cJSON *claim = ik_env_result(env, "claim");
	const char *boot, *here = ik_boot_id();
	int64_t lease, sent, now;

	if (!claim)
		return IK_EMPTY;
	lease = claim_ms(claim, "leaseMs");
	sent = claim_ms(claim, "sentBootMs");
	boot = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(claim, "bootId"));
	if (lease < 0 || sent < 0 || !boot)
		return ik_errf(err, IK_LEASE_SHORT, "the claim does not say how long its lease "
		    "is and when it began on this machine (leaseMs, sentBootMs, bootId): the "
		    "time left cannot be proven");
	if (!*here || strcmp(boot, here) != 0)
		return ik_errf(err, IK_LEASE_SHORT, "the claim was made on another boot or host "
		    "(bootId): the time left on its lease cannot be measured here");
	now = ik_boot_ms();
	if (now < sent)
		return ik_errf(err, IK_LEASE_SHORT, "this machine's boot clock is behind the "
		    "claim's (sentBootMs): the time left on its lease cannot be proven");
	/* both below 2^53: no overflow */
	*left_ms = lease - (now - sent);
	return IK_OK;
}

int
ik_env_step_code(const cJSON *env, const char *step)
{
	const cJSON *r = ik_env_result(env, step);
	const struct ik_outcome *o;
	const char *name;

	if (!r)
		return -1;
	name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "outcome"));
	o = ik_outcome_by_name(name);
	return o ? o->code : IK_SOFTWARE;
}

int
ik_env_settled(const cJSON *env, const struct ik_outcome **verdict)
{
	const cJSON *ack = ik_env_result(env, "ack");
	const char *act = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ack, "action"));

	*verdict = ik_outcome_by_name(cJSON_GetStringValue(
	    cJSON_GetObjectItemCaseSensitive(ack, "verdict")));
	return *verdict && act && ik_env_step_code(env, "ack") == IK_OK &&
	    (strcmp(act, "delete") == 0 || strcmp(act, "delete-audit") == 0 ||
	    strcmp(act, "dlq") == 0);
}

int
ik_env_outcome(const cJSON *env)
{
	static const char *const steps[] = { "claim", "debit", "notify", "done" };

	for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		int c = ik_env_step_code(env, steps[i]);
		if (c > 0)
			return c;
	}
	return IK_OK;
}

int
ik_env_verdict(const cJSON *env, const char **why)
{
	int claim = ik_env_step_code(env, "claim");
	int debit = ik_env_step_code(env, "debit");
	int notify = ik_env_step_code(env, "notify");
	int done = ik_env_step_code(env, "done");
	const char *dummy;

	if (!why)
		why = &dummy;
	if (claim < 0) {
		*why = "not claimed: no outcome is recorded";
		return IK_SOFTWARE;
	}
	if (claim != IK_OK) {
		*why = "claim";
		return claim;
	}
	if (debit < 0) {
		*why = "claimed but not debited";
		return IK_SOFTWARE;
	}
	if (debit != IK_OK && debit != IK_DECLINED) {
		*why = "debit";
		return debit;
	}
	/* Debited or declined: what decides now is whether it is recorded.
	 * After a good debit, a notification that is anything but OK (or
	 * missing) was recorded DEBITED_NOTIFICATION_FAILED: delete. */
	if (done < 0) {
		*why = "outcome not recorded";
		return IK_SOFTWARE;
	}
	if (done != IK_OK) {
		*why = "done";
		return done;
	}
	if (debit == IK_DECLINED) {
		*why = "debit";
		return IK_DECLINED;
	}
	if (notify == IK_OK) {
		*why = "done";
		return IK_OK;
	}
	*why = notify < 0 ? "debited, no notification result: recorded "
	    "DEBITED_NOTIFICATION_FAILED" : "notify";
	return IK_NOTIFY_FAILED;
}
