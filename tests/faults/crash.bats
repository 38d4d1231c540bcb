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
# dynamodb-local (DynamoDB Local) on DynamoDB + SQS (local-aws-sqs).

load faults

N=20
BACKEND=${IDEMKIT_TEST_BACKEND:-sqlite}

setup() {
	case $BACKEND in
	sqlite) embedded_queue 2 ;;
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
crash_run() {
	start=$SECONDS
	drain 120 -j 4 --no-lock
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
