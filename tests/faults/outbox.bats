#!/usr/bin/env bats
# The outbox under load and crashes (issue 27), on the embedded default
# (or the store IDEMKIT_TEST_BACKEND names: dynamodb on dynalite,
# dynamodb-local, redis, postgres (a throwaway server, pg_helper.bash); the
# queues stay embedded):
# OUTBOX_N charges (default 800, what fits CI's faults step; OUTBOX_N=10000
# by hand), each delivered 1-5 times, drained by
# charge-worker --stream while the relay (idemp-outbox --follow) is killed
# -9 every few hundred events and started again; then four
# example consumers apply the events.  Every finished charge has exactly one
# event in the store, every event is on the queue at least once (a copy
# only with the same eventId), and the consumer applies each exactly once.
# IDEMKIT_TEST_BACKEND=redis: the same on the Redis store (a redis-server
# per test, AOF with appendfsync always).

load faults

N=${OUTBOX_N:-800}
BACKEND=${IDEMKIT_TEST_BACKEND:-sqlite}

setup_file() {
	case $BACKEND in
	postgres) . "$IDEMKIT_SRC/tests/pg_helper.bash"; pg_start ;;
	esac
}
teardown_file() {
	case $BACKEND in
	postgres) . "$IDEMKIT_SRC/tests/pg_helper.bash"; pg_stop ;;
	esac
}

setup() { bank_start; }
teardown() {
	[ -z "${RELAY:-}" ] || kill -KILL "$RELAY" 2>/dev/null || true
	bank_stop
	[ -z "${REDIS_PID:-}" ] || redis_stop
	case $BACKEND in dynamodb*) ddb_emulator_stop ;; esac
}

# the_store: the store the backend asks for, after embedded_queue (which
# sets SQLite's).
the_store() {
	case $BACKEND in
	sqlite) ;;
	redis)
		load ../redis_helper
		require_redis
		redis_start
		export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
		;;
	dynamodb|dynamodb-local)
		aws_test_env
		ddb_emulator_start "$BACKEND" || return 1
		export IDEMKIT_STORE=dynamodb:obx-$$-$RANDOM
		idemp-init >/dev/null ;;
	postgres)
		export IDEMKIT_STORE="$PG_URL?table=fo_$$_$RANDOM"
		idemp-init >/dev/null ;;
	*) echo "unknown IDEMKIT_TEST_BACKEND=$IDEMKIT_TEST_BACKEND" >&2; return 1 ;;
	esac
}
# stored_events: "COUNT|DISTINCT CHARGES" of the events the store wrote
# (DynamoDB keeps none once published, PostgreSQL's are WAL messages:
# there the consumer's count is the check).
stored_events() {
	case $BACKEND in
	redis) rcli XRANGE idemkit:outbox - + | python3 -c 'import sys
l = sys.stdin.read().split("\n")
c = [l[i + 1] for i in range(len(l) - 1) if l[i] == "chargeId"]
print("%d|%d" % (len(c), len(set(c))))' ;;
	*) sqlite3 "$BATS_TEST_TMPDIR/idem.db" 'SELECT count(*), count(DISTINCT charge_id) FROM outbox' ;;
	esac
}

waiting() { idemp-outbox --stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["waiting"])'; }

# relay_chaos: starts relays, each killed -9 once it checkpointed about
# 300 more events, until the workers are done and nothing waits.
relay_chaos() {
	local i=0 lines after
	while :; do
		i=$((i + 1))
		idemp-outbox --follow --lease 1s --poll 20ms >> "$BATS_TEST_TMPDIR/relay.out" \
			2>>"$BATS_TEST_TMPDIR/relay.err" 3>&- &
		RELAY=$!
		lines=$(wc -l < "$BATS_TEST_TMPDIR/relay.out")
		while [ "$(wc -l < "$BATS_TEST_TMPDIR/relay.out")" -lt $((lines + 300)) ]; do
			# (workers that failed end the test now, not at bats' timeout)
			if [ -e "$BATS_TEST_TMPDIR/workers.failed" ]; then
				kill -KILL "$RELAY"
				return 1
			fi
			if [ -e "$BATS_TEST_TMPDIR/workers.done" ]; then
				[ "$(waiting)" -eq 0 ] && break 2
				# (the relay has 300 s after the workers to publish the rest)
				: "${after:=$SECONDS}"
				if [ $((SECONDS - after)) -gt 300 ]; then
					echo "events still waiting 300 s after the workers: $(idemp-outbox --stats)" >&2
					kill -KILL "$RELAY"
					return 1
				fi
			fi
			sleep 0.05
		done
		kill -KILL "$RELAY"
		wait "$RELAY" 2>/dev/null || true
		KILLS=$i
	done
	kill -TERM "$RELAY"
	wait "$RELAY" || true
	RELAY=
}

