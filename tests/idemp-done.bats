#!/usr/bin/env bats
# idemp-done: options, pass-through and the exit codes (OK, LEASE_LOST and
# the derived states are also in store.bats).

bats_require_minimum_version 1.5.0
load helper
load lock
load bank_helper

setup() { export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db; }
teardown() { bank_stop; }

# with STEPJSON: the claimed envelope for ID with more results appended.
claimed() { env=$(ev "$1" | idemp-claim 2>/dev/null); printf '%s\n' "${env%\}}${2:+,$2}}"; }

@test "--help lists its exit codes; --version; bad --state is 64" {
	run idemp-done --help
	[ "$status" -eq 0 ]
	for c in "0  OK" "13  LEASE_LOST" "65  DATAERR" "75  TEMPFAIL"; do [[ "$output" == *"$c"* ]]; done
	run idemp-done --version
	[ "$status" -eq 0 ]
	run idemp-done --state IN_PROGRESS
	[ "$status" -eq 64 ]
	run idemp-done --state maybe
	[ "$status" -eq 64 ]
}

@test "records DONE and exits 0" {
	run --separate-stderr idemp-done --state DONE < <(claimed CHG-D1)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[ "$(jget "$output" done.state)" = DONE ]
}

@test "an envelope with no claim is 65" {
	run --separate-stderr idemp-done < <(ev CHG-D2)
	[ "$status" -eq 65 ]
	[ "$(jget "$output" done.outcome)" = DATAERR ]
	[[ "$stderr" == *"no claim"* ]]
}

@test "a claim without a token is 65" {
	run --separate-stderr idemp-done --state DONE <<<'{"v":1,"body":"x","claim":{"outcome":"ACQUIRED","chargeId":"C"}}'
	[ "$status" -eq 65 ]
}

@test "nothing to record passes through untouched with the envelope's outcome" {
	env=$(ev CHG-D3 | idemp-claim 2>/dev/null)
	dup=$(ev CHG-D3 | idemp-claim 2>/dev/null || true)
	run --separate-stderr idemp-done <<<"$dup"
	[ "$status" -eq 11 ]
	[ "$output" = "$dup" ]
	tf=$(claimed CHG-D4 '"debit":{"outcome":"TEMPFAIL","error":"HTTP 503"}')
	run --separate-stderr idemp-done <<<"$tf"
	[ "$status" -eq 75 ]
	[ "$output" = "$tf" ]
	run idemp-show --json CHG-D4
	[ "$(jget "$output" state)" = IN_PROGRESS ]
}

@test "a lost lease is 13 and says so" {
	old=$(ev CHG-D5 | idemp-claim --lease 1s 2>/dev/null)
	sleep 1.2
	ev CHG-D5 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-done --state DONE <<<"$old"
	[ "$status" -eq 13 ]
	[[ "$(jget "$output" done.error)" == "lease lost"* ]]
}

@test "store busy -> 75, and the record stays IN_PROGRESS" {
	env=$(claimed CHG-D6)
	hold_write_lock "$BATS_TEST_TMPDIR/s.db" 3
	IDEMKIT_BUSY_TIMEOUT=200ms run --separate-stderr idemp-done --state DONE <<<"$env"
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[ "$(jget "$output" done.outcome)" = TEMPFAIL ]
	run idemp-show --json CHG-D6
	[ "$(jget "$output" state)" = IN_PROGRESS ]
}

@test "bad store -> 78" {
	env=$(claimed CHG-D7)
	run --separate-stderr idemp-done --state DONE --store nope: <<<"$env"
	[ "$status" -eq 78 ]
}

@test "--stream finishes many and reports each" {
	a=$(claimed CHG-D8 '"debit":{"outcome":"OK","ref":"T8"},"notify":{"outcome":"OK"}')
	b=$(claimed CHG-D9 '"debit":{"outcome":"DECLINED","error":"HTTP 402"}')
	run --separate-stderr idemp-done --stream < <(printf '%s\n%s\n' "$a" "$b")
	[ "$status" -eq 0 ]
	[ "$(jget "${lines[0]}" done.state)" = DONE ]
	[ "$(jget "${lines[1]}" done.state)" = FAILED ]
}

@test "--renotified: DNF becomes DONE when the notification now succeeded; only from DNF" {
	env=$(claimed CHG-RN1 '"debit":{"outcome":"OK","ref":"T-RN"},"notify":{"outcome":"NOTIFY_FAILED","error":"HTTP 503"}')
	idemp-done <<<"$env" >/dev/null
	rec=$(idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope)
	[ "$(jget "$rec" debit.ref)" = T-RN ]
	[ "$(jget "$rec" recovery.chargeId)" = CHG-RN1 ]
	# notification failed again: passes through, record unchanged
	run --separate-stderr idemp-done --renotified <<<"${rec%\}},\"notify\":{\"outcome\":\"NOTIFY_FAILED\"}}"
	[ "$status" -eq 21 ]
	[ "$(jget "$(idemp-show --json CHG-RN1)" state)" = DEBITED_NOTIFICATION_FAILED ]
	ok="${rec%\}},\"notify\":{\"outcome\":\"OK\"}}"
	run --separate-stderr idemp-done --renotified <<<"$ok"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.state)" = DONE ]
	[ "$(jget "$(idemp-show --json CHG-RN1)" state)" = DONE ]
	run --separate-stderr idemp-done --renotified <<<"$ok"
	[ "$status" -eq 13 ]
	run --separate-stderr idemp-done --renotified < <(claimed CHG-RN2)
	[ "$status" -eq 65 ]
	run idemp-done --renotified --state DONE </dev/null
	[ "$status" -eq 64 ]
}

