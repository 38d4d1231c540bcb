#!/usr/bin/env bats
# sqs-ack on the embedded default queue: every exit code it documents, the
# stream mode (order, per-entry results, batching, no added latency) and
# the action table in its man page; a debit the bank refuses as CONFIG
# (one charge among good ones; every charge) through charge-worker and
# bank-sim.  The actions themselves, on both backends: tests/queue.bats.

bats_require_minimum_version 1.5.0
load helper
load lock
load queue_backend
load bank_helper

teardown() {
	bank_stop
	[ -z "${ACK_PID:-}" ] || { kill "$ACK_PID" 2>/dev/null; wait "$ACK_PID" 2>/dev/null || true; }
}

# config_setup N: N charges (CHG-CF-1..N, ACC-1) on a fresh embedded queue
# whose redrive policy allows 3 deliveries, visibility 1 s, and a store.
config_setup() {
	local db=$BATS_TEST_TMPDIR/cq.db i
	export IDEMKIT_QUEUE="sqlite:$db#ch" IDEMKIT_DLQ="sqlite:$db#ch-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db" IDEMKIT_LOG=warn
	for i in $(seq "$1"); do event "CHG-CF-$i"; echo; done |
		sqs-send --queue "$IDEMKIT_QUEUE?maxReceiveCount=3&dlq=ch-dlq&visibility=1" >/dev/null
}
cfast=(--lease 12s --debit-timeout 1 --notify-timeout 1 --notify-retries 0)

# one received envelope with the given results merged in
recv_with() {
	sqs-recv "${@:2}" | envset "$1"
}

@test "sqs-ack: 0 for a finished charge: deleted" {
	echo '{"chargeId":"CHG-1"}' | sqs-send >/dev/null
	run --separate-stderr sqs-ack <<<"$(recv_with "$FINISHED" --visibility 1)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.outcome)" = OK ]
	[ "$(jget "$output" ack.action)" = delete ]
	[ "$(jget "$output" claim.chargeId)" = CHG-1 ]   # the envelope goes on whole
	sleep 1.1
	run sqs-recv
	[ "$status" -eq 1 ]
}

@test "sqs-ack: DLQ by default next to an embedded queue; the chargeId in the audit line" {
	echo '{"chargeId":"CHG-7","amount":1}' | sqs-send >/dev/null
	run --separate-stderr sqs-ack <<<"$(recv_with '{"claim":{"outcome":"DUP_FAILED","chargeId":"CHG-7","error":"declined before"}}')"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.dlq)" = "sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq" ]
	[[ "$stderr" == *'"level":"audit"'*'"chargeId":"CHG-7"'*'"outcome":"DUP_FAILED"'* ]]
	run sqs-recv --queue "sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq"
	[ "$(jget "$output" body)" = '{"chargeId":"CHG-7","amount":1}' ]
}

