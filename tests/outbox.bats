#!/usr/bin/env bats
# idemp-outbox and the transactional outbox (issue 27) on every store that
# keeps one, IDEMKIT_TEST_BACKEND picking it (sqlite, the default; dynamodb
# on dynalite; dynamodb-local), a fresh store per test (tests count what
# waits): the event written by the finish's own write (alone and in a group),
# its format (docs/outbox-event.schema.json), the relay's checkpoint after
# the queue accepted, kill -9 of the relay at every boundary, a worker that
# dies between debit and finish, two relays racing, a dead relay's lease
# taken over, the purge, and the downstream consumer
# (examples/outbox-consumer.sh) applying each event once.  The events go to
# the embedded queue, or with IDEMKIT_TEST_QUEUE_BACKEND=sqs to SQS
# (local-aws-sqs on loopback).  The store is SQLite, or by
# IDEMKIT_TEST_BACKEND redis (a redis-server per test: the counts are the
# store's whole outbox), dynamodb (dynalite) or dynamodb-local (a table per
# test), postgres (a table and its slot per test, one server per file); a test that needs SQLite's own file says so, and each store's own
# tests are in tests/outbox-STORE.bats.

bats_require_minimum_version 1.5.0
load helper
load queue_backend
load bank_helper
load outbox_helper

setup_file() { queue_backend_setup_file; store_backend_setup_file; }
teardown_file() { queue_backend_teardown_file; store_backend_teardown_file; }
setup() {
	queue_backend_setup
	unset IDEMKIT_QUEUE IDEMKIT_DLQ
	export IDEMKIT_OUTBOX=$QUEUE
	export IDEMKIT_LOG=quiet
	DB=$BATS_TEST_TMPDIR/store.db
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) export IDEMKIT_STORE=sqlite:$DB ;;
	redis)
		. "$IDEMKIT_SRC/tests/redis_helper.bash"
		require_redis
		redis_start
		export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
		;;
	dynamodb|dynamodb-local)
		export IDEMKIT_STORE=dynamodb:ob-$BATS_TEST_NUMBER-$$-$RANDOM
		idemp-init >/dev/null ;;
	postgres)
		# a table (and so its own replication slot, made by idemp-init
		# with IDEMKIT_OUTBOX set) on the file's server
		OB_TABLE=ob_$$_$RANDOM$RANDOM
		export IDEMKIT_STORE=$PG_URL?table=$OB_TABLE
		# quiet when it works; why, when it does not (CI saw a 70 once)
		idemp-init >/dev/null 2>"$BATS_TEST_TMPDIR/init.err" ||
			{ rc=$?; cat "$BATS_TEST_TMPDIR/init.err" >&2; return "$rc"; }
		;;
	*) echo "unknown IDEMKIT_TEST_BACKEND=$IDEMKIT_TEST_BACKEND" >&2; return 1 ;;
	esac
}
teardown() {
	for p in ${RELAYS:-}; do kill -KILL "$p" 2>/dev/null || true; done
	bank_stop
	[ -z "${REDIS_PID:-}" ] || redis_stop
	[ -z "${OB_TABLE:-}" ] || pg_sql "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'idemkit_$OB_TABLE'" >/dev/null 2>&1 || true
}
# sqlite_only: the test reaches into SQLite's file (its lock, its rows).
sqlite_only() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) ;;
	*) skip "SQLite's own file; tests/outbox-$IDEMKIT_TEST_BACKEND.bats has this store's" ;;
	esac
}
# republish N: the store forgets it published N of its events (a relay
# that died before its checkpoint), so they go out again: the first N, or
# on Redis the last N (the group reads the stream again from the entry
# before them; from its start, every event went out twice, and a sanitized
# consumer on a loaded machine took the whole test's 300 s over 400).
# REPUBLISHED: how many it made the store forget (0 where it cannot).
republish() {
	REPUBLISHED=$1
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	redis)
		# in one script: a relay polling between the two would publish
		# some before the count was set, and it would never come to 0
		rcli EVAL "local n = tonumber(ARGV[1])
			local e = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', n + 1)
			local from = '0'
			if #e > n then from = e[#e][1] end
			redis.call('XGROUP', 'SETID', KEYS[1], 'relay', from)
			return redis.call('SET', KEYS[2], math.min(#e, n))" \
			2 idemkit:outbox idemkit:outbox:waiting "$1" >/dev/null
		;;
	# DynamoDB keeps nothing published (the checkpoint removes the event
	# from the item), PostgreSQL's slot has passed it: their own suites
	# kill the relay instead
	dynamodb*|postgres) REPUBLISHED=0 ;;
	*) sqlite3 -cmd ".timeout 10000" "$DB" "UPDATE outbox SET published_at = NULL WHERE seq <= $1" ;;
	esac
}

