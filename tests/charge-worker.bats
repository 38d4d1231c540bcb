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
	export IDEMKIT_LOG=warn
}
teardown() { bank_stop; }

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 1 --lease 15s)
qcount() { sqs-stat "$@" | sed -n "s/.*\"visible\":\([0-9]*\),\"inflight\":\([0-9]*\),\"delayed\":\([0-9]*\).*/\1 \2 \3/p"; }
state() { jget "$(idemp-show --json "$1" 2>/dev/null)" state; }
summary() { grep '"summary":true' <<<"$stderr"; }
# records_debited: how many records say the bank debited the charge
records_debited() { { idemp-list --state DONE; idemp-list --state DEBITED_NOTIFICATION_FAILED; } 2>/dev/null | wc -l; }

# stop_group COUNTER N ARGS...: charge-worker ARGS in a session (and process
# group) of its own, SIGTERM to the whole group once bank-sim's COUNTER
# reached N; its status in $rc, then every process of the session gone.
stop_group() {
	local counter=$1 n=$2 w
	shift 2
	setsid charge-worker "$@" 2>"$BATS_TEST_TMPDIR/w.err" 3>&- &
	w=$!
	until_bank "$counter" "$n"
	kill -TERM -- "-$w"
	rc=0; wait "$w" || rc=$?
	for _ in $(seq 100); do pgrep -s "$w" >/dev/null || break; sleep 0.05; done
	run -1 pgrep -s "$w"
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
	export IDEMKIT_BANK_URL=http://127.0.0.1:1/debits IDEMKIT_NOTIFY_URL=http://127.0.0.1:1/n
	event CHG-DOWN | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 75 ]
	[[ "$(summary)" == *'"leftForRetry":1'* ]]
	[ "$(state CHG-DOWN)" = IN_PROGRESS ]
	[ "$(qcount)" = "0 1 0" ]
}

@test "two overlapping --drain runs: the second exits 1 at once, nothing doubles" {
	# 3 s a debit: once the first run's first debit is at the bank, it
	# holds the lock for 6 s more at least (its other two debits), time
	# for the second run to start on a loaded machine (300 ms a debit was
	# not: at load 50 the second reached the lock after the first ended)
	bank_start --latency 3s
	for i in 1 2 3; do event "CHG-OV$i"; echo; done | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" --debit-timeout 6 --lease 30s 2>"$BATS_TEST_TMPDIR/first.err" &
	first=$!
	until_bank attempts 1    # the first run is working, so it holds the lock
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"another run holds"* ]]
	wait "$first"
	[ "$(bank_stat debits)" -eq 3 ]
	[ "$(bank_stat attempts)" -eq 3 ]
}

@test "SIGTERM mid-run: the receive in flight is finished, the rest stay queued, nothing lost" {
	bank_start --latency 200ms
	for i in $(seq 1 25); do event "CHG-T$i"; echo; done | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>"$BATS_TEST_TMPDIR/w.err" &
	w=$!
	until_bank attempts 1
	kill -TERM "$w"
	rc=0; wait "$w" || rc=$?
	[ "$rc" -eq 143 ]
	# a receive takes up to 10 messages: those are finished, no more
	# received (two receives when the stop comes late on a loaded machine)
	done1=$(bank_stat debits)
	[ "$done1" -ge 1 ]; [ "$done1" -le 20 ]
	# nothing half-done: no record is left IN_PROGRESS, no message invisible
	run idemp-list --state IN_PROGRESS
	[ "$status" -eq 1 ]
	[ "$(qcount)" = "$((25 - done1)) 0 0" ]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 25 ]
	[ "$(bank_stat attempts)" -eq 25 ]
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
	# 26 messages; a copy met while its twin was in flight (DUP_IN_PROGRESS)
	# comes back after a short backoff and is received once more
	[ "$(jget "$(summary)" received)" -eq $((26 + $(jget "$(summary)" dupInProgress))) ]
	[ "$(jget "$(summary)" leftForRetry)" -eq 0 ]
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

