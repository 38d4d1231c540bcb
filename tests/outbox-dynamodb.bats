#!/usr/bin/env bats
# The transactional outbox's DynamoDB parts (issue 27; the store-neutral
# tests are tests/outbox.bats, run on dynamodb too): the event set on the
# record's item by the finish's own conditional UpdateItem, in the sparse
# index idemkit-outbox only while it waits, removed by the checkpoint;
# the lag gauge; nothing published kept, so nothing to purge; idemp-forget
# never deletes an event that waits; idemp-run's records publish nothing;
# a table made before the index; the emulator killed -9 and started again
# under a relay --follow.  IDEMKIT_TEST_BACKEND=dynamodb (dynalite, the
# default) or dynamodb-local; a table per test; the events go to the
# embedded queue.

bats_require_minimum_version 1.5.0
load helper
load queue_backend
load outbox_helper

BACKEND=${IDEMKIT_TEST_BACKEND:-dynamodb}

setup_file() {
	aws_test_env
	ddb_emulator_start "$BACKEND"
}
teardown_file() { ddb_emulator_stop; }
setup() {
	unset IDEMKIT_QUEUE IDEMKIT_DLQ
	export IDEMKIT_OUTBOX="sqlite:$BATS_TEST_TMPDIR/events.db#events"
	export IDEMKIT_LOG=quiet
	TABLE=obd-$BATS_TEST_NUMBER-$$-$RANDOM
	export IDEMKIT_STORE=dynamodb:$TABLE
	idemp-init >/dev/null 2>&1
}
teardown() {
	for p in ${RELAYS:-}; do kill -KILL "$p" 2>/dev/null || true; done
	[ -z "${OWN_DYNALITE:-}" ] || kill -KILL "$OWN_DYNALITE" 2>/dev/null || true
	[ -z "${SQS_PID:-}" ] || kill "$SQS_PID" 2>/dev/null || true
	recproxy_stop
}

# item ID: the stored item, raw (a GetItem through botocore's own client).
item() { python3 - "$1" <<'PY'
import json, os, sys, botocore.session
c = botocore.session.get_session().create_client("dynamodb",
    endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"], region_name="us-east-1")
t = os.environ["IDEMKIT_STORE"].split(":", 1)[1]
print(json.dumps(c.get_item(TableName=t, Key={"pk": {"S": sys.argv[1]}}, ConsistentRead=True).get("Item", {})))
PY
}
@test "the finish's own conditional write sets the event on the item; a claim and a refused finish set none; the checkpoint removes it" {
	k=$(uid w)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	[ "$(jget "$(item "$k")" obPend)" = "" ]
	# a finish under another token does not match: no event
	run -13 idemp-done --state DONE <<<"${env/\"token\":\"/\"token\":\"0}"
	i=$(item "$k")
	[ "$(jget "$i" obFin)" = "" ]; [ "$(jget "$i" obPend)" = "" ]
	[ "$(waiting)" = 0 ]
	run -0 idemp-done --state DONE < <(envset '{"debit":{"outcome":"OK","ref":"TXN-9"},"notify":{"outcome":"OK"}}' <<<"$env")
	i=$(item "$k")
	[ "$(jget "$i" state.S)" = DONE ]
	[ "$(jget "$i" obFin.M.s.S)" = DONE ]
	[ "$(jget "$i" obFin.M.r.S)" = TXN-9 ]
	[ "$(jget "$i" obFin.M.t.N)" = "$(jget "$i" updatedAt.N)" ]
	[[ "$(jget "$i" obPend.S)" =~ ^[0-7]$ ]]
	[ "$(waiting)" = 1 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 1 ]
	[ "$(jget "${lines[0]}" chargeId)" = "$k" ]
	i=$(item "$k")
	[ "$(jget "$i" obFin)" = "" ]; [ "$(jget "$i" obPend)" = "" ]; [ "$(jget "$i" obAt)" = "" ]
	[ "$(jget "$i" state.S)" = DONE ]
	[ "$(events | wc -l)" -eq 1 ]
	# off: a finish sets no event attribute
	k2=$(uid off)
	IDEMKIT_OUTBOX= finish "$k2" DONE
	[ "$(jget "$(item "$k2")" state.S)" = DONE ]
	[ "$(jget "$(item "$k2")" obFin)" = "" ]
}

@test "a re-notification behind a finished event that waits: both on the item, published in their order" {
	k=$(uid rn)
	finish "$k" DEBITED_NOTIFICATION_FAILED
	at=$(jget "$(item "$k")" obAt.N)
	renotify_all
	i=$(item "$k")
	[ "$(jget "$i" obFin.M.s.S)" = DEBITED_NOTIFICATION_FAILED ]
	[ -n "$(jget "$i" obRen.M.t.N)" ]
	# the item keeps the older event's place in the index
	[ "$(jget "$i" obAt.N)" = "$at" ]
	[ "$(waiting)" = 2 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" type)" = charge.finished ]
	[ "$(jget "${lines[1]}" type)" = charge.renotified ]
	[ "$(jget "$(item "$k")" obPend)" = "" ]
}

@test "the lag gauge: a finish on a clock 30 s slow has waited 30 s; nothing published is kept, so the purge deletes nothing" {
	slow_or_skip idemp-done
	SLOW=slow finish "$(uid g1)" DONE
	finish "$(uid g2)" FAILED
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 2 ]
	[ "$(jget "$st" oldestWaitingMs)" -ge 30000 ]
	[ "$(jget "$st" oldestWaitingMs)" -lt 600000 ]
	[ "$(jget "$st" published)" = 0 ]
	run -0 --separate-stderr idemp-outbox --retention 1s
	[ "${#lines[@]}" -eq 2 ]
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 0 ]
	[ "$(jget "$st" oldestWaitingMs)" = 0 ]
	[ "$(jget "$st" published)" = 0 ]
}

