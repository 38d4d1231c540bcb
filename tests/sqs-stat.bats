#!/usr/bin/env bats
# sqs-stat on the embedded default queue: counts and exit codes.

bats_require_minimum_version 1.5.0
load helper
load lock

@test "sqs-stat: 0 and exact counts on the SQLite queue" {
	run sqs-stat
	[ "$status" -eq 0 ]
	[ "$output" = '{"visible":0,"inflight":0,"delayed":0}' ]
	seq 1 3 | sqs-send >/dev/null
	echo later | sqs-send --delay 60 >/dev/null
	sqs-recv >/dev/null
	run sqs-stat
	[ "$output" = '{"visible":2,"inflight":1,"delayed":1}' ]
}

@test "sqs-stat: 64, 70, 75, 78" {
	run sqs-stat extra
	[ "$status" -eq 64 ]
	run bash -c 'sqs-stat >&-'
	[ "$status" -eq 70 ]
	run sqs-stat --queue 'sqlite:nohash'
	[ "$status" -eq 78 ]
	[[ "$output" == "sqs-stat: queue URL 'sqlite:nohash': no #NAME"* ]]
	echo x | sqs-send >/dev/null
	# a read does not wait for a writer (WAL): to see 75 the file must be
	# locked exclusively
	hold_write_lock "$IDEMKIT_STATE_DIR/queue.db" --exclusive
	IDEMKIT_BUSY_TIMEOUT=100ms run sqs-stat
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
}

@test "--resolve: the queue, the DLQ sqs-ack would fill and the state directory, as the C code resolves them" {
	run --separate-stderr sqs-stat --resolve
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "$(printf 'queue\tsqlite:%s/queue.db#charges' "$IDEMKIT_STATE_DIR")" ]
	[ "${lines[1]}" = "$(printf 'dlq\tsqlite:%s/queue.db#charges-dlq' "$IDEMKIT_STATE_DIR")" ]
	[ "${lines[2]}" = "$(printf 'stateDir\t%s' "$IDEMKIT_STATE_DIR")" ]
	IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#orders" run --separate-stderr sqs-stat --resolve
	[ "${lines[1]}" = "$(printf 'dlq\tsqlite:%s/q.db#orders-dlq' "$BATS_TEST_TMPDIR")" ]
	IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/d.db#dead" run --separate-stderr sqs-stat --resolve
	[ "${lines[1]}" = "$(printf 'dlq\tsqlite:%s/d.db#dead' "$BATS_TEST_TMPDIR")" ]
	run --separate-stderr sqs-stat --resolve --dlq "sqlite:$BATS_TEST_TMPDIR/e.db#x"
	[ "${lines[1]}" = "$(printf 'dlq\tsqlite:%s/e.db#x' "$BATS_TEST_TMPDIR")" ]
}

@test "--dlq URL alone counts that dead-letter queue (an operator's look at the dead letters); with --queue too, 64" {
	dlq="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	echo poison | sqs-send --queue "$dlq" >/dev/null
	run -0 --separate-stderr sqs-stat --dlq "$dlq"
	[ "$output" = '{"visible":1,"inflight":0,"delayed":0}' ]
	run -0 --separate-stderr sqs-stat --queue "sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	[ "$output" = '{"visible":0,"inflight":0,"delayed":0}' ]
	run -64 --separate-stderr sqs-stat --queue "sqlite:$BATS_TEST_TMPDIR/q.db#charges" --dlq "$dlq"
	[ "$stderr" = "sqs-stat: --queue and --dlq name two queues: count one at a time (--dlq URL alone counts the dead-letter queue)" ]
	[ -z "$output" ]
}

@test "--resolve: an SQS queue with no DLQ configured is 78" {
	aws_test_env
	IDEMKIT_QUEUE=http://127.0.0.1:1/000000000000/q run --separate-stderr sqs-stat --resolve
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"sqs-stat: "* ]]
}
