#!/usr/bin/env bats
# --inflight: charge-debit and charge-notify --stream keep many requests
# in flight (issue 16 item 1), against a real, slowed bank-sim.  Overlap is
# proven from the bank's side (/stats maxConcurrent); every envelope comes
# out once with its own outcome, in the order the answers came.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() { export IDEMKIT_LOG=warn; }
teardown() { bank_stop; }

# outcome_of FILE ID STEP: the STEP outcome of the envelope of charge ID.
outcome_of() { grep "\"m-$2\"" "$1" | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$3']['outcome'])"; }
# ids FILE: the messageIds written, sorted.
ids() { sed -n 's/.*"messageId":"\([^"]*\)".*/\1/p' "$1" | sort; }
control() { bank_post /control "$1" >/dev/null; }

@test "--inflight: bad values are usage (64) or configuration (78) errors; --help names it" {
	for cmd in charge-debit charge-notify; do
		run "$cmd" --stream --inflight 0 </dev/null
		[ "$status" -eq 64 ]
		[[ "$output" == *"--inflight"* ]]
		run "$cmd" --stream --inflight many </dev/null
		[ "$status" -eq 64 ]
		run "$cmd" --help
		[ "$status" -eq 0 ]
		[[ "$output" == *"--inflight N"* ]]
	done
	run env IDEMKIT_BANK_INFLIGHT=0 charge-debit --stream </dev/null
	[ "$status" -eq 78 ]
	[[ "$output" == *"IDEMKIT_BANK_INFLIGHT"* ]]
	run env IDEMKIT_NOTIFY_INFLIGHT=2000 charge-notify --stream </dev/null
	[ "$status" -eq 78 ]
	run env IDEMKIT_BANK_INFLIGHT=4 charge-debit --stream </dev/null
	[ "$status" -eq 0 ]
	run charge-worker --inflight 0
	[ "$status" -eq 64 ]
	[[ "$output" == *"--inflight: want 1 to 1024"* ]]
}

@test "charge-debit --stream --inflight 16: requests overlap at the bank, every envelope once, one debit per charge" {
	bank_start --latency 200ms
	for i in $(seq 1 48); do leased "O$i" 60000; done > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr charge-debit --stream --inflight 16 < "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 48 ]
	printf '%s\n' "${lines[@]}" > "$BATS_TEST_TMPDIR/out"
	[ "$(ids "$BATS_TEST_TMPDIR/out")" = "$(ids "$BATS_TEST_TMPDIR/in")" ]
	[ "$(grep -c '"debit":{"outcome":"OK","ref":"TXN-' "$BATS_TEST_TMPDIR/out")" -eq 48 ]
	[ "$(ledger_debits)" -eq 48 ]
	[ "$(bank_stat attempts)" -eq 48 ]
	# more than one at once, never more than asked for
	m=$(bank_stat maxConcurrent)
	echo "maxConcurrent $m"
	[ "$m" -ge 2 ]
	[ "$m" -le 16 ]
	# --inflight 1 is one at a time
	bank_stop
	rm -f "$BANK_DIR/ledger.db"
	bank_start --latency 50ms
	for i in $(seq 1 6); do envelope "P$i"; done | charge-debit --stream --inflight 1 >/dev/null
	[ "$(bank_stat maxConcurrent)" -eq 1 ]
	[ "$(ledger_debits)" -eq 6 ]
}

@test "a declined, a 5xx, a timeout and good debits in flight together each get their own outcome" {
	bank_start --latency 100ms --decline ACC-POOR
	control '{"failKeys":{"M-5XX":1},"slowKeys":{"M-SLOW":4000}}'
	{
		envelope M-SLOW; envelope M-DECL ACC-POOR; envelope M-5XX
		for i in 1 2 3 4 5; do envelope "M-OK$i"; done
	} > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr charge-debit --stream --inflight 8 --timeout 1s < "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 8 ]
	printf '%s\n' "${lines[@]}" > "$BATS_TEST_TMPDIR/out"
	[ "$(ids "$BATS_TEST_TMPDIR/out")" = "$(ids "$BATS_TEST_TMPDIR/in")" ]
	[ "$(outcome_of "$BATS_TEST_TMPDIR/out" M-DECL debit)" = DECLINED ]
	[ "$(outcome_of "$BATS_TEST_TMPDIR/out" M-5XX debit)" = TEMPFAIL ]
	grep '"m-M-5XX"' "$BATS_TEST_TMPDIR/out" | grep -q '"status":503'
	[ "$(outcome_of "$BATS_TEST_TMPDIR/out" M-SLOW debit)" = TEMPFAIL ]
	grep '"m-M-SLOW"' "$BATS_TEST_TMPDIR/out" | grep -qi 'timeout\|timed out'
	for i in 1 2 3 4 5; do [ "$(outcome_of "$BATS_TEST_TMPDIR/out" "M-OK$i" debit)" = OK ]; done
	# the slow one was read first and written last: the others did not wait
	[[ "${lines[7]}" == *'"m-M-SLOW"'* ]]
	for k in M-DECL M-5XX; do
		run bank_get "/debits/$k" -o /dev/null -w '%{http_code}'
		[ "$output" = 404 ]
	done
}

@test "the lease is checked when each request is sent: envelopes queued behind a slow bank go out LEASE_SHORT with nothing sent" {
	bank_start --latency 600ms
	# One lease end for all, 7.5 s away; 2 s timeout + 500 ms margin: only
	# what is sent within 5 s may go.  One at a time, at least 600 ms
	# each: at most 9 fit, so L10 is always late however slow the machine,
	# and a loaded machine's slow start still leaves time for the first
	# (and each call three times its latency).
	# (the lease granted once the ten are made: making them on a loaded
	# machine took up to the whole 5 s before, "ok 0 short 10")
	for i in $(seq 1 10); do LEASE_FROM=0 LEASE_FROM_BOOT=0 leased "L$i" 7500; done > "$BATS_TEST_TMPDIR/made"
	lease_now_on 7500 < "$BATS_TEST_TMPDIR/made" > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr charge-debit --stream --inflight 1 --timeout 2s --lease-margin 500ms \
		< "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 10 ]
	printf '%s\n' "${lines[@]}" > "$BATS_TEST_TMPDIR/out"
	ok=$(grep -c '"debit":{"outcome":"OK"' "$BATS_TEST_TMPDIR/out" || true)
	short=$(grep -c '"debit":{"outcome":"LEASE_SHORT"' "$BATS_TEST_TMPDIR/out" || true)
	echo "ok $ok short $short"
	[ "$ok" -ge 1 ]
	[ $((ok + short)) -eq 10 ]
	# the last ones waited past the check: never sent
	[ "$(outcome_of "$BATS_TEST_TMPDIR/out" L10 debit)" = LEASE_SHORT ]
	grep '"m-L10"' "$BATS_TEST_TMPDIR/out" | grep -q 'nothing was sent'
	# the bank saw exactly the calls that were made, each one while its
	# lease still had the timeout plus the margin left: its debit was made
	# (after the 300 ms latency) before the lease's margin began
	[ "$(bank_stat attempts)" -eq "$ok" ]
	[ "$(ledger_debits)" -eq "$ok" ]
	while read -r line; do
		id=$(jget "$line" messageId); id=${id#m-}
		until=$(jget "$line" claim.leaseUntil)
		if [ "$(jget "$line" debit.outcome)" = OK ]; then
			at=$(jget "$(bank_get "/debits/$id")" createdAt)
			echo "$id created $at lease $until"
			[ "${at%.*}" -le $((until - 500)) ]
		else
			run bank_get "/debits/$id" -o /dev/null -w '%{http_code}'
			[ "$output" = 404 ]
		fi
	done < "$BATS_TEST_TMPDIR/out"
}

@test "kill -9 of charge-debit with requests in flight: a rerun gives replays only, no second debit" {
	bank_start --latency 1s
	for i in $(seq 1 20); do envelope "K$i"; done > "$BATS_TEST_TMPDIR/in"
	charge-debit --stream --inflight 20 < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out1" 2>/dev/null 3>&- &
	pid=$!
	until_bank attempts 20
	kill -9 "$pid"
	rc=0; wait "$pid" || rc=$?
	[ "$rc" -eq 137 ]
	[ ! -s "$BATS_TEST_TMPDIR/out1" ]     # nothing was answered yet
	until_bank debits 20                  # the bank finished what it got
	run --separate-stderr charge-debit --stream --inflight 20 < "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 20 ]
	[ "$(printf '%s\n' "${lines[@]}" | grep -c '"outcome":"OK".*"replayed":true')" -eq 20 ]
	[ "$(ledger_debits)" -eq 20 ]
	[ "$(bank_stat replays)" -eq 20 ]
}

@test "SIGTERM: charge-debit stops reading, finishes what is in flight, exits 143" {
	bank_start --latency 700ms
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	charge-debit --stream --inflight 8 < "$BATS_TEST_TMPDIR/fifo" > "$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/fifo"
	for i in 1 2 3 4 5; do envelope "T$i"; done >&5
	until_bank attempts 5
	kill -TERM "$pid"
	t6=$(envelope T6)
	# after the stop: never started (on a loaded machine charge-debit may
	# have finished and closed the pipe already: the write then fails)
	( printf '%s\n' "$t6" >&5 ) 2>/dev/null || true
	rc=0; wait "$pid" || rc=$?
	exec 5>&-
	[ "$rc" -eq 143 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 5 ]
	[ "$(grep -c '"debit":{"outcome":"OK"' "$BATS_TEST_TMPDIR/out")" -eq 5 ]
	[ "$(ledger_debits)" -eq 5 ]
}

@test "charge-notify --inflight: overlap; a retried notification does not hold up the others" {
	bank_start
	# N-R answers 503 twice, then OK; each of its attempts takes 300 ms
	control '{"failKeys":{"N-R:notify":2},"slowKeys":{"N-R:notify":300}}'
	{ debited "$(leased N-R 60000)"; echo
	  for i in $(seq 1 9); do debited "$(leased "N$i" 60000)"; echo; done; } > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr charge-notify --stream --inflight 2 --backoff 50ms --retries 3 \
		< "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 10 ]
	printf '%s\n' "${lines[@]}" > "$BATS_TEST_TMPDIR/out"
	[ "$(ids "$BATS_TEST_TMPDIR/out")" = "$(ids "$BATS_TEST_TMPDIR/in")" ]
	[ "$(jget "$(grep '"m-N-R"' "$BATS_TEST_TMPDIR/out")" notify.outcome)" = OK ]
	[ "$(jget "$(grep '"m-N-R"' "$BATS_TEST_TMPDIR/out")" notify.attempts)" -eq 3 ]
	for i in $(seq 1 9); do
		[ "$(jget "$(grep "\"m-N$i\"" "$BATS_TEST_TMPDIR/out")" notify.attempts)" -eq 1 ]
	done
	# read first, written last: the nine went through the other slot
	printf '%s\n' "${lines[@]}" | cut -c1-80
	[[ "${lines[9]}" == *'"m-N-R"'* ]]
	[ "$(bank_stat notifications)" -eq 10 ]
	[ "$(bank_stat notificationAttempts)" -eq 12 ]

	# and at latency, the notifications overlap
	bank_stop
	rm -f "$BANK_DIR/ledger.db"
	bank_start --latency 200ms
	# (all 24 made first: piped from the loop that makes them, one at a
	# time under a loaded CI, each could be answered before the next came)
	for i in $(seq 1 24); do debited "$(envelope "NL$i")"; echo; done > "$BATS_TEST_TMPDIR/in2"
	charge-notify --stream --inflight 8 < "$BATS_TEST_TMPDIR/in2" > "$BATS_TEST_TMPDIR/out2"
	[ "$(grep -c '"notify":{"outcome":"OK"' "$BATS_TEST_TMPDIR/out2")" -eq 24 ]
	m=$(bank_stat maxConcurrent)
	echo "maxConcurrent $m"
	[ "$m" -ge 2 ]
	[ "$m" -le 8 ]
}

@test "charge-notify: the lease is checked when a notification is sent, not when it was read" {
	bank_start --latency 600ms
	# as above: one lease end 7.5 s away, at most 9 sends fit before NS10
	for i in $(seq 1 10); do debited "$(LEASE_FROM=0 LEASE_FROM_BOOT=0 leased "NS$i" 7500)"; echo; done \
		> "$BATS_TEST_TMPDIR/made"
	lease_now_on 7500 < "$BATS_TEST_TMPDIR/made" > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr charge-notify --stream --inflight 1 --timeout 2s --retries 0 \
		--lease-margin 500ms < "$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 10 ]
	printf '%s\n' "${lines[@]}" > "$BATS_TEST_TMPDIR/out"
	ok=$(grep -c '"notify":{"outcome":"OK"' "$BATS_TEST_TMPDIR/out" || true)
	short=$(grep -c '"notify":{"outcome":"LEASE_SHORT"' "$BATS_TEST_TMPDIR/out" || true)
	echo "ok $ok short $short"
	[ "$ok" -ge 1 ]
	[ $((ok + short)) -eq 10 ]
	[ "$(outcome_of "$BATS_TEST_TMPDIR/out" NS10 notify)" = LEASE_SHORT ]
	[ "$(jget "$(grep '"m-NS10"' "$BATS_TEST_TMPDIR/out")" notify.attempts)" -eq 0 ]
	[ "$(bank_stat notificationAttempts)" -eq "$ok" ]
}

@test "charge-worker --stream --inflight 16 end to end: every charge DONE once, queue empty, envelopes out of order handled" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 100ms --decline ACC-POOR
	# a few slow charges, so that later ones overtake them in every step
	control '{"slowKeys":{"E-3":600,"E-7":600,"E-3:notify":400}}'
	{ for i in $(seq 1 60); do event "E-$i"; echo; done; event E-D ACC-POOR; echo; } | sqs-send >/dev/null
	run --separate-stderr charge-worker --stream --drain --inflight 16 \
		--debit-timeout 2 --notify-timeout 2 --notify-retries 1 --lease 20s
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ]
	[ "$(ledger_debits)" -eq 60 ]
	[ "$(bank_stat replays)" -eq 0 ]
	[ "$(bank_stat notifications)" -eq 60 ]
	[ "$(bank_stat maxConcurrent)" -ge 2 ]
	run idemp-list --state DONE
	[ "${#lines[@]}" -eq 60 ]
	run idemp-list --state IN_PROGRESS
	[ "$status" -eq 1 ]
	s=$(grep '"summary":true' <<<"$stderr")
	[ "$(jget "$s" received)" -eq 61 ]
	[ "$(jget "$s" debited)" -eq 60 ]
	[ "$(jget "$s" declined)" -eq 1 ]
	[ "$(jget "$s" leftForRetry)" -eq 0 ]
	[ "$(sqs-stat | sed -n 's/.*"visible":\([0-9]*\),"inflight":\([0-9]*\).*/\1 \2/p')" = "0 0" ]
}

@test "charge-worker without --inflight keeps the steps' IDEMKIT_BANK_INFLIGHT and IDEMKIT_NOTIFY_INFLIGHT" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 100ms
	# one at a time each, as the variables say: at most a debit and a
	# notification at the bank together
	{ for i in $(seq 1 12); do event "V-$i"; echo; done; } | sqs-send >/dev/null
	IDEMKIT_BANK_INFLIGHT=1 IDEMKIT_NOTIFY_INFLIGHT=1 run --separate-stderr \
		charge-worker --stream --drain --lease 60s
	[ "$status" -eq 0 ]
	[ "$(ledger_debits)" -eq 12 ]
	[ "$(bank_stat maxConcurrent)" -le 2 ]
}

