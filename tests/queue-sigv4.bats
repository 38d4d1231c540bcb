#!/usr/bin/env bats
# Signing verified, not assumed: SQS requests from sqs-send and sqs-ack are
# captured on loopback and their SigV4 signature is recomputed by botocore.

load helper

setup() {
	command -v python3 >/dev/null && python3 -c 'import botocore' 2>/dev/null ||
		skip "python3-botocore not installed"
	LOG=$BATS_TEST_TMPDIR/requests
	python3 "$IDEMKIT_SRC/tests/sigv4_capture.py" "$BATS_TEST_TMPDIR/port" "$LOG" 3>&- &
	CAPTURE_PID=$!
	for _ in $(seq 1 100); do [ -s "$BATS_TEST_TMPDIR/port" ] && break; sleep 0.05; done
	PORT=$(cat "$BATS_TEST_TMPDIR/port")
	export AWS_ACCESS_KEY_ID=AKIDQUEUETEST AWS_SECRET_ACCESS_KEY='queue/Secret+Key/0123456789'
	export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
	export AWS_CONFIG_FILE=$BATS_TEST_TMPDIR/none AWS_SHARED_CREDENTIALS_FILE=$BATS_TEST_TMPDIR/none
	unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT_URL
	export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$PORT
	QUEUE=http://127.0.0.1:$PORT/123456789012/charges
}

teardown() {
	[ -n "${CAPTURE_PID:-}" ] && kill "$CAPTURE_PID" 2>/dev/null || true
}

verify() {
	python3 "$IDEMKIT_SRC/tests/sigv4_verify.py" "$LOG" "$@"
}

@test "sqs-send: SendMessageBatch is signed as botocore signs it" {
	run sqs-send --queue "$QUEUE" <<<'{"chargeId":"CHG-1","amount":2500}'
	[ "$status" -eq 0 ]
	[ "$(jget "$output" messageId)" = captured-0 ]
	run verify 0 "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == "ok AmazonSQS.SendMessageBatch "* ]]
	# and the request is the JSON protocol with our queue and body
	body=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["body"])' "$LOG")
	[ "$(jget "$body" QueueUrl)" = "$QUEUE" ]
	[ "$(jget "$body" Entries.0.MessageBody)" = '{"chargeId":"CHG-1","amount":2500}' ]
}

@test "session credentials: X-Amz-Security-Token is sent and signed" {
	export AWS_SESSION_TOKEN='FQoGZXIvYXdzEXAMPLE/session+token=='
	env='{"v":1,"queue":"'$QUEUE'","messageId":"m-1","receipt":"rh-1","receiveCount":1,"body":"x","claim":{"outcome":"DUP_DONE"}}'
	run sqs-ack <<<"$env"
	[ "$status" -eq 0 ]
	run verify 0 "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" "$AWS_SESSION_TOKEN"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == "ok AmazonSQS.DeleteMessage "* ]]
}

@test "a wrong secret does not verify (the check can fail)" {
	echo x | sqs-send --queue "$QUEUE" >/dev/null
	run verify 0 "$AWS_ACCESS_KEY_ID" 'not-the-secret'
	[ "$status" -ne 0 ]
	[[ "$output" == *"signature mismatch"* ]]
}

@test "a large body (curl's Expect: 100-continue path) is signed right too" {
	big=$(python3 -c 'print("{\"chargeId\":\"CHG-2\",\"pad\":\"" + "x" * 3000 + "\"}")')
	run sqs-send --queue "$QUEUE" <<<"$big"
	[ "$status" -eq 0 ]
	run verify 0 "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
	echo "$output"
	[ "$status" -eq 0 ]
}
