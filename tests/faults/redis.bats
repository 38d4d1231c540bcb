#!/usr/bin/env bats
# The Redis store under faults: the duplicate storm (2 000 charges x 1-5
# deliveries, 8 workers -> 2 000 debits), the same storm with redis-server
# killed with kill -9 and restarted (AOF, appendfsync always) in the
# middle, acknowledged claims surviving a kill -9, and a stream whose store
# was down at its first envelope recording again once the server is back (a
# transient failure to open is retried, not kept).  STORM_N overrides the
# number of charges.

load faults
load ../redis_helper
# One storm at a time in this file: each keeps 8 workers busy.
BATS_NO_PARALLELIZE_WITHIN_FILE=true

N=${STORM_N:-2000}

setup() {
	require_redis
	redis_start
	bank_start
	embedded_queue 2
	export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
}
teardown() {
	bank_stop
	redis_stop
}

# rstorm NAME: the storm's charges and messages, sent.
rstorm() {
	charges "$N" "$BATS_TEST_TMPDIR/charges" "$1"
	deliveries "$BATS_TEST_TMPDIR/charges" "$BATS_TEST_TMPDIR/messages" 42
	M=$(wc -l < "$BATS_TEST_TMPDIR/messages")
	sqs-send < "$BATS_TEST_TMPDIR/messages" > /dev/null
	[ "$(qdepth)" -eq "$M" ]
}

@test "duplicate storm, Redis store: $N charges x 1-5 deliveries, 8 workers -> $N debits, queue and DLQ empty, all DONE" {
	rstorm RSTORM
	start=$SECONDS
	drain 500 -j 8 --stream
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "storm redis: $N charges, $M messages, 8 workers --stream: drained in $((SECONDS - start))s; bank debits $(stat_of "$(bank_stats)" debits), attempts $(stat_of "$(bank_stats)" attempts), replays $REPLAYS"
}

@test "redis-server killed with kill -9 and restarted in the middle of a storm: no claim lost, nothing debited twice" {
	rstorm RKILL
	start=$SECONDS
	drain 500 -j 8 --stream &
	drainer=$!
	# kill once a third of the charges are debited
	for _ in $(seq 600); do
		[ "$(stat_of "$(bank_stats)" debits)" -ge $((N / 3)) ] && break
		sleep 0.1
	done
	before=$(stat_of "$(bank_stats)" debits)
	[ "$before" -lt "$N" ]   # the kill lands mid-storm
	redis_kill9
	sleep 1
	redis_restart
	rc=0
	wait "$drainer" || rc=$?
	[ "$rc" -eq 0 ]
	for st in IN_PROGRESS DONE FAILED DEBITED_NOTIFICATION_FAILED; do
		echo "$st: $(idemp-list --state "$st" 2>/dev/null | wc -l) listed, $(rcli ZCARD "idemkit:idx:$st") indexed"
	done
	echo "records: $(rcli DBSIZE) keys"
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "storm redis kill -9: $N charges, $M messages; killed at $before debits, restarted after 1s; drained in $((SECONDS - start))s; bank debits $(stat_of "$(bank_stats)" debits), attempts $(stat_of "$(bank_stats)" attempts), replays $REPLAYS"
}

@test "every claim acknowledged before a kill -9 is there after the restart, with its token" {
	for i in $(seq 1 300); do ev "ACK-$i"; done |
		idemp-claim --stream > "$BATS_TEST_TMPDIR/acked" 2>/dev/null
	redis_kill9
	redis_restart
	python3 - "$BATS_TEST_TMPDIR/acked" > "$BATS_TEST_TMPDIR/want" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)["claim"]
    if c["outcome"] == "ACQUIRED":
        print(c["chargeId"], c["token"])
PY
	[ "$(wc -l < "$BATS_TEST_TMPDIR/want")" -eq 300 ]
	while read -r id token; do
		[ "$(rcli HGET "idemkit:rec:$id" owner)" = "$token" ] || { echo "lost: $id" >&2; return 1; }
	done < "$BATS_TEST_TMPDIR/want"
	run --separate-stderr idemp-claim < <(ev ACK-7)
	[ "$status" -eq 11 ]
}

@test "a stream whose store was down at its first envelope opens it again once the server is back: later envelopes are recorded, not TEMPFAIL until a restart" {
	t=$BATS_TEST_TMPDIR
	# claimed, debited and notified: idemp-done records DONE
	a=$(debited "$(ev RDOWN-1 | idemp-claim 2>/dev/null)" | sed 's/}$/,"notify":{"outcome":"OK"}}/')
	b=$(debited "$(ev RDOWN-2 | idemp-claim 2>/dev/null)" | sed 's/}$/,"notify":{"outcome":"OK"}}/')
	[ "$(jget "$a" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$b" claim.outcome)" = ACQUIRED ]
	redis_stop
	mkfifo "$t/in" "$t/out"
	idemp-done --stream < "$t/in" > "$t/out" 2> "$t/err" 3>&- &
	pid=$!
	exec 5> "$t/in"
	exec 6< "$t/out"
	printf '%s\n' "$a" >&5          # the first envelope: the open fails
	IFS= read -r -t 20 -u 6 answer
	[ "$(jget "$answer" done.outcome)" = TEMPFAIL ]
	redis_restart 5>&- 6<&-   # the server must not hold the stream's pipes
	# The same process, the server back: the open is tried again after a
	# short backoff, so an envelope soon after is recorded (bounded: with
	# the failure kept for good, all 100 are TEMPFAIL).
	for _ in $(seq 100); do
		printf '%s\n' "$b" >&5
		IFS= read -r -t 20 -u 6 answer
		[ "$(jget "$answer" done.outcome)" = TEMPFAIL ] || break
		sleep 0.1
	done
	[ "$(jget "$answer" done.outcome)" = OK ]
	[ "$(jget "$answer" done.state)" = DONE ]
	printf '%s\n' "$a" >&5          # and the one left by the outage, redelivered
	IFS= read -r -t 20 -u 6 answer
	[ "$(jget "$answer" done.outcome)" = OK ]
	exec 5>&- 6<&-
	wait "$pid"
	[ "$(jget "$(idemp-show --json RDOWN-1)" state)" = DONE ]
	[ "$(jget "$(idemp-show --json RDOWN-2)" state)" = DONE ]
}