@test "charge-worker --inflight wins over the variables, and a replaced step that refuses the option is never given it" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 100ms
	printf '#!/bin/sh\nfor a; do [ "$a" = --inflight ] && { echo "unknown option --inflight" >&2; exit 64; }; done\nexec charge-debit "$@"\n' \
		> "$BATS_TEST_TMPDIR/debit-wrap"
	chmod +x "$BATS_TEST_TMPDIR/debit-wrap"
	{ for i in $(seq 1 12); do event "W-$i"; echo; done; } | sqs-send >/dev/null
	IDEMKIT_BANK_INFLIGHT=1 IDEMKIT_NOTIFY_INFLIGHT=1 CHARGE_DEBIT_CMD=$BATS_TEST_TMPDIR/debit-wrap \
		run --separate-stderr charge-worker --stream --drain --inflight 8 --lease 60s
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ]
	[ "$(ledger_debits)" -eq 12 ]
	[ "$(bank_stat maxConcurrent)" -ge 3 ]
	run idemp-list --state DONE
	[ "${#lines[@]}" -eq 12 ]
}

@test "bank-sim /control failKeys and slowKeys: checked (400, nothing changed), counted down per key" {
	bank_start
	for bad in '{"failKeys":3}' '{"failKeys":{"K":-1}}' '{"slowKeys":{"K":"x"}}' '{"slowKeys":{"K":3600001}}'; do
		run bank_post /control "$bad" -o /dev/null -w '%{http_code}'
		[ "$output" = 400 ]
	done
	control '{"failKeys":{"F-1":1}}'
	run --separate-stderr charge-debit <<<"$(envelope F-1)"
	[ "$status" -eq 75 ]
	[ "$(jget "$output" debit.status)" = 503 ]
	run --separate-stderr charge-debit <<<"$(envelope F-1)"
	[ "$status" -eq 0 ]
	run --separate-stderr charge-debit <<<"$(envelope F-2)"
	[ "$status" -eq 0 ]
	[ "$(ledger_debits)" -eq 2 ]
	[ "$(bank_stat maxConcurrent)" -eq 1 ]
}

