#!/usr/bin/env bats
load helper

@test "idemkit-code explains codes and names, the whole table without arguments" {
	run idemkit-code 11 DUP_FAILED 143
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "$(printf '11\tDUP_IN_PROGRESS\tleave-lease\tanother holder'"'"'s lease is live')" ]
	[[ "${lines[1]}" == "12	DUP_FAILED	dlq	"* ]]
	[[ "${lines[2]}" == "143	SIGNAL	leave	stopped by signal 15" ]]
	run idemkit-code
	[ "${#lines[@]}" -eq "$("$IDEMKIT_TEST_BIN/outcome_table" | wc -l)" ]   # every row of the table
	run idemkit-code --json 75
	[ "$(jget "$output" action)" = leave-backoff ]
}

@test "idemkit-code: unknown -> 1, bad option -> 64" {
	run idemkit-code 99
	[ "$status" -eq 1 ]
	[[ "$output" == *"99: not an idemkit exit code"* ]]
	run idemkit-code --nope
	[ "$status" -eq 64 ]
}
