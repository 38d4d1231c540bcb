/* tests/model/idemkit.pml: idemkit's claim protocol as the code implements
 * it, for spin.  One charge (one chargeId, one fingerprint), one message for
 * it on an at-least-once queue, NW workers, an abstract clock, a bank.
 * tests/model/run.sh checks it; idemkit(7) "What is verified, and how"
 * says what it proves and what it assumes.
 *
 * Every transition names the function it stands for.  Atomic blocks are the
 * single conditional writes of the code (one SQL statement, one DynamoDB
 * request), never more.  Between any two steps a worker may crash: stop for
 * good, or restart with nothing of its envelope (CRASHES times in all, of
 * which STOPS for good, STOPS < NW).
 *
 * Time is a set of timers, each "deadline - now" clamped to -1 (long past):
 * a lease is live while it is > 0 (now < leaseUntil) and claimable when it
 * is < 0 (leaseUntil < now), exactly the comparisons of the claim's
 * condition and ik_claim_decide; one tick of the clock moves every timer.
 *
 * Tokens: a worker stands for one envelope in flight (a charge-worker
 * loop, or one slot of a --stream pipeline) and holds one claim at a time;
 * a restart loses the envelope.  So "this worker's latest claim" is as good
 * as the fresh random token of ik_store_token: owner = worker + 1.
 *
 * Switches (cc -D, passed through spin -a):
 *   NW=2|3          workers
 *   BANK_NOKEY      the bank without its idempotency key: every call that
 *                   is applied is a new ledger entry
 *   PROGRESS        bound the clock (STALLS ticks while a worker is busy;
 *                   otherwise it ticks only when every live worker is idle),
 *                   for the liveness claim under weak fairness
 *   PROPS=mask      which assertions are checked: bit 0 P1, 1 P2, 2 P3,
 *                   3 P4a, 4 P4b, 5 P5 (default 63, all)
 *   CRASHES, STOPS, TEMPS, DUPS   the bounds: crashes (of which STOPS for
 *                   good), transient failures (bank unreachable, an answer
 *                   lost), deliveries racing their own first copy
 *   LEASE, VIS      the lease and the visibility timeout, in ticks
 * Broken variants, each a bug spin must find:
 *   BROKEN_NOFENCE        finish and release without "owner = token"
 *   BROKEN_NOLEASECHECK   charge-debit calls the bank whatever the lease left
 *   BROKEN_ACKEARLY       sqs-ack runs before idemp-done
 *   BROKEN_KEYDELIVERY    the bank's key is the delivery (messageId/receipt),
 *                         not the chargeId
 *   BROKEN_TEMPFAILED     idemp-done records FAILED for a debit TEMPFAIL
 *   BROKEN_CLAIMANYSTATE  the claim's condition without state = IN_PROGRESS
 *   BROKEN_CLAIMNOLEASE   the claim's condition without leaseUntil < now
 *   BROKEN_DUPDONELEAVE   sqs-ack leaves a DUP_DONE message instead of
 *                         deleting it (breaks progress only)
 *
 * Properties (P1..P6, numbered as in idemkit(7)):
 *   P1 at most one debit per charge in the bank's ledger (bank with key);
 *   P2 a second ledger entry only once the lease of the holder that made
 *      the first one has ended (it crashed, or was slower than its lease),
 *      never while that lease is live;
 *   P3 no message deleted before its record is final or its verdict is DLQ;
 *   P4a once a debit succeeded the record never becomes FAILED;
 *   P4b once a debit succeeded the record is claimable again only when the
 *      debiting holder's lease has ended (the crash window), and a final
 *      record is never claimed again;
 *   P5 a finish or release with a stale token changes nothing;
 *   P6 (ltl) every message is eventually deleted (or in the DLQ and
 *      deleted) and its record final, under weak fairness.
 */

#ifndef NW
#define NW 2
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef STOPS
#define STOPS 1
#endif
#ifndef TEMPS           /* transient failures: bank unreachable, answers lost */
#define TEMPS 1
#endif
#ifndef DUPS            /* deliveries that race their own first copy */
#define DUPS 1
#endif
#ifndef STALLS          /* PROGRESS: clock ticks while some worker is busy */
#define STALLS 2
#endif
#ifndef PROPS           /* which assertions: bit n-1 for P1..P5 (P4a bit 3, P4b 4, P5 5) */
#define PROPS 63
#endif

#ifndef LEASE
#define LEASE  3        /* idemp-claim --lease, in ticks */
#endif
#ifndef VIS
#define VIS    2        /* the queue's visibility timeout */
#endif
#define CALL   1        /* charge-debit --timeout */
#define MARGIN 1        /* lease-left check: timeout + margin */

