# tests/queue_backend.bash: the queue the queue suite runs against.
# IDEMKIT_TEST_QUEUE_BACKEND=sqlite (default): a SQLite file per test.
# IDEMKIT_TEST_QUEUE_BACKEND=sqs: local-aws-sqs (npm, pinned in
# package-lock.json) started once per file on a free loopback port, with
# fake credentials; every test gets its own queues.  Needs node: skipped
# only when node is absent outside CI (helper.bash require_node).
# IDEMKIT_TEST_QUEUE_BACKEND=amqp: one RabbitMQ broker per file
# (rabbit_helper.bash), every test its own quorum queue and DLQ.

QB=${IDEMKIT_TEST_QUEUE_BACKEND:-sqlite}
load rabbit_helper

queue_backend_setup_file() {
	case $QB in
	sqlite) ;;
	sqs)
		command -v node >/dev/null 2>&1 || return 0   # tests skip one by one
		local dir=$BATS_FILE_TMPDIR
		(cd "$IDEMKIT_SRC" && exec node tests/sqs-server.js) \
			>"$dir/sqs.port" 2>"$dir/sqs.log" 3>&- &
		echo $! >"$dir/sqs.pid"
		for _ in $(seq 1 100); do
			[ -s "$dir/sqs.port" ] && break
			sleep 0.05
		done
		[ -s "$dir/sqs.port" ] || { cat "$dir/sqs.log" >&2; return 1; }
		;;
	amqp)
		require_rabbit
		rabbit_start
		;;
	*) echo "unknown IDEMKIT_TEST_QUEUE_BACKEND=$QB" >&2; return 1 ;;
	esac
}

queue_backend_teardown_file() {
	local pidf=$BATS_FILE_TMPDIR/sqs.pid
	if [ -s "$pidf" ]; then
		kill "$(cat "$pidf")" 2>/dev/null || true
	fi
	[ "$QB" != amqp ] || rabbit_stop
}

# Fake credentials and the emulator's endpoint; nothing from the user's
# own AWS files.
sqs_env() {
	export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	export AWS_EC2_METADATA_DISABLED=true
	export AWS_CONFIG_FILE=$BATS_TEST_TMPDIR/no-aws-config
	export AWS_SHARED_CREDENTIALS_FILE=$BATS_TEST_TMPDIR/no-aws-credentials
	export IDEMKIT_AWS_MAX_BACKOFF=20ms
	unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT_URL AWS_DEFAULT_REGION
	unset AWS_CONTAINER_CREDENTIALS_FULL_URI AWS_CONTAINER_CREDENTIALS_RELATIVE_URI
	SQS_PORT=$(cat "$BATS_FILE_TMPDIR/sqs.port")
	export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$SQS_PORT
}

# sqs_create NAME [ATTRIBUTES-JSON]: CreateQueue on the emulator (test
# set-up talks to it directly; the code under test never does this).
sqs_create() {
	local attrs=${2:-}
	[ -n "$attrs" ] || attrs='{}'
	curl -sS --fail-with-body -H 'X-Amz-Target: AmazonSQS.CreateQueue' \
		-H 'Content-Type: application/x-amz-json-1.0' \
		-d "{\"QueueName\":\"$1\",\"Attributes\":$attrs}" \
		"$AWS_ENDPOINT_URL_SQS/" >/dev/null
	echo "$AWS_ENDPOINT_URL_SQS/123456789012/$1"
}

# queue_backend_setup [MAX_RECEIVE]: fresh QUEUE and DLQ (exported as
# IDEMKIT_QUEUE / IDEMKIT_DLQ too); with MAX_RECEIVE, QUEUE redrives to
# DLQ after that many receives.
queue_backend_setup() {
	local max=${1:-}
	case $QB in
	sqlite)
		local db=$BATS_TEST_TMPDIR/queue.db
		QUEUE="sqlite:$db#main"
		[ -n "$max" ] && QUEUE="$QUEUE?maxReceiveCount=$max&dlq=main-dlq"
		DLQ="sqlite:$db#main-dlq"
		;;
	sqs)
		require_node
		sqs_env
		local name=t${BATS_TEST_NUMBER}x$$x$RANDOM redrive='{}'
		DLQ=$(sqs_create "$name-dlq")
		[ -n "$max" ] && redrive="{\"RedrivePolicy\":\"{\\\"deadLetterTargetArn\\\":\\\"arn:aws:sqs:us-east-1:123456789012:$name-dlq\\\",\\\"maxReceiveCount\\\":\\\"$max\\\"}\"}"
		QUEUE=$(sqs_create "$name" "$redrive")
		;;
	amqp)
		require_rabbit
		local name=t${BATS_TEST_NUMBER}x$$x$RANDOM
		QUEUE=$(rabbit_url "$name" ${max:+"maxReceiveCount=$max&dlq=$name-dlq"})
		DLQ=$(rabbit_url "$name-dlq")
		;;
	esac
	export QUEUE DLQ IDEMKIT_QUEUE=$QUEUE IDEMKIT_DLQ=$DLQ
}

# envset JSON: merge JSON (an object) into every envelope line on stdin,
# its keys replacing the envelope's (jq: a python3 start costs twice a
# jq's here, and the suites call this hundreds of times a run).  jq 1.6
# reads a number as a double and writes bytes that are not UTF-8 as
# U+FFFD: an envelope with an integer past 2^53, or such bytes, is not
# for envset (python3's json.loads refused the bytes; no caller has either).
envset() {
	jq -c --argjson extra "$1" '. + $extra'
}

# The results a finished charge carries (verdict OK).
FINISHED='{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-1","token":"t","attempt":1,"leaseUntil":1},"debit":{"outcome":"OK","ref":"TXN-1"},"notify":{"outcome":"OK"},"done":{"outcome":"OK","state":"DONE"}}'

# bodies FILE: the bodies of the envelopes in FILE, sorted.
bodies() { jq -r '.body' "$1" | LC_ALL=C sort; }

# drain [ARGS...]: every message there is (sqs-recv --drain), EMPTY is fine.
drain() {
	local rc=0
	sqs-recv --max 10 --drain "$@" || rc=$?
	[ "$rc" -eq 1 ] && return 0
	return "$rc"
}
