#!/usr/bin/env bats
# Progress on a terminal: charge-worker and charge-recover under a
# pseudo-terminal (script(1)) draw one line rewritten in place, at most
# four times a second, ending at the run's totals, then a table of the
# outcomes before the JSON summary line, which stays as it is; with stderr
# not a terminal none of it.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() {
	command -v script >/dev/null || skip "script(1) (util-linux) not installed"
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=warn
}
teardown() { bank_stop; }


fast="--debit-timeout 2 --notify-timeout 1 --notify-retries 0 --lease 15s"
E=$'\e'
SUMMARY='{"summary":true,"received":12,"debited":10,"debitedNotificationFailed":0,"declined":1,"dupDone":1,"dupInProgress":0,"dupFailed":0,"payloadMismatch":0,"invalid":0,"staleEvent":0,"leaseLost":0,"toDlq":1,"leftForRetry":0,"ackFailed":0,"stranded":0,"bankReplays":0,"config":0}'

# twelve messages: ten new charges, a duplicate of one finished before
# (DUP_DONE whatever the order) and one the bank declines (DLQ)
charges() {
	bank_start --latency 30ms --decline ACC-POOR
	event CHG-D | sqs-send >/dev/null
	charge-worker --drain $fast 2>/dev/null
	{
		for i in $(seq 1 10); do event "CHG-$i"; echo; done
		event CHG-D; echo
		event CHG-POOR ACC-POOR; echo
	} | sqs-send >/dev/null
}

# on_tty CMD: CMD with stdout and stderr on a pseudo-terminal; $output is
# what the terminal got, $secs how long it took (whole seconds, rounded up).
on_tty() {
	local t0=$SECONDS
	run script -qfec "$1" /dev/null
	secs=$((SECONDS - t0 + 1))
	text=$(printf '%s' "$output" | tr -d '\r')
}

# frames PROG: the progress lines drawn, one a line, each as it was drawn:
# from the start of the line (\r), cleared to its end (\e[K).
frames() {
	printf '%s' "$output" | tr '\r' '\n' | sed -n "s/^$E\[K\($1: .*\/s\)\$/\1/p"
}

# progress_checks PROG LAST END: the line was drawn, rewritten in place, at
# most 4 times a second (generously), its first count rising to END, its
# last drawing LAST (before the rate), and cleared before the table.
progress_checks() {
	local n raw
	n=$(frames "$1" | wc -l)
	frames "$1" | tail -3
	[ "$n" -ge 1 ]
	raw=$(printf '%s' "$output" | grep -o "$E\[K$1: [^$E]*/s"$'\r' | wc -l)
	[ "$raw" -eq "$n" ]
	[ "$n" -le $((4 * secs + 4)) ]
	[[ "$(frames "$1" | tail -1)" == "$2, "[0-9]*.[0-9]/s ]]
	# what the reader drew before never goes back, nor past the end
	frames "$1" | sed 's/^[^0-9]*\([0-9]*\).*/\1/' | awk -v end="$3" '
		$1 < last || $1 > end { bad = 1 } { last = $1 } END { exit bad }'
	# the line is cleared, then the table
	[[ "$output" == *$'\r'"$E[K$1: "*" in "[0-9]*.[0-9]s* ]]
}

# worker_on_tty ARGS: a drain with ARGS on a terminal, then its checks.
worker_on_tty() {
	charges
	on_tty "charge-worker --drain $fast $*"
	[ "$status" -eq 0 ]
	progress_checks charge-worker "charge-worker: 12 received, 10 debited, 1 duplicates, 0 left, 1 to the DLQ" 12
	# the table: the outcomes that occurred, with their meanings, and
	# then the summary line as it always was
	[[ "$text" =~ "$E[Kcharge-worker: 12 received in "[0-9]+\.[0-9]s" ("[0-9]+\.[0-9]"/s)"$'\n'"  outcome "+"count  meaning"$'\n' ]]
	[[ "$text" =~ $'\n'"  OK "+"10  the step did its job"[^$'\n']*$'\n'"  DUP_DONE "+"1  key already DONE"[^$'\n']*$'\n'"  DECLINED "+"1  core banking refused the debit permanently"$'\n'"  to the DLQ "+"1  sent to the dead-letter queue"[^$'\n']*$'\n'"$SUMMARY"$'\n'?$ ]]
	[[ "$text" != *"LEASE_LOST"* ]]
	[ "$(printf '%s\n' "$text" | grep -c '"summary":true')" -eq 1 ]
	[ "$(bank_stat debits)" -eq 11 ]
}

# worker_off_tty ARGS: the same drain with stderr a file: nothing of the
# above, the summary line the same.
worker_off_tty() {
	charges
	run --separate-stderr charge-worker --drain $fast "$@"
	[ "$status" -eq 0 ]
	[ -z "$output" ]
	[[ "$stderr" != *$'\r'* ]]
	[[ "$stderr" != *"$E"* ]]
	[[ "$stderr" != *" received, "* ]]
	[[ "$stderr" != *"outcome "*"count  meaning"* ]]
	[ "$(printf '%s\n' "$stderr" | tail -1)" = "$SUMMARY" ]
	# what else is there is what the steps logged (JSON): the store's
	# preflight ("no record", the answer it asked for) says nothing
	[ -z "$(printf '%s\n' "$stderr" | grep -v '^{')" ]
}

