#!/usr/bin/env bats
bats_require_minimum_version 1.5.0
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

@test "idemkit-code --duration: the duration parser every command uses, in milliseconds" {
	run idemkit-code --duration 2m
	[ "$status" -eq 0 ]
	[ "$output" = 120000 ]
	run idemkit-code --duration 30
	[ "$output" = 30000 ]
	run idemkit-code --duration 500ms
	[ "$output" = 500 ]
	run --separate-stderr idemkit-code --duration 5x
	[ "$status" -eq 64 ]
	[[ "$stderr" == *'"5x" is not a duration'* ]]
}

@test "idemkit-code --tally: sqs-ack's output counted by verdict" {
	run idemkit-code --tally <<'EOF2'
{"v":1,"body":"x","messageId":"m1","ack":{"action":"leave-backoff","verdict":"TEMPFAIL","outcome":"OK"}}
{"v":1,"body":"x","messageId":"m1","ack":{"outcome":"OK","verdict":"OK","action":"delete"}}
{"v":1,"body":"x","messageId":"m2","ack":{"action":"leave-lease","verdict":"DUP_IN_PROGRESS","outcome":"TEMPFAIL"}}
not an envelope

{"v":1,"body":"x"}
EOF2
	[ "$status" -eq 0 ]
	[[ "$output" == *"$(printf 'OK\t1')"* ]]
	[[ "$output" == *"$(printf 'TEMPFAIL\t1')"* ]]
	[[ "$output" == *"$(printf 'DUP_IN_PROGRESS\t1')"* ]]
	[[ "$output" == *"$(printf 'DUP_DONE\t0')"* ]]
	# the last two lines no sqs-ack wrote (no ack result): stranded, not ack failures
	[[ "$output" == *"$(printf 'RECEIVED\t5\nACK_FAILED\t1\nSTRANDED\t2\nUNSETTLED\t3')" ]]
}
