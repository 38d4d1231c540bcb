#!/usr/bin/env bats
# lib/aws/: the error classifier on recorded DynamoDB and SQS error bodies
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
	if grep -q '^not ok' <<<"$output"; then false; fi
	if grep -q SECRETTOKEN <<<"$output"; then false; fi
}

# one fake AWS server for the file, its request log emptied by each test:
# the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	python3 "$BATS_TEST_DIRNAME/awsfake.py" "$BATS_FILE_TMPDIR/port" "$BATS_FILE_TMPDIR/log" 3>&- &
	echo $! > "$BATS_FILE_TMPDIR/pid"
	for _ in $(seq 1 100); do [ -s "$BATS_FILE_TMPDIR/port" ] && break; sleep 0.05; done
	[ -s "$BATS_FILE_TMPDIR/port" ]
}
teardown_file() {
	kill "$(cat "$BATS_FILE_TMPDIR/pid")" 2>/dev/null || true
}
# servers a test started for itself
teardown() {
	local p
	for p in ${TEST_PIDS:-}; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	return 0
}
setup() {
	aws_test_env
	FAKE=http://127.0.0.1:$(cat "$BATS_FILE_TMPDIR/port")
	LOG=$BATS_FILE_TMPDIR/log
	: > "$LOG"
	rm -f "$LOG.auth"
	probe() { "$IDEMKIT_TEST_BIN/aws_probe" "$@"; }
}

@test "credentials from the environment; endpoint defaults and overrides" {
	run --separate-stderr probe dynamodb
	[ "$status" -eq 0 ]
	[ "$output" = "source=env region=us-east-1 endpoint=https://dynamodb.us-east-1.amazonaws.com key=test" ]
	AWS_ENDPOINT_URL=http://127.0.0.1:1 run --separate-stderr probe sqs
	[[ $output == *"endpoint=http://127.0.0.1:1 "* ]]
	AWS_ENDPOINT_URL=http://127.0.0.1:1 AWS_ENDPOINT_URL_SQS=http://127.0.0.1:2 run --separate-stderr probe sqs
	[[ $output == *"endpoint=http://127.0.0.1:2 "* ]]
	unset AWS_REGION
	AWS_DEFAULT_REGION=ap-south-1 run --separate-stderr probe sqs
	[[ $output == *"region=ap-south-1 endpoint=https://sqs.ap-south-1.amazonaws.com "* ]]
}

@test "shared credentials file and config file, AWS_PROFILE, region from the profile" {
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
	export AWS_SHARED_CREDENTIALS_FILE=$BATS_TEST_TMPDIR/credentials AWS_CONFIG_FILE=$BATS_TEST_TMPDIR/config
	printf '[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n[ops]\n# comment\naws_access_key_id=AKIDOPS\naws_secret_access_key=secretOps123456\n' > "$AWS_SHARED_CREDENTIALS_FILE"
	printf '[default]\nregion = eu-west-1\n[profile ops]\nregion = ap-south-1\ns3 =\n  region = nope\n[profile cfgonly]\naws_access_key_id = AKIDCFG\naws_secret_access_key = secretCfg123456\nregion = us-west-2\n' > "$AWS_CONFIG_FILE"
	run --separate-stderr probe dynamodb
	[ "$output" = "source=shared-credentials-file region=eu-west-1 endpoint=https://dynamodb.eu-west-1.amazonaws.com key=AKIDDEFAULT" ]
	AWS_PROFILE=ops run --separate-stderr probe dynamodb
	[ "$output" = "source=shared-credentials-file region=ap-south-1 endpoint=https://dynamodb.ap-south-1.amazonaws.com key=AKIDOPS" ]
	AWS_PROFILE=cfgonly run --separate-stderr probe dynamodb
	[ "$output" = "source=config-file region=us-west-2 endpoint=https://dynamodb.us-west-2.amazonaws.com key=AKIDCFG" ]
	AWS_PROFILE=missing run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS profile missing not found"* ]]
	if grep -q secretOps <<<"$output$stderr"; then false; fi
}

