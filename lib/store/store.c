/* store.c: the store port: what all adapters share (tokens, states,
 * records as JSON, the claim and finish decisions, the outbox's setting
 * and eventId).  See store.h; picking an adapter from a URL is
 * open_store.c's. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/utf8.h"
#include "core/util.h"
#include "store/store.h"

static const char *const state_names[] = {
	[IK_ST_NONE] = "NONE",
	[IK_ST_IN_PROGRESS] = "IN_PROGRESS",
	[IK_ST_DONE] = "DONE",
	[IK_ST_FAILED] = "FAILED",
	[IK_ST_DNF] = "DEBITED_NOTIFICATION_FAILED",
};

const char *
ik_state_name(enum ik_state s)
{
	return (unsigned)s < sizeof state_names / sizeof state_names[0] ?
	    state_names[s] : "NONE";
}

enum ik_state
ik_state_parse(const char *s)
{
	for (size_t i = 1; s && i < sizeof state_names / sizeof state_names[0]; i++)
		if (strcmp(s, state_names[i]) == 0)
			return (enum ik_state)i;
	return IK_ST_NONE;
}

void
ik_record_free(struct ik_record *r)
{
	free(r->key);
	free(r->owner);
	free(r->fingerprint);
	free(r->event);
	free(r->debit_ref);
	free(r->last_error);
	free(r->history);
	memset(r, 0, sizeof *r);
}

static void
add_str(cJSON *o, const char *k, const char *v)
{
	if (v)
		cJSON_AddStringToObject(o, k, v);
	else
		cJSON_AddNullToObject(o, k);
}

cJSON *
ik_record_json(const struct ik_record *r, int64_t now_ms)
{
	cJSON *o = cJSON_CreateObject();
	/* leaseUntil comes from the store (any number a DynamoDB item holds):
	 * subtract only when it cannot overflow. */
	int64_t left = r->lease_until > now_ms ? r->lease_until - now_ms : 0;

	if (!o)
		return NULL;
	add_str(o, "chargeId", r->key);
	cJSON_AddStringToObject(o, "state", ik_state_name(r->state));
	add_str(o, "owner", r->owner);
	cJSON_AddNumberToObject(o, "leaseUntil", (double)r->lease_until);
	cJSON_AddNumberToObject(o, "leaseRemainingMs",
	    r->state == IK_ST_IN_PROGRESS && left > 0 ? (double)left : 0);
	cJSON_AddNumberToObject(o, "attempts", (double)r->attempts);
	add_str(o, "fingerprint", r->fingerprint);
	add_str(o, "debitRef", r->debit_ref);
	add_str(o, "lastError", r->last_error);
	cJSON_AddNumberToObject(o, "createdAt", (double)r->created_at);
	cJSON_AddNumberToObject(o, "updatedAt", (double)r->updated_at);
	/* expiresAt stays epoch seconds, the unit of DynamoDB's TTL attribute
	 * and of every reader so far (codes and fields are API); expiresAtMs
	 * is the same instant in the milliseconds of every other time here.
	 * In double: no overflow for any number a store holds. */
	cJSON_AddNumberToObject(o, "expiresAt", (double)r->expires_at);
	cJSON_AddNumberToObject(o, "expiresAtMs", (double)r->expires_at * 1000.0);
	add_str(o, "event", r->event);
	cJSON *h = r->history ? cJSON_Parse(r->history) : NULL;
	if (!cJSON_IsArray(h)) {
		cJSON_Delete(h);
		h = cJSON_CreateArray();
	}
	cJSON_AddItemToObject(o, "history", h);
	return o;
}