@test "sqs-ack --stream: a delete after a DLQ send into the same file is there for every process at once, whoever closes meanwhile" {
	# The embedded queue and its DLQ share a file, so sqs-ack opens it a
	# second time.  SQLite's locks belong to the process: had that second
	# open closed a descriptor of the file, the first connection's lock was
	# gone, the next process to close its last connection (sqs-stat here,
	# another pipeline of charge-worker -j 4 in the demo) took the file as
	# unused and deleted the WAL under sqs-ack, and sqs-ack's later deletes
	# went into the deleted WAL: acked, yet in flight for every other
	# process, then "database disk image is malformed" (CI, make demo-postgres).
	printf '%s\n' poison good | sqs-send >/dev/null
	sqs-recv --max 2 --visibility 60 >"$BATS_TEST_TMPDIR/r"
	[ "$(wc -l <"$BATS_TEST_TMPDIR/r")" -eq 2 ]
	mkfifo "$BATS_TEST_TMPDIR/in"
	sqs-ack --stream <"$BATS_TEST_TMPDIR/in" >"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" 3>&- &
	ACK_PID=$!
	STREAM_OUT=$BATS_TEST_TMPDIR/out   # for helper.bash's stream_lines
	exec 5>"$BATS_TEST_TMPDIR/in"
	sed -n 1p "$BATS_TEST_TMPDIR/r" | envset '{"claim":{"outcome":"DATAERR","error":"not JSON"}}' >&5
	stream_lines 1
	[ "$(jget "$(cat "$BATS_TEST_TMPDIR/out")" ack.action)" = dlq ]
	[[ $(sqs-stat) == *'"visible":0,"inflight":1,"delayed":0'* ]]   # opened and closed
	sed -n 2p "$BATS_TEST_TMPDIR/r" | envset "$FINISHED" >&5
	stream_lines 2
	[ "$(jget "$(sed -n 2p "$BATS_TEST_TMPDIR/out")" ack.action)" = delete ]
	# sqs-ack still running: its delete is seen by another process
	run sqs-stat
	echo "$output"
	[[ $output == *'"visible":0,"inflight":0,"delayed":0'* ]]
	exec 5>&-
	wait "$ACK_PID"
	ACK_PID=
	[[ $(sqs-stat) == *'"visible":0,"inflight":0,"delayed":0'* ]]
	run sqs-stat --queue "sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq"
	[[ $output == *'"visible":1,'* ]]
	run sqlite3 "$IDEMKIT_STATE_DIR/queue.db" 'PRAGMA integrity_check'
	[ "$output" = ok ]
}

@test "sqs-ack: the TEMPFAIL backoff is capped" {
	echo x | sqs-send >/dev/null
	env=$(recv_with '{"claim":{"outcome":"TEMPFAIL"},"receiveCount":9}')
	run --separate-stderr sqs-ack --backoff-base 2 --backoff-cap 5 <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.visibility)" = 5 ]
	IDEMKIT_BACKOFF_BASE=1 run --separate-stderr sqs-ack <<<"$(envset '{"receiveCount":3}' <<<"$env")"
	[ "$(jget "$output" ack.visibility)" = 8 ]
}

@test "sqs-ack: DUP_IN_PROGRESS comes back in seconds, growing with receiveCount, never after the lease" {
	echo x | sqs-send >/dev/null
	lease=$(( $(date +%s%3N) + 120000 ))
	env=$(recv_with "{\"claim\":{\"outcome\":\"DUP_IN_PROGRESS\",\"leaseUntil\":$lease}}")
	run --separate-stderr sqs-ack <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.action)" = leave-lease ]
	[ "$(jget "$output" ack.visibility)" = 2 ]
	run --separate-stderr sqs-ack <<<"$(envset '{"receiveCount":3}' <<<"$env")"
	[ "$(jget "$output" ack.visibility)" = 8 ]
	run --separate-stderr sqs-ack <<<"$(envset '{"receiveCount":9}' <<<"$env")"
	v=$(jget "$output" ack.visibility)
	[ "$v" -le 120 ] && [ "$v" -ge 110 ]   # 512 s capped at the lease left
}

@test "sqs-ack: DUP_IN_PROGRESS on a store clock an hour off ours: never parked past the holder's whole lease; the delivery before the last waits that whole lease" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/mq.db#mq"
	echo x | sqs-send --queue "$IDEMKIT_QUEUE?maxReceiveCount=10&dlq=mq-dlq" >/dev/null
	ahead=$(( $(date +%s%3N) + 3600000 )) behind=$(( $(date +%s%3N) - 3600000 ))
	env=$(recv_with "{\"claim\":{\"outcome\":\"DUP_IN_PROGRESS\",\"leaseUntil\":$ahead,\"holderLeaseMs\":30000},\"receiveCount\":8}")
	run --separate-stderr sqs-ack <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.action)" = leave-lease ]
	[ "$(jget "$output" ack.visibility)" = 30 ]   # 256 s capped at the whole lease, not the hour
	# the store's clock an hour behind: leaseUntil is past by ours, yet the
	# delivery before the last comes back after the whole lease, not at once
	run --separate-stderr sqs-ack <<<"$(envset "{\"claim\":{\"outcome\":\"DUP_IN_PROGRESS\",\"leaseUntil\":$behind,\"holderLeaseMs\":30000},\"receiveCount\":9}" <<<"$env")"
	[ "$(jget "$output" ack.visibility)" = 30 ]
	# without holderLeaseMs (an older idemp-claim): what our clock says
	run --separate-stderr sqs-ack <<<"$(envset "{\"claim\":{\"outcome\":\"DUP_IN_PROGRESS\",\"leaseUntil\":$behind},\"receiveCount\":9}" <<<"$env")"
	[ "$(jget "$output" ack.visibility)" = 0 ]
}