@test "container credentials over loopback, with the authorization token file; token and key signed into the call" {
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$FAKE/creds
	echo "Bearer tokenfromfile" > "$LOG.auth"
	echo "Bearer tokenfromfile" > "$BATS_TEST_TMPDIR/tok"
	export AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$BATS_TEST_TMPDIR/tok
	export AWS_ENDPOINT_URL_DYNAMODB=$FAKE/ok
	run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{"TableName":"t"}'
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=container region=us-east-1 endpoint=$FAKE/ok key=ASIAFAKECONTAINER1" ]]
	resp=${lines[2]#response=}
	[ "$(jget "$resp" target)" = DynamoDB_20120810.GetItem ]
	[ "$(jget "$resp" contentType)" = application/x-amz-json-1.0 ]
	[ "$(jget "$resp" securityToken)" = containerSessionToken456 ]
	[[ $(jget "$resp" authorization) == "AWS4-HMAC-SHA256 Credential=ASIAFAKECONTAINER1/"*"/us-east-1/dynamodb/aws4_request, SignedHeaders="*"x-amz-security-token"*"Signature="* ]]
	[ "$(jget "$resp" body)" = '{"TableName":"t"}' ]
	grep -q '"Authorization": "Bearer tokenfromfile"' "$LOG"
	if grep -q containerSecretValue <<<"$output$stderr"; then false; fi
}

@test "container credentials: a refused token -> 78; an http URL off loopback -> 78 without contact" {
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
	echo "Bearer right" > "$LOG.auth"
	AWS_CONTAINER_CREDENTIALS_FULL_URI=$FAKE/creds AWS_CONTAINER_AUTHORIZATION_TOKEN="Bearer wrong" \
		run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"container credentials: HTTP 401"* ]]
	: > "$LOG"
	AWS_CONTAINER_CREDENTIALS_FULL_URI=http://192.0.2.1/creds run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS_CONTAINER_CREDENTIALS_FULL_URI: the host must be a loopback address"* ]]
	[ ! -s "$LOG" ]
}

@test "retries: throttling retried AWS_MAX_ATTEMPTS times -> 75; 5xx retried; access denied once -> 78; client error returned" {
	AWS_MAX_ATTEMPTS=3 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/throttle run --separate-stderr probe dynamodb DynamoDB_20120810.PutItem
	[ "$status" -eq 75 ]
	[[ $output == *"error=dynamodb PutItem: ThrottlingException: Rate of requests exceeds the allowed throughput. (3 tries)"* ]]
	[ "$(wc -l < "$LOG")" -eq 3 ]
	: > "$LOG"
	AWS_MAX_ATTEMPTS=2 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/status500 run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem
	[ "$status" -eq 75 ]
	[ "$(wc -l < "$LOG")" -eq 2 ]
	: > "$LOG"
	AWS_ENDPOINT_URL_DYNAMODB=$FAKE/denied run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem
	[ "$status" -eq 78 ]
	[[ $output == *"error=dynamodb GetItem: AccessDeniedException: not authorized"* ]]
	[ "$(wc -l < "$LOG")" -eq 1 ]
	: > "$LOG"
	AWS_ENDPOINT_URL_SQS=$FAKE/nonexistent run --separate-stderr probe sqs AmazonSQS.GetQueueUrl
	[ "$status" -eq 2 ]
	[[ $output == *"type=QueueDoesNotExist status=400"* ]]
	[[ $output == *"error=sqs GetQueueUrl: QueueDoesNotExist: The specified queue does not exist."* ]]
	[ "$(wc -l < "$LOG")" -eq 1 ]
}

@test "calls in flight (ik_aws_submit): they overlap at the server, each is reported once, with the retries and errors of a call made alone" {
	# one at a time, the fake never sees two open: the baseline
	AWS_ENDPOINT_URL_DYNAMODB=$FAKE/slow run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{}' 3
	[ "$status" -eq 0 ]
	[[ $output == *'response={"peak":1}'* ]]
	: > "$LOG"
	AWS_PROBE_INFLIGHT=1 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/slow run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{}' 8
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"active=8"* ]]
	[[ $output == *"reported=8"* ]]
	for i in 0 1 2 3 4 5 6 7; do [ "$(grep -c "^call=$i rc=0 " <<<"$output")" -eq 1 ]; done
	peak=$(sed -n 's/^response={"peak":\([0-9]*\)}$/\1/p' <<<"$output" | sort -n | tail -1)
	[ "$peak" -ge 2 ]
	[ "$(wc -l < "$LOG")" -eq 8 ]
	# throttled in flight: each call gets its own 3 tries, its backoff a timer, then 75
	: > "$LOG"
	AWS_PROBE_INFLIGHT=1 AWS_MAX_ATTEMPTS=3 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/throttle run --separate-stderr probe dynamodb DynamoDB_20120810.PutItem '{}' 4
	[ "$status" -eq 75 ]
	[ "$(grep -c "^error=dynamodb PutItem: ThrottlingException: Rate of requests exceeds the allowed throughput. (3 tries)$" <<<"$output")" -eq 4 ]
	[ "$(wc -l < "$LOG")" -eq 12 ]
	# not retried: access denied, once each, 78; a client error for the caller (2)
	: > "$LOG"
	AWS_PROBE_INFLIGHT=1 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/denied run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{}' 3
	[ "$status" -eq 78 ]
	[ "$(grep -c "^error=dynamodb GetItem: AccessDeniedException: not authorized$" <<<"$output")" -eq 3 ]
	[ "$(wc -l < "$LOG")" -eq 3 ]
	AWS_PROBE_INFLIGHT=1 AWS_ENDPOINT_URL_SQS=$FAKE/nonexistent run --separate-stderr probe sqs AmazonSQS.GetQueueUrl '{}' 2
	[ "$status" -eq 2 ]
	[ "$(grep -c "type=QueueDoesNotExist status=400" <<<"$output")" -eq 2 ]
	# nothing listens: a transport failure, retried, then 75 for each
	AWS_PROBE_INFLIGHT=1 AWS_MAX_ATTEMPTS=2 AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:1 run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{}' 3
	[ "$status" -eq 75 ]
	[ "$(grep -c "^call=[012] rc=75 " <<<"$output")" -eq 3 ]
	[[ $output == *"(2 tries)"* ]]
	# closed with calls in flight: none reported, nothing leaks (make sanitize)
	AWS_PROBE_INFLIGHT=1 AWS_PROBE_ABANDON=1 AWS_ENDPOINT_URL_DYNAMODB=$FAKE/slow run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{}' 4
	[ "$status" -eq 0 ]
	[[ $output == *"abandoned=4 reported=0"* ]]
}

