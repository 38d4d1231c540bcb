#!/usr/bin/env bats
# Crash at every step boundary: kill -9 a worker after the claim, during
# the debit (the bank answers slowly), after the debit before idemp-done,
# and after idemp-done before the ack; 20 charges, each crashed once at the
# boundary (tests/faults/crashstep.sh wraps the step through charge-worker's
# *_CMD overrides).  After the leases (12s) and visibility timeouts (2s)
# expire and the messages return: every charge debited exactly once at the
# bank, every record DONE, queue and DLQ empty.  The second debit attempts
# the bank absorbed as replays are counted and reported.  On the embedded
# default, or with IDEMKIT_TEST_BACKEND=dynamodb (dynalite) or
# dynamodb-local (DynamoDB Local) on DynamoDB + SQS (local-aws-sqs), or with
# IDEMKIT_TEST_QUEUE_BACKEND=amqp on a RabbitMQ queue (one broker for the
# file, tests/rabbit_helper.bash) and the embedded store; there no holder
# may be left holding a delivery at the end (a held delivery is in none of
# sqs-stat's counts: faults.bash held_none).

load faults
load ../rabbit_helper

N=20
BACKEND=${IDEMKIT_TEST_BACKEND:-sqlite}

QBACKEND=${IDEMKIT_TEST_QUEUE_BACKEND:-}

setup_file() {
	[ "$QBACKEND" != amqp ] || { require_rabbit; rabbit_start; }
}
teardown_file() {
	[ "$QBACKEND" != amqp ] || rabbit_stop
}

setup() {
	case $QBACKEND:$BACKEND in
	amqp:*)
		require_rabbit
		local q=crash${BATS_TEST_NUMBER}x$$x$RANDOM
		export IDEMKIT_QUEUE IDEMKIT_DLQ IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/idem.db
		IDEMKIT_QUEUE=$(rabbit_url "$q" "visibility=2")
		IDEMKIT_DLQ=$(rabbit_url "$q-dlq")
		BACKEND=amqp ;;
	:sqlite) embedded_queue 2 ;;
	*) aws_queue_store "$BACKEND" ;;
	esac
	export CRASH_DIR=$BATS_TEST_TMPDIR/crashes
	mkdir -p "$CRASH_DIR"
	charges "$N" "$BATS_TEST_TMPDIR/charges" "CRASH$BATS_TEST_NUMBER"
	sqs-send < "$BATS_TEST_TMPDIR/charges" > /dev/null
}
teardown() {
	bank_stop
	aws_stop
}

W=$BATS_TEST_DIRNAME/crashstep.sh

# crash_run: drain with -j 4 one-shot loops (the wrappers need one process
# per step), no lock (killed loops leave nothing behind that matters).
# Within 120 s, 300 on RabbitMQ: there each one-shot receive opens a
# connection of its own (its holder), and the drain's 6-7 rounds took
# 16-20 s each at a load of 35 (after-claim: recovered in 120 s).
crash_run() {
	local max=120
	[ "$BACKEND" != amqp ] || max=420
	start=$SECONDS
	drain "$max" -j 4 --no-lock
	[ "$(find "$CRASH_DIR" -mindepth 1 -maxdepth 1 | wc -l)" -eq "$N" ]
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	ATTEMPTS=$(idemp-list --state DONE | python3 -c 'import json,sys; print(sorted(set(json.loads(l)["attempts"] for l in sys.stdin)))')
	report "crash $1 ($BACKEND): $N charges, $N kill -9: recovered in $((SECONDS - start))s; bank debits $(stat_of "$(bank_stats)" debits), replays absorbed $REPLAYS; record attempts $ATTEMPTS"
}

@test "kill -9 after the claim: each charge debited once after the lease expires, no replay needed" {
	bank_start
	IDEMP_CLAIM_CMD="$W after-claim idemp-claim" crash_run after-claim
	[ "$REPLAYS" -eq 0 ]
	[ "$ATTEMPTS" = "[2]" ]
}

@test "kill -9 during the debit (bank latency 400ms): each charge debited once; retries absorbed as replays" {
	bank_start --latency 400ms
	CHARGE_DEBIT_CMD="$W during-debit charge-debit" crash_run during-debit
	[ "$REPLAYS" -le "$N" ]
	[ "$ATTEMPTS" = "[2]" ]
}

@test "kill -9 after the debit, before idemp-done: the retry is a replay at the bank, never a second debit" {
	bank_start
	CHARGE_DEBIT_CMD="$W after-debit charge-debit" crash_run after-debit
	[ "$REPLAYS" -eq "$N" ]
	[ "$ATTEMPTS" = "[2]" ]
}

@test "kill -9 after idemp-done, before the ack: the redelivery is DUP_DONE and deleted, the bank sees nothing more" {
	bank_start
	SQS_ACK_CMD="$W after-done sqs-ack" crash_run after-done
	[ "$REPLAYS" -eq 0 ]
	[ "$ATTEMPTS" = "[1]" ]
	[ "$(stat_of "$(bank_stats)" attempts)" -eq "$N" ]
}
