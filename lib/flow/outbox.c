/* outbox.c: the outbox relay (what every store's outbox shares, the
 * setting and the eventId, is the port's: store.c).  See outbox.h.
 *
 * Rules: the checkpoint (outbox_ack) comes only after the queue accepted
 * the messages, and only for the accepted prefix of a batch; the lease is
 * taken again before every batch, so a relay that stalled past its lease
 * finds it gone, and its checkpoint is refused (LEASE_LOST) -- its
 * messages were sent, and the new holder sends them again under the same
 * eventIds.  A batch (up to IK_OUTBOX_BATCH_MAX events) goes out in queue
 * calls of IK_QUEUE_BATCH, one after another, and is checkpointed in one
 * outbox_ack: the store's calls of a round are paid once per batch, not
 * once per queue call.  Loops are bounded: --once ends when nothing waits or on the
 * first failure; --follow ends on a stop signal.
 */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "flow/outbox.h"
#include "queue/queue.h"

#define BACKOFF_BASE_MS 200
#define BACKOFF_CAP_MS 10000

static void
at(struct ik_relay *r, enum ik_relay_point p, const struct ik_outbox_ev *ev, size_t n)
{
	if (r->at)
		r->at(p, ev, n, r->arg);
}

/* How many of ev[0..n) go in one batch: up to the first second event of a
 * chargeId already in it (outbox.h: order per chargeId). */
static size_t
distinct_prefix(const struct ik_outbox_ev *ev, size_t n)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = 0; j < i; j++)
			if (strcmp(ev[i].charge_id, ev[j].charge_id) == 0)
				return i;
	return n;
}

/* Sends ev[0..n) in calls of IK_QUEUE_BATCH, in order: *accepted gets the
 * length of the prefix the queue accepted.  IK_OK when all were, else why
 * the first refused one was (err); nothing after it is sent, so what the
 * checkpoint marks is always a prefix. */
static int
publish(struct ik_relay *r, const struct ik_outbox_ev *ev, size_t n, size_t *accepted,
    ik_err *err)
{
	struct ik_qattr attrs[IK_QUEUE_BATCH][3];
	struct ik_qsend m[IK_QUEUE_BATCH];
	struct ik_qresult res[IK_QUEUE_BATCH];
	size_t i, k, ok;
	int rc;

	*accepted = 0;
	for (; *accepted < n; *accepted += ok) {
		const struct ik_outbox_ev *e = ev + *accepted;

		k = n - *accepted < IK_QUEUE_BATCH ? n - *accepted : IK_QUEUE_BATCH;
		memset(m, 0, sizeof m);
		for (i = 0; i < k; i++) {
			attrs[i][0] = (struct ik_qattr){ "eventId", e[i].id };
			attrs[i][1] = (struct ik_qattr){ "chargeId", e[i].charge_id };
			attrs[i][2] = (struct ik_qattr){ "eventType", e[i].type };
			m[i] = (struct ik_qsend){ .body = e[i].body, .attrs = attrs[i], .nattrs = 3 };
			res[i] = (struct ik_qresult){ .code = IK_SOFTWARE };
		}
		rc = r->queue->ops->send_batch(r->queue, m, k, res, err);
		for (i = 0; i < k; i++)
			free(m[i].message_id);
		if (rc != IK_OK)
			return rc;
		ok = 0;
		while (ok < k && res[ok].code == IK_OK)
			ok++;
		if (ok < k) {
			*accepted += ok;
			return ik_errf(err, res[ok].code, "%s", res[ok].msg);
		}
	}
	return IK_OK;
}

/* Purges what was published before the retention, in batches, each its
 * own short write (never one long one that holds the store). */
static int
purge(struct ik_relay *r, ik_err *err)
{
	int64_t n, before;
	int rc;

	at(r, IK_RELAY_BEFORE_PURGE, NULL, 0);
	before = ik_now_ms() - r->retention_ms;

	/* Bounded: each round deletes a batch or ends the loop; the cap keeps a
	 * huge backlog from starving the publishing. */
	for (int round = 0; round < 100; round++) {
		if ((rc = r->store->ops->outbox_purge(r->store, before, IK_OUTBOX_PURGE_BATCH,
		    &n, err)))
			return rc;
		r->purged += n;
		if (n < IK_OUTBOX_PURGE_BATCH || ik_stop_signal)
			break;
	}
	return IK_OK;
}

/* One round: lease, read, publish, checkpoint.  *idle set when nothing
 * waited.  IK_OK, or what stopped the round. */
