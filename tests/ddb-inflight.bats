#!/usr/bin/env bats
# idemp-claim and idemp-done --stream --inflight N on the DynamoDB store:
# many conditional writes outstanding at once (store.h "in flight"), each
# still its own conditional write with its own outcome.  Against a real
# emulator (IDEMKIT_TEST_BACKEND: dynamodb = dynalite, which decides a
# refused claim from a GetItem; dynamodb-local = DynamoDB Local, which
# returns the old item), behind tests/recproxy.py, which logs how many
# requests it was handling when each arrived ("concurrent") and injects
# faults.  Envelopes leave in the order the answers come, so every check
# matches outputs to inputs by chargeId, never by position.

bats_require_minimum_version 1.5.0
load helper

BACKEND=${IDEMKIT_TEST_BACKEND:-dynamodb}

# one emulator for the file, whose concurrency some tests measure: the
# tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	aws_test_env
	ddb_emulator_start "$BACKEND"
	export DDB_TABLE=idemfly-$$-$RANDOM
	idemp-init --store "dynamodb:$DDB_TABLE" >/dev/null
}
teardown_file() { ddb_emulator_stop; }
setup() { export IDEMKIT_STORE=dynamodb:$DDB_TABLE AWS_ENDPOINT_URL_DYNAMODB=$DDB_URL; }
teardown() { recproxy_stop; }

# events PREFIX N [AMOUNT]: N events PREFIX-1 .. PREFIX-N, one a line.
events() {
	local i
	for i in $(seq "$2"); do ev "$1-$i" "${3:-2500}"; done
}

# max_concurrent NAME: the most requests recproxy NAME handled at once.
max_concurrent() {
	python3 -c 'import json,sys
print(max(json.loads(l)["concurrent"] for l in open(sys.argv[1]) if l.strip()))' \
		"$BATS_TEST_TMPDIR/$1.log"
}

# outcomes STEP FILE: "chargeId outcome" per envelope of FILE, sorted.
outcomes() {
	python3 -c 'import json,sys
for l in open(sys.argv[2]):
    e = json.loads(l)
    cid = json.loads(e["body"]).get("chargeId") if e.get("body") else None
    print(cid, e[sys.argv[1]]["outcome"])' "$1" "$2" | sort
}

@test "--inflight 16: the claims overlap at the server; --inflight 1: never" {
	recproxy_start ddb "$DDB_URL"
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	events "$(uid many)" 120 > "$BATS_TEST_TMPDIR/ev"
	run --separate-stderr idemp-claim --stream --inflight 16 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/claimed"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/claimed")" -eq 120 ]
	[ "$(outcomes claim "$BATS_TEST_TMPDIR/claimed" | grep -c ' ACQUIRED$')" -eq 120 ]
	[ "$(ops ddb UpdateItem)" -eq 120 ]
	echo "max concurrent: $(max_concurrent ddb)"
	[ "$(max_concurrent ddb)" -ge 2 ]
	[ "$(max_concurrent ddb)" -le 16 ]
	# the same events again, one at a time: all refused, never overlapping
	: > "$BATS_TEST_TMPDIR/ddb.log"
	run --separate-stderr idemp-claim --stream --inflight 1 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out"
	[ "$(outcomes claim "$BATS_TEST_TMPDIR/out" | grep -c ' DUP_IN_PROGRESS$')" -eq 120 ]
	[ "$(max_concurrent ddb)" -eq 1 ]
	# and $IDEMKIT_STORE_INFLIGHT is the default when --inflight is not given
	: > "$BATS_TEST_TMPDIR/ddb.log"
	IDEMKIT_STORE_INFLIGHT=1 run --separate-stderr idemp-done --stream --state DONE \
		< "$BATS_TEST_TMPDIR/claimed"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"done":{"outcome":"OK"' <<<"$output")" -eq 120 ]
	[ "$(ops ddb UpdateItem)" -eq 120 ]
	[ "$(max_concurrent ddb)" -eq 1 ]
}

@test "--inflight and IDEMKIT_STORE_INFLIGHT out of range: 64 and 78" {
	run --separate-stderr idemp-claim --stream --inflight 0 < /dev/null
	[ "$status" -eq 64 ]
	[[ $stderr == *"--inflight"* ]]
	run --separate-stderr idemp-done --stream --inflight 1025 < /dev/null
	[ "$status" -eq 64 ]
	IDEMKIT_STORE_INFLIGHT=lots run --separate-stderr idemp-claim --stream < /dev/null
	[ "$status" -eq 78 ]
	[[ $stderr == *"IDEMKIT_STORE_INFLIGHT"* ]]
	run idemp-claim --help
	[[ $output == *"--inflight N"* ]]
}

