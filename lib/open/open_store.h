/* open_store.h: the store port's factory (store.h is the port): a store
 * opened from its URL, and the store the envelope steps open on first
 * use.  The only code that names the adapters (open_store.c). */
#ifndef IK_STORE_OPEN_H
#define IK_STORE_OPEN_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "store/store.h"

/* url: "sqlite:PATH", "dynamodb:TABLE", "redis://...", or NULL for
 * $IDEMKIT_STORE, else sqlite:STATE_DIR/idempotency.db.  When
 * $IDEMKIT_CACHE is set, the store returned is the cache (store_cache.c)
 * in front of that one.  A url given here (from argv) must carry no
 * password.  IK_OK or IK_CONFIG/IK_TEMPFAIL. */
int ik_store_open(const char *url, struct ik_store **out, ik_err *err);
/* The same for a command that only reads (idemp-show, -list, -stats):
 * a store that does not exist is IK_CONFIG "no store at URL" naming the
 * variables that choose it, never created empty. */
int ik_store_open_existing(const char *url, struct ik_store **out, ik_err *err);
/* The URL forms ik_store_open takes, from its table ("sqlite:PATH,
 * dynamodb:TABLE, ... or rediss://HOST:PORT"), for help and messages;
 * malloc'd, NULL when out of memory. */
char *ik_store_forms(void);

/* A store the envelope steps open on first use.  A failure to open is kept
 * and recorded in every envelope (a stream goes on, sqs-ack leaves the
 * messages) rather than ending the process; one that may pass (not
 * IK_CONFIG) is kept only until reopen_at, then the open is tried again on
 * the next envelope, the wait growing with each failure in a row. */
struct ik_store_lazy {
	const char *url;          /* NULL: $IDEMKIT_STORE or the default */
	struct ik_store *store;
	ik_err open_err;
	int64_t reopen_at;        /* monotonic ms */
	int64_t open_failures;    /* in a row */
	/* in flight: the envelopes answered and not yet reaped, oldest first
	 * (a ring of the in-flight count's slots: never full) */
	struct cJSON **done;
	size_t done_cap, done_head, done_n;
};
/* The open store, or NULL with *err set to why it could not be opened. */
struct ik_store *ik_store_lazy_get(struct ik_store_lazy *l, ik_err *err);
/* Whether the store offers the in-flight ops (claim_start...), for up to
 * n envelopes in flight: opens it now, and a failure to open is kept as on
 * first use (then 0: the steps take the group path, and each envelope
 * records the failure); when 1, the store is made ready (ops->warm). */
int ik_store_lazy_inflight(struct ik_store_lazy *l, size_t n);
/* step.h's wait and reap for the store steps: wait runs the open store
 * (1 s at most, so the loop sees a stop signal): 0, or -1 after a
 * message; an op's callback hands its envelope, result recorded, to
 * ik_store_lazy_done, and reap returns them in that order, NULL when
 * none is waiting. */
int ik_store_lazy_wait(struct ik_store_lazy *l, int fd, int *readable, int timeout_ms);
void ik_store_lazy_done(struct ik_store_lazy *l, struct cJSON *env);
struct cJSON *ik_store_lazy_reap(struct ik_store_lazy *l);
/* Closes the store and frees what the lazy holds. */
void ik_store_lazy_close(struct ik_store_lazy *l);
/* step.h's group hooks over a struct ik_store_lazy (its group_ctx). */
int ik_store_group_begin(void *lazy);
int ik_store_group_commit(void *lazy);

#endif