@test "sqs-ack: LEASE_SHORT from the debit: the claim was released, so leave with a backoff" {
	echo x | sqs-send >/dev/null
	env=$(recv_with '{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-1","token":"t","attempt":1,"leaseUntil":1},"debit":{"outcome":"LEASE_SHORT","error":"lease has 2s left, the bank call needs 12s"},"receiveCount":2}')
	# (base 10: hidden for 20 s; a base of 1 hid it 2 s, which CI's loaded
	# sanitizer run spent between sqs-ack's start and sqs-stat's look)
	run --separate-stderr sqs-ack --backoff-base 10 <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.verdict)" = LEASE_SHORT ]
	[ "$(jget "$output" ack.action)" = leave-backoff ]
	[ "$(jget "$output" ack.visibility)" = 20 ]   # 2^attempt x base: the tries, not the receives
	[ "$(sqs-stat)" = '{"visible":0,"inflight":1,"delayed":0}' ]   # left, hidden for the backoff
}

@test "sqs-ack: the leave-backoff grows with the claim's attempt; receiveCount only without an ACQUIRED claim" {
	echo x | sqs-send >/dev/null
	env=$(recv_with '{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-1","token":"t","attempt":3,"leaseUntil":1},"debit":{"outcome":"TEMPFAIL","error":"HTTP 503"},"receiveCount":9}')
	run --separate-stderr sqs-ack --backoff-base 1 <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.action)" = leave-backoff ]
	[ "$(jget "$output" ack.visibility)" = 8 ]   # 2^3 x 1 s, not 2^9
	# no attempt (a claim from before there was one): the receives
	run --separate-stderr sqs-ack --backoff-base 1 <<<"$(envset '{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-1"},"receiveCount":5}' <<<"$env")"
	[ "$(jget "$output" ack.visibility)" = 32 ]
	# the store failed at the claim: no claim of ours, the receives
	run --separate-stderr sqs-ack --backoff-base 1 <<<"$(envset '{"claim":{"outcome":"TEMPFAIL","error":"store unreachable"},"receiveCount":5}' <<<"$env")"
	[ "$(jget "$output" ack.verdict)" = TEMPFAIL ]
	[ "$(jget "$output" ack.visibility)" = 32 ]
}

@test "sqs-ack: 13 for a stale receipt; nothing deleted" {
	echo x | sqs-send >/dev/null
	old=$(recv_with "$FINISHED" --visibility 0)
	new=$(recv_with "$FINISHED")
	run --separate-stderr sqs-ack <<<"$old"
	[ "$status" -eq 13 ]
	[ "$(jget "$output" ack.outcome)" = LEASE_LOST ]
	[ "$stderr" = "sqs-ack: stale receipt handle: message $(jget "$old" messageId) was received again since" ]
	run sqs-ack <<<"$new"
	[ "$status" -eq 0 ]
}

@test "sqs-ack: 64 on a bad command line or two envelopes without --stream" {
	run sqs-ack --backoff-base 0
	[ "$status" -eq 64 ]
	run sqs-ack extra
	[ "$status" -eq 64 ]
	run sqs-ack <<<$'{"v":1,"receipt":"a"}\n{"v":1,"receipt":"b"}'
	[ "$status" -eq 64 ]
	[[ "$output" == *"more than one envelope; use --stream"* ]]
}