@test "--stream -j 2, copies next to their originals (held in the worker): SIGTERM to the whole process group; every debit the bank made is recorded, nothing lost, later runs debit the rest once" {
	bank_start --latency 300ms
	for i in $(seq 1 30); do e=$(event "CHG-G$i"); printf '%s\n%s\n' "$e" "$e"; done | sqs-send >/dev/null
	stop_group debits 4 --stream -j 2 --drain "${fast[@]}"
	[ "$rc" -eq 143 ]
	# every debit the bank made is recorded (DONE, or DEBITED_NOTIFICATION_FAILED
	# for a notification the stop cut short): nothing waits IN_PROGRESS
	got=$(bank_stat debits)
	run -1 idemp-list --state IN_PROGRESS
	[ "$(records_debited)" -eq "$got" ]
	# nothing lost: later drains (copies left DUP_IN_PROGRESS come back
	# after their backoff) debit each charge once, none twice
	for _ in $(seq 20); do
		charge-worker --stream --drain "${fast[@]}" 2>/dev/null || true
		[ "$(qcount)" = "0 0 0" ] && break
		sleep 0.5
	done
	[ "$(qcount)" = "0 0 0" ]
	[ "$(qcount --queue "$IDEMKIT_DLQ")" = "0 0 0" ]
	[ "$(bank_stat debits)" -eq 30 ]
	[ "$(bank_stat replays)" -eq 0 ]
	[ "$(records_debited)" -eq 30 ]
}

@test "--once: one message per loop, then stop" {
	bank_start
	for i in 1 2 3; do event "CHG-ONCE$i"; echo; done | sqs-send >/dev/null
	run --separate-stderr charge-worker --once "${fast[@]}"
	[ "$status" -eq 0 ]
	[[ "$(summary)" == *'"received":1,"debited":1'* ]]
	[ "$(qcount)" = "2 0 0" ]
}

@test "one-shot: each receive's messages go through one process per step; a copy next to its original in the same receive is DUP_DONE in this run, none left on the queue" {
	bank_start
	for i in $(seq 1 5); do e=$(event "CHG-B$i"); printf '%s\n%s\n' "$e" "$e"; done | sqs-send >/dev/null
	# each step's processes, counted: the driver finds its steps beside
	# itself first, here wrappers that note each start
	local d=$BATS_TEST_TMPDIR/bin step
	mkdir -p "$d"
	cp "$(command -v charge-worker)" "$d/"
	for step in sqs-recv idemp-claim charge-debit charge-notify idemp-done sqs-ack; do
		printf '#!/bin/sh\necho "%s $*" >> "%s"\nexec "%s" "$@"\n' \
			"$step" "$BATS_TEST_TMPDIR/exec" "$(command -v "$step")" > "$d/$step"
		chmod +x "$d/$step"
	done
	"$d/charge-worker" --drain "${fast[@]}" 2>"$BATS_TEST_TMPDIR/w.err"
	cat "$BATS_TEST_TMPDIR/exec"
	grep '"summary":true' "$BATS_TEST_TMPDIR/w.err"
	[[ "$(cat "$BATS_TEST_TMPDIR/w.err")" == *'"received":10,"debited":5,'*'"dupDone":5,"dupInProgress":0,'*'"leftForRetry":0,'* ]]
	[ "$(bank_stat attempts)" -eq 5 ]
	[ "$(qcount)" = "0 0 0" ]
	# one receive of 10: each step ran once for the batch (the drain's
	# checks before it and its empty receives after it aside)
	for step in idemp-claim charge-debit charge-notify idemp-done sqs-ack; do
		n=$(grep -c "^$step --stream" "$BATS_TEST_TMPDIR/exec")
		echo "$step $n"
		[ "$n" -eq 1 ]
	done
}

