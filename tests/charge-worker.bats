#!/usr/bin/env bats
# charge-worker: the driver on every outcome path, against bank-sim and the
# embedded queue; stops, overlapping runs, adapters, traces.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=quiet
}
teardown() { bank_stop; }

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 1 --lease 15s)
qcount() { sqs-stat "$@" | sed -n "s/.*\"visible\":\([0-9]*\),\"inflight\":\([0-9]*\),\"delayed\":\([0-9]*\).*/\1 \2 \3/p"; }
state() { jget "$(idemp-show --json "$1" 2>/dev/null)" state; }
summary() { grep '"summary":true' <<<"$stderr"; }
# until_bank NAME N: wait (at most 20 s) until bank-sim's counter NAME >= N.
until_bank() {
	for _ in $(seq 1 400); do
		[ "$(bank_stat "$1")" -ge "$2" ] && return 0
		sleep 0.05
	done
	echo "bank $1 never reached $2" >&2
	return 1
}

@test "--help, --version, usage errors, and a lease too short for the timeouts" {
	run charge-worker --help
	[ "$status" -eq 0 ]
	[[ "$output" == "usage: charge-worker"* ]]
	run charge-worker --version
	[[ "$output" == "charge-worker (idemkit) "* ]]
	run charge-worker --bogus
	[ "$status" -eq 64 ]
	run charge-worker -j 0
	[ "$status" -eq 64 ]
	run charge-worker --lease 20s --debit-timeout 10
	[ "$status" -eq 64 ]
	[[ "$output" == *"shorter than the debit and notify timeouts"* ]]
}

@test "--drain on an empty queue is 1 EMPTY" {
	bank_start
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 1 ]
	[[ "$(summary)" == *'"received":0'* ]]
}

@test "every outcome path in one drain: debited, declined, duplicate, invalid, mismatch, notify failed" {
	bank_start --decline ACC-POOR
	{
		event CHG-OK ACC-1 100; echo
		event CHG-DECL ACC-POOR 100; echo
		event CHG-DUP ACC-1 100; echo
		event CHG-MM ACC-1 100; echo
		echo '{"chargeId":"CHG-BAD","amount":1.5}'
	} | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ]
	# second deliveries: a duplicate, and the same chargeId with another amount
	{ event CHG-DUP ACC-1 100; echo; event CHG-MM ACC-1 999; echo; } | sqs-send >/dev/null
	bank_post /control '{"notifyFail":true}' >/dev/null
	event CHG-NF ACC-1 100 | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[[ "$(summary)" == *'"received":3,"debited":0,"debitedNotificationFailed":1'*'"dupDone":1'*'"payloadMismatch":1'* ]]
	[ "$(state CHG-OK)" = DONE ]
	[ "$(state CHG-DECL)" = FAILED ]
	[ "$(state CHG-DUP)" = DONE ]
	[ "$(state CHG-NF)" = DEBITED_NOTIFICATION_FAILED ]
	[ "$(bank_stat debits)" -eq 4 ]
	[ "$(qcount)" = "0 0 0" ]
	# the DLQ holds the declined charge, the mismatch and the poison message, bodies intact
	[ "$(qcount --queue "$IDEMKIT_DLQ")" = "3 0 0" ]
	run --separate-stderr sqs-recv --queue "$IDEMKIT_DLQ" --max 10
	[[ "$output" == *'{\"chargeId\":\"CHG-BAD\",\"amount\":1.5}'* ]]
	[[ "$output" == *'\"amount\":999'* ]]
}

@test "bank down: 75, the record stays IN_PROGRESS, the message is left, nothing acked" {
	export IDEMKIT_BANK_URL=http://127.0.0.1:$(free_port)/debits IDEMKIT_NOTIFY_URL=http://127.0.0.1:1/n
	event CHG-DOWN | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 75 ]
	[[ "$(summary)" == *'"leftForRetry":1'* ]]
	[ "$(state CHG-DOWN)" = IN_PROGRESS ]
	[ "$(qcount)" = "0 1 0" ]
}

@test "two overlapping --drain runs: the second exits 1 at once, nothing doubles" {
	bank_start --latency 300ms
	for i in 1 2 3 4; do event "CHG-OV$i"; echo; done | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>"$BATS_TEST_TMPDIR/first.err" &
	first=$!
	until_bank attempts 1    # the first run is working, so it holds the lock
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"another run holds"* ]]
	wait "$first"
	[ "$(bank_stat debits)" -eq 4 ]
	[ "$(bank_stat attempts)" -eq 4 ]
}

