#!/usr/bin/env bats
# Queue calls in flight on SQS (issue 16): sqs-recv keeps several receives
# outstanding, sqs-ack sends a group's DLQ copies, visibility changes and
# delete batches concurrently.  Against local-aws-sqs behind tests/recproxy.py,
# which shows the overlap at the server ("inflight" in its log) and fails
# whole calls or single entries on demand.  Each test checks what the
# server holds afterwards, not only what the commands said.

bats_require_minimum_version 1.5.0
load helper
load queue_backend
load ddblocal_helper

QB=sqs

# one emulator for the file, whose concurrency some tests measure: the
# tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() { QB=sqs queue_backend_setup_file; }
teardown_file() { queue_backend_teardown_file; }
setup() {
	QB=sqs queue_backend_setup
	SQS_DIRECT=$AWS_ENDPOINT_URL_SQS
}
teardown() { recproxy_stop; }

# via_proxy [RULES-JSON]: from now on the commands talk to SQS through
# recproxy "sqs" (log: $BATS_TEST_TMPDIR/sqs.log).
via_proxy() {
	recproxy_start sqs "$SQS_DIRECT" "${1:-}"
	export AWS_ENDPOINT_URL_SQS=$RECPROXY_URL
}

# sqs_call TARGET JSON: one call straight to the emulator (test set-up).
sqs_call() {
	curl -sS --fail-with-body -H "X-Amz-Target: AmazonSQS.$1" \
		-H 'Content-Type: application/x-amz-json-1.0' -d "$2" "$SQS_DIRECT/"
}

# stat_direct: sqs-stat straight to the emulator.  local-aws-sqs counts the
# messages in flight in "visible" too: it is every message still there.
stat_direct() { AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-stat "$@"; }

# max_inflight OP: the most requests the proxy was handling at once when
# an OP request arrived.
max_inflight() {
	python3 -c 'import json, sys
print(max([json.loads(l)["inflight"] for l in open(sys.argv[1])
           if json.loads(l)["target"].endswith("." + sys.argv[2])] or [0]))' \
		"$BATS_TEST_TMPDIR/sqs.log" "$1"
}

@test "sqs-recv --drain, receives in flight: 2 000 messages each exactly once, overlapping at the server, 0" {
	seq -f 'm%04g' 1 2000 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	via_proxy '[{"op":"ReceiveMessage","times":null,"do":"delay","ms":20}]'
	run --separate-stderr sqs-recv --max 10 --drain --visibility 600 --inflight 4
	[ "$status" -eq 0 ]
	printf '%s\n' "${lines[@]}" >"$BATS_TEST_TMPDIR/out"
	[ "${#lines[@]}" -eq 2000 ]
	[ "$(bodies "$BATS_TEST_TMPDIR/out")" = "$(seq -f 'm%04g' 1 2000)" ]
	[ "$(python3 -c 'import json,sys
print(len({json.loads(l)["messageId"] for l in open(sys.argv[1])}))' "$BATS_TEST_TMPDIR/out")" -eq 2000 ]
	# received, all of them, and none left visible: the drain ended at the end
	[ "$(stat_direct)" = '{"visible":2000,"inflight":2000,"delayed":0}' ]
	[ "$(max_inflight ReceiveMessage)" -ge 2 ]
	[ "$(max_inflight ReceiveMessage)" -le 4 ]
}

@test "sqs-recv --drain: an empty receive answered before one that brought messages ends nothing early: they are written, 0" {
	seq 1 10 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	# the first receive takes all 10 and is answered late; the second
	# reaches the queue after it, finds nothing and is answered first
	via_proxy '[{"op":"ReceiveMessage","times":1,"do":"slow-answer","after":800},
	            {"op":"ReceiveMessage","times":null,"do":"delay","ms":200}]'
	run --separate-stderr sqs-recv --max 10 --drain --visibility 600 --inflight 2
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 10 ]
	printf '%s\n' "${lines[@]}" >"$BATS_TEST_TMPDIR/out"
	[ "$(bodies "$BATS_TEST_TMPDIR/out")" = "$(seq 1 10 | sort)" ]
	[ "$(stat_direct)" = '{"visible":10,"inflight":10,"delayed":0}' ]
}

@test "sqs-recv --inflight 1: one receive at a time, as before" {
	seq -f 'm%03g' 1 50 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	via_proxy '[{"op":"ReceiveMessage","times":null,"do":"delay","ms":20}]'
	run --separate-stderr sqs-recv --max 10 --drain --inflight 1
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 50 ]
	[ "$(max_inflight ReceiveMessage)" -eq 1 ]
}