@test "sqs-ack: 65 for a line without a receipt; no input is 1 (EMPTY, nothing to do)" {
	run --separate-stderr sqs-ack <<<'{"chargeId":"CHG-1"}'
	[ "$status" -eq 65 ]
	[ "$(jget "$output" ack.outcome)" = DATAERR ]
	[ "$(jget "$output" body)" = '{"chargeId":"CHG-1"}' ]
	[[ "$stderr" == *"no receipt"* ]]
	run --separate-stderr sqs-ack </dev/null
	[ "$status" -eq 1 ]
	[ "$stderr" = "sqs-ack: stdin: no envelope or event: nothing to do" ]
	run sqs-ack --queue "sqlite:$BATS_TEST_TMPDIR/q.db#main" <<<'{"v":1,"body":"x","receipt":"not-ours","claim":{"outcome":"DUP_DONE"}}'
	[ "$status" -eq 65 ]
	[[ "$output" == *"not a receipt handle of this queue"* ]]
}

@test "sqs-ack: 70 when stdout is closed (the delete itself was done)" {
	echo x | sqs-send >/dev/null
	recv_with "$FINISHED" --visibility 1 >"$BATS_TEST_TMPDIR/env"
	run bash -c 'sqs-ack <"$1" >&-' _ "$BATS_TEST_TMPDIR/env"
	[ "$status" -eq 70 ]
	sleep 1.1
	run sqs-recv
	[ "$status" -eq 1 ]
}

@test "sqs-ack: 75 when the queue is busy; the message is left" {
	echo x | sqs-send >/dev/null
	env=$(recv_with "$FINISHED" --visibility 1)
	hold_write_lock "$IDEMKIT_STATE_DIR/queue.db"
	IDEMKIT_BUSY_TIMEOUT=100ms run --separate-stderr sqs-ack <<<"$env"
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[ "$(jget "$output" ack.outcome)" = TEMPFAIL ]
	sleep 1.1
	run sqs-recv
	[ "$status" -eq 0 ]
}

@test "sqs-ack: 78 on a malformed queue URL, or an SQS queue with no DLQ" {
	run --separate-stderr sqs-ack --queue 'sqs://nope' <<<'{"v":1,"body":"x","receipt":"r","claim":{"outcome":"DUP_DONE"}}'
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"queue URL 'sqs://nope': unknown scheme"* ]]
	# an SQS queue opens without the network; the missing DLQ is found first
	export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	export AWS_EC2_METADATA_DISABLED=true AWS_ENDPOINT_URL_SQS=http://127.0.0.1:1
	export AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent
	run --separate-stderr sqs-ack <<<'{"v":1,"body":"x","receipt":"r","queue":"https://sqs.us-east-1.amazonaws.com/123456789012/charges","claim":{"outcome":"DUP_FAILED"}}'
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"no dead-letter queue for https://sqs.us-east-1.amazonaws.com/123456789012/charges"* ]]
}

@test "sqs-ack --stream: envelopes from two queues: each poison message goes to its own queue's DLQ" {
	db=$BATS_TEST_TMPDIR/two.db
	unset IDEMKIT_QUEUE IDEMKIT_DLQ
	poison='{"claim":{"outcome":"DATAERR","error":"not JSON"}}'
	echo 'poison-a' | sqs-send --queue "sqlite:$db#a" >/dev/null
	echo 'poison-b' | sqs-send --queue "sqlite:$db#b" >/dev/null
	echo 'poison-a2' | sqs-send --queue "sqlite:$db#a" >/dev/null
	{
		sqs-recv --queue "sqlite:$db#a" | envset "$poison"
		sqs-recv --queue "sqlite:$db#b" | envset "$poison"
		sqs-recv --queue "sqlite:$db#a" | envset "$poison"
	} >"$BATS_TEST_TMPDIR/in"
	run --separate-stderr sqs-ack --stream <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[ "$(jget "${lines[0]}" ack.dlq)" = "sqlite:$db#a-dlq" ]
	[ "$(jget "${lines[1]}" ack.dlq)" = "sqlite:$db#b-dlq" ]
	[ "$(jget "${lines[2]}" ack.dlq)" = "sqlite:$db#a-dlq" ]
	# what each DLQ holds, read back
	run sqs-recv --queue "sqlite:$db#b-dlq" --max 10
	[ "${#lines[@]}" -eq 1 ]
	[ "$(jget "$output" body)" = poison-b ]
	run sqs-recv --queue "sqlite:$db#a-dlq" --max 10
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" body)$(jget "${lines[1]}" body)" = poison-apoison-a2 ]
	for q in a b; do
		[ "$(sqs-stat --queue "sqlite:$db#$q" | sed -n 's/.*"visible":\([0-9]*\).*/\1/p')" = 0 ]
	done
}