@test "bad settings -> 78: AWS_MAX_ATTEMPTS, region name, CA bundle" {
	AWS_MAX_ATTEMPTS=zero run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	AWS_REGION='us east' run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	AWS_CA_BUNDLE=/nonexistent/ca.pem AWS_ENDPOINT_URL_DYNAMODB=$FAKE/ok run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem
	[ "$status" -eq 78 ]
	[[ $output == *"CA file"* ]]
}

# The https side of the proxy rule (conn/http.h; the plain-http side, never
# through a proxy, is in charge-debit.bats and charge-notify.bats): an AWS
# endpoint over https goes through the environment's proxy (HTTPS_PROXY,
# the AWS CLI's rule) as a CONNECT tunnel, the credentials endpoint of the
# container (plain http) never, and NO_PROXY is honoured.  The https
# endpoint is a loopback stand-in for dynamodb.REGION.amazonaws.com
# (awsfake.py with AWSFAKE_TLS, a self-signed certificate made here and
# trusted through AWS_CA_BUNDLE); the proxy is tests/proxystub.py, which
# logs what reaches it.
@test "https to AWS goes through HTTPS_PROXY as a CONNECT tunnel, TLS end to end; the container credentials endpoint never; NO_PROXY honoured" {
	d=$BATS_TEST_TMPDIR
	mkdir -p "$d/tls" "$d/proxy"
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
		-addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' \
		-keyout "$d/tls/key.pem" -out "$d/tls/cert.pem" 2>/dev/null
	AWSFAKE_TLS=$d/tls python3 "$BATS_TEST_DIRNAME/awsfake.py" "$d/tls/port" "$d/tls/log" 3>&- &
	TEST_PIDS=$!
	python3 "$BATS_TEST_DIRNAME/proxystub.py" "$d/proxy" 3>&- &
	TEST_PIDS="$TEST_PIDS $!"
	for _ in $(seq 1 100); do [ -s "$d/tls/port" ] && [ -s "$d/proxy/port" ] && break; sleep 0.05; done
	tport=$(cat "$d/tls/port")
	P=http://127.0.0.1:$(cat "$d/proxy/port")
	export HTTPS_PROXY=$P https_proxy=$P HTTP_PROXY=$P http_proxy=$P ALL_PROXY=$P all_proxy=$P
	unset NO_PROXY no_proxy AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$FAKE/creds AWS_CA_BUNDLE=$d/tls/cert.pem
	export AWS_ENDPOINT_URL_DYNAMODB=https://127.0.0.1:$tport/ok

	run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{"TableName":"t"}'
	[ "$status" -eq 0 ]
	[ "$(jget "${lines[2]#response=}" target)" = DynamoDB_20120810.GetItem ]
	# the proxy saw one CONNECT to the endpoint and nothing else: not the
	# credentials (plain http, fetched directly), not a byte in cleartext
	[ "$(wc -l < "$d/proxy/log")" -eq 1 ]
	grep -q "\"method\": \"CONNECT\", \"target\": \"127.0.0.1:$tport\"" "$d/proxy/log"
	run ! grep -q -e GetItem -e ASIAFAKECONTAINER1 "$d/proxy/log"
	grep -q '"path": "/creds"' "$LOG"
	grep -q '"path": "/ok"' "$d/tls/log"

	# NO_PROXY names the endpoint: straight to it, the proxy sees nothing
	: > "$d/proxy/log"
	NO_PROXY=127.0.0.1 run --separate-stderr probe dynamodb DynamoDB_20120810.GetItem '{"TableName":"t"}'
	[ "$status" -eq 0 ]
	[ ! -s "$d/proxy/log" ]
	[ "$(grep -c '"path": "/ok"' "$d/tls/log")" -eq 2 ]
}