@test "--help, --version, usage errors; no queue is 78; off by default: a finish writes no event" {
	run idemp-outbox --help
	[ "$status" -eq 0 ]
	[[ "$output" == "usage: idemp-outbox"* ]]
	[[ "$output" == *"11  DUP_IN_PROGRESS"* ]]
	run idemp-outbox --version
	[[ "$output" == "idemp-outbox (idemkit) "* ]]
	run idemp-outbox --once --follow
	[ "$status" -eq 64 ]
	run idemp-outbox --lease 0
	[ "$status" -eq 64 ]
	run -64 --separate-stderr idemp-outbox --batch 101
	[[ "$stderr" == *"--batch: want 1-100 events"* ]]
	run -64 idemp-outbox --batch 0
	run -78 --separate-stderr env -u IDEMKIT_OUTBOX idemp-outbox
	[[ "$stderr" == *"IDEMKIT_OUTBOX"* ]]
	IDEMKIT_OUTBOX= finish "$(uid off)" DONE
	[ "$(waiting)" = 0 ]
	run -1 idemp-outbox
	[ -z "$output" ]
}

@test "each finished state is one event, in the store's order, valid against the schema, eventId as an attribute" {
	a=$(uid a) b=$(uid b) c=$(uid c)
	finish "$a" DONE 2500
	finish "$b" FAILED 100 "declined: insufficient funds"
	finish "$c" DEBITED_NOTIFICATION_FAILED 999999999999 "sms gateway 503"
	[ "$(waiting)" = 3 ]
	run --separate-stderr idemp-outbox
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[ "$(jget "${lines[0]}" chargeId)" = "$a" ]
	[ "$(jget "${lines[2]}" chargeId)" = "$c" ]
	[ "$(waiting)" = 0 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 3 ]
	python3 - "$BATS_TEST_TMPDIR/ev" "$IDEMKIT_SRC/docs/outbox-event.schema.json" "$a" "$b" "$c" <<'PY'
import json, sys, jsonschema
schema = json.load(open(sys.argv[2]))
got = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    jsonschema.validate(e["body"], schema)
    assert e["attr"] == e["body"]["eventId"], e
    got[e["body"]["chargeId"]] = e["body"]
a, b, c = (got[k] for k in sys.argv[3:6])
assert (a["type"], a["state"], a["amount"], a["reason"], a["bankRef"]) == ("charge.finished", "DONE", 2500, None, "TXN-T1"), a
assert (b["state"], b["amount"], b["reason"], b["bankRef"]) == ("FAILED", 100, "declined: insufficient funds", None), b
assert (c["state"], c["amount"], c["reason"], c["bankRef"]) == ("DEBITED_NOTIFICATION_FAILED", 999999999999, "sms gateway 503", "TXN-T3"), c
assert a["accountId"] == "ACC-0042" and a["currency"] == "INR" and a["chargeType"] == "SMS_ALERT_FEE"
assert len({a["eventId"], b["eventId"], c["eventId"]}) == 3
PY
	# Published once: nothing waits, a second run has nothing to do.
	run -1 idemp-outbox
}

@test "a re-notification is its own event; a refused finish (LEASE_LOST) and a claim write none" {
	k=$(uid rn)
	renotified "$k"
	[ "$(jget "$(idemp-show --json "$k")" state)" = DONE ]
	# a claim alone, and a finish under a stale token: no event
	env=$(ev "$(uid lost)" | idemp-claim 2>/dev/null)
	run -13 idemp-done --state DONE <<<"${env/\"token\":\"/\"token\":\"0}"
	[ "$(waiting)" = 2 ]
	run --separate-stderr idemp-outbox
	[ "$status" -eq 0 ]
	[ "$(jget "${lines[0]}" type)" = charge.finished ]
	[ "$(jget "${lines[1]}" type)" = charge.renotified ]
	[ "$(jget "${lines[1]}" chargeId)" = "$k" ]
	[ "$(jget "${lines[0]}" eventId)" != "$(jget "${lines[1]}" eventId)" ]
	events > "$BATS_TEST_TMPDIR/ev"
	grep -q '"type": "charge.renotified".*"state": "DONE"' "$BATS_TEST_TMPDIR/ev"
}

