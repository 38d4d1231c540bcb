#!/usr/bin/env bats
# Throttling and server errors from AWS: tests/recproxy.py in front of
# DynamoDB Local (IDEMKIT_TEST_BACKEND=dynamodb for dynalite) and
# local-aws-sqs answers ProvisionedThroughputExceededException,
# ThrottlingException, RequestLimitExceeded, HTTP 500 and 503, or resets
# the connection (before the request reaches the service, or mid-response
# after it took effect).  A passing fault is retried with the standard
# mode's backoff (full jitter, base 50 ms; the tests keep the shipped cap)
# and the charge goes through; one that outlasts AWS_MAX_ATTEMPTS (3) makes
# the run TEMPFAIL (75) with nothing acked, nothing lost and nothing
# debited twice: every call was tried exactly 3 times, and once the fault
# is gone the next runs finish every charge exactly once.  The wall time of
# each failing run is reported (idemkit(7), RETRIES states the bound).

bats_require_minimum_version 1.5.0
load faults

N=5

setup_file() {
	aws_queue_store "${IDEMKIT_TEST_BACKEND:-dynamodb-local}"
	export DDB_DIRECT=$AWS_ENDPOINT_URL_DYNAMODB SQS_DIRECT=$AWS_ENDPOINT_URL_SQS
}
teardown_file() { aws_stop; }
setup() {
	heal
	aws_fresh
	unset IDEMKIT_AWS_MAX_BACKOFF AWS_MAX_ATTEMPTS   # the shipped standard mode
	bank_start
	charges "$N" "$BATS_TEST_TMPDIR/charges" "THR$BATS_TEST_NUMBER"
	sqs-send < "$BATS_TEST_TMPDIR/charges" > /dev/null
}
teardown() {
	recproxy_stop
	bank_stop
}

# inject DDB-RULES [SQS-RULES]: the proxies in front of both services, with
# these fault rules (recproxy.py); heal: straight to the services again.
inject() {
	recproxy_start ddb "$DDB_DIRECT" "$1"
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	recproxy_start sqs "$SQS_DIRECT" "${2:-}"
	export AWS_ENDPOINT_URL_SQS=$RECPROXY_URL
}
heal() {
	recproxy_stop
	export AWS_ENDPOINT_URL_DYNAMODB=$DDB_DIRECT AWS_ENDPOINT_URL_SQS=$SQS_DIRECT
}

# tries LOG OP: "3x" when every key (DynamoDB) or queue (SQS) got its OP
# requests in whole rounds of 3 (a call is tried AWS_MAX_ATTEMPTS times,
# and a run may make the same call again after a 75), else the counts.
tries() {
	python3 - "$BATS_TEST_TMPDIR/$1.log" "$2" <<'PY'
import collections, json, sys
c = collections.Counter()
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["target"].rsplit(".", 1)[-1] != sys.argv[2]:
        continue
    b = r["body"]
    c[json.dumps(b.get("Key") or b.get("QueueUrl"), sort_keys=True)] += 1
print("3x" if c and all(n % 3 == 0 for n in c.values()) else sorted(c.values()))
PY
}

# outlasting KIND: the failing run -> 75, nothing acked or dead-lettered,
# nothing debited (ATTEMPTS_AT_BANK overrides: the fault is after the
# debit); then healed, exactly once.  Called as a plain command, never
# behind || or &&: bats' errexit is off inside a function so called, and
# its checks would not fail the test.
outlasting() {
	local kind=$1 t0
	t0=$(date +%s%3N)
	run --separate-stderr charge-worker --drain -j 2 "${WORKER_OPTS[@]}"
	FAILED_MS=$(($(date +%s%3N) - t0))
	echo "$stderr" | tail -3
	[ "$status" -eq 75 ]
	grep -q "(3 tries)" <<<"$stderr"
	[ "$(qdepth)" -eq "$N" ]
	[ "$(qdepth "$IDEMKIT_DLQ")" -eq 0 ]
	[ "$(stat_of "$(bank_stats)" attempts)" -eq "${ATTEMPTS_AT_BANK:-0}" ]
	heal
	drain 90 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "throttle $kind: failing run ($N charges, -j 2) exited 75 in ${FAILED_MS} ms, every call tried 3 times, nothing acked; healed: $N charges debited once each, replays $REPLAYS"
}

# Each outlasting fault on the claim's UpdateItem: every claim tried 3 times.
claim_fault() {
	inject "[{\"op\":\"UpdateItem\",\"times\":null,$2}]"
	outlasting "$1 on the claim"
	[ "$(tries ddb UpdateItem)" = 3x ]
	[ "$(ops sqs DeleteMessage)" -eq 0 ]
	[ "$(ops sqs DeleteMessageBatch)" -eq 0 ]
}

@test "ProvisionedThroughputExceededException on every claim: 3 tries each, then 75; nothing acked or debited; exactly once after" {
	claim_fault PTEE '"do":"error","status":400,"type":"ProvisionedThroughputExceededException"'
}

@test "ThrottlingException on every claim: 3 tries each, then 75; exactly once after" {
	claim_fault ThrottlingException '"do":"error","status":400,"type":"ThrottlingException"'
}

@test "RequestLimitExceeded on every claim: 3 tries each, then 75; exactly once after" {
	claim_fault RequestLimitExceeded '"do":"error","status":400,"type":"RequestLimitExceeded"'
}

@test "HTTP 500 (no AWS error body) on every claim: 3 tries each, then 75; exactly once after" {
	claim_fault HTTP-500 '"do":"error","status":500'
}

@test "HTTP 503 (no AWS error body) on every claim: 3 tries each, then 75; exactly once after" {
	claim_fault HTTP-503 '"do":"error","status":503'
}

