#!/usr/bin/env bats
# Outages: the store (a locked SQLite file; DynamoDB unreachable), the
# queue (SQS unreachable), the bank (down, slow, 503) -> charge-worker
# exits 75, nothing is acked (every message still in the queue, none in
# the DLQ), nothing is debited twice; when the service comes back, the
# next runs finish every charge exactly once.  The notification gateway
# down is different by design (DESIGN.md): the debit is the recorded fact,
# the record is DEBITED_NOTIFICATION_FAILED, the message is deleted, and
# the notification re-drive sends each notification once when it is back.
# "Down" for DynamoDB and SQS is a loopback proxy in front of the emulator
# (tests/recproxy.py) killed and restarted on its port, so the emulator's
# in-memory state survives the outage as a real service's would.

bats_require_minimum_version 1.5.0
load faults
load ../lock

N=5
# A drain keeps looking again at what it left while the copy is due back
# within its wait (one lease, 12 s here): a backoff that can grow past that
# lets the drain end, 75, while the outage lasts.
export IDEMKIT_BACKOFF_CAP=30

setup() {
	embedded_queue 2
	charges "$N" "$BATS_TEST_TMPDIR/charges" "OUT$BATS_TEST_NUMBER"
}
teardown() {
	[ -z "${LOCK_PID:-}" ] || { kill "$LOCK_PID" 2>/dev/null; wait "$LOCK_PID" 2>/dev/null || true; }
	proxy_stop
	bank_stop
	aws_stop
}

enqueue() { sqs-send < "$BATS_TEST_TMPDIR/charges" > /dev/null; }

# outage_run: one drain run during the outage: 75, and nothing acked.
outage_run() {
	run --separate-stderr charge-worker --drain -j 2 "${WORKER_OPTS[@]}"
	echo "$stderr" | tail -3
	[ "$status" -eq 75 ]
	[ "$(qdepth)" -eq "$N" ]
	[ "$(qdepth "$IDEMKIT_DLQ")" -eq 0 ]
}

# proxy_start UPSTREAM [PORT]: recproxy.py in front of UPSTREAM; PROXY_URL.
proxy_start() {
	local d=$BATS_TEST_TMPDIR i
	rm -f "$d/proxy.port"
	python3 "$IDEMKIT_SRC/tests/recproxy.py" "$1" "$d/proxy.port" "$d/proxy.log" ${2:-} 3>&- &
	PROXY_PID=$!
	for i in $(seq 100); do [ -s "$d/proxy.port" ] && break; sleep 0.05; done
	PROXY_URL=http://127.0.0.1:$(cat "$d/proxy.port")
}
proxy_stop() {
	[ -n "${PROXY_PID:-}" ] || return 0
	kill "$PROXY_PID" 2>/dev/null
	wait "$PROXY_PID" 2>/dev/null || true
	PROXY_PID=
}

@test "store down (SQLite write-locked): 75, nothing acked, nothing debited; exactly once after" {
	bank_start
	enqueue
	idemp-init > /dev/null
	hold_write_lock "${IDEMKIT_STORE#sqlite:}"
	IDEMKIT_BUSY_TIMEOUT=100ms outage_run
	[ "$(stat_of "$(bank_stats)" attempts)" -eq 0 ]
	kill "$LOCK_PID"; wait "$LOCK_PID" 2>/dev/null || true; LOCK_PID=
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}

