#!/usr/bin/env bats
# Each step of charge-worker killed (SIGKILL) in turn, in each mode
# (--stream -j 2, one-shot batches -j 2, one message at a time -j 2), at
# several moments defined by the bank: debits at the bank, and
# notifications at the gateway (some debits answered, their envelopes past
# charge-debit).  Whatever was killed and whenever: every message still in
# flight on the queue is counted left for retry, a run that left any is
# neither 0 nor 1, and a step that held messages it took with it is named
# with their count (issue 48).  The compact case (charge-debit, --stream and
# one-shot) is in tests/charge-worker.bats; this is the whole matrix.

load faults

STEPS=(sqs-recv idemp-claim charge-debit charge-notify idemp-done sqs-ack)
OPTS=(--no-lock --lease 20s --debit-timeout 3 --notify-timeout 3 --notify-retries 0)

setup_file() {
	# one bank-sim for the file: every call answered after 1 s
	BATS_TEST_TMPDIR=$BATS_FILE_TMPDIR bank_start --latency 1000ms
	export BANK_PID BANK_DIR BANK_URL BANK_PORT
}
teardown_file() { BATS_TEST_TMPDIR=$BATS_FILE_TMPDIR bank_stop; }

# run_killed STEP COUNTER MODE...: a fresh queue (visibility 30 s: nothing
# stranded comes back during the run) with charges, every third sent twice
# (12 charges; 4 one message at a time); charge-worker --drain MODE in a
# session of its own; every STEP process of it killed once bank-sim's
# COUNTER grew by one.  Then the checks.
run_killed() {
	local step=$1 counter=$2 n=12 w c0 rc=0 s inflight i
	shift 2
	K=$((${K:-0} + 1))
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#k$K?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	[ "${IDEMP_DONE_CMD:-}" = "" ] || n=4
	for i in $(seq 1 "$n"); do
		event "CHG-$BATS_TEST_NUMBER-$K-$i"; echo
		[ $((i % 3)) -ne 1 ] || { event "CHG-$BATS_TEST_NUMBER-$K-$i"; echo; }
	done | sqs-send >/dev/null
	c0=$(bank_stat "$counter")
	setsid charge-worker --drain "${OPTS[@]}" "$@" 2>"$BATS_TEST_TMPDIR/w.err" 3>&- &
	w=$!
	until_bank "$counter" $((c0 + 1))
	pkill -KILL -s "$w" -x "$step" || true
	wait "$w" || rc=$?
	s=$(grep '"summary":true' "$BATS_TEST_TMPDIR/w.err")
	inflight=$(sqs-stat | sed -n 's/.*"inflight":\([0-9]*\).*/\1/p')
	echo "$step at $counter, $*: status $rc, in flight $inflight, $s"
	grep '^charge-worker: ' "$BATS_TEST_TMPDIR/w.err" || true
	# every message in flight is counted, and keeps the run from 0 and 1
	[ "$(jget "$s" leftForRetry)" -ge "$inflight" ]
	[ "$inflight" -eq 0 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; }
	case $rc in 0|1|70|75) ;; *) echo "unexpected status $rc"; return 1 ;; esac
	# what was stranded is named with the step that took it
	if [ "$(jget "$s" stranded)" -gt 0 ]; then
		grep -q "^charge-worker: [a-z-]* \(was killed by signal\|exited\) .*message(s)" "$BATS_TEST_TMPDIR/w.err"
	fi
}

# matrix MODE...: every step, at each moment
matrix() {
	local step counter
	for step in "${STEPS[@]}"; do
		for counter in attempts notificationAttempts; do
			run_killed "$step" "$counter" "$@"
		done
	done
}

@test "--stream -j 2: each step killed at each moment: every message in flight counted, never 0 or 1 with one" {
	matrix --stream -j 2
}

@test "one-shot batches -j 2: each step killed at each moment: every message in flight counted, never 0 or 1 with one" {
	matrix -j 2
}

@test "one message at a time -j 2: each step killed at each moment: every message in flight counted, never 0 or 1 with one" {
	IDEMP_DONE_CMD=idemp-done matrix -j 2
}