@test "-j 2: a copy received by one loop while its original is in flight in the other is held in idemp-claim until the original is recorded (DUP_DONE), not left on the queue" {
	bank_start --latency 300ms
	# ten originals, then their ten copies: one receive each, one per loop
	for i in $(seq 1 10); do event "CHG-SIB$i"; echo; done > "$BATS_TEST_TMPDIR/evs"
	cat "$BATS_TEST_TMPDIR/evs" "$BATS_TEST_TMPDIR/evs" | sqs-send >/dev/null
	run --separate-stderr charge-worker -j 2 --drain "${fast[@]}"
	summary
	[ "$status" -eq 0 ]
	[[ "$(summary)" == *'"received":20,"debited":10,'*'"dupDone":10,"dupInProgress":0,'* ]]
	[ "$(bank_stat attempts)" -eq 10 ]
	[ "$(qcount)" = "0 0 0" ]
}

@test "one-shot: SIGTERM to the whole process group finishes the receive in flight; every debit recorded, nothing IN_PROGRESS, the rest queued" {
	bank_start --latency 300ms
	for i in $(seq 1 25); do event "CHG-PG$i"; echo; done | sqs-send >/dev/null
	stop_group attempts 1 --drain "${fast[@]}"
	[ "$rc" -eq 143 ]
	# the receive in flight finished (two when the stop came late)
	got=$(bank_stat debits)
	[ "$got" -ge 1 ]; [ "$got" -le 20 ]
	run -1 idemp-list --state IN_PROGRESS
	[ "$(records_debited)" -eq "$got" ]
	[ "$(qcount)" = "$((25 - got)) 0 0" ]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 25 ]
	[ "$(bank_stat attempts)" -eq 25 ]
}

@test "one-shot: charge-notify killed (SIGKILL) in the middle of a receive's batch: every debited charge is recorded DNF, the messages deleted, nothing debited twice" {
	# the gateway never answers: charge-notify waits out its 5 s timeout,
	# and is killed long before that, whatever the machine's load
	bank_start --notify-hang
	for i in $(seq 1 10); do event "CHG-NK$i"; echo; done | sqs-send >/dev/null
	setsid charge-worker --drain --debit-timeout 2 --notify-timeout 5 --notify-retries 0 \
		--lease 20s 2>"$BATS_TEST_TMPDIR/w.err" 3>&- &
	w=$!
	# the debits answered: their notifications are at the gateway
	until_bank notificationAttempts 1
	pkill -KILL -s "$w" -x charge-notify
	rc=0; wait "$w" || rc=$?
	cat "$BATS_TEST_TMPDIR/w.err"
	[ "$rc" -eq 0 ]
	grep -q 'did not reach sqs-ack (a step ended early); recording them now' "$BATS_TEST_TMPDIR/w.err"
	run -1 idemp-list --state IN_PROGRESS
	[ "$(records_debited)" -eq 10 ]
	[ "$(idemp-list --state DEBITED_NOTIFICATION_FAILED | wc -l)" -eq 10 ]
	[ "$(qcount)" = "0 0 0" ]
	[ "$(bank_stat debits)" -eq 10 ]
	[ "$(bank_stat attempts)" -eq 10 ]
}

# notifier_tls: a second bank-sim serving HTTPS with a self-signed
# certificate nobody trusts, for notifications; sets TLS_URL.
notifier_tls() {
	local d=$BATS_TEST_TMPDIR/tls i
	mkdir -p "$d"
	self_signed "$d"
	bank-sim --port 0 --db "$d/ledger.db" --port-file "$d/port" \
		--tls-cert "$d/cert.pem" --tls-key "$d/key.pem" >"$d/out" 2>"$d/err" 3>&- &
	TLS_PID=$!
	for i in $(seq 200); do
		[ -s "$d/port" ] && grep -q '^listening ' "$d/out" && break
		sleep 0.05
	done
	TLS_URL=$(sed -n 's/^listening //p' "$d/out")/notifications
}