@test "connection reset before the claim reaches DynamoDB: 3 tries each, then 75; exactly once after" {
	claim_fault reset '"do":"reset"'
}

@test "connection reset mid-response after the claim took effect: 75, the claim held until its lease ends; exactly once after" {
	claim_fault cut-mid-response '"do":"cut"'
	# the first try of each claim took effect: attempts 2 once the lease
	# (12s) of the claim nobody heard about had ended.  The failing run
	# looks at a charge again while its copy is due back within its wait:
	# 3 rounds of 3 tries here, the last ~11.2 s after the first, so on a
	# loaded machine past the lease, and a try after the lease takes effect
	# too (it is a claim like any).  So each try is judged by its time (the
	# proxy's log): one 12 s or more after the last that took effect takes
	# effect, one sooner is refused by the live lease (within a second of
	# the edge either may be: both are allowed), plus the healed drain's
	# one; the record's attempts must be one of the counts that allows
	run python3 - "$BATS_TEST_TMPDIR/ddb.log" "$(idemp-list --state DONE)" <<'PY'
import collections, json, sys
LEASE, EDGE = 12000, 1000
tries = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["target"].rsplit(".", 1)[-1] == "UpdateItem":
        tries[json.dumps(r["body"].get("Key"), sort_keys=True)].append(r["ms"])
def counts(ts):
    out = set()
    def go(i, last, n):
        if i == len(ts):
            out.add(n + 1)          # the healed drain's claim
            return
        d = ts[i] - last
        if d >= LEASE - EDGE:
            go(i + 1, ts[i], n + 1)
        if d < LEASE + EDGE:
            go(i + 1, last, n)
    if ts:
        go(1, ts[0], 1)
    return out
for l in sys.argv[2].splitlines():
    rec = json.loads(l)
    ts = sorted(t for k, v in tries.items() for t in v
                if '"%s"' % rec["chargeId"] in k or '#%s"' % rec["chargeId"] in k)
    ok = rec["attempts"] in counts(ts)
    print(rec["chargeId"], "attempts", rec["attempts"], "allowed", sorted(counts(ts)),
          "tries at +ms", [t - ts[0] for t in ts], "ok" if ok else "BAD")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq "$N" ]
	[[ "$output" != *BAD* ]]
}

@test "throttling that passes (2 of 3 tries on the claim, the finish, the receive and the delete): retried, exit 0, exactly once" {
	t='"do":"error","status":400,"type":"ThrottlingException"'
	inject "[{\"op\":\"UpdateItem\",\"times\":2,$t},{\"op\":\"UpdateItem\",\"skip\":3,\"times\":2,$t}]" \
		"[{\"op\":\"ReceiveMessage\",\"times\":2,\"do\":\"error\",\"status\":503},{\"op\":\"DeleteMessage\",\"times\":2,$t},{\"op\":\"DeleteMessageBatch\",\"times\":2,$t}]"
	run --separate-stderr charge-worker --drain "${WORKER_OPTS[@]}"
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ]
	heal
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	[ "$REPLAYS" -eq 0 ]
	# the faults were met and retried past
	[ "$(grep -c '"fault"' "$BATS_TEST_TMPDIR/ddb.log")" -eq 4 ]
	[ "$(grep -c '"fault"' "$BATS_TEST_TMPDIR/sqs.log")" -ge 4 ]
	report "throttle passing: 4 DynamoDB and $(grep -c '"fault"' "$BATS_TEST_TMPDIR/sqs.log") SQS faults retried past; $N charges debited once each"
}

@test "SQS throttles every delete after the debit: 75, the charges DONE and not acked; the redelivery is DUP_DONE, the bank sees nothing more" {
	t='"do":"error","status":400,"type":"ThrottlingException"'
	inject '[]' "[{\"op\":\"DeleteMessage\",\"times\":null,$t},{\"op\":\"DeleteMessageBatch\",\"times\":null,$t}]"
	# a loop debits the charges of one receive (the 5 here, up to 10),
	# cannot ack them, and ends the drain (75) instead of debiting more
	# charges it cannot ack
	ATTEMPTS_AT_BANK=$N outlasting "ThrottlingException on the ack"
	[ "$(stat_of "$(bank_stats)" attempts)" -eq "$N" ]
	[ "$REPLAYS" -eq 0 ]
}

@test "SQS answers 503 to every receive: 75, nothing received, nothing debited; exactly once after" {
	inject '[]' '[{"op":"ReceiveMessage","times":null,"do":"error","status":503}]'
	outlasting "HTTP 503 on the receive"
	[ "$(tries sqs ReceiveMessage)" = 3x ]
	[ "$(ops ddb UpdateItem)" -eq 0 ]
}

@test "AWS_MAX_ATTEMPTS bounds the tries of one call: 5 -> exactly 5 requests, then 75 TEMPFAIL naming the error" {
	inject '[{"op":"UpdateItem","times":null,"do":"error","status":400,"type":"ProvisionedThroughputExceededException"}]'
	AWS_MAX_ATTEMPTS=5 run --separate-stderr idemp-claim < <(head -1 "$BATS_TEST_TMPDIR/charges")
	[ "$status" -eq 75 ]
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	[[ $stderr == *"dynamodb UpdateItem: ProvisionedThroughputExceededException: injected by recproxy (5 tries)"* ]]
	[ "$(ops ddb UpdateItem)" -eq 5 ]
	: > "$BATS_TEST_TMPDIR/ddb.log"
	AWS_MAX_ATTEMPTS=1 run --separate-stderr idemp-claim < <(head -1 "$BATS_TEST_TMPDIR/charges")
	[ "$status" -eq 75 ]
	[ "$(ops ddb UpdateItem)" -eq 1 ]
	heal
	drain 60 -j 2
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
}