@test "idemp-forget never deletes a FAILED record whose event waits (75); once published it does" {
	k=$(uid f)
	finish "$k" FAILED
	run -75 --separate-stderr idemp-forget "$k"
	[[ "$stderr" == *"outbox event is not yet published; run idemp-outbox first"* ]]
	[ "$(jget "$(item "$k")" state.S)" = FAILED ]
	run -0 idemp-outbox
	run -0 idemp-forget "$k"
	[ "$(item "$k")" = "{}" ]
	[ "$(events | wc -l)" -eq 1 ]
}

@test "idemp-run's records are no charge: their finish publishes nothing" {
	run -0 idemp-run --key "$(uid run)" -- true
	run -1 idemp-outbox
	[ "$(waiting)" = 0 ]
	[ "$(events | wc -l)" -eq 0 ]
}

@test "a table made before the outbox index: the relay says to run idemp-init (78), which adds it (DynamoDB Local) or says to recreate the table (dynalite)" {
	t=old-$$-$RANDOM
	python3 - "$t" <<'PY'
import os, sys, time, botocore.session
c = botocore.session.get_session().create_client("dynamodb",
    endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"], region_name="us-east-1")
c.create_table(TableName=sys.argv[1], BillingMode="PAY_PER_REQUEST",
    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "openState", "AttributeType": "S"},
        {"AttributeName": "updatedAt", "AttributeType": "N"}],
    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    GlobalSecondaryIndexes=[{"IndexName": "idemkit-open",
        "KeySchema": [{"AttributeName": "openState", "KeyType": "HASH"},
                      {"AttributeName": "updatedAt", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"}}])
while c.describe_table(TableName=sys.argv[1])["Table"]["TableStatus"] != "ACTIVE":
    time.sleep(0.05)
PY
	export IDEMKIT_STORE=dynamodb:$t
	# without the outbox, the table is as idemp-init wants it
	run -0 env IDEMKIT_OUTBOX= idemp-init
	run -78 --separate-stderr idemp-outbox
	[[ "$stderr" == *"no index idemkit-outbox; run idemp-init with IDEMKIT_OUTBOX set"* ]]
	if [ "$BACKEND" = dynamodb ]; then
		run -78 --separate-stderr idemp-init
		[[ "$stderr" == *"accepted the index idemkit-outbox but did not add it"* ]]
		return
	fi
	# an event written before the table had its index and its stream:
	# the relay's sweep of the index publishes it
	finish "$(uid p)" DONE
	run -0 idemp-init
	[ "$(stream_view "$t")" = NEW_IMAGE ]
	finish "$(uid o)" DONE
	run -0 idemp-outbox
	[ "${#lines[@]}" -eq 2 ]
}

# stream_view TABLE: the view type of the table's stream, "none" without one.
stream_view() { python3 - "$1" <<'PY'
import os, sys, botocore.session
c = botocore.session.get_session().create_client("dynamodb",
    endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"], region_name="us-east-1")
t = c.describe_table(TableName=sys.argv[1])["Table"]
s = t.get("StreamSpecification", {})
print(s["StreamViewType"] if s.get("StreamEnabled") and t.get("LatestStreamArn") else "none")
PY
}

@test "the table's stream (DynamoDB Local; dynalite keeps none: the index alone): the relay reads the finishes from it, sends none the index sweep sent already, and checkpoints its position on its lease item, where the next relay goes on" {
	t=${IDEMKIT_STORE#dynamodb:}
	if [ "$BACKEND" = dynamodb ]; then
		[ "$(stream_view "$t")" = none ]
		finish "$(uid n)" DONE
		run -0 --separate-stderr env IDEMKIT_LOG=debug idemp-outbox
		[ "${#lines[@]}" -eq 1 ]
		[[ "$stderr" == *'"msg":"outbox: the table has no stream with new images; the relay reads the outbox index"'* ]]
		[[ "$stderr" == *'"msg":"outbox events read","from":"index"'* ]]
		return
	fi
	[ "$(stream_view "$t")" = NEW_IMAGE ]
	# published by the sweep a relay starts with; in the stream as well
	finish "$(uid a)" DONE
	run -0 idemp-outbox
	[ "${#lines[@]}" -eq 1 ]
	IDEMKIT_LOG=debug idemp-outbox --follow --poll 50ms >"$BATS_TEST_TMPDIR/relay" \
		2>"$BATS_TEST_TMPDIR/relay.err" 3>&- &
	RELAYS=$!
	# (past its first sweep: the streams client is made at the first read)
	for _ in $(seq 100); do grep -q '"service":"dynamodbstreams"' "$BATS_TEST_TMPDIR/relay.err" && break; sleep 0.1; done
	sleep 0.5
	for i in 1 2 3; do finish "$(uid "b$i")" DONE; done
	renotified "$(uid c)"
	for _ in $(seq 200); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 5 ] && break; sleep 0.1; done
	kill -TERM "$RELAYS"
	wait "$RELAYS" || true
	RELAYS=
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq 5 ]
	# read from the stream, not found by a sweep (a sweep runs a minute on)
	grep -q '"msg":"outbox events read","from":"stream"' "$BATS_TEST_TMPDIR/relay.err"
	run ! grep -q '"msg":"outbox events read","from":"index"' "$BATS_TEST_TMPDIR/relay.err"
	# the position on the lease item: this stream's, a sequence number per shard read
	lease=$(item 'idemkit#outbox-relay')
	python3 - "$lease" "$t" <<'PY'
import json, sys
i = json.loads(sys.argv[1])
assert ":table/%s/stream/" % sys.argv[2] in i["obStream"]["S"], i
pos = i["obPos"]["M"]
assert pos and all(v["S"].isdigit() or v["S"] == "end" for v in pos.values()), i
PY
	# a relay started again: the sweep first, then the stream from the
	# position: the two left waiting go out, nothing else again
	finish "$(uid d1)" DONE
	finish "$(uid d2)" FAILED
	IDEMKIT_LOG=debug idemp-outbox --follow --poll 50ms >"$BATS_TEST_TMPDIR/relay2" \
		2>"$BATS_TEST_TMPDIR/relay2.err" 3>&- &
	RELAYS=$!
	for _ in $(seq 100); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay2")" -ge 2 ] && break; sleep 0.1; done
	finish "$(uid e)" DONE
	for _ in $(seq 100); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay2")" -ge 3 ] && break; sleep 0.1; done
	sleep 1
	kill -TERM "$RELAYS"
	wait "$RELAYS" || true
	RELAYS=
	grep -q '"msg":"outbox events read","from":"stream"' "$BATS_TEST_TMPDIR/relay2.err"
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 9 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | sort -u | wc -l)" -eq 9 ]
	[ "$(waiting)" = 0 ]
}

@test "the streams endpoint down (DynamoDB Local): the relay reads the index meanwhile and says so; nothing is lost" {
	[ "$BACKEND" = dynamodb-local ] || skip "dynalite keeps no streams"
	export AWS_ENDPOINT_URL_DYNAMODB_STREAMS=http://127.0.0.1:$(free_port) IDEMKIT_AWS_MAX_BACKOFF=50ms
	IDEMKIT_LOG=debug idemp-outbox --follow --poll 50ms >"$BATS_TEST_TMPDIR/relay" \
		2>"$BATS_TEST_TMPDIR/relay.err" 3>&- &
	RELAYS=$!
	sleep 1
	for i in 1 2 3; do finish "$(uid "a$i")" DONE; done
	for _ in $(seq 200); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 3 ] && break; sleep 0.1; done
	kill -TERM "$RELAYS"
	wait "$RELAYS" || true
	RELAYS=
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq 3 ]
	grep -q '"level":"warn".*"msg":"outbox: the table'"'"'s stream cannot be read; the relay reads the outbox index meanwhile"' "$BATS_TEST_TMPDIR/relay.err"
	grep -q '"msg":"outbox events read","from":"index"' "$BATS_TEST_TMPDIR/relay.err"
	[ "$(waiting)" = 0 ]
}