@test "a batch cut at a chargeId's second event (its re-notification) with more waiting behind: what the batch did not send is read again, nothing skipped" {
	k=$(uid rn)
	renotified "$k"
	for i in $(seq 1 12); do ev "$(uid "b$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	[ "$(waiting)" = 14 ]
	# batches of 10: the first is cut after the finished event, the other 9
	# are read again (a read-ahead must not have moved past them)
	run -0 --separate-stderr idemp-outbox --batch 10
	[ "${#lines[@]}" -eq 14 ]
	[ "$(waiting)" = 0 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 14 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 14 ]
	# the chargeId's two events in their order
	[ "$(grep -c "\"chargeId\":\"$k\"" <<<"$output")" -eq 2 ]
	[ "$(grep "\"chargeId\":\"$k\"" <<<"$output" | head -1 | grep -c charge.finished)" -eq 1 ]
}

@test "the group commit (idemp-done --stream) writes each finish's event in the group's transaction" {
	for i in $(seq 1 40); do ev "$(uid "g$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE > "$BATS_TEST_TMPDIR/done" 2>/dev/null
	[ "$(grep -c '"done":{"outcome":"OK"' "$BATS_TEST_TMPDIR/done")" -eq 40 ]
	[ "$(waiting)" = 40 ]
	run --separate-stderr idemp-outbox
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 40 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 40 ]
}

@test "a rolled-back finish writes no event: the event and the record commit together" {
	sqlite_only "a writer holds the file's lock"
	k=$(uid rb)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	# A writer holds the store's write lock: the finish cannot commit
	# (TEMPFAIL, the record stays IN_PROGRESS) and no event exists.
	python3 - "$DB" <<'PY' &
import sqlite3, sys, time, os
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
open(sys.argv[1] + ".locked", "w").close()
while not os.path.exists(sys.argv[1] + ".release"):
    time.sleep(0.02)
db.execute("ROLLBACK")
PY
	locker=$!
	for _ in $(seq 200); do [ -e "$DB.locked" ] && break; sleep 0.05; done
	run -75 env IDEMKIT_BUSY_TIMEOUT=100ms idemp-done --state DONE <<<"$env"
	touch "$DB.release"
	wait "$locker"
	[ "$(jget "$(idemp-show --json "$k")" state)" = IN_PROGRESS ]
	[ "$(waiting)" = 0 ]
	run -0 idemp-done --state DONE <<<"$env"
	[ "$(waiting)" = 1 ]
}

@test "a worker killed between debit and finish publishes nothing until the finish" {
	bank_start
	k=$(uid wk)
	env=$(ev "$k" | idemp-claim --lease 4s 2>/dev/null | charge-debit --timeout 1s --lease-margin 500ms 2>/dev/null)
	[ "$(jget "$env" debit.outcome)" = OK ]
	# (the worker died here: no idemp-done)
	run -1 idemp-outbox
	events > "$BATS_TEST_TMPDIR/ev"
	[ ! -s "$BATS_TEST_TMPDIR/ev" ]
	# The retry after the lease: a replay at the bank, then the finish.
	for _ in $(seq 100); do
		env2=$(ev "$k" | idemp-claim 2>/dev/null) && break
		sleep 0.1
	done
	printf '%s\n' "$env2" | charge-debit 2>/dev/null | charge-notify 2>/dev/null | idemp-done >/dev/null 2>&1
	run -0 idemp-outbox
	[ "${#lines[@]}" -eq 1 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 1 ]
	grep -q "\"bankRef\": \"TXN-" "$BATS_TEST_TMPDIR/ev"
	grep -q '"attempts": 2' "$BATS_TEST_TMPDIR/ev"
}