char *
ik_history_entry(const struct ik_hist *h)
{
	cJSON *o = cJSON_CreateObject();
	char *s;

	if (!o)
		return NULL;
	cJSON_AddNumberToObject(o, "at", (double)h->at);
	cJSON_AddStringToObject(o, "op", h->op);
	if (strcmp(h->op, "claim") == 0) {
		cJSON_AddNumberToObject(o, "attempt", (double)h->attempt);
		cJSON_AddNumberToObject(o, "leaseUntil", (double)h->lease_until);
	}
	if (strcmp(h->op, "finish") == 0 || strcmp(h->op, "renotified") == 0)
		cJSON_AddStringToObject(o, "state", ik_state_name(h->state));
	if (strcmp(h->op, "renotified") != 0)
		add_str(o, "owner", h->owner);
	if (strcmp(h->op, "finish") == 0) {
		add_str(o, "debitRef", h->debit_ref);
		add_str(o, "error", h->error);
		if (h->bank_replayed)
			cJSON_AddTrueToObject(o, "bankReplayed");
	}
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return s;
}

char *
ik_history_append(const char *old, const char *entry)
{
	cJSON *a = old && *old ? cJSON_Parse(old) : cJSON_CreateArray();
	cJSON *e = cJSON_Parse(entry);
	char *s = NULL;

	if (cJSON_IsArray(a) && cJSON_IsObject(e)) {
		cJSON_AddItemToArray(a, e);
		e = NULL;
		while (cJSON_GetArraySize(a) > IK_HISTORY_MAX)
			cJSON_DeleteItemFromArray(a, 0);
		s = cJSON_PrintUnformatted(a);
	}
	cJSON_Delete(e);
	cJSON_Delete(a);
	return s;
}

/* A finish whose text had to be repaired: the repaired request and its
 * copies live until the adapter answered. */
struct clean_finish {
	struct ik_finish_req req;
	char *copy[2];
	ik_store_cb cb;
	void *arg;
};

static void
clean_finish_free(struct clean_finish *f)
{
	free(f->copy[0]);
	free(f->copy[1]);
	free(f);
}

/* IK_OK with *out NULL when req's text is valid UTF-8 already (the common
 * case: no copy), else with *out the repaired request; or IK_SOFTWARE. */