@test "the store killed -9 mid-run and started again on its files: the relay --follow carries on, every event published once" {
	port=$(free_port) dir=$BATS_TEST_TMPDIR/ddb
	mkdir -p "$dir"
	# the file's emulator runs in memory: this test's own keeps its data
	# on disk (dynalite --path, DynamoDB Local -dbPath)
	own_dynalite() {
		if [ "$BACKEND" = dynamodb-local ]; then
			(cd "$DDBLOCAL_DIR" && exec java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
				-Djava.library.path=DynamoDBLocal_lib -jar DynamoDBLocal.jar \
				-dbPath "$dir" -sharedDb -disableTelemetry -port "$port") \
				>>"$BATS_TEST_TMPDIR/emulator.log" 2>&1 3>&- &
		else
			node "$IDEMKIT_SRC/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$port" \
				--path "$dir" --createTableMs 20 >>"$BATS_TEST_TMPDIR/emulator.log" 2>&1 3>&- &
		fi
		OWN_DYNALITE=$!
		for _ in $(seq 600); do
			[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/")" = 000 ] ||
				return 0
			sleep 0.1
		done
		return 1
	}
	own_dynalite
	export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$port IDEMKIT_AWS_MAX_BACKOFF=200ms
	run -0 idemp-init
	for i in $(seq 1 40); do ev "$(uid "a$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	# (a lease of 10 s: a round that outlasts the relay's lease -- 3 s
	# did, once, on a machine at load 8 -- rightly checkpoints nothing and
	# sends its batch again under the same eventIds, test 9's case, not
	# this one's)
	idemp-outbox --follow --poll 50ms --lease 10s > "$BATS_TEST_TMPDIR/relay" 2>"$BATS_TEST_TMPDIR/relay.err" 3>&- &
	RELAYS=$!
	# (killed once the 40 are checkpointed: a kill between the publish and
	# the checkpoint -- one transaction for the whole batch -- would send
	# them all again, rightly, with the same eventIds)
	for _ in $(seq 600); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 40 ] && [ "$(waiting)" = 0 ] && break; sleep 0.1; done
	[ "$(waiting)" = 0 ]
	kill -KILL "$OWN_DYNALITE"
	wait "$OWN_DYNALITE" 2>/dev/null || true
	# the relay meets a store that is gone for a while
	for _ in $(seq 100); do grep -q '"level":"warn"' "$BATS_TEST_TMPDIR/relay.err" && break; sleep 0.1; done
	kill -0 "$RELAYS"
	own_dynalite
	for i in $(seq 1 40); do ev "$(uid "b$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	for _ in $(seq 600); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 80 ] && [ "$(waiting)" = 0 ] && break; sleep 0.1; done
	[ "$(waiting)" = 0 ]
	kill -TERM "$RELAYS"
	rc=0; wait "$RELAYS" || rc=$?
	[ "$rc" -eq 143 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(sort -u "$BATS_TEST_TMPDIR/ev" | wc -l)" -eq 80 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 80 ]
}

