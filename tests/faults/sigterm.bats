#!/usr/bin/env bats
# Stop signals to the whole process group (issue 24 item 1): systemd's
# KillMode=control-group, supervisord's stopasgroup and kill -TERM -PGID
# signal every process of the worker at once.  A stop is an ordinary stop,
# never a loss: every charge the bank debited is recorded DONE or
# DEBITED_NOTIFICATION_FAILED before charge-worker exits 128+signal, none
# is left IN_PROGRESS with money moved, and nothing is debited twice.
# bank-sim answers each call after 1.5 s, so the signal always lands with
# debits in flight; --stream and one-shot, -j 1 and -j 2; TERM and INT to
# the group, and TERM to the driver alone.

load faults

# one-shot takes up to 10 a receive, finished at a stop: enough for two
# stops of -j 2 and a rest
N=50

setup() {
	embedded_queue 20
	bank_start --latency 1500ms
	charges "$N" "$BATS_TEST_TMPDIR/charges" "SIG$BATS_TEST_NUMBER"
	sqs-send < "$BATS_TEST_TMPDIR/charges" > /dev/null
}
teardown() { bank_stop; }

# stop_run SIGNAL group|driver ARGS...: a worker in a session (and process
# group) of its own, with SIGINT at its default (a shell's background job
# would ignore it, and the worker rightly keeps what it finds ignored);
# SIGNAL to the whole group, or to the driver alone, once its first
# request is at the bank.  Sets RC; the worker's stderr in w.err.
stop_run() {
	local sig=$1 to=$2 w before
	shift 2
	before=$(bank_stat attempts)
	BEFORE_DEBITS=$(ledger_debits)
	python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
os.execvp(sys.argv[1], sys.argv[1:])' charge-worker --drain --no-lock --lease 20s --debit-timeout 5 \
		--notify-timeout 2 --notify-retries 0 "$@" 2>"$BATS_TEST_TMPDIR/w.err" 3>&- &
	w=$!
	until_bank attempts $((before + 1))
	if [ "$to" = group ]; then kill "-$sig" -- "-$w"; else kill "-$sig" "$w"; fi
	RC=0
	wait "$w" || RC=$?
	grep '"summary":true' "$BATS_TEST_TMPDIR/w.err" || true
}

# check_recorded: every debit at the bank is DONE or DNF in the store
# (looked up by the bank's own keys), none twice, and the store holds no
# IN_PROGRESS record whose charge the bank debited.
check_recorded() {
	local debits k s bad=0
	# the bank finishes the calls it got, whether or not anyone waits
	until_bank debits "$(bank_stat attempts)"
	debits=$(ledger_debits)
	echo "bank debits $debits ($BEFORE_DEBITS before this run)"
	[ "$debits" -gt "$BEFORE_DEBITS" ]
	[ "$(bank_stat attempts)" -eq "$debits" ]
	for k in $(sqlite3 "$BANK_DIR/ledger.db" 'SELECT key FROM debits'); do
		s=$(jget "$(idemp-show --json "$k" 2>/dev/null)" state)
		case $s in
		DONE|DEBITED_NOTIFICATION_FAILED) ;;
		*) echo "debited at the bank, record '$s': $k"; bad=$((bad + 1)) ;;
		esac
	done
	[ "$bad" -eq 0 ]
	# and the run's summary counted its own
	s=$(grep '"summary":true' "$BATS_TEST_TMPDIR/w.err")
	[ $(( $(jget "$s" debited) + $(jget "$s" debitedNotificationFailed) )) -eq $((debits - BEFORE_DEBITS)) ]
}

# then_rest: the next run (the bank quick again, its ledger kept) finishes
# the rest, the re-notify job what the stop left DNF; each charge debited
# once.
then_rest() {
	bank_stop
	bank_start
	drain 60 -j 2 --no-lock
	charge-recover --renotify 2>/dev/null || true
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}

@test "--stream -j 1: SIGTERM to the process group records every answered debit, exits 143" {
	stop_run TERM group --stream -j 1
	[ "$RC" -eq 143 ]
	check_recorded
	then_rest
}

@test "--stream -j 2: SIGTERM to the process group records every answered debit, exits 143" {
	stop_run TERM group --stream -j 2
	[ "$RC" -eq 143 ]
	check_recorded
	then_rest
}

@test "--stream -j 2: SIGINT to the process group (a terminal's ^C) records every answered debit, exits 130" {
	stop_run INT group --stream -j 2
	[ "$RC" -eq 130 ]
	check_recorded
	then_rest
}

@test "--stream: SIGTERM to the driver alone: the same" {
	stop_run TERM driver --stream -j 2
	[ "$RC" -eq 143 ]
	check_recorded
	then_rest
}

@test "one-shot -j 1: SIGTERM to the process group records the charges of the receive in flight, exits 143" {
	stop_run TERM group -j 1
	[ "$RC" -eq 143 ]
	check_recorded
	then_rest
}

@test "one-shot -j 2: SIGTERM and SIGINT to the process group record the charges in flight" {
	stop_run TERM group -j 2
	[ "$RC" -eq 143 ]
	check_recorded
	stop_run INT group -j 2
	[ "$RC" -eq 130 ]
	check_recorded
	then_rest
}

@test "one-shot: SIGTERM to the driver alone: the same" {
	stop_run TERM driver -j 2
	[ "$RC" -eq 143 ]
	check_recorded
	then_rest
}
