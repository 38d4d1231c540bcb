#!/usr/bin/env bats
# make demo, as a user runs it: twice in a row, each from a clean state.
load helper

@test "the demo passes, twice in a row" {
	for round in 1 2; do
		run env IDEMKIT_DEMO_DIR="$BATS_TEST_TMPDIR/demo" sh "$IDEMKIT_SRC/examples/demo.sh"
		echo "$output" | tail -5
		[ "$status" -eq 0 ]
		[[ "$output" == *"demo: OK: every one of the 20 chargeIds was debited exactly once"* ]]
		[ "$(grep -c '  DONE  ' <<<"$output")" -eq 20 ]
	done
}

@test "make demo-aws: the same on DynamoDB and SQS (dynalite, local-aws-sqs)" {
	require_node
	cd "$IDEMKIT_SRC"
	run env IDEMKIT_DEMO_DIR="$BATS_TEST_TMPDIR/demo-aws" DEMO_BACKEND=aws sh examples/demo.sh
	echo "$output" | tail -5
	[ "$status" -eq 0 ]
	[[ "$output" == *"DynamoDB (dynalite) on http://127.0.0.1:"* ]]
	[[ "$output" == *"demo: OK: every one of the 20 chargeIds was debited exactly once"* ]]
}