# cpu_ms CMD...: CMD's user + system CPU in ms (its own and its children's),
# on stderr as "cpu N"; stdin and stdout pass through.
cpu_ms() {
	python3 -c 'import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, st, ru = os.wait4(p.pid, 0)
print("cpu %d" % round((ru.ru_utime + ru.ru_stime) * 1000), file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(st))' "$@"
}

@test "cost: the outbox adds no request to the pipeline (the same UpdateItem per finish, a few attributes more); client CPU and the relay's requests reported" {
	N=${OUTBOX_COST_N:-200}
	recproxy_start ddb "$AWS_ENDPOINT_URL_DYNAMODB"
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	for mode in off on; do
		[ "$mode" = on ] || export IDEMKIT_OUTBOX=
		[ "$mode" = off ] || export IDEMKIT_OUTBOX="sqlite:$BATS_TEST_TMPDIR/events.db#events"
		for i in $(seq 1 "$N"); do ev "$(uid "$mode$i")"; done | idemp-claim --stream 2>/dev/null \
			| envset '{"debit":{"outcome":"OK","ref":"TXN-C"},"notify":{"outcome":"OK"}}' \
			> "$BATS_TEST_TMPDIR/claimed.$mode"
		: > "$BATS_TEST_TMPDIR/ddb.log"
		start=$(date +%s%N)
		cpu_ms idemp-done --stream < "$BATS_TEST_TMPDIR/claimed.$mode" \
			> "$BATS_TEST_TMPDIR/done.$mode" 2> "$BATS_TEST_TMPDIR/cpu.$mode"
		eval "wall_$mode=$((($(date +%s%N) - start) / 1000000))"
		[ "$(grep -c '"outcome":"OK","state":"DONE"' "$BATS_TEST_TMPDIR/done.$mode")" -eq "$N" ]
		ops ddb | sort | uniq -c > "$BATS_TEST_TMPDIR/ops.$mode"
	done
	# the finishes' requests: one UpdateItem per charge, with or without
	diff "$BATS_TEST_TMPDIR/ops.off" "$BATS_TEST_TMPDIR/ops.on"
	[ "$(ops ddb UpdateItem)" -eq "$N" ]
	[ "$(ops ddb | wc -l)" -eq "$N" ]
	off=$(sed -n 's/^cpu //p' "$BATS_TEST_TMPDIR/cpu.off") on=$(sed -n 's/^cpu //p' "$BATS_TEST_TMPDIR/cpu.on")
	# the relay: its requests and CPU per event
	: > "$BATS_TEST_TMPDIR/ddb.log"
	start=$(date +%s%N)
	cpu_ms idemp-outbox > "$BATS_TEST_TMPDIR/relay" 2> "$BATS_TEST_TMPDIR/cpu.relay"
	ms=$((($(date +%s%N) - start) / 1000000))
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq "$N" ]
	relay=$(sed -n 's/^cpu //p' "$BATS_TEST_TMPDIR/cpu.relay")
	echo "# outbox cost ($BACKEND, $N finishes, idemp-done --stream): requests per finish 1 UpdateItem without and with; finishes in ${wall_off} / ${wall_on} ms; client CPU ${off} ms without, ${on} ms with ($(python3 -c "print('%+.1f%%' % ((int('$on') - int('$off')) * 100 / max(1, int('$off'))))")); pipeline $((N * 1000 / (wall_on > 0 ? wall_on : 1))) finishes/s with the outbox; relay: $N events in ${ms} ms, $((N * 1000 / (ms > 0 ? ms : 1))) events/s, $(ops ddb | wc -l) requests ($(ops ddb | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')), ${relay} ms CPU" >&3
	# keeping up: a relay --follow while the pipeline finishes N more (on
	# DynamoDB Local it reads the stream, on dynalite the index)
	for i in $(seq 1 "$N"); do ev "$(uid "f$i")"; done | idemp-claim --stream 2>/dev/null \
		| envset '{"debit":{"outcome":"OK","ref":"TXN-C"},"notify":{"outcome":"OK"}}' \
		> "$BATS_TEST_TMPDIR/claimed.f"
	IDEMKIT_LOG=debug idemp-outbox --follow --poll 50ms > "$BATS_TEST_TMPDIR/relay.f" \
		2> "$BATS_TEST_TMPDIR/relay.f.err" 3>&- &
	RELAYS=$!
	sleep 1
	: > "$BATS_TEST_TMPDIR/ddb.log"
	start=$(date +%s%N)
	idemp-done --stream < "$BATS_TEST_TMPDIR/claimed.f" > /dev/null 2>&1
	end=$(date +%s%N)
	for _ in $(seq 600); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay.f")" -ge "$N" ] && break; sleep 0.05; done
	last=$(date +%s%N)
	kill -TERM "$RELAYS"
	wait "$RELAYS" || true
	RELAYS=
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay.f")" -eq "$N" ]
	from=index
	grep -q '"from":"stream"' "$BATS_TEST_TMPDIR/relay.f.err" && from=stream || true
	echo "# outbox relay --follow ($BACKEND, from the $from): $N finishes in $(((end - start) / 1000000)) ms, the last event published $(((last - end) / 1000000)) ms after the last finish; the relay's and the finishes' requests together: $(ops ddb | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')" >&3
}