# a step wrapper that breaks the notification's configuration after the
# run started (the checks before it still pass): BREAK is an env assignment.
broken_notify() {
	cat > "$BATS_TEST_TMPDIR/notify.sh" <<SH
#!/bin/sh
case " \$* " in *" --check "*) exec charge-notify "\$@" ;; esac
exec env $1 charge-notify "\$@"
SH
	chmod +x "$BATS_TEST_TMPDIR/notify.sh"
	export CHARGE_NOTIFY_CMD=$BATS_TEST_TMPDIR/notify.sh
}

@test "a notification that cannot be sent after a good debit (TLS, URL unset, token file gone): one debit, DNF, deleted; --renotify sends it later" {
	bank_start
	notifier_tls
	n=0
	for how in tls url token; do
		n=$((n + 1))
		unset CHARGE_NOTIFY_CMD
		case $how in
		tls) export IDEMKIT_NOTIFY_URL=$TLS_URL ;;
		url) export IDEMKIT_NOTIFY_URL=$BANK_URL/notifications; broken_notify -u IDEMKIT_NOTIFY_URL ;;
		token) export IDEMKIT_NOTIFY_URL=$BANK_URL/notifications; broken_notify "IDEMKIT_NOTIFY_TOKEN_FILE=$BATS_TEST_TMPDIR/gone" ;;
		esac
		event "CHG-NC$n" | sqs-send >/dev/null
		run --separate-stderr charge-worker --drain "${fast[@]}"
		echo "$how: $status $(summary)"
		[ "$status" -eq 0 ]
		[[ "$(summary)" == *'"received":1,"debited":0,"debitedNotificationFailed":1,'* ]]
		[ "$(bank_stat attempts)" -eq "$n" ]
		[ "$(bank_stat debits)" -eq "$n" ]
		[ "$(state "CHG-NC$n")" = DEBITED_NOTIFICATION_FAILED ]
		[ "$(qcount)" = "0 0 0" ]
	done
	kill "$TLS_PID"; wait "$TLS_PID" || true
	[ "$(bank_stat notifications)" -eq 0 ]
	unset CHARGE_NOTIFY_CMD
	export IDEMKIT_NOTIFY_URL=$BANK_URL/notifications
	run --separate-stderr charge-recover --renotify --older-than 1ms
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":3,"renotified":3'* ]]
	for n in 1 2 3; do [ "$(state "CHG-NC$n")" = DONE ]; done
	[ "$(bank_stat debits)" -eq 3 ]
	[ "$(bank_stat attempts)" -eq 3 ]
}

# crash_notify [after-lines]: a notify step that dies by SIGSEGV with
# nothing written (after reading one line, in --stream).
crash_notify() {
	cat > "$BATS_TEST_TMPDIR/crash.sh" <<'SH'
#!/bin/sh
case " $* " in *" --check "*) exit 0 ;; esac
head -n 1 > /dev/null
kill -s SEGV $$
SH
	chmod +x "$BATS_TEST_TMPDIR/crash.sh"
	export CHARGE_NOTIFY_CMD=$BATS_TEST_TMPDIR/crash.sh
}