@test "sqs-recv --window N with receives in flight: what they may bring counts, never more than N held" {
	seq 1 100 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	: >"$BATS_TEST_TMPDIR/acked"      # nothing is ever acked
	via_proxy '[{"op":"ReceiveMessage","times":null,"do":"delay","ms":100}]'
	sqs-recv --max 10 --follow --wait 1 --inflight 4 --window 30 --acked "$BATS_TEST_TMPDIR/acked" \
		>"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	for _ in $(seq 1 100); do
		[ "$(wc -l <"$BATS_TEST_TMPDIR/out")" -ge 30 ] && break
		sleep 0.1
	done
	sleep 1      # time for a receive too many, were one started
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 143 ]
	[ "$(wc -l <"$BATS_TEST_TMPDIR/out")" -eq 30 ]
	[ "$(stat_direct)" = '{"visible":100,"inflight":30,"delayed":0}' ]
	[ "$(ops sqs ReceiveMessage)" -eq 3 ]
}

@test "sqs-recv: SIGTERM with receives in flight: they finish, are written, 143; nothing received is lost" {
	seq 1 60 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	via_proxy '[{"op":"ReceiveMessage","times":null,"do":"delay","ms":400}]'
	sqs-recv --max 10 --follow --wait 1 --inflight 4 >"$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	for _ in $(seq 1 100); do
		[ "$(ops sqs ReceiveMessage)" -ge 4 ] && break
		sleep 0.05
	done
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 143 ]
	n=$(wc -l <"$BATS_TEST_TMPDIR/out")
	[ "$n" -ge 10 ]
	# every message received was written: the ones in flight are the lines
	[ "$(stat_direct)" = "{\"visible\":60,\"inflight\":$n,\"delayed\":0}" ]
}

# ack_check OUT: every envelope sqs-ack wrote is OK exactly when the proxy
# never failed its delete (an entry in "failed", or an entry of a call the
# proxy answered 500); prints the receipts left.
ack_check() {
	python3 - "$1" "$BATS_TEST_TMPDIR/sqs.log" <<'PY'
import json, sys
failed = set()
for l in open(sys.argv[2]):
    r = json.loads(l)
    if not r["target"].endswith("DeleteMessageBatch") and not r["target"].endswith("DeleteMessage"):
        continue
    failed |= set(r.get("failed", []))
    if r.get("fault") == "error":
        failed |= {e["ReceiptHandle"] for e in r["body"].get("Entries", [])}
        if "ReceiptHandle" in r["body"]:
            failed.add(r["body"]["ReceiptHandle"])
seen = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    seen += 1
    want = "TEMPFAIL" if e["receipt"] in failed else "OK"
    assert e["ack"]["outcome"] == want, (e["messageId"], e["ack"], want)
    assert e["ack"]["action"] == "delete", e["ack"]
assert seen == 300, seen
print("\n".join(sorted(failed)))
PY
}

@test "sqs-ack --stream, a group of 300, deletes in flight, entries and a whole call failing: each failed one left, each good one deleted" {
	seq -f 'm%03g' 1 300 | AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	# (a drain ends at the first empty receive, which a loaded emulator can
	# answer early: drained again until all 300 are in hand)
	: >"$BATS_TEST_TMPDIR/in"
	for _ in $(seq 20); do
		AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-recv --max 10 --drain --visibility 600 | envset "$FINISHED" \
			>>"$BATS_TEST_TMPDIR/in"
		[ "$(wc -l <"$BATS_TEST_TMPDIR/in")" -ge 300 ] && break
	done
	[ "$(wc -l <"$BATS_TEST_TMPDIR/in")" -eq 300 ]
	export AWS_MAX_ATTEMPTS=1    # the 500 is the call's end, not retried
	via_proxy '[{"op":"DeleteMessageBatch","skip":4,"times":1,"do":"error","status":500,"ms":30},
	            {"op":"DeleteMessageBatch","times":null,"do":"fail-entries","ids":["3","7"],"ms":30}]'
	run --separate-stderr sqs-ack --stream <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	printf '%s\n' "${lines[@]}" >"$BATS_TEST_TMPDIR/out"
	left=$(ack_check "$BATS_TEST_TMPDIR/out")
	nleft=$(grep -c . <<<"$left")
	# 30 batches of 10: one failed whole (10), two entries of each other (58)
	[ "$nleft" -eq 68 ]
	[ "$(max_inflight DeleteMessageBatch)" -ge 2 ]
	[ "$(stat_direct)" = "{\"visible\":$nleft,\"inflight\":$nleft,\"delayed\":0}" ]
	# the ones left are exactly the failed ones: visible again, received
	while read -r r; do
		sqs_call ChangeMessageVisibility "$(jq -nc --arg q "$QUEUE" --arg r "$r" \
			'{QueueUrl: $q, ReceiptHandle: $r, VisibilityTimeout: 0}')" >/dev/null
	done <<<"$left"
	AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-recv --max 10 --drain >"$BATS_TEST_TMPDIR/again"
	python3 - "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/again" <<'PY'