@test "charge-worker -j 1 on a terminal: the line, the table, the summary unchanged" {
	worker_on_tty -j 1
}

@test "charge-worker -j 2 on a terminal: summed over the jobs" {
	worker_on_tty -j 2
}

@test "charge-worker --stream on a terminal" {
	worker_on_tty --stream
}

@test "charge-worker --stream -j 2 on a terminal" {
	worker_on_tty --stream -j 2
}

@test "charge-worker --once on a terminal: one message, one line, a table" {
	bank_start
	event CHG-1 | sqs-send >/dev/null
	on_tty "charge-worker --once $fast"
	[ "$status" -eq 0 ]
	progress_checks charge-worker "charge-worker: 1 received, 1 debited, 0 duplicates, 0 left" 1
	[[ "$text" =~ $'\n'"  OK "+"1  the step did its job" ]]
}

@test "charge-worker -j 2 long-running on a terminal: the line while it runs, the table after SIGTERM" {
	charges
	pidf=$BATS_TEST_TMPDIR/pid
	script -qfec "sh -c 'echo \$\$ > $pidf; exec charge-worker -j 2 --wait 1 $fast'" /dev/null \
		>"$BATS_TEST_TMPDIR/tty" 2>&1 3>&- &
	sc=$!
	t0=$SECONDS
	until_bank debits 11
	# the line reaches the totals while the loops wait for more
	for _ in $(seq 1 100); do
		grep -aq "12 received, 10 debited" "$BATS_TEST_TMPDIR/tty" && break
		sleep 0.1
	done
	kill -TERM "$(cat "$pidf")"
	rc=0
	wait "$sc" || rc=$?
	secs=$((SECONDS - t0 + 1))
	[ "$rc" -eq 143 ]
	output=$(cat "$BATS_TEST_TMPDIR/tty")
	text=$(printf '%s' "$output" | tr -d '\r')
	progress_checks charge-worker "charge-worker: 12 received, 10 debited, 1 duplicates, 0 left, 1 to the DLQ" 12
	[[ "$text" =~ $'\n'"  OK "+"10  the step did its job"[^$'\n']*$'\n'"  DUP_DONE "+"1  "[^$'\n']*$'\n'"  DECLINED "+"1  "[^$'\n']*$'\n'"  to the DLQ "+"1  "[^$'\n']*$'\n'"$SUMMARY"$'\n'?$ ]]
}

@test "charge-worker off a terminal, -j 2: no line, no table, the same summary" {
	worker_off_tty -j 2
}

@test "charge-worker --stream -j 2 off a terminal: no line, no table, the same summary" {
	worker_off_tty --stream -j 2
}

@test "charge-recover --renotify on a terminal: counted as they are recorded" {
	bank_start --notify-fail --latency 150ms
	for i in $(seq 1 8); do event "CHG-N$i"; echo; done | sqs-send >/dev/null
	charge-worker --drain $fast 2>/dev/null
	[ "$(idemp-list --state DEBITED_NOTIFICATION_FAILED | wc -l)" -eq 8 ]
	bank_post /control '{"notifyFail":false}' >/dev/null
	sleep 0.1
	on_tty "charge-recover --renotify --older-than 50ms"
	[ "$status" -eq 0 ]
	progress_checks charge-recover "charge-recover: renotify 8 of 8, 8 renotified" 8
	[[ "$text" =~ "$E[Kcharge-recover: --renotify in "[0-9]+\.[0-9]s$'\n'"  outcome "+"count  meaning"$'\n'"  found "+"8  DEBITED_NOTIFICATION_FAILED records listed"$'\n'"  renotified "+"8  notification sent again"[^$'\n']*$'\n'"  stillFailed "+"0  still DEBITED"[^$'\n']*$'\n''{"summary":true,"mode":"renotify","found":8,"renotified":8,"stillFailed":0}'$'\n'?$ ]]
	[ "$(idemp-list --state DONE | wc -l)" -eq 8 ]
}

@test "charge-recover --renotify off a terminal: the summary line alone, as before" {
	bank_start --notify-fail
	event CHG-N1 | sqs-send >/dev/null
	charge-worker --drain $fast 2>/dev/null
	bank_post /control '{"notifyFail":false}' >/dev/null
	sleep 0.1
	run --separate-stderr charge-recover --renotify --older-than 50ms
	[ "$status" -eq 0 ]
	[ "$stderr" = '{"summary":true,"mode":"renotify","found":1,"renotified":1,"stillFailed":0}' ]
	[ -z "$output" ]
}

@test "charge-recover --dlq on a terminal" {
	bank_start --decline ACC-POOR
	for i in $(seq 1 3); do event "CHG-P$i" ACC-POOR; echo; done | sqs-send >/dev/null
	charge-worker --drain $fast 2>/dev/null
	on_tty "charge-recover --dlq"
	[ "$status" -eq 0 ]
	progress_checks charge-recover "charge-recover: dlq 3 of 3, 3 requeued" 3
	[[ "$text" =~ "  found "+"3  messages received from the DLQ"$'\n'"  requeued "+"3  sent to the queue again"[^$'\n']*$'\n''{"summary":true,"mode":"dlq","found":3,"requeued":3}' ]]
}