@test "store down (DynamoDB unreachable): 75, nothing acked, nothing debited; exactly once after" {
	require_node
	aws_test_env
	export AWS_MAX_ATTEMPTS=2 IDEMKIT_AWS_MAX_BACKOFF=20ms
	dynalite_start
	proxy_start "$DYNALITE_URL"
	port=${PROXY_URL##*:}
	export AWS_ENDPOINT_URL_DYNAMODB=$PROXY_URL IDEMKIT_STORE=dynamodb:out-$$
	idemp-init >/dev/null 2>&1
	bank_start
	enqueue
	proxy_stop
	outage_run
	[ "$(stat_of "$(bank_stats)" attempts)" -eq 0 ]
	proxy_start "$DYNALITE_URL" "$port"
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}

@test "queue down (SQS unreachable): 75 at once, nothing debited; processing resumes when it is back" {
	aws_queue_store
	SQS_URL=$AWS_ENDPOINT_URL_SQS
	proxy_start "$SQS_URL"
	port=${PROXY_URL##*:}
	export AWS_MAX_ATTEMPTS=2 IDEMKIT_AWS_MAX_BACKOFF=20ms
	export AWS_ENDPOINT_URL_SQS=$PROXY_URL
	export IDEMKIT_QUEUE=${IDEMKIT_QUEUE/$SQS_URL/$PROXY_URL} IDEMKIT_DLQ=${IDEMKIT_DLQ/$SQS_URL/$PROXY_URL}
	bank_start
	enqueue
	proxy_stop
	start=$SECONDS
	run --separate-stderr charge-worker --drain -j 2 "${WORKER_OPTS[@]}"
	[ "$status" -eq 75 ]
	[[ $stderr == *"receive failed (75"* ]]
	[ $((SECONDS - start)) -lt 20 ]
	[ "$(stat_of "$(bank_stats)" attempts)" -eq 0 ]
	proxy_start "$SQS_URL" "$port"
	[ "$(qdepth)" -eq "$N" ]
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}

@test "bank down: 75, nothing acked; after it is back (and the leases end) exactly once" {
	bank_start
	enqueue
	bank_stop
	outage_run
	idemp-list --state IN_PROGRESS > /dev/null
	drain 60 -j 2     # restarts the bank on its port (bank_ensure)
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}

@test "bank slow (answers after the debit timeout): 75, nothing acked; debits it made meanwhile are replays later" {
	bank_start --latency 2500ms
	enqueue
	outage_run
	bank_post /control '{"latencyMs":0}' >/dev/null
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "outage bank slow: $N charges; debits the slow bank committed while the client timed out, absorbed later as replays: $REPLAYS"
}

@test "bank 503: 75, nothing acked, nothing debited; exactly once after" {
	bank_start --error-rate 1
	enqueue
	outage_run
	[ "$(stat_of "$(bank_stats)" debits)" -eq 0 ]
	[ "$(stat_of "$(bank_stats)" errors)" -ge "$N" ]
	bank_post /control '{"errorRate":0}' >/dev/null
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	[ "$REPLAYS" -eq 0 ]
}

@test "notification gateway down: debited once, recorded DEBITED_NOTIFICATION_FAILED, message deleted; the re-drive notifies once" {
	bank_start --notify-fail
	enqueue
	run --separate-stderr charge-worker --drain -j 2 "${WORKER_OPTS[@]}"
	[ "$status" -eq 0 ]
	[[ $stderr == *"\"debitedNotificationFailed\":$N"* ]]
	[ "$(qdepth)" -eq 0 ]
	[ "$(qdepth "$IDEMKIT_DLQ")" -eq 0 ]
	[ "$(idemp-list --state DEBITED_NOTIFICATION_FAILED | wc -l)" -eq "$N" ]
	[ "$(stat_of "$(bank_stats)" debits)" -eq "$N" ]
	[ "$(stat_of "$(bank_stats)" notifications)" -eq 0 ]
	# a redelivery now is a duplicate: nothing more at the bank
	sqs-send < "$BATS_TEST_TMPDIR/charges" > /dev/null
	drain 30 -j 2
	[ "$(stat_of "$(bank_stats)" attempts)" -eq "$N" ]
	# the gateway is back: the re-drive
	bank_post /control '{"notifyFail":false}' >/dev/null
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope \
		| charge-notify --stream --timeout 2s | idemp-done --renotified --stream > /dev/null
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	[ "$(stat_of "$(bank_stats)" notifications)" -eq "$N" ]
}