@test "a relay whose lease ended before its checkpoint checkpoints nothing (DynamoDB Local: the transaction's lease check; dynalite: the lease read before the updates); its next round sends the batch again, same eventIds" {
	for i in $(seq 1 5); do ev "$(uid "f$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	[ "$(waiting)" = 5 ]
	# The read's BatchGetItem held 4 s by the proxy, past the relay's 3 s
	# lease taken just before: the relay publishes, then checkpoints with
	# its lease over.  The second round's 3 s outlast a slow machine's
	# round (CI's, with a 1 s lease, lost it too: a third round, 15 events).
	recproxy_start ddb "$AWS_ENDPOINT_URL_DYNAMODB" \
		'[{"op":"BatchGetItem","times":1,"do":"delay","ms":4000}]'
	AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL IDEMKIT_LOG=warn \
		run -0 --separate-stderr idemp-outbox --lease 3s
	echo "$stderr"
	[ "$(grep -c 'outbox lease lost before the checkpoint' <<<"$stderr")" -eq 1 ]
	# only the second round's checkpoint, of the same 5
	[ "${#lines[@]}" -eq 5 ]
	# DynamoDB Local: the transaction itself refused it, no lease read needed
	if [ "$BACKEND" = dynamodb-local ]; then
		[ "$(ops ddb TransactWriteItems)" -ge 2 ]
		[ "$(ops ddb GetItem)" -eq 0 ]
	fi
	[ "$(waiting)" = 0 ]
	events > "$BATS_TEST_TMPDIR/ev"
	echo "events on the queue: $(wc -l < "$BATS_TEST_TMPDIR/ev")"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 10 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 5 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq -c | awk '$1 != 2' | wc -l)" -eq 0 ]
}