# crash POINT: 25 events; the relay kill -9's itself at POINT of its first
# batch (of 10, on every store: --batch); then a relay after the dead one's
# lease ends publishes the rest.
# Every event is on the queue; a duplicate only with the same eventId.
crash() {
	for i in $(seq 1 25); do ev "$(uid "k$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	[ "$(waiting)" = 25 ]
	# (leases of 4 s: a relay whose lease ends before its checkpoint, as
	# one of 1 s did on a loaded machine with dynalite, and one of 4 s
	# once in CI, publishes its batch again by design, and says so: LOST
	# counts those batches of 10, which the counts below allow and no more)
	run -137 --separate-stderr env IDEMKIT_TEST_RELAY_CRASH="$1" IDEMKIT_LOG=debug \
		idemp-outbox --lease 4s --batch 10
	printf '%s\n' "$stderr" > "$BATS_TEST_TMPDIR/first.log"
	LOST=$(grep -c "outbox lease lost before the checkpoint" "$BATS_TEST_TMPDIR/first.log" || true)
	# The dead relay's lease holds the next one off (11) until it ends.
	rc=11
	for _ in $(seq 300); do
		rc=0; IDEMKIT_LOG=debug idemp-outbox --lease 4s > "$BATS_TEST_TMPDIR/second" \
			2> "$BATS_TEST_TMPDIR/second.log" || rc=$?
		[ "$rc" -ne 11 ] && break
		sleep 0.1
	done
	[ "$rc" -eq 0 ]
	[ "$(waiting)" = 0 ]
	events > "$BATS_TEST_TMPDIR/ev"
	# (CI once saw a count other than 25 here, on the SQS emulator: what
	# the relays said is printed with it)
	n=$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)
	[ "$n" -eq 25 ] || {
		echo "$n eventIds of 25 on the queue, $(wc -l < "$BATS_TEST_TMPDIR/ev") copies; first relay (lost $LOST):"
		cat "$BATS_TEST_TMPDIR/first.log"
		echo "second relay:"; cat "$BATS_TEST_TMPDIR/second.log"
		return 1
	}
	# every copy of one eventId is the same event
	python3 - "$BATS_TEST_TMPDIR/ev" <<'PY'
import json, sys
seen = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    assert seen.setdefault(e["attr"], e["body"]) == e["body"], e
PY
	COPIES=$(wc -l < "$BATS_TEST_TMPDIR/ev")
	SECOND=$(wc -l < "$BATS_TEST_TMPDIR/second")
	# shown when a count below fails: both relays' logs, the copies
	echo "first relay (lost $LOST):"; cat "$BATS_TEST_TMPDIR/first.log"
	echo "second relay:"; cat "$BATS_TEST_TMPDIR/second.log"
	echo "eventIds sent more than once:"; ids "$BATS_TEST_TMPDIR/ev" | uniq -d
}

@test "relay killed -9 before publish: nothing sent, the next relay sends all 25 once" {
	crash before-publish
	[ "$COPIES" -eq 25 ]
	[ "$SECOND" -eq 25 ]
}

@test "relay killed -9 after the queue accepted, before the checkpoint: the batch again, same eventIds" {
	crash after-publish
	[ "$COPIES" -eq $((35 + 10 * LOST)) ]     # the first batch of 10 twice
	[ "$SECOND" -eq 25 ]
}

@test "relay killed -9 after the checkpoint: nothing again, the next relay sends the other 15" {
	crash after-checkpoint
	[ "$COPIES" -eq $((25 + 10 * LOST)) ]
	[ "$SECOND" -eq 15 ]
}

@test "two relays racing: one publishes, each event once; the other takes over when the first dies" {
	for i in $(seq 1 300); do ev "$(uid "r$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	# (a lease of 15 s: a round slower than the lease -- 4 s was, once,
	# under the sanitizer on dynalite -- rightly lets the other take over,
	# which is not this test's case)
	idemp-outbox --follow --lease 15s --poll 50ms > "$BATS_TEST_TMPDIR/r1" 2>/dev/null 3>&- &
	r1=$!
	idemp-outbox --follow --lease 15s --poll 50ms > "$BATS_TEST_TMPDIR/r2" 2>/dev/null 3>&- &
	r2=$!
	RELAYS="$r1 $r2"
	for _ in $(seq 600); do [ "$(waiting)" = 0 ] && break; sleep 0.1; done
	[ "$(waiting)" = 0 ]
	n1=$(wc -l < "$BATS_TEST_TMPDIR/r1") n2=$(wc -l < "$BATS_TEST_TMPDIR/r2")
	[ $((n1 + n2)) -eq 300 ]
	# one of them did it all (the other never held the lease)
	[ "$n1" -eq 0 ] || [ "$n2" -eq 0 ]
	if [ "$n1" -gt 0 ]; then live=$r2 dead=$r1 out=r2; else live=$r1 dead=$r2 out=r1; fi
	kill -KILL "$dead"
	finish "$(uid after)" DONE
	# the live one takes over once the dead one's lease ran out (15 s: a
	# look each 0.5 s, not 150 processes and store connections)
	for _ in $(seq 60); do [ "$(waiting)" = 0 ] && break; sleep 0.5; done
	[ "$(waiting)" = 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/$out")" -eq 1 ]
	kill -TERM "$live"
	rc=0; wait "$live" || rc=$?
	[ "$rc" -eq 143 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 301 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 301 ]
}

