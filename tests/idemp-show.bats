#!/usr/bin/env bats
# idemp-show and idemp-list: the operator's and cron's view of the store.

bats_require_minimum_version 1.5.0
load helper

setup() { export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db; }

@test "idemp-show: human view answers debited, holder, attempts, bank ref" {
	env=$(ev CHG-H1 | idemp-claim 2>/dev/null)
	run idemp-show CHG-H1
	[ "$status" -eq 0 ]
	[[ "$output" == *"state        IN_PROGRESS"* ]]
	[[ "$output" == *"held by $(jget "$env" claim.token)"* ]]
	[[ "$output" == *"attempts     1"* ]]
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-9\"},\"notify\":{\"outcome\":\"OK\"}}" | idemp-done >/dev/null
	run idemp-show CHG-H1
	[[ "$output" == *"debited      yes"* ]]
	[[ "$output" == *"bank ref     TXN-9"* ]]
}

@test "idemp-show --json, several ids, stdin, unknown -> 1" {
	ev CHG-H2 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show --json CHG-H2 CHG-NOPE
	[ "$status" -eq 1 ]
	[ "$(jget "${lines[0]}" chargeId)" = CHG-H2 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "$stderr" == *"CHG-NOPE: no record"* ]]
	run --separate-stderr idemp-show --json <<<"CHG-H2"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" state)" = IN_PROGRESS ]
}

@test "idemp-show: '-' reads chargeIds from stdin in its place; CRLF lines too" {
	ev CHG-H3 | idemp-claim >/dev/null 2>&1
	ev CHG-H4 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show --json CHG-H3 - <<<$'CHG-H4\r\n\nCHG-NOPE'
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" chargeId)" = CHG-H3 ]
	[ "$(jget "${lines[1]}" chargeId)" = CHG-H4 ]
	[ "$stderr" = "idemp-show: CHG-NOPE: no record" ]
}

@test "idemp-show and idemp-forget refuse an empty chargeId: 64 before any lookup" {
	ev CHG-H5 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show CHG-H5 ''
	[ "$status" -eq 64 ]
	[ -z "$output" ]
	[ "$stderr" = "idemp-show: empty chargeId (argument 2)" ]
	run --separate-stderr idemp-forget ''
	[ "$status" -eq 64 ]
	[ "$stderr" = "idemp-forget: empty chargeId (argument 1)" ]
	# the store is not opened either: a bad one is not what is reported
	run --separate-stderr idemp-show --store nope: ''
	[ "$status" -eq 64 ]
}

@test "idemp-show: help, version, bad option, bad store" {
	run idemp-show --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"1  EMPTY"* ]]
	run idemp-show --version
	[ "$status" -eq 0 ]
	run idemp-show --nope
	[ "$status" -eq 64 ]
	run idemp-show --store x:y CHG
	[ "$status" -eq 78 ]
}

@test "idemp-list: empty store -> 1; help; bad options -> 64" {
	run --separate-stderr idemp-list
	[ "$status" -eq 1 ]
	run idemp-list --help
	[ "$status" -eq 0 ]
	run idemp-list --state NOPE
	[ "$status" -eq 64 ]
	run idemp-list --older-than soon
	[ "$status" -eq 64 ]
	run idemp-list --store x:y
	[ "$status" -eq 78 ]
}

@test "idemp-list: one JSON record per line with the stored event" {
	ev CHG-L1 | idemp-claim >/dev/null 2>&1
	ev CHG-L2 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-list --state IN_PROGRESS
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "$(jget "${lines[0]}" event)" amount)" = 2500 ]
}

@test "idemp-list --format event gives the stored bodies; bad format is 64" {
	ev CHG-F1 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-list --format event
	[ "$status" -eq 0 ]
	[ "$output" = "$(ev CHG-F1)" ]
	run idemp-list --format xml
	[ "$status" -eq 64 ]
}