@test "sqs-ack --stream: in order, each with its own result, exit 0" {
	printf '%s\n' a b c | sqs-send >/dev/null
	sqs-recv --max 10 --visibility 0 >"$BATS_TEST_TMPDIR/old"
	sqs-recv --max 10 >"$BATS_TEST_TMPDIR/new"
	{
		sed -n 1p "$BATS_TEST_TMPDIR/new" | envset "$FINISHED"
		echo 'not an envelope'
		sed -n 2p "$BATS_TEST_TMPDIR/old" | envset "$FINISHED"   # stale
		sed -n 3p "$BATS_TEST_TMPDIR/new" | envset '{"claim":{"outcome":"LEASE_LOST"}}'
		sed -n 2p "$BATS_TEST_TMPDIR/new" | envset "$FINISHED"
	} >"$BATS_TEST_TMPDIR/in"
	run --separate-stderr sqs-ack --stream <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 5 ]
	got=$(for l in "${lines[@]}"; do printf '%s/%s ' "$(jget "$l" ack.action)" "$(jget "$l" ack.outcome)"; done)
	[ "$got" = "delete/OK none/DATAERR delete/LEASE_LOST leave/OK delete/OK " ]
	[ "$(jget "${lines[1]}" body)" = 'not an envelope' ]
}

@test "sqs-ack --stream: a partial batch goes out as soon as the input is quiet" {
	echo x | sqs-send >/dev/null
	recv_with "$FINISHED" >"$BATS_TEST_TMPDIR/env"
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	sqs-ack --stream <"$BATS_TEST_TMPDIR/fifo" >"$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5>"$BATS_TEST_TMPDIR/fifo"
	cat "$BATS_TEST_TMPDIR/env" >&5
	for _ in $(seq 1 40); do [ -s "$BATS_TEST_TMPDIR/out" ] && break; sleep 0.05; done
	[ "$(jget "$(cat "$BATS_TEST_TMPDIR/out")" ack.outcome)" = OK ]   # while stdin is still open
	exec 5>&-
	wait "$pid"
}

@test "sqs-ack --stream: deletes go out in batches of 10 (DeleteMessageBatch)" {
	LOG=$BATS_TEST_TMPDIR/requests
	python3 "$IDEMKIT_SRC/tests/sigv4_capture.py" "$BATS_TEST_TMPDIR/port" "$LOG" 3>&- &
	cap=$!
	for _ in $(seq 1 100); do [ -s "$BATS_TEST_TMPDIR/port" ] && break; sleep 0.05; done
	port=$(cat "$BATS_TEST_TMPDIR/port")
	export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	export AWS_EC2_METADATA_DISABLED=true AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$port
	export AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent
	q=http://127.0.0.1:$port/123456789012/charges
	for i in $(seq 1 25); do
		echo "{\"v\":1,\"queue\":\"$q\",\"messageId\":\"m$i\",\"receipt\":\"r$i\",\"receiveCount\":1,\"body\":\"b$i\"}"
	done | envset "$FINISHED" >"$BATS_TEST_TMPDIR/in"
	run --separate-stderr sqs-ack --stream <"$BATS_TEST_TMPDIR/in"
	kill "$cap"
	[ "$status" -eq 0 ]
	[ "$(printf '%s\n' "${lines[@]}" | grep -c '"outcome":"OK","action":"delete"')" -eq 25 ]
	python3 - "$LOG" <<'PY'
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
targets = [dict((k.lower(), v) for k, v in r["headers"])["x-amz-target"] for r in reqs]
sizes = [len(json.loads(r["body"])["Entries"]) for r in reqs]
assert targets == ["AmazonSQS.DeleteMessageBatch"] * 3, targets
assert sorted(sizes) == [5, 10, 10], sizes   # in flight: in the order they finish
PY
}