@test "SIGTERM mid-run: the message in flight is finished, the rest stay queued, nothing lost" {
	bank_start --latency 200ms
	for i in $(seq 1 10); do event "CHG-T$i"; echo; done | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>"$BATS_TEST_TMPDIR/w.err" &
	w=$!
	until_bank attempts 1
	kill -TERM "$w"
	rc=0; wait "$w" || rc=$?
	[ "$rc" -eq 143 ]
	done1=$(bank_stat debits)
	[ "$done1" -ge 1 ] && [ "$done1" -lt 10 ]
	# nothing half-done: no record is left IN_PROGRESS, no message invisible
	run idemp-list --state IN_PROGRESS
	[ "$status" -eq 1 ]
	[ "$(qcount)" = "$((10 - done1)) 0 0" ]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 10 ]
	[ "$(bank_stat attempts)" -eq 10 ]
	[ "$(qcount)" = "0 0 0" ]
}

@test "-j 4 with duplicates: every chargeId debited once" {
	bank_start
	for i in $(seq 1 30); do event "CHG-J$i"; echo; done > "$BATS_TEST_TMPDIR/evs"
	cat "$BATS_TEST_TMPDIR/evs" "$BATS_TEST_TMPDIR/evs" | sqs-send >/dev/null
	run --separate-stderr charge-worker -j 4 --drain "${fast[@]}"
	[[ "$(summary)" == *'"received":60,"debited":30'* ]] || [[ "$(summary)" == *'"dupInProgress":'[1-9]* ]]
	[ "$(bank_stat debits)" -eq 30 ]
	[ "$(bank_stat attempts)" -eq 30 ]
}

@test "a bank's own debit adapter plugged in through CHARGE_DEBIT_CMD" {
	bank_start
	export ADAPTER_LEDGER=$BATS_TEST_TMPDIR/adapter.ledger
	export CHARGE_DEBIT_CMD=$IDEMKIT_SRC/tests/adapters/debit-adapter.sh
	{ event CHG-AD1; echo; event CHG-AD2; echo; event CHG-AD1; echo; } | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ "$(sort "$ADAPTER_LEDGER" | tr '\n' ' ')" = "CHG-AD1 CHG-AD2 " ]
	[ "$(jget "$(idemp-show --json CHG-AD1)" debitRef)" = ADAPTER-CHG-AD1 ]
	[ "$(bank_stat debits)" -eq 0 ]
	[ "$(bank_stat notifications)" -eq 2 ]
}

@test "--trace: each step's exit code, name and meaning; the final envelope on stdout" {
	bank_start
	run --separate-stderr charge-worker --trace "${fast[@]}" < <(event CHG-TR)
	[ "$status" -eq 0 ]
	[[ "$stderr" == *"idemp-claim    ->   0 OK"* ]]
	[[ "$stderr" == *"charge-debit   ->   0 OK"* ]]
	[[ "$stderr" == *"idemp-done     ->   0 OK"* ]]
	[ "$(jget "$output" done.state)" = DONE ]
	run --separate-stderr charge-worker --trace "${fast[@]}" < <(event CHG-TR)
	[ "$status" -eq 10 ]
	[[ "$stderr" == *"idemp-claim    ->  10 DUP_DONE (key already DONE"* ]]
}

@test "--stream --drain: long-lived pipelines give the same result" {
	bank_start
	for i in $(seq 1 20); do event "CHG-S$i"; echo; done > "$BATS_TEST_TMPDIR/evs"
	cat "$BATS_TEST_TMPDIR/evs" <(head -5 "$BATS_TEST_TMPDIR/evs") <(echo poison) | sqs-send >/dev/null
	run --separate-stderr charge-worker --stream -j 2 --drain "${fast[@]}"
	echo "$stderr" | tail -2
	[ "$(bank_stat debits)" -eq 20 ]
	[[ "$(summary)" == *'"received":26'* ]]
	[[ "$(summary)" == *'"invalid":1'* ]]
	[ "$(qcount --queue "$IDEMKIT_DLQ")" = "1 0 0" ]
}

@test "--stream: SIGTERM stops receiving; what was received is finished; nothing lost" {
	bank_start --latency 100ms
	for i in $(seq 1 40); do event "CHG-ST$i"; echo; done | sqs-send >/dev/null
	charge-worker --stream --drain "${fast[@]}" 2>"$BATS_TEST_TMPDIR/w.err" &
	w=$!
	until_bank attempts 1
	kill -TERM "$w"
	rc=0; wait "$w" || rc=$?
	[ "$rc" -eq 143 ]
	# the receiver may have read ahead: whatever it received was finished
	got=$(bank_stat debits)
	[ "$got" -ge 1 ]
	run idemp-list --state IN_PROGRESS
	[ "$status" -eq 1 ]
	[ "$(qcount)" = "$((40 - got)) 0 0" ]
	run --separate-stderr charge-worker --stream --drain "${fast[@]}"
	[ "$(bank_stat debits)" -eq 40 ]
	[ "$(qcount)" = "0 0 0" ]
}

@test "--once: one message per loop, then stop" {
	bank_start
	for i in 1 2 3; do event "CHG-ONCE$i"; echo; done | sqs-send >/dev/null
	run --separate-stderr charge-worker --once "${fast[@]}"
	[ "$status" -eq 0 ]
	[[ "$(summary)" == *'"received":1,"debited":1'* ]]
	[ "$(qcount)" = "2 0 0" ]
}