static int
round1(struct ik_relay *r, const char *holder, int *idle, ik_err *err)
{
	struct ik_outbox_ev ev[IK_OUTBOX_BATCH_MAX];
	int64_t until = 0;
	size_t n = 0, k, accepted = 0, i;
	int rc, prc;

	*idle = 0;
	memset(ev, 0, sizeof ev);
	rc = r->store->ops->outbox_lease(r->store, holder, ik_now_ms(), r->lease_ms, &until,
	    err);
	if (rc == IK_DUP_IN_PROGRESS)
		return ik_errf(err, IK_DUP_IN_PROGRESS, "%s: another relay holds the outbox "
		    "lease for %lld ms more", r->store->ops->name,
		    (long long)(until > ik_now_ms() ? until - ik_now_ms() : 0));
	if (rc)
		return rc;
	if ((rc = r->store->ops->outbox_read(r->store, r->batch, ev, &n, err)))
		return rc;
	if (n == 0) {
		*idle = 1;
		return IK_OK;
	}
	k = distinct_prefix(ev, n);
	at(r, IK_RELAY_BEFORE_PUBLISH, ev, k);
	prc = publish(r, ev, k, &accepted, err);
	if (accepted) {
		at(r, IK_RELAY_AFTER_PUBLISH, ev, accepted);
		ik_err aerr = { 0 };
		rc = r->store->ops->outbox_ack(r->store, holder, ev, accepted, ik_now_ms(),
		    &aerr);
		if (rc == IK_LEASE_LOST) {
			/* Sent, not checkpointed: the holder now sends them again,
			 * under the same eventIds. */
			r->lease_lost++;
			ik_log(IK_LOG_WARN, "outbox lease lost before the checkpoint; the next "
			    "holder publishes these again", IK_LOG_NUM("events", accepted),
			    "eventId", ev[0].id, NULL);
		} else if (rc) {
			*err = aerr;
		} else {
			r->published += (int64_t)accepted;
			at(r, IK_RELAY_AFTER_CHECKPOINT, ev, accepted);
		}
	}
	for (i = 0; i < n; i++)
		ik_outbox_ev_free(&ev[i]);
	if (rc && rc != IK_LEASE_LOST)
		return rc;
	return prc;
}

/* A relay that stops ends its lease, so the next one need not wait for
 * it; one that dies leaves it to expire.  Best effort: ours or no one's. */
static void
end_lease(struct ik_relay *r, const char *holder)
{
	ik_err e = { 0 };
	int64_t until;

	r->store->ops->outbox_lease(r->store, holder, ik_now_ms(), 0, &until, &e);
}

int
ik_relay_run(struct ik_relay *r, ik_err *err)
{
	char holder[IK_TOKEN_HEX];
	int64_t failures = 0, next_purge = 0, lost;
	int rc, idle;

	if (!r->store->ops->outbox_lease)
		return ik_errf(err, IK_CONFIG, "%s: this store keeps no outbox (yet)",
		    r->store->ops->name);
	if (r->batch == 0)
		r->batch = r->store->ops->outbox_batch ? r->store->ops->outbox_batch :
		    IK_QUEUE_BATCH;
	if (r->batch > IK_OUTBOX_BATCH_MAX)
		r->batch = IK_OUTBOX_BATCH_MAX;
	ik_store_token(holder);
	while (!ik_stop_signal) {
		lost = r->lease_lost;
		rc = round1(r, holder, &idle, err);
		if (rc == IK_OK && idle && ik_mono_ms() >= next_purge) {
			next_purge = ik_mono_ms() + 60000;
			rc = purge(r, err);
		}
		if (r->round)
			r->round(rc, rc == IK_OK && r->lease_lost == lost, r->arg);
		if (rc == IK_OK && !idle) {
			failures = 0;
			continue;
		}
		if (!r->follow) {
			end_lease(r, holder);
			if (rc == IK_OK)
				return r->published || r->purged ? IK_OK : IK_EMPTY;
			return rc;
		}
		if (rc == IK_OK) {
			failures = 0;
			ik_sleep_ms(r->poll_ms);
		} else if (rc == IK_DUP_IN_PROGRESS) {
			/* The holder's lease: wait for it to end or be renewed. */
			ik_sleep_ms(r->poll_ms);
		} else {
			ik_log(IK_LOG_WARN, err->msg, IK_LOG_NUM("code", rc), NULL);
			ik_sleep_ms(ik_backoff_jitter(BACKOFF_BASE_MS, BACKOFF_CAP_MS, failures++));
		}
	}
	end_lease(r, holder);
	return IK_OK;
}