@test "two idemp-claim --stream --inflight 32 racing on 300 chargeIds: exactly one ACQUIRED each" {
	id=$(uid race)
	events "$id" 300 > "$BATS_TEST_TMPDIR/ev"
	idemp-claim --stream --inflight 32 < "$BATS_TEST_TMPDIR/ev" > "$BATS_TEST_TMPDIR/a" 2>/dev/null &
	a=$!
	tac "$BATS_TEST_TMPDIR/ev" | idemp-claim --stream --inflight 32 > "$BATS_TEST_TMPDIR/b" 2>/dev/null &
	b=$!
	wait "$a"
	wait "$b"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/a")" -eq 300 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/b")" -eq 300 ]
	cat "$BATS_TEST_TMPDIR/a" "$BATS_TEST_TMPDIR/b" > "$BATS_TEST_TMPDIR/both"
	python3 - "$BATS_TEST_TMPDIR/both" <<'PY'
import collections, json, sys
acq, seen = collections.Counter(), collections.Counter()
for l in open(sys.argv[1]):
    e = json.loads(l)
    cid = json.loads(e["body"])["chargeId"]
    seen[cid] += 1
    o = e["claim"]["outcome"]
    assert o in ("ACQUIRED", "DUP_IN_PROGRESS"), (cid, o)
    if o == "ACQUIRED":
        acq[cid] += 1
assert len(seen) == 300 and set(seen.values()) == {2}, seen
assert len(acq) == 300 and set(acq.values()) == {1}, [k for k, v in acq.items() if v != 1]
PY
	# the winner's token is the record's owner, for every key
	python3 - "$BATS_TEST_TMPDIR/both" > "$BATS_TEST_TMPDIR/owners" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["claim"]["outcome"] == "ACQUIRED":
        print(e["claim"]["chargeId"], e["claim"]["token"])
PY
	for k in 7 150 299; do
		tok=$(awk -v k="$id-$k" '$1 == k { print $2 }' "$BATS_TEST_TMPDIR/owners")
		run idemp-show --json "$id-$k"
		[ "$(jget "$output" owner)" = "$tok" ]
		[ "$(jget "$output" attempts)" = 1 ]
	done
}

@test "one stream, every kind of claim in flight together: each gets its own outcome" {
	id=$(uid mix)
	# the records the stream will meet: DONE, FAILED, IN_PROGRESS (live)
	for k in $(seq 1 10); do ev "$id-done-$k"; ev "$id-failed-$k"; ev "$id-busy-$k"; done \
		| idemp-claim --stream > "$BATS_TEST_TMPDIR/pre"
	grep -e "-done-" "$BATS_TEST_TMPDIR/pre" | idemp-done --stream --state DONE >/dev/null
	grep -e "-failed-" "$BATS_TEST_TMPDIR/pre" | idemp-done --stream --state FAILED >/dev/null
	{
		for k in $(seq 1 10); do
			ev "$id-new-$k"               # ACQUIRED
			ev "$id-done-$k"              # DUP_DONE
			ev "$id-failed-$k"            # DUP_FAILED
			ev "$id-busy-$k"              # DUP_IN_PROGRESS
			ev "$id-busy-$k" 9999         # PAYLOAD_MISMATCH
			ev "$id-bad-$k" 1.5           # DATAERR (never sent)
		done
	} | shuf > "$BATS_TEST_TMPDIR/ev"
	# one try per request, and the proxy throttles 12 of the 50 UpdateItems
	recproxy_start ddb "$DDB_URL" \
		'[{"op":"UpdateItem","skip":6,"times":12,"do":"error","status":400,"type":"ThrottlingException"}]'
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL AWS_MAX_ATTEMPTS=1
	run --separate-stderr idemp-claim --stream --inflight 16 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 60 ]
	[ "$(ops ddb UpdateItem)" -eq 50 ]
	[ "$(grep -c '"fault": "error"' "$BATS_TEST_TMPDIR/ddb.log")" -eq 12 ]
	[ "$(max_concurrent ddb)" -ge 2 ]
	# what each claim must have got: TEMPFAIL where its write was throttled
	# (the proxy's log says which), else what its kind calls for
	python3 - "$BATS_TEST_TMPDIR/ev" "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/ddb.log" <<'PY'
import hashlib, json, re, sys
# the writes the proxy throttled, by chargeId and fingerprint (busy-k and
# its mismatching twin share a chargeId)
throttled = set()
for l in open(sys.argv[3]):
    r = json.loads(l)
    if r.get("fault"):
        v = r["body"]["ExpressionAttributeValues"]
        throttled.add((r["body"]["Key"]["pk"]["S"], v[":fp"]["S"]))
def fp(ev):
    return hashlib.sha256(("%s|%d|%s|%s" % (ev["accountId"], ev["amount"], ev["currency"],
                                              ev["chargeType"])).encode()).hexdigest()
want = {"new": "ACQUIRED", "done": "DUP_DONE", "failed": "DUP_FAILED", "busy": "DUP_IN_PROGRESS"}
ins = [l for l in open(sys.argv[1]).read().split("\n") if l]
outs = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(e["body"] for e in outs) == sorted(ins), "not one envelope per line"
tempfails = 0
for e in outs:
    ev = json.loads(e["body"])
    cid, kind, got = ev["chargeId"], ev["chargeId"].split("-")[-2], e["claim"]["outcome"]
    if kind == "bad":
        assert got == "DATAERR", (cid, got)
        continue
    if (cid, fp(ev)) in throttled:
        assert got == "TEMPFAIL" and "ThrottlingException" in e["claim"]["error"], (cid, e["claim"])
        tempfails += 1
        continue
    exp = "PAYLOAD_MISMATCH" if ev["amount"] == 9999 else want[kind]
    assert got == exp, (cid, ev["amount"], got, exp)
    if got == "ACQUIRED":
        assert e["claim"]["attempt"] == 1 and re.fullmatch(r"[0-9a-f]{32}@[A-Za-z0-9._-]+:[0-9]+", e["claim"]["token"]), e["claim"]