@test "charge-notify crashes with nothing written: the debited envelope is recorded DNF and the message deleted" {
	bank_start
	crash_notify
	event CHG-CR1 | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	echo "$(summary)"
	[ "$status" -eq 0 ]
	[[ "$(summary)" == *'"received":1,"debited":0,"debitedNotificationFailed":1,'* ]]
	[ "$(state CHG-CR1)" = DEBITED_NOTIFICATION_FAILED ]
	[[ "$(jget "$(idemp-show --json CHG-CR1)" lastError)" == "no notification result"* ]]
	[ "$(qcount)" = "0 0 0" ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "sqs-ack crashes with nothing written: the message is counted received, stranded and left, the run is sqs-ack's 70, sqs-ack named; the others settled" {
	bank_start
	cat > "$BATS_TEST_TMPDIR/ack" <<'SH'
#!/bin/sh
in=$(cat)
case $in in *CHG-AK2*) exit 70 ;; esac
printf '%s\n' "$in" | exec sqs-ack "$@"
SH
	chmod +x "$BATS_TEST_TMPDIR/ack"
	{ event CHG-AK1; echo; event CHG-AK2; echo; event CHG-AK3; echo; } | sqs-send >/dev/null
	SQS_ACK_CMD=$BATS_TEST_TMPDIR/ack run --separate-stderr charge-worker --drain "${fast[@]}"
	echo "$(summary)"
	[ "$status" -eq 70 ]
	# debited counts what sqs-ack wrote; the bank and the record know all three
	[[ "$(summary)" == *'"received":3,"debited":2,'* ]]
	[[ "$(summary)" == *'"leftForRetry":1,"ackFailed":0,"stranded":1,'* ]]
	[[ "$stderr" == *"charge-worker: sqs-ack exited 70 SOFTWARE"*"holding 1 message(s) received and not settled"* ]]
	[ "$(bank_stat debits)" -eq 3 ]
	[ "$(state CHG-AK2)" = DONE ]
	[ "$(qcount)" = "0 1 0" ]
}

@test "--stream: charge-notify crashes mid-stream: every debited charge is recorded DNF, nothing debited twice" {
	bank_start --latency 50ms
	crash_notify
	for i in $(seq 1 8); do event "CHG-CS$i"; echo; done | sqs-send >/dev/null
	run --separate-stderr charge-worker --stream --drain "${fast[@]}"
	echo "$stderr" | tail -3
	[[ "$stderr" == *"did not reach sqs-ack"* ]]
	debits=$(bank_stat debits)
	[ "$debits" -ge 1 ]
	run idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "${#lines[@]}" -eq "$debits" ]
	[[ "$(summary)" == *"\"debitedNotificationFailed\":$debits,"* ]]
	# what was claimed but not debited is still IN_PROGRESS, its message in flight
	inprog=$(idemp-list --state IN_PROGRESS 2>/dev/null | wc -l)
	[ $((debits + inprog)) -le 8 ]
	[ "$(qcount)" = "$((8 - debits - inprog)) $inprog 0" ]
	[ "$(bank_stat attempts)" -eq "$debits" ]
}

@test "refuses to start (78) before receiving anything when the store or queue configuration is wrong" {
	event CHG-PF | sqs-send >/dev/null
	bank_start
	IDEMKIT_STORE=nope: run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"idemp-claim: configuration refused"* ]]
	IDEMKIT_QUEUE=nope run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"sqs-stat: configuration refused"* ]]
	[ "$(qcount)" = "1 0 0" ]
	run idemp-show CHG-PF
	[ "$status" -eq 1 ]
}

# Needs helper "bank"'s charge-debit/charge-notify --check; skipped only
# while the commands do not have it.
@test "refuses to start (78) before receiving anything when a step's configuration is missing" {
	event CHG-PF | sqs-send >/dev/null
	bank_start
	(unset IDEMKIT_NOTIFY_URL; run --separate-stderr charge-worker --drain "${fast[@]}"
	 [ "$status" -eq 78 ] && [[ "$stderr" == *"charge-notify: configuration refused"* ]]) || return 1
	run env -u IDEMKIT_BANK_URL charge-worker --drain --stream "${fast[@]}"
	[ "$status" -eq 78 ]
	[[ "$output" == *"charge-debit: configuration refused"* ]]
	run env IDEMKIT_NOTIFY_TOKEN_FILE="$BATS_TEST_TMPDIR/gone" charge-worker --drain "${fast[@]}"
	[ "$status" -eq 78 ]
	[ "$(qcount)" = "1 0 0" ]
	run idemp-show CHG-PF
	[ "$status" -eq 1 ]
	[ "$(bank_stat attempts)" -eq 0 ]
}