@test "a stop signal mid-batch (TERM before the publish, or after it before the checkpoint): the batch of 99 ends checkpointed, the lease ended, each event once" {
	local at n1 left
	for at in before-publish after-publish; do
		for i in $(seq 1 99); do ev "$(uid "$at$i")"; done | idemp-claim --stream 2>/dev/null \
			| idemp-done --stream --state DONE >/dev/null 2>&1
		[ "$(waiting)" = 99 ]
		# the relay sends itself SIGTERM there, as a group stop would
		run -143 --separate-stderr env IDEMKIT_TEST_RELAY_CRASH="$at:TERM" idemp-outbox --lease 1h --batch 99
		n1=${#lines[@]}
		[ "$n1" -ge 1 ]                # a round that read anything ends it
		left=$(waiting)
		[ "$left" -eq $((99 - n1)) ]   # what it printed is checkpointed
		# its lease of an hour ended at the stop: the next relay needs no wait
		finish "$(uid "$at-after")" DONE
		run -0 --separate-stderr idemp-outbox --lease 1h
		[ "${#lines[@]}" -eq $((left + 1)) ]
		[ "$(waiting)" = 0 ]
		events > "$BATS_TEST_TMPDIR/ev"
		# nothing twice: the stop let the checkpoint follow the publish
		[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 100 ]
		[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 100 ]
	done
}

@test "--once while another relay holds the lease is 11; a relay that stopped ended its own" {
	finish "$(uid l1)" DONE
	run -0 idemp-outbox --lease 1h
	finish "$(uid l2)" DONE
	# the first ended its lease of an hour when it stopped: no wait
	run -0 idemp-outbox --lease 1h
	[ "${#lines[@]}" -eq 1 ]
	finish "$(uid l3)" DONE
	run -137 env IDEMKIT_TEST_RELAY_CRASH=before-publish idemp-outbox --lease 1h
	run -11 --separate-stderr idemp-outbox
	[[ "$stderr" == *"another relay holds the outbox lease"* ]]
	[ -z "$output" ]
	[ "$(waiting)" = 1 ]
}

# stopped PID: PID is paused (SIGSTOP: a relay at IDEMKIT_TEST_RELAY_CRASH's
# POINT:STOP); until_stopped PID: at most 30 s for it.
stopped() { local st; read -r _ _ st _ < "/proc/$1/stat" 2>/dev/null && [ "$st" = T ]; }
until_stopped() {
	for _ in $(seq 300); do stopped "$1" && return 0; sleep 0.1; done
	echo "relay $1 never reached its pause" >&2; return 1
}

@test "--once beside a live --follow relay: 11, and 11 again; the holder's lease left as it was, only the holder publishes (issue 45)" {
	finish "$(uid h1)" DONE
	# the live relay: it published h1 and holds its lease of an hour,
	# paused at its first purge (so nothing it does races the test)
	IDEMKIT_TEST_RELAY_CRASH=before-purge:STOP idemp-outbox --follow --lease 1h --poll 100ms \
		> "$BATS_TEST_TMPDIR/f" 2>"$BATS_TEST_TMPDIR/f.err" 3>&- &
	f=$!
	RELAYS=$f
	until_stopped "$f"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/f")" -eq 1 ]
	finish "$(uid h2)" DONE
	# the --once runs fail to take the lease; neither may end or move the
	# holder's (an end moved to theirs, a second away, shows in what the
	# next is told is left), or the second would take it and publish h2
	for once in 1 2; do
		run -11 --separate-stderr idemp-outbox --once --lease 1s
		[ -z "$output" ]
		[[ "$stderr" =~ "another relay holds the outbox lease for "([0-9]+)" ms more" ]]
		echo "--once $once: ${BASH_REMATCH[1]} ms left"
		[ "${BASH_REMATCH[1]}" -gt 3000000 ]
	done
	[ "$(waiting)" = 1 ]
	# the holder goes on and publishes h2 under its own lease
	kill -CONT "$f"
	for _ in $(seq 300); do [ "$(wc -l < "$BATS_TEST_TMPDIR/f")" -ge 2 ] && break; sleep 0.1; done
	[ "$(wc -l < "$BATS_TEST_TMPDIR/f")" -eq 2 ]
	[ "$(jget "$(sed -n 2p "$BATS_TEST_TMPDIR/f")" chargeId)" = "$(uid h2)" ]
	kill -TERM "$f"
	rc=0; wait "$f" || rc=$?
	[ "$rc" -eq 143 ]
	[ "$(waiting)" = 0 ]
}

