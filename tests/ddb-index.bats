#!/usr/bin/env bats
# The DynamoDB store's sparse index of unfinished records (idemkit-open),
# against dynalite behind tests/recproxy.py, which logs every request's
# X-Amz-Target: only IN_PROGRESS, FAILED and DEBITED_NOTIFICATION_FAILED
# items carry openState; idemp-list, charge-recover and idemp-stats list
# and count them by Query on the index, never by a Scan of the table; and
# idemp-init adds the index to a table made before it and indexes the
# unfinished records already there.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

# one dynalite for the file, whose request counts some tests assert: the
# tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	require_node
	aws_test_env
	dynalite_start
}
teardown_file() { dynalite_stop; }
setup() {
	LOG=$BATS_TEST_TMPDIR/ddb.log
	python3 "$IDEMKIT_SRC/tests/recproxy.py" "$DYNALITE_URL" "$BATS_TEST_TMPDIR/proxy.port" "$LOG" 3>&- &
	PROXY_PID=$!
	for i in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/proxy.port" ] && break; sleep 0.05; done
	export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/proxy.port")
	export IDEMKIT_STORE=dynamodb:ix-$$-$RANDOM-$BATS_SUITE_TEST_NUMBER
	export IDEMKIT_LOG=quiet
}
teardown() {
	kill "$PROXY_PID" 2>/dev/null; wait "$PROXY_PID" 2>/dev/null
	bank_stop
}