@test "the lease minimum comes from the steps' timeouts: 39s refused naming 40s, 40s accepted (defaults)" {
	bank_start
	run --separate-stderr charge-worker --drain --lease 39s
	[ "$status" -eq 64 ]
	[[ "$stderr" == *"--lease 39s is shorter than the debit and notify timeouts plus a margin (minimum 40s = 10s + 5s x 4 attempts + 10s)"* ]]
	run --separate-stderr charge-worker --drain --lease 40s
	[ "$status" -eq 1 ]
	[[ "$(summary)" == *'"received":0'* ]]
	# the same forms of duration every command takes
	run --separate-stderr charge-worker --drain --lease 40000ms
	[ "$status" -eq 1 ]
	run --separate-stderr charge-worker --drain --lease 39999ms
	[ "$status" -eq 64 ]
	run --separate-stderr charge-worker --drain --lease 50s --notify-retries 6
	[ "$status" -eq 64 ]
	[[ "$stderr" == *"(minimum 55s"* ]]
	run --separate-stderr charge-worker --drain --lease 2x
	[ "$status" -eq 64 ]
	[[ "$stderr" == *"--lease: not a duration: '2x'"* ]]
}

# Issue 11 item 2: with only a count bound, the first pipeline took the whole
# window at once and its claims waited in the pipes past their leases while
# the second worker re-claimed and re-debited them.  The receiver now bounds
# the age of what is in flight (and so, at the rate it is acking, how much).
@test "--stream: two workers on one queue and a slow bank: every charge debited once, replays near zero" {
	bank_start --latency 300ms
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=12"
	for i in $(seq 1 60); do event "CHG-2W$i"; echo; done | sqs-send >/dev/null
	short=(--debit-timeout 1 --notify-timeout 1 --notify-retries 0 --lease 12s)
	# two long-running workers (not drains: the second must compete)
	charge-worker --stream --no-lock "${short[@]}" 2>"$BATS_TEST_TMPDIR/w1.err" 3>&- &
	w1=$!
	charge-worker --stream --no-lock "${short[@]}" 2>"$BATS_TEST_TMPDIR/w2.err" 3>&- &
	w2=$!
	for _ in $(seq 1 1200); do
		[ "$(idemp-list --state DONE 2>/dev/null | wc -l)" -ge 60 ] && break
		sleep 0.1
	done
	kill -TERM "$w1" "$w2"
	wait "$w1" || true
	wait "$w2" || true
	cat "$BATS_TEST_TMPDIR"/w*.err | grep summary
	echo "attempts $(bank_stat attempts) replays $(bank_stat replays)"
	[ "$(bank_stat debits)" -eq 60 ]
	[ "$(bank_stat replays)" -le 3 ]
	[ "$(bank_stat notifications)" -eq 60 ]
	run idemp-list --state DONE
	[ "${#lines[@]}" -eq 60 ]
	[ "$(qcount)" = "0 0 0" ]
}

# Issue 11 item 11: a duplicate of a charge that another holder finishes a
# moment later is settled in this drain, not left hidden for a lease.
@test "--drain waits for the copies it left that are due back, and exits 0 once every message is settled (one-shot and --stream)" {
	bank_start
	for mode in oneshot stream; do
		id=CHG-SETTLE-$mode
		# a lease a loaded machine's worker start-up cannot outlast (at
		# load 30 a 3 s one ended before the holder finished: 13; a
		# sanitized --stream worker beside two busy loops outlasted 12 s)
		held=$(event "$id" | idemp-claim --lease 40s 2>/dev/null)
		event "$id" | sqs-send >/dev/null
		# the holder finishes a moment after the drain met its claim: a
		# second after the drain received the message (not after the
		# worker's start, which a loaded machine can stretch past it)
		(for _ in $(seq 400); do [ "$(qcount)" = "0 1 0" ] && break; sleep 0.05; done
		 sleep 1; idemp-done --state DONE <<<"$held" >/dev/null 2>&1) 3>&- &
		holder=$!
		args=(--drain "${fast[@]}")
		[ "$mode" = stream ] && args+=(--stream)
		run --separate-stderr charge-worker "${args[@]}"
		wait "$holder"
		echo "$mode: $status $(summary)"
		[ "$status" -eq 0 ]
		# met in flight at least once (more when the machine is slow to
		# run the holder), then settled as a duplicate of DONE
		[[ "$(summary)" =~ '"dupDone":1,"dupInProgress":'[1-9][0-9]*, ]]
		[[ "$(summary)" == *'"leftForRetry":0,'* ]]
		[ "$(qcount)" = "0 0 0" ]
	done
	[ "$(bank_stat attempts)" -eq 0 ]
}