@test "sqs-ack --progress: the counts of idemkit-code --tally, added to what the file holds" {
	printf '%s\n' a b c | sqs-send >/dev/null
	sqs-recv --max 10 >"$BATS_TEST_TMPDIR/new"
	{
		sed -n 1p "$BATS_TEST_TMPDIR/new" | envset "$FINISHED"
		echo 'not an envelope'
		sed -n 2p "$BATS_TEST_TMPDIR/new" | envset '{"claim":{"outcome":"DUP_DONE"}}'
		sed -n 3p "$BATS_TEST_TMPDIR/new" | envset '{"claim":{"outcome":"LEASE_LOST"}}'
	} >"$BATS_TEST_TMPDIR/in"
	p=$BATS_TEST_TMPDIR/progress
	run --separate-stderr sqs-ack --stream --progress "$p" <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	printf '%s\n' "${lines[@]}" | idemkit-code --tally >"$BATS_TEST_TMPDIR/tally"
	# the same rows; LEFT (lines not settled: the non-envelope, the lease lost);
	# BANK_REPLAYED and STRANDED (lines no sqs-ack wrote) are for the summary
	# only, not the progress line
	diff <(grep -v 'UNSETTLED\|BANK_REPLAYED\|STRANDED' "$BATS_TEST_TMPDIR/tally") <(grep -v LEFT "$p")
	grep -qx "$(printf 'OK\t1')" "$p"
	grep -qx "$(printf 'RECEIVED\t4')" "$p"
	grep -qx "$(printf 'ACK_FAILED\t1')" "$p"
	grep -qx "$(printf 'LEFT\t2')" "$p"
	[ ! -e "$p.tmp" ]
	# a one-shot run (from the environment) adds to them
	echo d | sqs-send >/dev/null
	recv_with "$FINISHED" >"$BATS_TEST_TMPDIR/one"
	IDEMKIT_PROGRESS=$p run --separate-stderr sqs-ack <"$BATS_TEST_TMPDIR/one"
	[ "$status" -eq 0 ]
	grep -qx "$(printf 'OK\t2')" "$p"
	grep -qx "$(printf 'RECEIVED\t5')" "$p"
	grep -qx "$(printf 'LEFT\t2')" "$p"
	# a file that cannot be written is no error
	echo e | sqs-send >/dev/null
	recv_with "$FINISHED" >"$BATS_TEST_TMPDIR/one"
	run --separate-stderr sqs-ack --progress "$BATS_TEST_TMPDIR/no/such/dir/p" <"$BATS_TEST_TMPDIR/one"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.outcome)" = OK ]
	[ -z "$stderr" ]
}

@test "sqs-ack --stream --progress: the last counts are written while the input is still open" {
	printf '%s\n' a b | sqs-send >/dev/null
	sqs-recv --max 10 | envset "$FINISHED" >"$BATS_TEST_TMPDIR/envs"
	[ "$(wc -l <"$BATS_TEST_TMPDIR/envs")" -eq 2 ]
	p=$BATS_TEST_TMPDIR/progress
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	sqs-ack --stream --progress "$p" <"$BATS_TEST_TMPDIR/fifo" >"$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5>"$BATS_TEST_TMPDIR/fifo"
	# two at once: the second is counted within 250 ms of the first write,
	# so it is written when that time is up, not at the next line
	cat "$BATS_TEST_TMPDIR/envs" >&5
	for _ in $(seq 1 100); do grep -qx "$(printf 'RECEIVED\t2')" "$p" 2>/dev/null && break; sleep 0.05; done
	got=$(grep RECEIVED "$p")
	exec 5>&-
	wait "$pid"
	[ "$got" = "$(printf 'RECEIVED\t2')" ]
}

