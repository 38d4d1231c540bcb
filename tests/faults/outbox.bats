#!/usr/bin/env bats
# The outbox under load and crashes (issue 27), on the embedded default
# or the store IDEMKIT_TEST_BACKEND picks (postgres: a throwaway server,
# pg_helper.bash):
# OUTBOX_N charges (default 800, what fits CI's faults step; OUTBOX_N=10000
# by hand), each delivered 1-5 times, drained by
# charge-worker --stream while the relay (idemp-outbox --follow) is killed
# -9 every few hundred events and started again; then four
# example consumers apply the events.  Every finished charge has exactly one
# event in the store, every event is on the queue at least once (a copy
# only with the same eventId), and the consumer applies each exactly once.

load faults

N=${OUTBOX_N:-800}

setup_file() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	postgres) . "$IDEMKIT_SRC/tests/pg_helper.bash"; pg_start ;;
	esac
}
teardown_file() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	postgres) . "$IDEMKIT_SRC/tests/pg_helper.bash"; pg_stop ;;
	esac
}
setup() { bank_start; }
teardown() {
	[ -z "${RELAY:-}" ] || kill -KILL "$RELAY" 2>/dev/null || true
	bank_stop
}
# outbox_store: the store for the test (after embedded_queue, which
# chose the embedded one), its outbox made by idemp-init.
outbox_store() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	postgres)
		export IDEMKIT_STORE="$PG_URL?table=fo_$$_$RANDOM"
		idemp-init >/dev/null
		;;
	esac
}

waiting() { idemp-outbox --stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["waiting"])'; }

# relay_chaos: starts relays, each killed -9 once it checkpointed about
# 300 more events, until the workers are done and nothing waits.
relay_chaos() {
	local i=0 lines
	while :; do
		i=$((i + 1))
		idemp-outbox --follow --lease 1s --poll 20ms >> "$BATS_TEST_TMPDIR/relay.out" \
			2>>"$BATS_TEST_TMPDIR/relay.err" 3>&- &
		RELAY=$!
		lines=$(wc -l < "$BATS_TEST_TMPDIR/relay.out")
		while [ "$(wc -l < "$BATS_TEST_TMPDIR/relay.out")" -lt $((lines + 300)) ]; do
			[ -e "$BATS_TEST_TMPDIR/workers.done" ] && [ "$(waiting)" -eq 0 ] && break 2
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
	export IDEMKIT_OUTBOX="sqlite:$BATS_TEST_TMPDIR/events.db#events"
	outbox_store
	charges "$N" "$BATS_TEST_TMPDIR/charges" OBX
	deliveries "$BATS_TEST_TMPDIR/charges" "$BATS_TEST_TMPDIR/messages" 27
	sqs-send < "$BATS_TEST_TMPDIR/messages" > /dev/null
	: > "$BATS_TEST_TMPDIR/relay.out"
	KILLS=0
	start=$SECONDS
	( drain 900 -j 4 --stream; touch "$BATS_TEST_TMPDIR/workers.done" ) 3>&- &
	workers=$!
	relay_chaos
	wait "$workers"
	took=$((SECONDS - start))
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	# one event per finished charge, in the store
	if [ "${IDEMKIT_TEST_BACKEND:-sqlite}" = sqlite ]; then
		[ "$(sqlite3 "$BATS_TEST_TMPDIR/idem.db" 'SELECT count(*), count(DISTINCT charge_id) FROM outbox')" = "$N|$N" ]
	fi
	# (elsewhere the store keeps no table of events: the consumer's check
	# below is that every finished charge had its one event)
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
	report "outbox (${IDEMKIT_TEST_BACKEND:-sqlite}): $N charges, $(wc -l < "$BATS_TEST_TMPDIR/messages") messages, relay killed -9 $KILLS times: drained and published in ${took}s; $copies event messages for $N events ($((copies - N)) same-eventId copies); consumer applied $N once each in $((SECONDS - cstart))s"
}