@test "--drain: a copy due back later than a lease is not waited for: 75, left for the next run" {
	bank_start
	# (a lease far past what the looks take: the copy's visibility is
	# capped at the lease's remainder, so once a sanitized drain beside two
	# busy loops had spent most of a 60 s lease on five looks, the next
	# was due within its 15 s, was waited for, and took the claim over)
	held=$(event CHG-LATER | idemp-claim --lease 300s 2>/dev/null)
	event CHG-LATER | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}"
	echo "$status $(summary)"
	[ "$status" -eq 75 ]
	# The copy comes back after a short backoff that grows with each look
	# (sqs-ack), so the drain sees it a few times, every time in progress,
	# until the next look would be later than its wait.
	n=$(jget "$(summary)" dupInProgress)
	[ "$n" -ge 1 ]
	[ "$(jget "$(summary)" received)" = "$n" ]
	[[ "$(summary)" == *'"leftForRetry":1,'* ]]
	[ "$(qcount)" = "0 1 0" ]
}

@test "a stale event (no record, first sent longer ago than records are kept) is counted in the summary: staleEvent and toDlq, the message in the DLQ" {
	bank_start
	# first sent 2 h ago, records kept 1 h (a retention must outlive the
	# 15 s lease: issue 24 item 15)
	event CHG-STALE1 | sqs-send --attr "idemkit.firstSentAt=$(( $(date +%s%3N) - 7200000 ))" >/dev/null
	IDEMKIT_RETENTION=1h run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	s=$(printf '%s\n' "$stderr" | grep '^{"summary"')
	[ "$(jget "$s" received)" = 1 ]
	[ "$(jget "$s" staleEvent)" = 1 ]
	[ "$(jget "$s" toDlq)" = 1 ]
	[ "$(jget "$s" leftForRetry)" = 0 ]
	[ "$(jget "$(sqs-stat --queue "$IDEMKIT_DLQ")" visible)" = 1 ]
	[ "$(jget "$(idemp-show --json CHG-STALE1)" state)" = FAILED ]
	[ "$(bank_get /stats | python3 -c 'import json,sys; print(json.load(sys.stdin).get("attempts", 0))')" = 0 ]
}

@test "a retention not longer than the lease: 78 before anything is received, idemp-claim's reason on stderr (issue 24 item 15)" {
	bank_start
	event CHG-RET | sqs-send >/dev/null
	IDEMKIT_RETENTION=10s run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"IDEMKIT_RETENTION (10s) is not longer than the lease (15s)"* ]]
	[[ "$stderr" == *"idemp-claim: configuration refused (above); nothing was received"* ]]
	[ "$(qcount)" = "1 0 0" ]
	run idemp-show CHG-RET   # no store even: the preflight refused first
	[ "$status" -eq 78 ]
}