static int
clean_finish(const struct ik_finish_req *req, struct clean_finish **out, ik_err *err)
{
	struct clean_finish *f;

	*out = NULL;
	if ((!req->last_error || ik_utf8_valid(req->last_error, strlen(req->last_error))) &&
	    (!req->debit_ref || ik_utf8_valid(req->debit_ref, strlen(req->debit_ref))))
		return IK_OK;
	if (!(f = calloc(1, sizeof *f)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	f->req = *req;
	if (ik_utf8_clean(req->last_error, &f->req.last_error, &f->copy[0]) < 0 ||
	    ik_utf8_clean(req->debit_ref, &f->req.debit_ref, &f->copy[1]) < 0) {
		clean_finish_free(f);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	ik_log(IK_LOG_WARN, "the finish's reason or reference is not valid UTF-8: "
	    "invalid bytes recorded as U+FFFD", "chargeId", req->key, NULL);
	*out = f;
	return IK_OK;
}

int
ik_store_finish(struct ik_store *s, const struct ik_finish_req *req, ik_err *err)
{
	struct clean_finish *f;
	int rc;

	if ((rc = clean_finish(req, &f, err)) != IK_OK)
		return rc;
	rc = s->ops->finish(s, f ? &f->req : req, err);
	if (f)
		clean_finish_free(f);
	return rc;
}

static void
clean_finish_done(void *arg, int rc, const ik_err *err)
{
	struct clean_finish *f = arg;
	ik_store_cb cb = f->cb;
	void *cbarg = f->arg;

	clean_finish_free(f);
	cb(cbarg, rc, err);
}

int
ik_store_finish_start(struct ik_store *s, const struct ik_finish_req *req,
    ik_store_cb cb, void *arg, ik_err *err)
{
	struct clean_finish *f;
	int rc;

	if ((rc = clean_finish(req, &f, err)) != IK_OK)
		return rc;
	if (!f)
		return s->ops->finish_start(s, req, cb, arg, err);
	f->cb = cb;
	f->arg = arg;
	if ((rc = s->ops->finish_start(s, &f->req, clean_finish_done, f, err)) != IK_OK)
		clean_finish_free(f);   /* nothing started: no callback comes */
	return rc;
}

int
ik_claim_decide(const struct ik_claim_req *req, struct ik_claim_res *res, ik_err *err)
{
	const struct ik_record *r = &res->cur;

	if (!r->fingerprint || !req->fingerprint || strcmp(r->fingerprint, req->fingerprint) != 0) {
		res->code = IK_PAYLOAD_MISMATCH;
		return IK_OK;
	}
	switch (r->state) {
	case IK_ST_DONE:
	case IK_ST_DNF:
		res->code = IK_DUP_DONE;
		return IK_OK;
	case IK_ST_FAILED:
		res->code = IK_DUP_FAILED;
		return IK_OK;
	case IK_ST_IN_PROGRESS:
		if (r->owner && req->token && strcmp(r->owner, req->token) == 0) {
			res->code = IK_OK;
			res->attempt = r->attempts;
			res->lease_until = r->lease_until;
			return IK_OK;
		}
		if (r->lease_until < req->now_ms)
			return IK_EMPTY;
		res->code = IK_DUP_IN_PROGRESS;
		res->lease_until = r->lease_until;
		return IK_OK;
	case IK_ST_NONE:
		break;
	}
	return ik_errf(err, IK_SOFTWARE, "record %.128s is in a state this version does "
	    "not know; refusing the claim", r->key ? r->key : req->key);
}

/* This host's name as tokens carry it: cut to 63 characters, anything
 * but [A-Za-z0-9._-] as '_', so the tail parses back. */
static void
this_host(char host[64])
{
	host[0] = '\0';
	if (gethostname(host, 63) < 0 || !host[0])
		strcpy(host, "unknown");
	host[63] = '\0';
	for (char *h = host; *h; h++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *h))
			*h = '_';
}

void
ik_store_token(char out[IK_TOKEN_HEX])
{
	unsigned char raw[16];
	char host[64], *end;
	const char *p = getenv("IDEMKIT_RUN_PID");
	long pid = p && *p ? strtol(p, &end, 10) : 0;

	if (sodium_init() < 0)
		abort();  /* no randomness source: nothing safe can follow */
	randombytes_buf(raw, sizeof raw);
	ik_hex(raw, sizeof raw, out);
	if (!p || !*p || *end || pid <= 0)
		pid = (long)getpid();
	this_host(host);
	snprintf(out + 2 * sizeof raw, IK_TOKEN_HEX - 2 * sizeof raw, "@%s:%ld", host, pid);
}

int
ik_owner_holder(const char *owner, char short_tok[9], char host[64], long *pid, int *local)
{
	const char *at, *colon;
	char *end, me[64];
	size_t n;

	*local = 0;
	snprintf(short_tok, 9, "%.8s", owner ? owner : "?");
	host[0] = '\0';
	*pid = 0;
	if (!owner || !(at = strchr(owner, '@')) || !(colon = strrchr(at, ':')) ||
	    (n = (size_t)(colon - at - 1)) == 0 || n > 63)
		return 0;
	*pid = strtol(colon + 1, &end, 10);
	if (*end || *pid <= 0)
		return 0;
	memcpy(host, at + 1, n);
	host[n] = '\0';
	this_host(me);
	*local = strcmp(host, me) == 0;
	return 1;
}

int
ik_finish_decide(const struct ik_finish_req *req, const struct ik_record *cur)
{
	if (cur && cur->state == req->state && cur->owner && req->token &&
	    strcmp(cur->owner, req->token) == 0)
		return IK_OK;
	return IK_LEASE_LOST;
}

int
ik_store_lease(const char *opt, int64_t *ms)
{
	const char *v = opt ? opt : getenv("IDEMKIT_LEASE");

	*ms = IK_LEASE_DEFAULT_MS;
	if (!v || (!opt && !*v))
		return IK_OK;
	if (ik_opt_duration(opt ? "--lease" : "IDEMKIT_LEASE", v, IK_LEASE_MIN_MS,
	    IK_LEASE_MAX_MS, ms) < 0)
		return opt ? IK_USAGE : IK_CONFIG;
	return IK_OK;
}

int
ik_store_retention(int64_t lease_ms, int64_t *ms, ik_err *err)
{
	const char *v = getenv("IDEMKIT_RETENTION");

	*ms = IK_RETENTION_DEFAULT_MS;
	if (v && *v && (ik_parse_duration(v, ms) < 0 || *ms > IK_RETENTION_MAX_MS))
		return ik_errf(err, IK_CONFIG, "IDEMKIT_RETENTION: \"%.64s\" is not a duration "
		    "up to 3650d", v);
	if (*ms <= lease_ms)
		return ik_errf(err, IK_CONFIG, "IDEMKIT_RETENTION (%llds) is not longer than the "
		    "lease (%llds): a record would expire while its claim is live and a second "
		    "worker claim it afresh", (long long)(*ms / 1000), (long long)(lease_ms / 1000));
	if (*ms < 14LL * 86400000)
		ik_log(IK_LOG_WARN, "retention under 14 days: a redelivery or DLQ redrive "
		    "after the record expires would debit again", "retention", v, NULL);
	return IK_OK;
}

int
ik_store_inflight(const char *opt, size_t *out)
{
	const char *v = opt ? opt : getenv("IDEMKIT_STORE_INFLIGHT");
	long long n;

	*out = IK_STORE_INFLIGHT_DEFAULT;
	if (!v || (!opt && !*v))
		return IK_OK;
	if (ik_opt_int(opt ? "--inflight" : "IDEMKIT_STORE_INFLIGHT", v, 1,
	    IK_STORE_INFLIGHT_MAX, &n) < 0)
		return opt ? IK_USAGE : IK_CONFIG;
	*out = (size_t)n;
	return IK_OK;
}

/* ---- what every store's outbox shares (outbox.h: the relay) ---- */

const char *
ik_outbox_url(void)
{
	const char *u = getenv("IDEMKIT_OUTBOX");
	return u && *u ? u : NULL;
}

void
ik_outbox_event_id(const char *op, const char *key, const char *owner,
    char out[IK_EVENT_ID_HEX])
{
	static const char tag[] = "idemkit.outbox.v1";
	crypto_hash_sha256_state h;
	unsigned char d[crypto_hash_sha256_BYTES];

	/* Each part with its NUL, so no two (op, key, owner) hash alike. */
	crypto_hash_sha256_init(&h);
	crypto_hash_sha256_update(&h, (const unsigned char *)tag, sizeof tag);
	crypto_hash_sha256_update(&h, (const unsigned char *)op, strlen(op) + 1);
	crypto_hash_sha256_update(&h, (const unsigned char *)key, strlen(key) + 1);
	crypto_hash_sha256_update(&h, (const unsigned char *)(owner ? owner : ""),
	    owner ? strlen(owner) + 1 : 1);
	crypto_hash_sha256_final(&h, d);
	ik_hex(d, (IK_EVENT_ID_HEX - 1) / 2, out);   /* 128 of the 256 bits */
}

void
ik_outbox_ev_free(struct ik_outbox_ev *e)
{
	free(e->pos);
	free(e->id);
	free(e->charge_id);
	free(e->type);
	free(e->body);
	memset(e, 0, sizeof *e);
}

int
ik_outbox_ev_copy(struct ik_outbox_ev *to, const struct ik_outbox_ev *from)
{
	*to = (struct ik_outbox_ev){ .seq = from->seq, .at = from->at };
	to->pos = from->pos ? strdup(from->pos) : NULL;
	to->id = strdup(from->id);
	to->charge_id = strdup(from->charge_id);
	to->type = strdup(from->type);
	to->body = strdup(from->body);
	if ((from->pos && !to->pos) || !to->id || !to->charge_id || !to->type || !to->body) {
		ik_outbox_ev_free(to);
		return -1;
	}
	return 0;
}

int
ik_store_check(struct ik_store *s, ik_err *err)
{
	struct ik_record r = { 0 };
	int rc = s->ops->get(s, IK_STORE_CHECK_KEY, &r, err);

	ik_record_free(&r);
	if (rc != IK_OK && rc != IK_EMPTY)
		return rc;
	return s->ops->claim_check ? s->ops->claim_check(s, err) : IK_OK;
}

void
ik_store_close(struct ik_store *s)
{
	if (!s)
		return;
	if (s->ops && s->ops->close)
		s->ops->close(s);
	free(s->url);
	free(s);
}
