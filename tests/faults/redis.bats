#!/usr/bin/env bats
# The Redis store under faults: the duplicate storm (2 000 charges x 1-5
# deliveries, 8 workers -> 2 000 debits), the same storm with redis-server
# killed with kill -9 and restarted (AOF, appendfsync always) in the
# middle, and acknowledged claims surviving a kill -9.  STORM_N overrides
# the number of charges.

load faults
load ../redis_helper

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