@test "IDEMKIT_LOG=quiet: a run that succeeds writes nothing; one that fails writes its messages and its summary; the shipped crontabs mail failures and run quiet (issue 29 item 5)" {
	bank_start
	event CHG-Q1 | sqs-send >/dev/null
	IDEMKIT_LOG=quiet run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ -z "$stderr" ]
	[ "$(state CHG-Q1)" = DONE ]
	IDEMKIT_LOG=quiet run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 1 ]
	[ -z "$stderr" ]
	IDEMKIT_LOG=quiet run --separate-stderr charge-recover --renotify
	[ "$status" -eq 1 ]
	[ -z "$stderr" ]
	# a failing run speaks: the bank is down
	bank_post /control '{"errorRate":1,"errorStatus":503}' >/dev/null
	event CHG-Q2 | sqs-send >/dev/null
	IDEMKIT_LOG=quiet run --separate-stderr charge-worker --once "${fast[@]}"
	[ "$status" -eq 75 ]
	[[ "$stderr" == *'"outcome":"TEMPFAIL"'* ]]
	[[ "$stderr" == *'{"summary":true,"received":1,'*'"leftForRetry":1,'* ]]
	# the crontabs: MAILTO set, every job quiet
	for f in "$IDEMKIT_SRC/examples/crontab" "$IDEMKIT_SRC/examples/prometheus/crontab"; do
		grep -q '^MAILTO=.' "$f"
		[ -z "$(awk '/^[0-9*]/ && !/IDEMKIT_LOG=quiet; /' "$f")" ]
	done
}

# kill_step STEP COUNTER N ARGS...: charge-worker --drain ARGS in a session
# of its own, every STEP process of it killed (SIGKILL) once bank-sim's
# COUNTER reached N; its status in $rc, its stderr in w.err.
kill_step() {
	local step=$1 counter=$2 n=$3 w
	shift 3
	setsid charge-worker --drain "${fast[@]}" "$@" 2>"$BATS_TEST_TMPDIR/w.err" 3>&- &
	w=$!
	until_bank "$counter" "$n"
	pkill -KILL -s "$w" -x "$step" || true
	rc=0; wait "$w" || rc=$?
	grep -v '^{"ts"' "$BATS_TEST_TMPDIR/w.err" || true
}

# accounted: every message still in flight on the queue is counted left for
# retry, and a run that left any is neither 0 nor 1; sets S, the summary.
accounted() {
	local inflight
	S=$(grep '"summary":true' "$BATS_TEST_TMPDIR/w.err")
	inflight=$(qcount | cut -d' ' -f2)
	echo "status $rc, in flight $inflight"
	[ "$(jget "$S" leftForRetry)" -ge "$inflight" ]
	[ "$inflight" -eq 0 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; }
}

@test "charge-debit killed with debits at the bank (--stream -j 2, one-shot -j 2) or after some were answered: what it held is counted received, stranded and left, 75, charge-debit named (issue 48)" {
	bank_start --latency 1500ms
	local k=0 mode at a0
	for mode in '--stream -j 2' '-j 2' '--stream -j 2'; do
		k=$((k + 1))
		export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#k$k?visibility=30"
		# 10 charges, 5 of them sent twice
		for i in $(seq 1 10); do event "CHG-K$k-$i"; echo; [ $((i % 2)) -eq 1 ] && { event "CHG-K$k-$i"; echo; }; done |
			sqs-send >/dev/null
		a0=$(bank_stat attempts)
		# with debits at the bank; the third, once some were answered
		# (those are settled, the copies held for them stranded)
		at="attempts $((a0 + 1))"
		[ "$k" -ne 3 ] || at="debits $(( $(bank_stat debits) + 3 ))"
		# shellcheck disable=SC2086
		kill_step charge-debit $at $mode
		accounted
		[ "$rc" -eq 75 ]
		[ "$(jget "$S" stranded)" -ge 1 ]
		[ "$(jget "$S" received)" -ge "$(( $(jget "$S" stranded) + $(jget "$S" debited) + $(jget "$S" debitedNotificationFailed) ))" ]
		grep -q "^charge-worker: charge-debit was killed by signal 9 holding [1-9][0-9]* message(s) received and not settled" "$BATS_TEST_TMPDIR/w.err"
	done
}