@test "outbox: $N charges x 1-5 deliveries, the relay killed -9 again and again: one event per charge, each applied once downstream" {
	embedded_queue 5
	# (before the_store: PostgreSQL's idemp-init makes the slot only for
	# an outbox it is told of)
	export IDEMKIT_OUTBOX="sqlite:$BATS_TEST_TMPDIR/events.db#events"
	the_store
	charges "$N" "$BATS_TEST_TMPDIR/charges" OBX
	deliveries "$BATS_TEST_TMPDIR/charges" "$BATS_TEST_TMPDIR/messages" 27
	sqs-send < "$BATS_TEST_TMPDIR/messages" > /dev/null
	: > "$BATS_TEST_TMPDIR/relay.out"
	KILLS=0
	start=$SECONDS
	( if drain 900 -j 4 --stream; then touch "$BATS_TEST_TMPDIR/workers.done"
	  else touch "$BATS_TEST_TMPDIR/workers.failed"; fi ) 3>&- &
	workers=$!
	relay_chaos
	wait "$workers"
	took=$((SECONDS - start))
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	# one event per finished charge, in the store
	case $BACKEND in dynamodb*|postgres) ;; *) [ "$(stored_events)" = "$N|$N" ] ;; esac
	[ "$(waiting)" -eq 0 ]
	copies=$(sqs-stat --queue "$IDEMKIT_OUTBOX" | python3 -c 'import json,sys; print(json.load(sys.stdin)["visible"])')
	[ "$copies" -ge "$N" ]
	cstart=$SECONDS
	# four consumers at once on one dedup store: disjoint receives, and a
	# copy that reaches another consumer is still applied once
	pids=
	for _ in 1 2 3 4; do
		env CONSUMER_STORE="sqlite:$BATS_TEST_TMPDIR/consumer.db" IDEMKIT_LOG=error \
			"$IDEMKIT_SRC/examples/outbox-consumer.sh" -- sh -c "cat >> '$BATS_TEST_TMPDIR/applied'" \
			2>/dev/null 3>&- &
		pids="$pids $!"
	done
	for p in $pids; do wait "$p"; done
	# a copy left by a consumer that found its twin being applied (11,
	# left with a backoff) comes back: one consumer until none is left
	for _ in $(seq 240); do
		[ "$(sqs-stat --queue "$IDEMKIT_OUTBOX")" = '{"visible":0,"inflight":0,"delayed":0}' ] && break
		env CONSUMER_STORE="sqlite:$BATS_TEST_TMPDIR/consumer.db" IDEMKIT_LOG=error \
			"$IDEMKIT_SRC/examples/outbox-consumer.sh" -- sh -c "cat >> '$BATS_TEST_TMPDIR/applied'" 2>/dev/null
		sleep 0.5
	done
	python3 - "$BATS_TEST_TMPDIR/applied" "$BATS_TEST_TMPDIR/charges" <<'PY'
import collections, json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
want = {json.loads(l)["chargeId"] for l in open(sys.argv[2])}
ids = collections.Counter(e["eventId"] for e in ev)
charges = collections.Counter(e["chargeId"] for e in ev)
assert all(v == 1 for v in ids.values()), [k for k, v in ids.items() if v > 1][:5]
assert set(charges) == want and all(v == 1 for v in charges.values()), len(charges)
assert all(e["state"] == "DONE" and e["bankRef"] for e in ev)
PY
	[ "$(sqs-stat --queue "$IDEMKIT_OUTBOX")" = '{"visible":0,"inflight":0,"delayed":0}' ]
	report "outbox ($BACKEND): $N charges, $(wc -l < "$BATS_TEST_TMPDIR/messages") messages, relay killed -9 $KILLS times: drained and published in ${took}s; $copies event messages for $N events ($((copies - N)) same-eventId copies); consumer applied $N once each in $((SECONDS - cstart))s"
}
