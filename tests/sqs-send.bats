#!/usr/bin/env bats
# sqs-send on the embedded default queue: every exit code it documents.

bats_require_minimum_version 1.5.0
load helper
load lock

@test "sqs-send: 0, one messageId per line, bodies verbatim" {
	printf '%s\n' '  spaced  ' '{"a":"\u00e9"}' 'tab	in' >"$BATS_TEST_TMPDIR/in"
	run sqs-send <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[ -n "$(jget "${lines[2]}" messageId)" ]
	sqs-recv --max 10 >"$BATS_TEST_TMPDIR/out"
	python3 - "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out" <<'PY'
import json, sys
want = sorted(open(sys.argv[1]).read().splitlines())
got = sorted(json.loads(l)["body"] for l in open(sys.argv[2]))
assert want == got, (want, got)
PY
}

@test "sqs-send: no input sends nothing, 0" {
	run sqs-send </dev/null
	[ "$status" -eq 0 ]
	[ -z "$output" ]
}

@test "sqs-send: 64 on a bad command line" {
	run sqs-send --delay 901
	[ "$status" -eq 64 ]
	run sqs-send --attr novalue
	[ "$status" -eq 64 ]
	[[ "$output" == *"NAME=VALUE"* ]]
	run sqs-send extra
	[ "$status" -eq 64 ]
}

@test "sqs-send: 65 for an empty line; the other lines are sent" {
	run --separate-stderr sqs-send <<<$'one\n\ntwo'
	[ "$status" -eq 65 ]
	[ "${#lines[@]}" -eq 2 ]
	[[ "$stderr" == *"line 2: empty body, not sent"* ]]
	run sqs-recv --max 10
	[ "${#lines[@]}" -eq 2 ]
}

@test "sqs-send --from-envelope: 65 for a line that is not an envelope" {
	run sqs-send --from-envelope <<<'{"chargeId":"CHG-1"}'
	[ "$status" -eq 65 ]
	[[ "$output" == *"line 1: not an envelope from sqs-recv"* ]]
}

@test "sqs-send --from-envelope: sends the body, then deletes the source" {
	mkdir -p "$IDEMKIT_STATE_DIR"
	dlq="sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq"
	echo '{"chargeId":"CHG-9"}' | sqs-send --queue "$dlq" --attr idemkit.reason=DECLINED >/dev/null
	sqs-recv --queue "$dlq" --visibility 1 >"$BATS_TEST_TMPDIR/env"
	run sqs-send --from-envelope <"$BATS_TEST_TMPDIR/env"
	[ "$status" -eq 0 ]
	[ -n "$(jget "$output" source)" ]
	run sqs-recv
	[ "$(jget "$output" body)" = '{"chargeId":"CHG-9"}' ]
	# the DLQ's reasons stay behind; when the first copy was sent goes on
	python3 -c 'import json, sys
a = json.loads(sys.argv[1])["attributes"]; src = json.load(open(sys.argv[2]))
assert a == {"idemkit.firstSentAt": str(src["sentAt"])}, a' "$output" "$BATS_TEST_TMPDIR/env"
	sleep 1.1
	run sqs-recv --queue "$dlq"
	[ "$status" -eq 1 ]
}

@test "sqs-send: 70 when stdout is closed" {
	run bash -c 'echo x | sqs-send >&-'
	[ "$status" -eq 70 ]
}

@test "sqs-send: 75 when the queue is busy" {
	echo warm | sqs-send >/dev/null
	hold_write_lock "$IDEMKIT_STATE_DIR/queue.db"
	IDEMKIT_BUSY_TIMEOUT=100ms run sqs-send <<<"x"
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[[ "$output" == *"lines 1-1 not sent"* ]]
}

@test "sqs-send: 78 on a malformed queue URL" {
	run sqs-send --queue 'https://sqs.us-east-1.amazonaws.com' <<<"x"
	[ "$status" -eq 78 ]
	[[ "$output" == "sqs-send: queue URL 'https://sqs.us-east-1.amazonaws.com': no /ACCOUNT/NAME path"* ]]
}

@test "sqs-send: --help and --version" {
	run sqs-send --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"--from-envelope"* ]]
	run sqs-send --version
	[[ "$output" == "sqs-send (idemkit) "* ]]
}