# targets: the X-Amz-Target of each request logged since the last mark.
mark() { : > "$LOG"; }
targets() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    print(json.loads(l)["target"])' "$LOG"; }
# queries_on_index: every Query logged used the idemkit-open index.
queries_on_index() { python3 -c 'import json,sys
rs=[json.loads(l) for l in open(sys.argv[1])]
q=[r for r in rs if r["target"].endswith(".Query")]
assert q, "no Query"
assert all(r["body"].get("IndexName")=="idemkit-open" for r in q), "a Query off the index"' "$LOG"; }
no_scan() { if targets | grep -q Scan; then echo "a Scan was made:"; targets; return 1; fi; }

# item ID: the stored item, raw (a GetItem through botocore's own client).
item() { python3 - "$1" <<'PY'
import json, os, sys, botocore.session
c = botocore.session.get_session().create_client("dynamodb",
    endpoint_url=os.environ["DYNALITE_URL"], region_name="us-east-1")
t = os.environ["IDEMKIT_STORE"].split(":", 1)[1]
print(json.dumps(c.get_item(TableName=t, Key={"pk": {"S": sys.argv[1]}}, ConsistentRead=True).get("Item", {})))
PY
}

record() {
	env=$(ev "$1" | idemp-claim ${3:+--lease $3} 2>/dev/null)
	[ "$2" = IN_PROGRESS ] || printf '%s\n' "$env" | idemp-done --state "$2" >/dev/null 2>&1
}

@test "idemp-init creates the table with the index; only unfinished items carry openState" {
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	grep -q '"IndexName": "idemkit-open"' <(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r["target"].endswith("CreateTable"): print(json.dumps(r["body"]))' "$LOG")
	record "$(uid ip)" IN_PROGRESS
	record "$(uid dn)" DONE
	record "$(uid fa)" FAILED
	record "$(uid nf)" DEBITED_NOTIFICATION_FAILED
	[[ "$(jget "$(item "$(uid ip)")" openState.S)" =~ ^IN_PROGRESS#[0-7]$ ]]
	[[ "$(jget "$(item "$(uid fa)")" openState.S)" =~ ^FAILED#[0-7]$ ]]
	[[ "$(jget "$(item "$(uid nf)")" openState.S)" =~ ^DEBITED_NOTIFICATION_FAILED#[0-7]$ ]]
	[ -z "$(jget "$(item "$(uid dn)")" openState)" ]
	[ "$(jget "$(item "$(uid dn)")" state.S)" = DONE ]
	# re-notified: DONE, out of the index
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope \
		| sed 's/}$/,"notify":{"outcome":"OK"}}/' | idemp-done --renotified >/dev/null 2>&1
	[ "$(jget "$(item "$(uid nf)")" state.S)" = DONE ]
	[ -z "$(jget "$(item "$(uid nf)")" openState)" ]
}

@test "idemp-list: Query on the index for each unfinished filter, never a Scan" {
	idemp-init >/dev/null
	for i in 1 2 3 4 5 6 7 8 9; do record "$(uid n$i)" DEBITED_NOTIFICATION_FAILED; done
	record "$(uid s1)" IN_PROGRESS 1s
	record "$(uid live)" IN_PROGRESS
	record "$(uid f1)" FAILED
	record "$(uid d1)" DONE
	sleep 1.2
	mark
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 9 ]
	# oldest update first, across the shards
	python3 -c 'import json,sys
u=[json.loads(l)["updatedAt"] for l in sys.stdin]
assert u == sorted(u), u' <<<"$output"
	run --separate-stderr idemp-list --expired
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 1 ]
	[ "$(jget "${lines[0]}" chargeId)" = "$(uid s1)" ]
	run --separate-stderr idemp-list --state IN_PROGRESS
	[ "${#lines[@]}" -eq 2 ]
	run --separate-stderr idemp-list --state FAILED --older-than 1s
	[ "${#lines[@]}" -eq 1 ]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED --older-than 1h
	[ "$status" -eq 1 ]
	run --separate-stderr idemp-list --state FAILED --expired
	[ "$status" -eq 1 ]
	queries_on_index
	no_scan
	[ "$(targets | grep -c Query)" -ge 8 ]
	# DONE, or every state, is still a Scan (the man page says so)
	mark
	run --separate-stderr idemp-list --state DONE
	[ "${#lines[@]}" -eq 1 ]
	targets | grep -qx DynamoDB_20120810.Scan
}

@test "charge-recover --renotify and --redrive on DynamoDB: Query on the index, no Scan" {
	idemp-init >/dev/null
	bank_start
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	record "$(uid nf)" DEBITED_NOTIFICATION_FAILED
	record "$(uid st)" IN_PROGRESS 1s
	sleep 1.2
	mark
	# (at warn: quiet writes no summary on success)
	IDEMKIT_LOG=warn run --separate-stderr charge-recover --renotify --older-than 100ms --notify-retries 0
	echo "$stderr"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"renotified":1'* ]]
	queries_on_index
	no_scan
	mark
	IDEMKIT_LOG=warn run --separate-stderr charge-recover --redrive --older-than 100ms
	echo "$stderr"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"requeued":1'* ]]
	queries_on_index
	no_scan
}

@test "idemp-stats on DynamoDB: Queries on the index and one DescribeTable, no Scan" {
	idemp-init >/dev/null
	record "$(uid nf)" DEBITED_NOTIFICATION_FAILED
	record "$(uid st)" IN_PROGRESS 1s
	record "$(uid fa)" FAILED
	sleep 1.2
	mark
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$output" stuck)" -eq 1 ]
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	[ "$(jget "$output" states.FAILED)" -eq 1 ]
	queries_on_index
	no_scan
	[ "$(targets | sort -u | tr '\n' ' ')" = "DynamoDB_20120810.DescribeTable DynamoDB_20120810.Query " ]
	# 3 states x 8 shards
	[ "$(targets | grep -c Query)" -eq 24 ]
}

# oldtable NAME INDEX: a table as something other than this idemp-init
# made it (INDEX=1: with the open index, as after a migration; 0: as an
# older idemp-init did), with records an older idemkit wrote (no openState).
oldtable() { /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys, time, botocore.session
c = botocore.session.get_session().create_client("dynamodb",
    endpoint_url=os.environ["DYNALITE_URL"], region_name="us-east-1")
t, ix = sys.argv[1], sys.argv[2] == "1"
kw = {}
defs = [{"AttributeName": "pk", "AttributeType": "S"}]
if ix:
    defs += [{"AttributeName": "openState", "AttributeType": "S"},
             {"AttributeName": "updatedAt", "AttributeType": "N"}]
    kw["GlobalSecondaryIndexes"] = [{"IndexName": "idemkit-open",
        "KeySchema": [{"AttributeName": "openState", "KeyType": "HASH"},
                      {"AttributeName": "updatedAt", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"}}]
c.create_table(TableName=t, BillingMode="PAY_PER_REQUEST", AttributeDefinitions=defs,
    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}], **kw)
while c.describe_table(TableName=t)["Table"]["TableStatus"] != "ACTIVE":
    time.sleep(0.05)
now = int(time.time() * 1000)
for k, st, lease in (("OLD-DNF", "DEBITED_NOTIFICATION_FAILED", 0), ("OLD-IP", "IN_PROGRESS", 5),
                     ("OLD-DONE", "DONE", 0), ("OLD-F", "FAILED", 0)):
    c.put_item(TableName=t, Item={"pk": {"S": k}, "state": {"S": st}, "owner": {"S": "x"},
        "leaseUntil": {"N": str(lease)}, "attempts": {"N": "1"}, "fingerprint": {"S": "f"},
        "event": {"S": "{}"}, "createdAt": {"N": str(now - 7200000)},
        "updatedAt": {"N": str(now - 7200000)}, "expiresAt": {"N": str(now // 1000 + 86400)}})
PY
}

@test "a table made before the index: refused (78) until idemp-init adds it; dynalite's UpdateTable is retried with throughput" {
	oldtable "${IDEMKIT_STORE#dynamodb:}" 0
	run --separate-stderr idemp-stats
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"no index idemkit-open; run idemp-init"* ]]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$status" -eq 78 ]
	mark
	IDEMKIT_LOG=info run --separate-stderr idemp-init
	echo "$stderr"
	# dynalite insists on ProvisionedThroughput for the new index even on an
	# on-demand table (the retry sends it), then drops the index: said so,
	# instead of waiting for an index that never comes
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"accepted the index idemkit-open but did not add it"* ]]
	python3 -c 'import json,sys
u=[json.loads(l)["body"] for l in open(sys.argv[1]) if json.loads(l)["target"].endswith("UpdateTable")]
assert len(u) == 2, u
c=[g["Create"] for g in (x["GlobalSecondaryIndexUpdates"][0] for x in u)]
assert c[0]["IndexName"] == "idemkit-open" and "ProvisionedThroughput" not in c[0], c
assert c[1]["ProvisionedThroughput"] == {"ReadCapacityUnits": 1, "WriteCapacityUnits": 1}, c
assert {"AttributeName": "openState", "AttributeType": "S"} in u[0]["AttributeDefinitions"]' "$LOG"
}

@test "idemp-init indexes the unfinished records written before the index; again, it changes nothing" {
	oldtable "${IDEMKIT_STORE#dynamodb:}" 1
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" dnfBacklog)" -eq 0 ]     # not indexed yet
	IDEMKIT_LOG=info run --separate-stderr idemp-init
	echo "$stderr"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"indexed unfinished records"'*'"records":"3"'* ]]
	[ -z "$(jget "$(item OLD-DONE)" openState)" ]
	[[ "$(jget "$(item OLD-DNF)" openState.S)" =~ ^DEBITED_NOTIFICATION_FAILED#[0-7]$ ]]
	[[ "$(jget "$(item OLD-IP)" openState.S)" =~ ^IN_PROGRESS#[0-7]$ ]]
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	[ "$(jget "$output" stuck)" -eq 1 ]
	[ "$(jget "$output" states.FAILED)" -eq 1 ]
	[ "$(jget "$output" oldestDnfMs)" -ge 7200000 ]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$(jget "$output" chargeId)" = OLD-DNF ]
	# again: nothing to index, no index change
	mark
	IDEMKIT_LOG=info run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	if [[ "$stderr" == *'"indexed unfinished records"'* ]]; then false; fi
	if targets | grep -q -e UpdateTable -e UpdateItem; then false; fi
}