#define CHECK(n) ((PROPS >> (n - 1)) & 1)
#define PASSERT(n, e) if :: CHECK(n) -> assert(e) :: else -> skip fi

mtype = {
	IN_PROGRESS, DONE, FAILED, DNF,                   /* record states */
	ACQUIRED, DUP_DONE, DUP_IN_PROGRESS, DUP_FAILED,  /* claim */
	OK, DECLINED, TEMPFAIL, LEASE_SHORT,              /* debit */
	NOTIFY_FAILED,                                    /* notify */
	LEASE_LOST,                                       /* done */
	DELETE, DLQ, LEAVE,                               /* sqs-ack action */
	QUEUED, DELETED                                   /* message */
};

#define FINAL(s) (s == DONE || s == FAILED || s == DNF)
#ifdef BROKEN_TEMPFAILED
#define RECORDED(d) (d == OK || d == DECLINED || d == TEMPFAIL)
#else
#define RECORDED(d) (d == OK || d == DECLINED)   /* idemp-done.c derive() */
#endif

/* the idempotency record (lib/store/store.h struct ik_record) */
mtype rs;               /* 0 = absent */
short rl = -1;          /* leaseUntil - now */
byte owner;             /* the claim token, see "Tokens" below */

/* the message (lib/queue/sqlite/queue_sqlite.c messages row) */
mtype ms = QUEUED;
short vis = -1;         /* visible_at - now: visible when <= 0 */
byte rcpt;              /* receives, for BROKEN_KEYDELIVERY only */
bool dlqd;              /* a copy was sent to the DLQ */

/* the bank */
byte ledger;            /* debits of this charge in the bank's ledger (2: two or more) */
mtype bdec;             /* what the bank decided for the key (with key) */
byte bkey;              /* the key it decided it for */

/* per worker: its copy of claim.leaseUntil, and its bank call's deadline */
short wl[NW];
short dl[NW];

/* ghost: the lease of the holder that made the last ledger entry */
short dbl = -1;

byte crashes, stops, temps, dups, stalls, busy;

#define LEDGER_ADD if :: ledger < 2 -> ledger++ :: else -> skip fi
#define DEC(t) if :: t > -1 -> t-- :: else -> skip fi