@test "the purge at a retention of 0: the published event goes, one still waiting when the purge runs stays, and is published next (every store; issue 45)" {
	finish "$(uid q1)" DONE
	# the relay publishes q1, is idle, and pauses just before its purge;
	# q2 is finished meanwhile: waiting when the purge runs
	IDEMKIT_TEST_RELAY_CRASH=before-purge:STOP idemp-outbox --retention 0 \
		> "$BATS_TEST_TMPDIR/r" 2>"$BATS_TEST_TMPDIR/r.err" 3>&- &
	r=$!
	RELAYS=$r
	until_stopped "$r"
	finish "$(uid q2)" DONE
	[ "$(waiting)" = 1 ]
	kill -CONT "$r"
	rc=0; wait "$r" || rc=$?
	cat "$BATS_TEST_TMPDIR/r.err"
	[ "$rc" -eq 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/r")" -eq 1 ]
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 1 ]
	# where published events are kept, q1 went (DynamoDB and PostgreSQL
	# keep none: their purge has nothing to delete)
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite|redis) [ "$(jget "$st" published)" = 0 ] ;;
	esac
	run -0 --separate-stderr idemp-outbox --retention 0
	[ "${#lines[@]}" -eq 1 ]
	[ "$(jget "${lines[0]}" chargeId)" = "$(uid q2)" ]
	[ "$(waiting)" = 0 ]
}

@test "the purge: published events past the retention go, waiting ones stay" {
	sqlite_only "published times rewritten in the file (tests/outbox-dynamodb.bats: nothing published is kept there)"
	finish "$(uid p1)" DONE
	finish "$(uid p2)" DONE
	run -0 idemp-outbox
	[ "$(jget "$(idemp-outbox --stats)" published)" = 2 ]
	finish "$(uid p3)" DONE
	sqlite3 -cmd ".timeout 10000" "$DB" "UPDATE outbox SET published_at = published_at - 3600000 WHERE published_at IS NOT NULL"
	run -0 --separate-stderr idemp-outbox --retention 30m
	[ "${#lines[@]}" -eq 1 ]
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" published)" = 1 ]
	[ "$(jget "$st" waiting)" = 0 ]
	run -78 --separate-stderr env IDEMKIT_OUTBOX_RETENTION=soon idemp-outbox
}

@test "the lag gauge: events waiting and the oldest one's age" {
	sqlite_only "an event's time rewritten in the file (tests/outbox-dynamodb.bats: a finish on a slow clock)"
	finish "$(uid g1)" DONE
	sqlite3 -cmd ".timeout 10000" "$DB" "UPDATE outbox SET created_at = created_at - 90000"
	finish "$(uid g2)" FAILED
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 2 ]
	[ "$(jget "$st" oldestWaitingMs)" -ge 90000 ]
	[ "$(jget "$st" oldestWaitingMs)" -lt 600000 ]
}

# prom FILE NAME: the value of NAME{idemkit_job="outbox"} in the metrics file.
prom() { awk -v s="$2{idemkit_job=\"outbox\"}" '$1 == s { print $2 }' "$1"; }
promlint() {
	command -v promtool >/dev/null || return 0
	run promtool check metrics < "$1"
	echo "$output"
	[ "$status" -eq 0 ] && [ -z "$output" ]
}