@test "sqs-ack: --actions is the library's table, and sqs-ack(1) prints every row" {
	run sqs-ack --actions
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 14 ]
	for row in "${lines[@]}"; do
		grep -qxF ".It ${row//$'\t'/ Ta }" "$IDEMKIT_SRC/man/sqs-ack.1" ||
			{ echo "missing in sqs-ack.1: $row"; return 1; }
	done
	[ "$(grep -c '^\.It [0-9]* Ta ' "$IDEMKIT_SRC/man/sqs-ack.1")" -eq 14 ]
}

@test "sqs-ack: the acker library against the embedded queue (C unit test)" {
	run "$IDEMKIT_TEST_BIN/acker" "$BATS_TEST_TMPDIR"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = ok ]
}

@test "sqs-ack: an SQS batch answer is applied by its entries' exact Ids: an unknown, malformed or missing Id to no message, an entry answered twice not as a success (C unit test)" {
	run "$IDEMKIT_TEST_BIN/sqs_batch"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = ok ]
}

@test "sqs-ack: --help and --version" {
	run sqs-ack --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"  13  LEASE_LOST"* ]]
	run sqs-ack --version
	[[ "$output" == "sqs-ack (idemkit) "* ]]
}

@test "sqs-ack: a charge the bank refuses with a status in neither list does not stop the others, and reaches the DLQ with its reason on its last delivery" {
	bank_start
	config_setup 4
	bank_post /control '{"errorStatus":400,"failKeys":{"CHG-CF-1":1000}}' >/dev/null
	run --separate-stderr charge-worker --drain "${cfast[@]}"
	[ "$status" -eq 78 ]             # the alarm: the bank refused a charge as misconfigured
	for i in 2 3 4; do
		[ "$(jget "$(idemp-show --json "CHG-CF-$i")" state)" = DONE ]
	done
	[ "$(bank_stat debits)" -eq 3 ]
	# bounded: at most the policy's 3 deliveries, then the DLQ, with the
	# reason.  Each drain ends at once while the message left is invisible
	# (the queue's 1 s), so the wait is for the DLQ, bounded in time, not a
	# count of drains (five ran inside that second on a fast machine).
	local end=$((SECONDS + 30))
	until [ "$(sqs-stat --queue "$IDEMKIT_DLQ" | sed -n 's/.*"visible":\([0-9]*\).*/\1/p')" = 1 ]; do
		[ "$SECONDS" -lt "$end" ] || break
		charge-worker --drain "${cfast[@]}" 2>/dev/null || true
		sleep 0.2
	done
	run sqs-recv --queue "$IDEMKIT_DLQ"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = "$(event CHG-CF-1)" ]
	python3 -c 'import json,sys; a=json.loads(sys.argv[1])["attributes"]
assert a["idemkit.reason"]=="CONFIG", a
assert a["idemkit.step"]=="debit", a
assert "HTTP 400" in a["idemkit.error"], a
assert a["idemkit.chargeId"]=="CHG-CF-1", a' "$output"
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	[ "$(bank_stat errors)" -le 3 ]
	[ "$(bank_stat debits)" -eq 3 ]
	[ "$(jget "$(idemp-show --json CHG-CF-1)" state)" = IN_PROGRESS ]   # nothing debited
}

@test "sqs-ack: a TEMPFAIL on the last delivery the queue's redrive policy allows goes to the DLQ with its reason, not moved without one by the queue at the next receive" {
	# the soak's run embedded 1006: a charge whose ten deliveries all met
	# faults (its debit at the bank, the 201 after the step's timeout) was
	# left on the tenth, and the queue's redrive dead-lettered it with no
	# reason, its record IN_PROGRESS
	local db=$BATS_TEST_TMPDIR/lq.db
	export IDEMKIT_QUEUE="sqlite:$db#lq" IDEMKIT_DLQ="sqlite:$db#lq-dlq"
	event CHG-LD-1 | sqs-send --queue "$IDEMKIT_QUEUE?maxReceiveCount=2&dlq=lq-dlq" >/dev/null
	local r='{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-LD-1","token":"t","attempt":1,"leaseUntil":1},"debit":{"outcome":"TEMPFAIL","error":"bank: Operation timed out after 2001 milliseconds with 0 bytes received"}}'
	run --separate-stderr sqs-ack --backoff-base 1 <<<"$(recv_with "$r")"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" ack.action)" = leave-backoff ]   # the first of two: left
	run --separate-stderr sqs-ack --backoff-base 1 <<<"$(recv_with "$r" --wait 10)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
	[ "$(jget "$output" ack.action)" = dlq ]
	[ "$(jget "$output" ack.maxReceiveCount)" = 2 ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	run sqs-recv --queue "$IDEMKIT_DLQ"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = "$(event CHG-LD-1)" ]
	python3 -c 'import json,sys; a=json.loads(sys.argv[1])["attributes"]