/* One tick of the abstract clock: every timer moves. */
active proctype clock()
{
	byte i;
endclock:
	do
#ifdef PROGRESS
	:: d_step { (busy == 0 || stalls < STALLS) ->
		if :: busy > 0 -> stalls++ :: else -> skip fi;
#else
	:: d_step { true ->
#endif
		DEC(rl); DEC(vis); DEC(dbl);
		i = 0;
		do
		:: i < NW -> DEC(wl[i]); DEC(dl[i]); i++
		:: else -> break
		od;
		i = 0 }
	od
}

/* A crash between two steps: the process is gone with its envelope; its
 * claim stays as the store holds it, its message stays in flight until
 * the visibility timeout. */
#define CRASHPOINT \
	if \
	:: crashes < CRASHES -> \
		atomic { crashes++; busy--; wl[me] = -1; dl[me] = -1; \
		if \
		:: stops < STOPS -> stops++; goto endstopped \
		:: true -> goto idle \
		fi } \
	:: true -> skip \
	fi

proctype worker(byte me)
{
	byte tok;               /* claim.token in the envelope */
	mtype cl, db, nt, dn, act;
	byte key;
	bool early;

idle:
	atomic { tok = 0; cl = 0; db = 0; nt = 0; dn = 0; act = 0; key = 0; early = false };

	/* sqs-recv: lib/queue/sqlite/queue_sqlite.c receive (one BEGIN
	 * IMMEDIATE picks a visible message, a fresh receipt, visible_at = now +
	 * visibility) */
endrecv:
	if
	:: atomic { ms == QUEUED && vis <= 0 -> vis = VIS; busy++;
#ifdef BROKEN_KEYDELIVERY
		rcpt = 1 - rcpt; key = rcpt + 1
#endif
		}
	/* at-least-once: a second delivery while the first copy is in flight */
	:: atomic { ms == QUEUED && vis > 0 && dups < DUPS -> dups++; busy++;
#ifdef BROKEN_KEYDELIVERY
		rcpt = 1 - rcpt; key = rcpt + 1
#endif
		}
	fi;
	CRASHPOINT;

	/* idemp-claim: claim() -> store->ops->claim, ONE conditional write:
	 * lib/store/sqlite/ INSERT ... ON CONFLICT DO UPDATE ... WHERE
	 * state = 'IN_PROGRESS' AND lease_until < now AND fingerprint = ...;
	 * lib/store/dynamodb/ attribute_not_exists(#k) OR (#st = :ip AND
	 * #lu < :now AND #fp = :fp).  Refused: ik_claim_decide
	 * (lib/store/store.c) on the record that refused it. */
claim:
	atomic {
		if
#if defined(BROKEN_CLAIMANYSTATE)
		:: rs == 0 || rl < 0 ->
#elif defined(BROKEN_CLAIMNOLEASE)
		:: rs == 0 || rs == IN_PROGRESS ->
#else
		:: rs == 0 || (rs == IN_PROGRESS && rl < 0) ->
#endif
			PASSERT(5, ledger == 0 || (rs == IN_PROGRESS && dbl <= 0));  /* P4b */
			PASSERT(5, !FINAL(rs));                                      /* P4b */
			rs = IN_PROGRESS; owner = me + 1; rl = LEASE;
			tok = me + 1; wl[me] = LEASE; cl = ACQUIRED
		:: else ->
			/* ik_claim_decide: DONE, DNF -> DUP_DONE; FAILED ->
			 * DUP_FAILED; a live lease (or one ending now) ->
			 * DUP_IN_PROGRESS.  (Our own token cannot be there:
			 * the token is fresh; see the lost answer below.) */
			if
			:: rs == DONE || rs == DNF -> cl = DUP_DONE
			:: rs == FAILED -> cl = DUP_FAILED
			:: rs == IN_PROGRESS -> cl = DUP_IN_PROGRESS
			fi
		fi
	};
	/* The write went through but its answer was lost (timeout): the
	 * adapter asks again with the same token, and ik_claim_decide finds
	 * our own claim (ACQUIRED again, with the lease it recorded), or what
	 * happened since. */
	if
	:: cl == ACQUIRED && temps < TEMPS ->
		temps++;
		atomic {
			if
			:: rs == IN_PROGRESS && owner == tok -> wl[me] = rl
			:: rs == IN_PROGRESS && owner != tok && rl < 0 ->
				goto claim      /* IK_EMPTY: the adapter writes again */
			:: rs == IN_PROGRESS && owner != tok && rl >= 0 ->
				cl = DUP_IN_PROGRESS; wl[me] = -1
			:: rs == DONE || rs == DNF -> cl = DUP_DONE; wl[me] = -1
			:: rs == FAILED -> cl = DUP_FAILED; wl[me] = -1
			fi
		}
	:: else -> skip
	fi;
	if
	:: cl != ACQUIRED -> goto ack   /* the other steps pass it through */
	:: else -> skip
	fi;
	CRASHPOINT;

	/* charge-debit: debit().  First the lease-left check: less left than
	 * the call's timeout plus a margin, nothing is sent (LEASE_SHORT). */
	atomic {
		if
#ifndef BROKEN_NOLEASECHECK
		:: wl[me] < CALL + MARGIN -> db = LEASE_SHORT; goto done
#endif
		:: else -> dl[me] = CALL   /* ik_bankapi_post: the request leaves */
		fi
	};
	/* The bank, on its side (sim/banksim_ledger.c stands for it).  It
	 * acts on a request before the client's timeout or not at all
	 * (assumed; idemkit(7) says so).  With its key it replays what it
	 * decided for the key; without, every call applied is a new debit. */
	if
	:: atomic { dl[me] >= 0 ->
#ifdef BANK_NOKEY
		if
		:: PASSERT(2, ledger == 0 || dbl <= 0);                    /* P2 */
			LEDGER_ADD; dbl = wl[me]; db = OK
		:: db = DECLINED
		fi;
		PASSERT(1, ledger <= 1);                                   /* P1 */
#else
		/* key: the chargeId (charge-debit.c), the same for every
		 * call: 0 here; the delivery under BROKEN_KEYDELIVERY */
		if
		:: bdec != 0 && bkey == key -> db = bdec   /* replayed */
		:: else ->
			if
			:: PASSERT(2, ledger == 0 || dbl <= 0);            /* P2 */
				LEDGER_ADD; dbl = wl[me]; db = OK
			:: db = DECLINED
			fi;
			bdec = db; bkey = key
		fi;
		PASSERT(1, ledger <= 1);                                   /* P1 */
#endif
		dl[me] = -1 }
	:: atomic { dl[me] < 0 -> db = TEMPFAIL }            /* timed out */
	:: atomic { temps < TEMPS -> temps++; db = TEMPFAIL; dl[me] = -1 }  /* unreachable, 5xx */
	fi;
	/* the bank acted, but its answer was lost: TEMPFAIL */
	if
	:: db != TEMPFAIL && temps < TEMPS -> temps++; db = TEMPFAIL
	:: true -> skip
	fi;
	if
	:: db != OK -> goto done
	:: else -> skip
	fi;
	CRASHPOINT;

	/* charge-notify: notify(); OK, NOTIFY_FAILED after its retries, or
	 * TEMPFAIL (CONFIG, SOFTWARE: the same for the record) */
	if
	:: nt = OK
	:: nt = NOTIFY_FAILED
	:: nt = TEMPFAIL
	fi;
#ifdef BROKEN_ACKEARLY
	early = true;
	goto ack;
#endif

done:
	CRASHPOINT;
	/* idemp-done: done() -> derive(): DECLINED -> FAILED; debit OK ->
	 * DONE or DEBITED_NOTIFICATION_FAILED whatever the notification did;
	 * LEASE_SHORT -> release; anything else: nothing to record.  finish
	 * and release are each ONE conditional write on state = IN_PROGRESS
	 * AND owner = token (lib/store/sqlite/ UPDATE ... WHERE ... owner =
	 * ?2; lib/store/dynamodb/ "#st = :ip AND #ow = :tok"); no match is
	 * LEASE_LOST and changes nothing. */
	atomic {
		if
		:: RECORDED(db) ->
#ifdef BROKEN_NOFENCE
			if
			:: rs == IN_PROGRESS ->
#else
			if
			:: rs == IN_PROGRESS && owner == tok ->
#endif
				PASSERT(6, owner == tok);                          /* P5 */
				if
				:: db == OK && nt == OK -> rs = DONE
				:: db == OK && nt != OK -> rs = DNF
				:: else ->
					PASSERT(4, ledger == 0);                   /* P4a */
					rs = FAILED
				fi;
				dn = OK;
				rl = -1; dbl = -1   /* nobody reads them again */
			:: else -> dn = LEASE_LOST
			fi
		:: db == LEASE_SHORT ->
			/* store->ops->release: leaseUntil = 0 */
#ifdef BROKEN_NOFENCE
			if
			:: rs == IN_PROGRESS ->
#else
			if
			:: rs == IN_PROGRESS && owner == tok ->
#endif
				PASSERT(6, owner == tok);                          /* P5 */
				rl = -1; dn = OK
			:: else -> dn = LEASE_LOST
			fi
		:: else -> skip
		fi;
		wl[me] = -1
	};
	if
	:: early -> goto leave
	:: else -> skip
	fi;

ack:
	/* sqs-ack: the verdict (lib/core/envelope.c ik_env_verdict) and its
	 * action (lib/core/outcome.c): delete, DLQ then delete, or leave. */
	atomic {
		if
		:: cl == DUP_DONE ->
#ifdef BROKEN_DUPDONELEAVE
			act = LEAVE
#else
			act = DELETE
#endif
		:: cl == DUP_FAILED -> act = DLQ
		:: cl == DUP_IN_PROGRESS -> act = LEAVE
		:: cl == ACQUIRED && early ->   /* BROKEN_ACKEARLY: no done yet */
			if
			:: db == OK && nt != TEMPFAIL -> act = DELETE
			:: db == DECLINED -> act = DLQ
			:: else -> act = LEAVE
			fi
		:: cl == ACQUIRED && !early ->
			if
			:: db == OK && nt == TEMPFAIL -> act = LEAVE  /* verdict: notify */
			:: (db == OK || db == DECLINED) && dn == OK ->
				act = (db == OK -> DELETE : DLQ)
			:: else -> act = LEAVE   /* TEMPFAIL, LEASE_SHORT, LEASE_LOST */
			fi
		fi;
		/* what the verdict was made of is read no more */
		if
		:: !early -> tok = 0; cl = 0; db = 0; nt = 0; dn = 0; key = 0
		:: else -> skip
		fi
	};
	CRASHPOINT;
	if
	:: act == DLQ ->
		/* to_dlq(): the body to the DLQ, then the delete */
		dlqd = true;
		CRASHPOINT
	:: else -> skip
	fi;
	if
	:: act == DELETE || act == DLQ ->
		/* q->ops->delete (lib/queue/sqlite/queue_sqlite.c S_DELETE; SQS may accept
		 * a stale receipt, so the model lets any receipt delete) */
		atomic {
			PASSERT(3, FINAL(rs) || act == DLQ);                       /* P3 */
			ms = DELETED; vis = -1
		}
	:: else -> skip   /* leave: visible again when its visibility ends */
	fi;
	if
	:: early -> goto done
	:: else -> skip
	fi;
leave:
	busy--;
	goto idle;

endstopped:
	false
}

init
{
	atomic {
		byte i = 0;
		do
		:: i < NW -> wl[i] = -1; dl[i] = -1; run worker(i); i++
		:: else -> break
		od
	}
}

ltl p6 { <> (ms == DELETED && (rs == DONE || rs == FAILED || rs == DNF)) }