@test "--metrics: the lag gauge in the Prometheus file agrees with --stats; 0 waiting after a publish; at every exit, and periodically with --follow" {
	M=$BATS_TEST_TMPDIR/outbox.prom
	for i in 1 2 3; do finish "$(uid m$i)" DONE; done
	# the oldest waits at least a second (a condition waited on, bounded)
	for _ in $(seq 100); do
		[ "$(jget "$(idemp-outbox --stats)" oldestWaitingMs)" -ge 1000 ] && break
		sleep 0.05
	done
	st1=$(idemp-outbox --stats)
	# a relay that cannot reach its queue publishes nothing, writes the file
	run -78 --separate-stderr idemp-outbox --once --queue "sqlite:$BATS_TEST_TMPDIR/none/q.db#ev" --metrics "$M"
	st2=$(idemp-outbox --stats)
	[ "$(jget "$st1" waiting)" = 3 ]; [ "$(jget "$st2" waiting)" = 3 ]
	[ "$(prom "$M" idemkit_outbox_stats_up)" = 1 ]
	[ "$(prom "$M" idemkit_outbox_waiting_events)" = 3 ]
	age=$(prom "$M" idemkit_outbox_oldest_waiting_age_seconds)
	python3 -c 'import sys; a, lo, hi = map(float, sys.argv[1:]); assert lo / 1000 <= a <= hi / 1000, (a, lo, hi)' \
		"$age" "$(jget "$st1" oldestWaitingMs)" "$(jget "$st2" oldestWaitingMs)"
	[ "$(prom "$M" idemkit_outbox_published_total)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_last_success_timestamp_seconds)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_lease_held)" = 0 ]
	promlint "$M"
	# it publishes: nothing waits, the counter says 3, a good round's time
	t0=$(date +%s)
	run -0 idemp-outbox --once --metrics "$M"
	[ "${#lines[@]}" -eq 3 ]
	[ "$(waiting)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_waiting_events)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_oldest_waiting_age_seconds)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_published_total)" = 3 ]
	t=$(prom "$M" idemkit_outbox_last_success_timestamp_seconds)
	[ "${t%.*}" -ge "$t0" ]
	promlint "$M"
	# --follow rewrites it while it runs (lease held), and at its exit
	# (lease ended); a new file's counter starts again
	rm -f "$M"
	idemp-outbox --follow --poll 50ms --metrics "$M" --metrics-every 1 >"$BATS_TEST_TMPDIR/f.out" &
	RELAYS=$!
	for _ in $(seq 200); do [ "$(prom "$M" idemkit_outbox_lease_held 2>/dev/null)" = 1 ] && break; sleep 0.05; done
	[ "$(prom "$M" idemkit_outbox_lease_held)" = 1 ]
	finish "$(uid m4)" DONE
	for _ in $(seq 200); do [ "$(prom "$M" idemkit_outbox_published_total 2>/dev/null)" = 1 ] && break; sleep 0.05; done
	[ "$(prom "$M" idemkit_outbox_published_total)" = 1 ]
	[ "$(prom "$M" idemkit_outbox_waiting_events)" = 0 ]
	kill -TERM "$RELAYS"
	rc=0
	wait "$RELAYS" || rc=$?
	RELAYS=
	[ "$rc" -eq 143 ]
	[ "$(prom "$M" idemkit_outbox_lease_held)" = 0 ]
	[ "$(prom "$M" idemkit_outbox_published_total)" = 1 ]
	promlint "$M"
	run -64 idemp-outbox --stats --metrics "$M"
	run -64 idemp-outbox --once --metrics "$M" --metrics-every 0
}

@test "the example consumer: what its command prints goes to its standard error, not into the ack stream (each event acked, no 'not an envelope')" {
	# the consumer's store and queue are its own, the same on every run
	[ "${IDEMKIT_TEST_QUEUE_BACKEND:-sqlite}" = sqlite ] && [ "${IDEMKIT_TEST_BACKEND:-sqlite}" = sqlite ] ||
		skip "the consumer's own store and queue: the default run's"
	printf '{"v":1,"eventId":"ab0%s","chargeId":"C%s"}\n' 1 1 2 2 | sqs-send --queue "$IDEMKIT_OUTBOX" >/dev/null
	run --separate-stderr env CONSUMER_STORE="sqlite:$BATS_TEST_TMPDIR/consumer.db" \
		"$IDEMKIT_SRC/examples/outbox-consumer.sh" -- sh -c "cat >> '$BATS_TEST_TMPDIR/ledger'; echo applied"
	echo "$stderr"
	[ "$status" -eq 0 ]
	[ -z "$output" ]
	[ "$(grep -c '^applied$' <<<"$stderr")" -eq 2 ]
	[ "$(grep -c 'not an envelope' <<<"$stderr")" -eq 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ledger")" -eq 2 ]
	[ "$(grep -c '"outcome":"DUP_DONE"' <<<"$stderr")" -eq 2 ]
	[ "$(jget "$(sqs-stat --queue "$IDEMKIT_OUTBOX")" visible)" = 0 ]
	[ "$(jget "$(sqs-stat --queue "$IDEMKIT_OUTBOX")" inflight)" = 0 ]
}