# Issue 24 item 1: no step drops an answered envelope.  A step whose
# stdout fails records what it cannot pass on in the store itself (settle.h),
# fenced by the claim's token.  /dev/full fails every write (ENOSPC) the
# same way a gone reader does (EPIPE), with no timing involved.
claimed() {   # claimed ID...: real claims (tokens) of the events, one per line
	local id
	for id; do event "$id"; echo; done | idemp-claim --stream --lease 60s 2>/dev/null
}
to_full() { "$@" > /dev/full; }   # to_full CMD...: CMD's stdout fails

@test "stdout fails: charge-debit --stream records each answered debit DNF in the store (ref kept), a decline FAILED; exit 70" {
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 200ms --decline ACC-POOR
	{ claimed F1 F2 F3 F4; event F5 ACC-POOR | idemp-claim 2>/dev/null; } > "$BATS_TEST_TMPDIR/in"
	run --separate-stderr to_full charge-debit --stream --inflight 8 < "$BATS_TEST_TMPDIR/in"
	echo "$stderr"
	[ "$status" -eq 70 ]
	[[ "$stderr" == *"stdout: No space left on device; the envelopes not passed on are recorded in the store"* ]]
	[ "$(ledger_debits)" -eq 4 ]
	for id in F1 F2 F3 F4; do
		run idemp-show --json "$id"
		[ "$(jget "$output" state)" = DEBITED_NOTIFICATION_FAILED ]
		[ "$(jget "$output" debitRef)" = "$(jget "$(bank_get "/debits/$id")" ref)" ]
	done
	[ "$(jget "$(idemp-show --json F5)" state)" = FAILED ]
	# one-shot the same: the outcome was OK, the run is 70, the record DNF
	bank_stop; bank_start
	claimed F6 > "$BATS_TEST_TMPDIR/one"
	run --separate-stderr to_full charge-debit < "$BATS_TEST_TMPDIR/one"
	[ "$status" -eq 70 ]
	[ "$(jget "$(idemp-show --json F6)" state)" = DEBITED_NOTIFICATION_FAILED ]
}