assert a["idemkit.reason"]=="TEMPFAIL", a
assert a["idemkit.step"]=="debit", a
assert "timed out" in a["idemkit.error"], a
assert a["idemkit.receiveCount"]=="2", a' "$output"
}

@test "sqs-ack: a configuration that refuses every charge stops the worker at the third refusal in a row (78), one message at a time, a receive at a time or --stream; nothing dead-lettered" {
	bank_start
	config_setup 40
	bank_post /control '{"errorStatus":400,"errorRate":1}' >/dev/null
	# one message at a time (a step replaced through the environment)
	IDEMP_DONE_CMD=idemp-done run --separate-stderr charge-worker --drain "${cfast[@]}"
	[ "$status" -eq 78 ]
	[ "$(bank_stat attempts)" -eq 3 ]
	[[ "$stderr" == *'"config":3}'* ]]
	# a receive's batch at a time: sqs-ack halts the batch, at most its 10
	run --separate-stderr charge-worker --drain "${cfast[@]}"
	[ "$status" -eq 78 ]
	[ "$(bank_stat attempts)" -gt 3 ]; [ "$(bank_stat attempts)" -le $((3 + 10)) ]
	# across batches of one message each: the loop counts the refusals,
	# and stops at the third.  Each message is sent once the bank has seen
	# the one before (messages due 2 s apart were received two at a time
	# by a sanitized worker whose start took longer on a loaded machine)
	local q="sqlite:$BATS_TEST_TMPDIR/cq.db#one" i n0 w rc=0
	n0=$(bank_stat attempts)
	event CHG-CF1-1 | sqs-send --queue "$q" >/dev/null
	IDEMKIT_QUEUE=$q charge-worker --drain --wait 10 "${cfast[@]}" \
		2>"$BATS_TEST_TMPDIR/one.err" 3>&- &
	w=$!
	for i in 2 3 4 5; do
		# (or the worker stopped: at the third refusal, before this one)
		until_bank attempts $((n0 + i - 1)) "$w" || break
		kill -0 "$w" 2>/dev/null || break
		event "CHG-CF1-$i" | sqs-send --queue "$q" >/dev/null
	done
	wait "$w" || rc=$?
	[ "$rc" -eq 78 ]
	[ "$(bank_stat attempts)" -eq $((n0 + 3)) ]
	grep -q '"received":3,' "$BATS_TEST_TMPDIR/one.err"
	# --stream: sqs-ack halts, and the pipeline winds down
	n0=$(bank_stat attempts)
	run --separate-stderr charge-worker --drain --stream --window 4 "${cfast[@]}"
	[ "$status" -eq 78 ]
	# bounded by what the receiver may hand out before it learns:
	# --window 4 plus one receive of up to 10, never the 40
	[ "$(bank_stat attempts)" -le $((n0 + 3 + 4 + 10)) ]
	[ "$(bank_stat debits)" -eq 0 ]
	[ "$(sqs-stat --queue "$IDEMKIT_DLQ")" = '{"visible":0,"inflight":0,"delayed":0}' ]
	s=$(sqs-stat)
	python3 -c 'import json,sys; s=json.loads(sys.argv[1]); assert s["visible"]+s["inflight"]+s["delayed"]==40, s' "$s"
}
