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
	hold_write_lock "$BATS_TEST_TMPDIR/s.db"
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

@test "--fail CHARGEID --reason: a charge the bank refuses for good is FAILED by hand, its next delivery goes to the DLQ, which the runbook's peek shows without hiding (issue 29 item 3)" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	unset IDEMKIT_DLQ   # resolved as the commands do: the queue's own
	run --separate-stderr idemp-done --fail CHG-G1
	[ "$status" -eq 64 ]
	[ "$stderr" = "idemp-done: --fail CHARGEID needs --reason TEXT, and goes alone" ]
	run --separate-stderr idemp-done --fail CHG-G1 --reason x --stream
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-done --fail CHG-G1 --reason x
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"no store at sqlite:$BATS_TEST_TMPDIR/s.db"* ]]
	bank_start
	# the bank refuses the account for good: a 404 is CONFIG, not a decline
	bank_post /control '{"errorRate":1,"errorStatus":404}' >/dev/null
	# (a 3 s lease: a loaded sanitizer run spent a 1 s one before
	# charge-debit's lease check, LEASE_SHORT, no bank call)
	ev CHG-G1 | idemp-claim --lease 3s 2>/dev/null \
		| charge-debit --timeout 500ms --lease-margin 0 2>/dev/null | idemp-done >/dev/null 2>&1 || true
	[[ "$(jget "$(idemp-show --json CHG-G1)" lastError)" == "CONFIG from the bank: HTTP 404"*"(the lease decides the retry)" ]]
	# a live lease holds another: 11, nothing written
	ev CHG-G2 | idemp-claim --lease 60s >/dev/null 2>&1
	run --separate-stderr idemp-done --fail CHG-G2 --reason "account closed"
	[ "$status" -eq 11 ]
	[[ "$stderr" == "idemp-done: CHG-G2: a live lease holds it ("*"s left): wait for it to end" ]]
	[ "$(jget "$(idemp-show --json CHG-G2)" state)" = IN_PROGRESS ]
	# no record: 1
	run --separate-stderr idemp-done --fail CHG-G9 --reason x
	[ "$status" -eq 1 ]
	[ "$stderr" = "idemp-done: CHG-G9: no record in sqlite:$BATS_TEST_TMPDIR/s.db: nothing to fail (its next delivery claims it)" ]
	# CHG-G1's lease ends (3 s): then it can be failed
	end=$(( SECONDS + 30 ))
	while [ "$SECONDS" -lt "$end" ]; do
		[ "$(jget "$(idemp-show --json CHG-G1)" leaseRemainingMs)" = 0 ] && break
		sleep 0.05
	done
	run --separate-stderr idemp-done --fail CHG-G1 --reason "account closed, ticket 4711"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"level":"audit"'*'"msg":"recorded FAILED by an operator","chargeId":"CHG-G1","reason":"account closed, ticket 4711"'* ]]
	rec=$(idemp-show --json CHG-G1)
	[ "$(jget "$rec" state)" = FAILED ]
	[ "$(jget "$rec" lastError)" = "FAILED by an operator: account closed, ticket 4711" ]
	run idemp-done --fail CHG-G1 --reason again   # already FAILED: 0, unchanged
	[ "$status" -eq 0 ]
	[ "$(jget "$(idemp-show --json CHG-G1)" lastError)" = "FAILED by an operator: account closed, ticket 4711" ]
	# its next delivery: DUP_FAILED, to the DLQ with its body; no debit ever
	printf '%s' "$(ev CHG-G1)" | sqs-send >/dev/null   # the same event as claimed
	IDEMKIT_LOG=warn run --separate-stderr charge-worker --drain --debit-timeout 2 \
		--notify-timeout 1 --notify-retries 0 --lease 15s
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"dupFailed":1,'*'"toDlq":1,'* ]]
	[ "$(bank_stat debits)" -eq 0 ]
	# the runbook's DLQ step: resolved as the commands do, a peek that does
	# not hide the message (the second look finds it still)
	dlq=$(sqs-stat --resolve | awk -F '\t' '$1 == "dlq" { print $2 }')
	[ "$dlq" = "$IDEMKIT_QUEUE-dlq" ]
	for look in 1 2; do
		run --separate-stderr sqs-recv --queue "$dlq" --max 10 --visibility 0
		[ "$status" -eq 0 ]
		[ "${#lines[@]}" -eq 1 ]
		[[ "$(jget "${lines[0]}" body)" == *'"chargeId":"CHG-G1"'* ]]
	done
	# a charge the bank debited is never FAILED: 10
	ev CHG-G3 | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	run --separate-stderr idemp-done --fail CHG-G3 --reason x
	[ "$status" -eq 10 ]
	[ "$stderr" = "idemp-done: CHG-G3: DONE: the bank debited it; it cannot be FAILED" ]
	[ "$(jget "$(idemp-show --json CHG-G3)" state)" = DONE ]
}