@test "a batch over 10 goes out in SendMessageBatch calls of 10; an entry refused in the second call ends the batch there: only the prefix the queue accepted is checkpointed, the rest is sent again" {
	(cd "$IDEMKIT_SRC" && exec node tests/sqs-server.js) >"$BATS_TEST_TMPDIR/sqs.port" \
		2>"$BATS_TEST_TMPDIR/sqs-server.log" 3>&- &
	SQS_PID=$!
	for _ in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/sqs.port" ] && break; sleep 0.05; done
	export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/sqs.port")
	export IDEMKIT_OUTBOX=$AWS_ENDPOINT_URL_SQS/123456789012/events
	curl -sS --fail-with-body -H 'X-Amz-Target: AmazonSQS.CreateQueue' \
		-H 'Content-Type: application/x-amz-json-1.0' -d '{"QueueName":"events"}' \
		"$AWS_ENDPOINT_URL_SQS/" >/dev/null
	for i in $(seq 1 25); do ev "$(uid "s$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	[ "$(waiting)" = 25 ]
	# the second SendMessageBatch (events 11-20) has its entry 3 (the 14th
	# event) refused by the proxy (SQS's per-entry failure)
	recproxy_start sqs "$AWS_ENDPOINT_URL_SQS" \
		'[{"op":"SendMessageBatch","skip":1,"times":1,"do":"fail-entries","ids":["3"]}]'
	AWS_ENDPOINT_URL_SQS=$RECPROXY_URL run -75 --separate-stderr idemp-outbox
	[[ "$stderr" == *"injected by recproxy"* ]]
	# 13 checkpointed: the first call's 10 and the second's 3 before the refused one
	[ "${#lines[@]}" -eq 13 ]
	[ "$(ops sqs SendMessageBatch)" -eq 2 ]
	[ "$(waiting)" = 12 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 12 ]
	[ "$(waiting)" = 0 ]
	events > "$BATS_TEST_TMPDIR/ev"
	# every event, the refused one too; again only those sent after the refusal
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 25 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 31 ]
}
