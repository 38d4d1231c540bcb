#!/usr/bin/env bats
# tests/run.sh gives every test a time limit, so a hang is a red test with
# a name in the tally, not a run that never ends.  The inner runs get a
# clean environment: bats' own variables must not leak into them.
load helper

inner() {
	# (PATH without bats' own libexec, whose "bats" is not the front end)
	env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME" TMPDIR="$BATS_TEST_TMPDIR" "$@"
}

@test "a hanging test is ended and counted as failed, by name" {
	d=$BATS_TEST_TMPDIR/suite
	mkdir -p "$d"
	# (printf, not a here-document: bats would take its test lines as ours)
	printf '%s\n' '@test "quick" { true; }' \
		'@test "a receive loop that never ends" { sleep 120; }' > "$d/hang.bats"
	SECONDS=0
	run inner BATS_TEST_TIMEOUT=3 sh "$IDEMKIT_SRC/tests/run.sh" "$d/hang.bats"
	[ "$status" -ne 0 ]
	[[ "$output" == *"ok 1 quick"* ]]
	[[ "$output" == *"not ok 2 a receive loop that never ends # timeout after 3s"* ]]
	[ "${lines[${#lines[@]}-1]}" = "1 passed, 1 failed, 0 skipped" ]
	[ "$SECONDS" -lt 100 ]
}

@test "every run gets a default time limit" {
	d=$BATS_TEST_TMPDIR/suite
	mkdir -p "$d"
	printf '@test "limit" { echo "limit=$BATS_TEST_TIMEOUT" >&3; }\n' > "$d/limit.bats"
	run inner sh "$IDEMKIT_SRC/tests/run.sh" "$d/limit.bats"
	[ "$status" -eq 0 ]
	[[ "$output" == *"limit=600"* ]]
}