import json, sys
bad = sorted(json.loads(l)["body"] for l in open(sys.argv[1]) if json.loads(l)["ack"]["outcome"] != "OK")
again = sorted(json.loads(l)["body"] for l in open(sys.argv[2]))
assert bad == again, (bad, again)
PY
}

@test "sqs-ack --stream, DLQ moves in flight: a message whose DLQ send failed is not deleted; the others are, after their copy" {
	for i in $(seq -w 1 30); do echo "{\"chargeId\":\"CHG-$i\"}"; done |
		AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-send >/dev/null
	AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-recv --max 10 --drain --visibility 600 |
		envset '{"claim":{"outcome":"DUP_FAILED","error":"declined before"}}' >"$BATS_TEST_TMPDIR/in"
	[ "$(wc -l <"$BATS_TEST_TMPDIR/in")" -eq 30 ]
	export AWS_MAX_ATTEMPTS=1
	via_proxy '[{"op":"SendMessage","match":"CHG-07","do":"error","status":400,"type":"InvalidParameterValue"},
	            {"op":"SendMessage","match":"CHG-13","do":"error","status":500},
	            {"op":"SendMessage","times":null,"do":"delay","ms":30}]'
	run --separate-stderr sqs-ack --stream <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	printf '%s\n' "${lines[@]}" >"$BATS_TEST_TMPDIR/out"
	python3 - "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/sqs.log" "$DLQ" <<'PY'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
log = [json.loads(l) for l in open(sys.argv[2])]
for e in out:
    cid = json.loads(e["body"])["chargeId"]
    a = e["ack"]
    assert a["action"] == "dlq", a
    if cid in ("CHG-07", "CHG-13"):
        assert a["outcome"] == ("DATAERR" if cid == "CHG-07" else "TEMPFAIL"), a
        assert a["error"].startswith("DLQ " + sys.argv[3]), a
        assert "dlqMessageId" not in a and "dlqSentNotDeleted" not in a, a
    else:
        assert a["outcome"] == "OK" and a["dlqMessageId"], a
# at the server: a receipt is deleted only after its copy's send was answered
# (it arrived later), and never one whose copy failed
sent = {}
deleted = []
for i, r in enumerate(log):
    b = r["body"]
    if r["target"].endswith(".SendMessage"):
        if r.get("fault") != "error":
            sent[json.loads(b["MessageBody"])["chargeId"]] = i
    elif r["target"].endswith("DeleteMessageBatch"):
        deleted += [(e["ReceiptHandle"], i) for e in b["Entries"]]
    elif r["target"].endswith("DeleteMessage"):
        deleted.append((b["ReceiptHandle"], i))
by_receipt = {e["receipt"]: json.loads(e["body"])["chargeId"] for e in out}
assert len(deleted) == 28, len(deleted)
for rh, i in deleted:
    cid = by_receipt[rh]
    assert cid not in ("CHG-07", "CHG-13"), cid
    assert sent[cid] < i, (cid, sent[cid], i)
PY
	[ "$(max_inflight SendMessage)" -ge 2 ]
	# the source keeps the two whose copy failed; the DLQ has the 28 others
	[ "$(stat_direct)" = '{"visible":2,"inflight":2,"delayed":0}' ]
	AWS_ENDPOINT_URL_SQS=$SQS_DIRECT sqs-recv --queue "$DLQ" --max 10 --drain >"$BATS_TEST_TMPDIR/dlq"
	[ "$(wc -l <"$BATS_TEST_TMPDIR/dlq")" -eq 28 ]
	run grep -c 'CHG-07\|CHG-13' "$BATS_TEST_TMPDIR/dlq"
	[ "$output" = 0 ]
}