@test "stdout fails: charge-notify records DONE (or DNF) itself; idemp-claim releases the claims it could not pass on" {
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start
	control '{"failKeys":{"G2:notify":1}}'
	claimed G1 G2 | charge-debit --stream > "$BATS_TEST_TMPDIR/debited" 2>/dev/null
	run --separate-stderr to_full charge-notify --stream --retries 0 < "$BATS_TEST_TMPDIR/debited"
	[ "$status" -eq 70 ]
	[ "$(jget "$(idemp-show --json G1)" state)" = DONE ]
	[ "$(jget "$(idemp-show --json G2)" state)" = DEBITED_NOTIFICATION_FAILED ]
	# a claim that cannot be passed on is released: claimed again at once
	run --separate-stderr to_full idemp-claim --stream --lease 60s < <(event G3; echo; event G4; echo)
	[ "$status" -eq 70 ]
	run --separate-stderr idemp-claim --lease 60s < <(event G3)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" -eq 2 ]
	[ "$(jget "$(idemp-show --json G4)" state)" = IN_PROGRESS ]
}

@test "SIGTERM and the reader gone (a stop of the whole process group): charge-debit records every debit in flight, exits 143" {
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 1s
	claimed S1 S2 S3 S4 S5 S6 > "$BATS_TEST_TMPDIR/in"
	mkfifo "$BATS_TEST_TMPDIR/out"
	charge-debit --stream --inflight 8 < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" \
		2>"$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	exec 6< "$BATS_TEST_TMPDIR/out"
	until_bank attempts 6
	# the next step stops too, before any answer: nothing was read
	kill -TERM "$pid"
	exec 6<&-
	rc=0; wait "$pid" || rc=$?
	cat "$BATS_TEST_TMPDIR/err"
	[ "$rc" -eq 143 ]
	[ "$(ledger_debits)" -eq 6 ]
	for id in S1 S2 S3 S4 S5 S6; do
		[ "$(jget "$(idemp-show --json "$id")" state)" = DEBITED_NOTIFICATION_FAILED ]
	done
}

