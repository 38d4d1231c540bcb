/* outbox.h: the transactional outbox (issue 27, idemkit(7) "OUTBOX").
 *
 * The store writes each finished charge's event inside the atomic write
 * that finishes it (store.h, the outbox ops); the relay here reads them
 * in the store's order, publishes each to a queue (queue.h: SQS or the
 * embedded queue) with its eventId as a message attribute, and only then
 * checkpoints them in the store, fenced by the relay lease the store
 * keeps: at least once, never lost, a duplicate always with the same
 * eventId.  A batch never holds two events of one chargeId, so a
 * chargeId's events are first published in their order even when a batch
 * is partly refused and re-sent.
 */
#ifndef IK_OUTBOX_H
#define IK_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "store/store.h"

struct ik_queue;

#define IK_OUTBOX_LEASE_DEFAULT_MS 30000
#define IK_OUTBOX_RETENTION_DEFAULT_MS (7LL * 86400000)
#define IK_OUTBOX_PURGE_BATCH 1000
/* The most events one round reads, publishes (in calls of IK_QUEUE_BATCH)
 * and checkpoints together: where each store call is a network round trip
 * (DynamoDB), a round's fixed calls are paid once per this many. */
#define IK_OUTBOX_BATCH_MAX 100

/* The relay's boundaries, for progress and the crash tests (the command
 * decides what to do there; the library only tells). */
enum ik_relay_point {
	IK_RELAY_BEFORE_PUBLISH,   /* read from the store, nothing sent */
	IK_RELAY_AFTER_PUBLISH,    /* the queue accepted them, no checkpoint */
	IK_RELAY_AFTER_CHECKPOINT, /* checkpointed in the store */
	IK_RELAY_BEFORE_PURGE,     /* idle, about to purge (no events: n 0) */
};

struct ik_relay {
	struct ik_store *store;
	struct ik_queue *queue;
	int follow;                /* until a stop signal; else what waits now */
	int64_t lease_ms;
	int64_t poll_ms;           /* idle wait between reads (--follow) */
	int64_t retention_ms;      /* published events kept this long */
	size_t batch;              /* events per round, 1..IK_OUTBOX_BATCH_MAX;
	                            * 0: the store's (store.h outbox_batch) */
	/* Called at each boundary with the events of the batch (n of them);
	 * may be NULL. */
	void (*at)(enum ik_relay_point p, const struct ik_outbox_ev *ev, size_t n, void *arg);
	void *arg;
	/* Called after every round with its status (IK_OK: a good round,
	 * idle or not; IK_DUP_IN_PROGRESS: another relay holds the lease)
	 * and whether this relay ended it holding the lease; may be NULL. */
	void (*round)(int rc, int lease_held, void *arg);
	/* out */
	int64_t published, purged, lease_lost;
};

/* Runs the relay.  IK_OK when it published (or, --follow, stopped on a
 * signal), IK_EMPTY when nothing was waiting (not --follow),
 * IK_DUP_IN_PROGRESS when another relay holds the lease (not --follow;
 * --follow waits for it), IK_CONFIG when the store has no outbox, else
 * the error that stopped it (not --follow; --follow backs off and goes
 * on). */
int ik_relay_run(struct ik_relay *r, ik_err *err);

#endif