@test "the example consumer dead-letters what is not an event byte for byte (bytes that are not UTF-8 included), applies an event once and its copy not again" {
	[ "${IDEMKIT_TEST_QUEUE_BACKEND:-sqlite}" = sqlite ] || skip "SQS carries only valid Unicode in a body"
	printf 'not an event caf\xe9 \x80\n{"v":1,"eventId":"ab01","chargeId":"C1"}\n{"v":1,"eventId":"ab01","chargeId":"C1"}\n' |
		sqs-send --queue "$IDEMKIT_OUTBOX" >/dev/null
	run -0 env CONSUMER_STORE="sqlite:$BATS_TEST_TMPDIR/consumer.db" IDEMKIT_DLQ="$DLQ" \
		"$IDEMKIT_SRC/examples/outbox-consumer.sh" -- sh -c "cat >> '$BATS_TEST_TMPDIR/ledger'"
	[ "$(cat "$BATS_TEST_TMPDIR/ledger")" = '{"v":1,"eventId":"ab01","chargeId":"C1"}' ]
	sqs-recv --queue "$DLQ" --max 10 > "$BATS_TEST_TMPDIR/dlq"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/dlq")" -eq 1 ]
	python3 -c 'import json, sys
print(json.loads(open(sys.argv[1], "rb").read().decode("utf-8", "surrogateescape"))["body"].encode("utf-8", "surrogateescape"))' \
		"$BATS_TEST_TMPDIR/dlq" > "$BATS_TEST_TMPDIR/body"
	[ "$(cat "$BATS_TEST_TMPDIR/body")" = "b'not an event caf\\xe9 \\x80'" ]
}

@test "end to end: worker, relay and the example consumer: every charge's event applied once downstream" {
	bank_start
	N=200
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/charges.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/charges.db#charges-dlq"
	for i in $(seq 1 "$N"); do ev "$(uid "e$i")"; done | sqs-send --queue "$IDEMKIT_QUEUE" >/dev/null
	# 20 sent twice
	for i in $(seq 1 20); do ev "$(uid "e$i")"; done | sqs-send --queue "$IDEMKIT_QUEUE" >/dev/null
	idemp-outbox --follow --poll 50ms > "$BATS_TEST_TMPDIR/relay" 2>/dev/null 3>&- &
	RELAYS=$!
	run --separate-stderr charge-worker -j 2 --drain --debit-timeout 5 --notify-timeout 2 --lease 60s
	echo "$stderr" | tail -5
	[ "$status" -eq 0 ]
	for _ in $(seq 600); do [ "$(waiting)" = 0 ] && break; sleep 0.1; done
	[ "$(waiting)" = 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq "$N" ]
	# A duplicate on the events queue (a relay that died before its
	# checkpoint): applied once all the same.
	republish 7
	for _ in $(seq 600); do [ "$(waiting)" = 0 ] && break; sleep 0.1; done
	[ "$(waiting)" = 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq "$(( N + REPUBLISHED ))" ]
	run -0 env CONSUMER_STORE="sqlite:$BATS_TEST_TMPDIR/consumer.db" \
		"$IDEMKIT_SRC/examples/outbox-consumer.sh" -- sh -c "cat >> '$BATS_TEST_TMPDIR/ledger'"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ledger")" -eq "$N" ]
	[ "$(python3 -c 'import json, sys
print(len({json.loads(l)["eventId"] for l in open(sys.argv[1])}))' "$BATS_TEST_TMPDIR/ledger")" -eq "$N" ]
	[ "$(python3 -c 'import json, sys
print(len({json.loads(l)["chargeId"] for l in open(sys.argv[1])}))' "$BATS_TEST_TMPDIR/ledger")" -eq "$N" ]
	run sqs-stat --queue "$IDEMKIT_OUTBOX"
	[ "$(jget "$output" visible)" = 0 ]
	[ "$(jget "$output" inflight)" = 0 ]
}