# Once the debit said OK, money moved: whatever the notification did (or
# did not do), the record ends DEBITED_NOTIFICATION_FAILED and the message
# is deleted; charge-recover --renotify re-sends later.
@test "debit OK and the notification anything but OK: DEBITED_NOTIFICATION_FAILED, verdict delete" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	n=0
	for notify in '"notify":{"outcome":"CONFIG","error":"IDEMKIT_NOTIFY_URL is not set"}' \
	    '"notify":{"outcome":"SOFTWARE","error":"out of memory"}' \
	    '"notify":{"outcome":"TEMPFAIL","error":"HTTP 503"}' \
	    '"notify":{"outcome":"LEASE_SHORT","error":"lease ends in 1s"}' \
	    ''; do
		n=$((n + 1))
		ev "CHG-DN$n" | sqs-send >/dev/null
		env=$(sqs-recv | idemp-claim 2>/dev/null)
		env="${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"T-$n\"}${notify:+,$notify}}"
		run --separate-stderr idemp-done <<<"$env"
		echo "$notify -> $status $output"
		[ "$status" -eq 0 ]
		[ "$(jget "$output" done.outcome)" = OK ]
		[ "$(jget "$output" done.state)" = DEBITED_NOTIFICATION_FAILED ]
		rec=$(idemp-show --json "CHG-DN$n")
		[ "$(jget "$rec" state)" = DEBITED_NOTIFICATION_FAILED ]
		[ "$(jget "$rec" debitRef)" = "T-$n" ]
		[ -n "$(jget "$rec" lastError)" ]
		run --separate-stderr sqs-ack <<<"$output"
		[ "$status" -eq 0 ]
		[ "$(jget "$output" ack.verdict)" = NOTIFY_FAILED ]
		[ "$(jget "$output" ack.action)" = delete ]
	done
	[ "$(jget "$(idemp-show --json CHG-DN5)" lastError)" = "no notification result: charge-notify did not run or wrote nothing" ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	run idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope
	[ "${#lines[@]}" -eq 5 ]
}

@test "--stream: the same, whatever the notification did" {
	a=$(claimed CHG-DS1 '"debit":{"outcome":"OK","ref":"T1"},"notify":{"outcome":"CONFIG","error":"x"}')
	b=$(claimed CHG-DS2 '"debit":{"outcome":"OK","ref":"T2"}')
	run --separate-stderr idemp-done --stream < <(printf '%s\n%s\n' "$a" "$b")
	[ "$status" -eq 0 ]
	[ "$(jget "${lines[0]}" done.state)" = DEBITED_NOTIFICATION_FAILED ]
	[ "$(jget "${lines[1]}" done.state)" = DEBITED_NOTIFICATION_FAILED ]
}

@test "debit LEASE_SHORT: the claim is released (fenced by the token), the record stays IN_PROGRESS and claimable" {
	env=$(claimed CHG-LS1 '"debit":{"outcome":"LEASE_SHORT","error":"lease ends in 2s"}')
	run --separate-stderr idemp-done <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[ "$(jget "$output" done.released)" = True ]
	[ "$(jget "$output" done.state)" = IN_PROGRESS ]
	rec=$(idemp-show --json CHG-LS1)
	[ "$(jget "$rec" state)" = IN_PROGRESS ]
	[ "$(jget "$rec" attempts)" = 1 ]
	# a retry claims it at once, not after the lease
	run --separate-stderr idemp-claim < <(ev CHG-LS1)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 2 ]
	# the old token no longer owns it: LEASE_LOST, and the new claim is untouched
	run --separate-stderr idemp-done <<<"$env"
	[ "$status" -eq 13 ]
	[ "$(jget "$output" done.outcome)" = LEASE_LOST ]
	[ "$(jget "$output" done.released)" = False ]
	[ "$(jget "$(idemp-show --json CHG-LS1)" attempts)" = 2 ]
	run --separate-stderr idemp-claim < <(ev CHG-LS1)
	[ "$status" -eq 11 ]
}

# charge-debit's lease-left check (LEASE_SHORT) and idemp-done's release.
@test "a claim with too little lease left: charge-debit sends nothing, idemp-done releases it, the next claim is at once" {
	bank_start
	env=$(ev CHG-LS2 | idemp-claim --lease 2s 2>/dev/null)
	run --separate-stderr charge-debit --timeout 10s <<<"$env"
	[ "$status" -eq 15 ]
	[ "$(jget "$output" debit.outcome)" = LEASE_SHORT ]
	run --separate-stderr idemp-done <<<"$output"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.released)" = True ]
	[ "$(bank_stat attempts)" -eq 0 ]
	run --separate-stderr idemp-claim < <(ev CHG-LS2)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 2 ]
}