assert tempfails == len(throttled) == 12, (tempfails, len(throttled))
PY
	# an ACQUIRED claim's token is the one its record holds
	line=$(grep -m1 '"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/out")
	export AWS_ENDPOINT_URL_DYNAMODB=$DDB_URL
	run idemp-show --json "$(jget "$line" claim.chargeId)"
	[ "$(jget "$output" owner)" = "$(jget "$line" claim.token)" ]
}

@test "idemp-done --stream --inflight: fenced finishes in flight, a lease-lost one among them" {
	id=$(uid fin)
	events "$id" 40 | idemp-claim --stream --lease 1s > "$BATS_TEST_TMPDIR/claimed"
	[ "$(grep -c '"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/claimed")" -eq 40 ]
	sleep 1.2
	# another worker takes over key 17 once our lease ran out
	run --separate-stderr idemp-claim < <(ev "$id-17")
	[ "$status" -eq 0 ]
	newtok=$(jget "$output" claim.token)
	# the envelopes say what to record: DONE, FAILED (declined) or DNF
	python3 - "$BATS_TEST_TMPDIR/claimed" > "$BATS_TEST_TMPDIR/results" <<'PY'
import json, sys
for i, l in enumerate(open(sys.argv[1])):
    e = json.loads(l)
    k = int(e["claim"]["chargeId"].rsplit("-", 1)[1])
    if k % 3 == 0:
        e["debit"] = {"outcome": "DECLINED", "error": "HTTP 402: no funds"}
    else:
        e["debit"] = {"outcome": "OK", "ref": "TXN-%d" % k}
        e["notify"] = {"outcome": "OK" if k % 3 == 1 else "NOTIFY_FAILED"}
    print(json.dumps(e))
PY
	recproxy_start ddb "$DDB_URL"
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	run --separate-stderr idemp-done --stream --inflight 8 < "$BATS_TEST_TMPDIR/results"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 40 ]
	[ "$(max_concurrent ddb)" -ge 2 ]
	python3 - "$BATS_TEST_TMPDIR/out" "$id-17" <<'PY'
import json, sys
n = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    cid = e["claim"]["chargeId"]
    k = int(cid.rsplit("-", 1)[1])
    want = ["FAILED", "DONE", "DEBITED_NOTIFICATION_FAILED"][k % 3]
    assert e["done"]["state"] == want, (cid, e["done"])
    if cid == sys.argv[2]:
        assert e["done"]["outcome"] == "LEASE_LOST", e["done"]
    else:
        assert e["done"]["outcome"] == "OK", e["done"]
    n += 1
assert n == 40
PY
	export AWS_ENDPOINT_URL_DYNAMODB=$DDB_URL
	# the taken-over record is the new holder's, untouched
	run idemp-show --json "$id-17"
	[ "$(jget "$output" state)" = IN_PROGRESS ]
	[ "$(jget "$output" owner)" = "$newtok" ]
	# the others are what their envelope said, with the bank's ref
	run idemp-show --json "$id-4"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" debitRef)" = TXN-4 ]
	[[ $(jget "$output" history) == *'"op": "finish"'* ]]
	run idemp-show --json "$id-6"
	[ "$(jget "$output" state)" = FAILED ]
	run idemp-show --json "$id-5"
	[ "$(jget "$output" state)" = DEBITED_NOTIFICATION_FAILED ]
	# finished twice: each finish finds its own, in the state it asked for
	# under its token (OK, as a retry after a lost answer would), the
	# taken-over one is LEASE_LOST again; nothing changed
	before=$(idemp-show --json "$id-4")
	run --separate-stderr idemp-done --stream --inflight 8 < "$BATS_TEST_TMPDIR/results"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"done":{"outcome":"OK"' <<<"$output")" -eq 39 ]
	[ "$(grep -c '"outcome":"LEASE_LOST"' <<<"$output")" -eq 1 ]
	[ "$(idemp-show --json "$id-4")" = "$before" ]
	run idemp-show --json "$id-17"
	[ "$(jget "$output" owner)" = "$newtok" ]
}

@test "SQLite keeps the group path: --inflight is accepted and changes no outcome" {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db
	events "$(uid sq)" 20 > "$BATS_TEST_TMPDIR/ev"
	run --separate-stderr idemp-claim --stream --inflight 8 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 20 ]
	# in input order, as a group writes them
	[ "$(python3 -c 'import json,sys
print(" ".join(json.loads(json.loads(l)["body"])["chargeId"].rsplit("-",1)[1] for l in sys.stdin))' <<<"$output")" = "$(seq -s ' ' 20)" ]
}