@test "SIGTERM to a hand-built pipeline's process group: every debit the bank made is recorded" {
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	bank_start --latency 1s
	claimed P1 P2 P3 P4 P5 P6 P7 P8 > "$BATS_TEST_TMPDIR/in"
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	setsid sh -c 'charge-debit --stream --inflight 8 | charge-notify --stream | idemp-done --stream' \
		< "$BATS_TEST_TMPDIR/fifo" > "$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/fifo"
	cat "$BATS_TEST_TMPDIR/in" >&5
	until_bank attempts 8
	kill -TERM -- "-$pid"
	wait "$pid" || true
	exec 5>&-
	until_bank debits 8
	# what charge-debit could not pass on it recorded itself
	for _ in $(seq 1 100); do pgrep -s "$pid" >/dev/null || break; sleep 0.05; done
	cat "$BATS_TEST_TMPDIR/err"
	for id in P1 P2 P3 P4 P5 P6 P7 P8; do
		s=$(jget "$(idemp-show --json "$id")" state)
		echo "$id $s"
		[ "$s" = DONE ] || [ "$s" = DEBITED_NOTIFICATION_FAILED ]
	done
}

# Issue 18: the write hold (IK_STEP_HOLD_US) must never keep an answer
# while the input stays open; failed by assertion, not by the time limit.
@test "--stream with stdin kept open: an answer goes out while a slow request is still in flight" {
	bank_start
	control '{"slowKeys":{"H-SLOW":5000}}'
	mkfifo "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out"
	charge-debit --stream --inflight 4 < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	exec 6< "$BATS_TEST_TMPDIR/out"
	envelope H-SLOW >&5
	until_bank attempts 1
	envelope H-FAST >&5
	line=
	IFS= read -r -t 3 -u 6 line || true
	[ -n "$line" ]
	[ "$(jget "$line" messageId)" = m-H-FAST ]
	[ "$(jget "$line" debit.outcome)" = OK ]
	[ "$(bank_stat debits)" -eq 1 ]    # H-SLOW is still at the bank
	kill -0 "$pid"
	exec 5>&-
	IFS= read -r -t 10 -u 6 line
	[ "$(jget "$line" messageId)" = m-H-SLOW ]
	exec 6<&-
	wait "$pid"
}
