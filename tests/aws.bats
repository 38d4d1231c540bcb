#!/usr/bin/env bats
# lib/aws: the error classifier on recorded DynamoDB and SQS error bodies
# (a C unit test), and the client's credential chain, region, endpoint,
# signing and retries against a loopback fake (tests/lib/awsfake.py).
# Nothing here contacts a non-loopback address: IMDS is disabled.

bats_require_minimum_version 1.5.0
load helper

@test "classifier: throttling, transient, auth, validation, conditional failure, query-error header" {
	run "$IDEMKIT_TEST_BIN/aws_classify"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = PASSED ]
	! grep -q '^not ok' <<<"$output"
	! grep -q SECRETTOKEN <<<"$output"
}
