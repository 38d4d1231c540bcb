#!/usr/bin/env bats
# The fuzz targets' seed corpora and every input that once broke a parser
# (tests/fuzz/regress/NAME/), replayed through the same targets built
# without libFuzzer (make test; under ASan + UBSan in make sanitize).

load helper

replay() {
	local t=$1 files
	files=$(find "$IDEMKIT_SRC/tests/fuzz/corpus/$t" "$IDEMKIT_SRC/tests/fuzz/regress/$t" \
		-type f 2>/dev/null || true)
	[ -n "$files" ]
	# shellcheck disable=SC2086
	run "$IDEMKIT_TEST_BIN/replay_$t" $files
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c '^ok ' <<<"$output")" -eq "$(wc -l <<<"$files")" ]
}

@test "fuzz corpus replay: event parser" { replay event; }
@test "fuzz corpus replay: envelope parser" { replay envelope; }
@test "fuzz corpus replay: AWS error classifier" { replay aws_classify; }
@test "fuzz corpus replay: DynamoDB item and claim decision (incl. leaseUntil = INT64_MIN)" {
	replay ddb_item
}

@test "fuzz corpus replay: SQS receive and batch responses" { replay sqs_response; }
