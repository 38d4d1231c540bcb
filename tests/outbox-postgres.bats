#!/usr/bin/env bats
# The outbox on PostgreSQL (issue 27; store_postgres_outbox.c), what
# tests/outbox.bats (run with IDEMKIT_TEST_BACKEND=postgres) cannot say
# for every store: the eventId the statement computes is
# ik_outbox_event_id's; finishes in flight (pipeline mode) carry their
# events and add no commit; the slot (missing: claims refused, finishes
# still recorded; the role without REPLICATION); the slot follows the
# checkpoint (WAL released: the purge); a worker that meets no slot stops
# at the third claim refused; the lag gauge; a server restart
# under a following relay; a failover to a streaming standby (no slot
# there: the relay says so, claims wait, idemp-init makes the slot and
# the relay re-publishes from the records what the WAL lost).  Against a real throwaway
# PostgreSQL 15 (pg_helper.bash: wal_level = logical) and the embedded
# queue for the events.

bats_require_minimum_version 1.5.0
# one server for the file, which tests restart and fail over
BATS_NO_PARALLELIZE_WITHIN_FILE=true

load helper
load pg_helper
load queue_backend
load outbox_helper

setup_file() {
	require_pg
	pg_start
}
teardown_file() {
	pg_stop
	if [ -n "${PG2_DIR:-}" ]; then rm -rf "$PG2_DIR"; fi
}
setup() {
	export TBL=o_${BATS_TEST_NUMBER}_$RANDOM
	export IDEMKIT_STORE="$PG_URL?table=$TBL"
	export IDEMKIT_OUTBOX="sqlite:$BATS_TEST_TMPDIR/events.db#events"
	export IDEMKIT_LOG=quiet
	idemp-init >/dev/null 2>&1
}
teardown() {
	for p in ${RELAYS:-}; do kill -KILL "$p" 2>/dev/null || true; done
	[ -z "${RELAY_PID:-}" ] || { kill "$RELAY_PID" 2>/dev/null; wait "$RELAY_PID" 2>/dev/null || true; }
	if [ -n "${STANDBY:-}" ]; then
		pg_as "$PG_BIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	pg_sql "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'idemkit_$TBL' AND NOT active" >/dev/null 2>&1 || true
	# last (a bank-sim that crashed fails the test, after the rest is
	# cleaned up): the no-slot test's bank-sim, when an assertion ended
	# the test before its own bank_stop (a mutant's run left it running)
	if declare -F bank_stop >/dev/null; then bank_stop; fi
}

# charges PREFIX N: N claimed and finished DONE through the streams (in
# flight: pipeline mode).
charges() {
	local i
	for i in $(seq "$2"); do ev "$(uid "$1$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
}
queued_ids() {
	sqs-recv --queue "$IDEMKIT_OUTBOX" --max 10 --visibility 600 2>/dev/null \
		| python3 -c 'import json, sys
for l in sys.stdin: print(json.loads(l)["attributes"]["eventId"])'
}
all_ids() {
	local out
	while out=$(queued_ids) && [ -n "$out" ]; do printf '%s\n' "$out"; done
}

@test "the eventId the statement computes is ik_outbox_event_id: SHA-256 of the parts, 128 bits" {
	k=$(uid id)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	token=$(jget "$env" claim.token)
	printf '%s\n' "$env" | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null 2>&1
	renotify_all
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 2 ]
	want() { python3 -c 'import hashlib, sys
print(hashlib.sha256(b"".join(p.encode() + b"\0" for p in ["idemkit.outbox.v1"] + sys.argv[1:])).hexdigest()[:32])' "$@"; }
	[ "$(jget "${lines[0]}" eventId)" = "$(want finish "$k" "$token")" ]
	[ "$(jget "${lines[1]}" eventId)" = "$(want renotified "$k" "$token")" ]
	[ "$(jget "${lines[1]}" type)" = charge.renotified ]
}

@test "idemp-run's records (no charge) write no event, and their finish is not refused for it" {
	run -0 idemp-run --key "$(uid run)" -- true
	run -10 idemp-run --key "$(uid run)" -- true      # done: once
	[ "$(waiting)" = 0 ]
	run -1 idemp-outbox
}

@test "finishes in flight carry their events in the batch's own transaction: no commit added, none for a claim" {
	charges w 50                # warm: the table and the slot in use
	idemp-outbox >/dev/null
	for mode in off on; do
		for i in $(seq 200); do ev "$(uid "$mode$i")"; done > "$BATS_TEST_TMPDIR/ev.$mode"
		if [ "$mode" = off ]; then o=; else o=$IDEMKIT_OUTBOX; fi
		IDEMKIT_OUTBOX=$o idemp-claim --stream --inflight 64 < "$BATS_TEST_TMPDIR/ev.$mode" \
			> "$BATS_TEST_TMPDIR/claimed.$mode" 2>/dev/null
		x0=$(pg_sql "SELECT pg_current_xact_id()")
		IDEMKIT_OUTBOX=$o idemp-done --stream --inflight 64 --state DONE \
			< "$BATS_TEST_TMPDIR/claimed.$mode" > "$BATS_TEST_TMPDIR/done.$mode" 2>/dev/null
		x1=$(pg_sql "SELECT pg_current_xact_id()")
		[ "$(grep -c '"done":{"outcome":"OK"' "$BATS_TEST_TMPDIR/done.$mode")" -eq 200 ]
		eval "tx_$mode=$((x1 - x0 - 1))"
	done
	echo "write transactions for 200 finishes: without the outbox $tx_off, with it $tx_on"
	# the events ride in the same batches (in-flight batches vary in size
	# with timing; never one more transaction per charge)
	[ "$tx_on" -le $((tx_off + tx_off / 2 + 2)) ]
	[ "$tx_on" -lt 100 ]
	# only the 200 with the outbox on wrote events
	[ "$(waiting)" = 200 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 200 ]
	grep -q "$(uid on1)\"" <<<"$output"
	run ! grep -q "$(uid off1)\"" <<<"$output"
}

@test "no slot: claims are refused (78) before any debit, a finish still records its charge; idemp-init makes it again and the finish's event comes from the records" {
	k=$(uid before)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	pg_sql "SELECT pg_drop_replication_slot('idemkit_$TBL')" >/dev/null
	# the money moved before the slot went: the finish is never refused
	run -0 idemp-done --state DONE <<<"$env"
	[ "$(jget "$(idemp-show --json "$k")" state)" = DONE ]
	run -78 --separate-stderr idemp-claim < <(ev "$(uid after)")
	[ "$(jget "$output" claim.outcome)" = CONFIG ]
	[[ "$stderr" == *"replication slot idemkit_$TBL does not exist"* ]]
	# what charge-worker asks before it receives anything says so too
	run -78 --separate-stderr idemp-claim --check-store
	[[ "$stderr" == *"replication slot idemkit_$TBL does not exist"* ]]
	IDEMKIT_OUTBOX= run -0 idemp-claim --check-store
	run --separate-stderr idemp-claim --stream < <(ev "$(uid after2)")
	[[ "$output" == *'"outcome":"CONFIG"'* ]]
	run -78 --separate-stderr idemp-outbox
	[[ "$stderr" == *"replication slot idemkit_$TBL does not exist"*"failover"* ]]
	run -0 idemp-init
	run -0 idemp-claim --check-store
	run -0 --separate-stderr idemp-claim < <(ev "$(uid after)")
	printf '%s\n' "$output" | idemp-done --state DONE >/dev/null 2>&1
	# the finish made with no slot comes from the records (the window the
	# new slot opened), then the one after it from the slot
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" chargeId)" = "$k" ]
	[ "$(jget "${lines[1]}" chargeId)" = "$(uid after)" ]
}

@test "no slot: the worker stops before receiving (its store check); a slot gone after that check stops it at the third claim refused (78), one message at a time or --stream; the rest not received, nothing dead-lettered" {
	load bank_helper
	bank_start
	local db=$BATS_TEST_TMPDIR/cq.db i
	export IDEMKIT_QUEUE="sqlite:$db#ch" IDEMKIT_DLQ="sqlite:$db#ch-dlq"
	for i in $(seq 100); do event "$(uid NS$i)"; echo; done |
		sqs-send --queue "$IDEMKIT_QUEUE?maxReceiveCount=3&dlq=ch-dlq&visibility=1" >/dev/null
	pg_sql "SELECT pg_drop_replication_slot('idemkit_$TBL')" >/dev/null
	# the worker's own check (idemp-claim --check-store) finds it before
	# anything is received
	run --separate-stderr charge-worker --drain --lease 60s
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"replication slot idemkit_$TBL does not exist"* ]]
	[ "$(jget "$(sqs-stat)" visible)" -eq 100 ]
	# a slot gone after that check: its claims are refused, and the
	# worker stops at the third
	printf '#!/bin/sh\ncase " $* " in *" --check-store "*) exit 0 ;; esac\nexec idemp-claim "$@"\n' \
		> "$BATS_TEST_TMPDIR/claim"
	chmod +x "$BATS_TEST_TMPDIR/claim"
	export IDEMP_CLAIM_CMD=$BATS_TEST_TMPDIR/claim
	run --separate-stderr charge-worker --drain --lease 60s
	bank_stop
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"replication slot idemkit_$TBL does not exist"* ]]
	[[ "$stderr" == *'"received":3,'*'"config":3}'* ]]
	# --stream: sqs-ack halts, bounded by what the pipeline holds before
	# it learns (the receiver's window, the acker's group of up to 10, the
	# claims' instant refusals: up to 20 seen) -- far from the 100
	bank_start
	run --separate-stderr charge-worker --drain --stream --window 4 --lease 60s
	bank_stop
	[ "$status" -eq 78 ]
	python3 -c 'import json,sys
s = json.loads([l for l in sys.argv[1].split("\n") if "\"summary\"" in l][-1])
assert s["received"] <= 40 and s["debited"] == 0, s' "$stderr"
	[ "$(sqs-stat --queue "$IDEMKIT_DLQ")" = '{"visible":0,"inflight":0,"delayed":0}' ]
	s=$(sqs-stat)
	python3 -c 'import json,sys; s=json.loads(sys.argv[1]); assert s["visible"]+s["inflight"]+s["delayed"]==100, s' "$s"
}

@test "idemp-init with the outbox: a role without REPLICATION is 78 and says so" {
	pg_sql "CREATE ROLE norepl LOGIN PASSWORD 'pw-norepl'; GRANT ALL ON DATABASE idemkit TO norepl; GRANT ALL ON SCHEMA public TO norepl; GRANT ALL ON ALL TABLES IN SCHEMA public TO norepl" >/dev/null
	run -78 --separate-stderr env IDEMKIT_STORE="postgres://norepl:pw-norepl@127.0.0.1:$PG_PORT/idemkit?table=${TBL}_n" idemp-init
	echo "$stderr"
	[[ "$stderr" == *"the role needs REPLICATION"* ]]
	[[ "$stderr" != *"pw-norepl"* ]]
	# without the outbox the same role is fine
	run -0 env -u IDEMKIT_OUTBOX IDEMKIT_STORE="postgres://norepl:pw-norepl@127.0.0.1:$PG_PORT/idemkit?table=${TBL}_n" idemp-init
}

@test "the slot follows the checkpoint: WAL held while the relay is down is released once it published; nothing to purge" {
	charges s 30
	slot() { pg_sql "SELECT confirmed_flush_lsn, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots WHERE slot_name = 'idemkit_$TBL'"; }
	before=$(slot)
	held0=${before#*|}
	echo "WAL held before the relay: $held0 bytes"
	run -0 --separate-stderr idemp-outbox --retention 0s
	[ "${#lines[@]}" -eq 30 ]
	after=$(slot)
	[ "${after%|*}" != "${before%|*}" ]          # confirmed_flush_lsn moved
	# the checkpoint row says what was published
	[ "$(pg_sql "SELECT ckpt_commit > '0/0' FROM idemkit_outbox_relay WHERE tbl = '$TBL'")" = t ]
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 0 ]
	[ "$(jget "$st" published)" = 0 ]
	run -1 idemp-outbox --retention 0s
}

@test "the lag gauge: events waiting and the oldest one's age, from the commit's time" {
	charges g 3
	[ "$(waiting)" = 3 ]
	for _ in $(seq 100); do
		age=$(jget "$(idemp-outbox --stats)" oldestWaitingMs)
		[ "$age" -ge 1000 ] && break
		sleep 0.1
	done
	[ "$age" -ge 1000 ]
	[ "$age" -lt 600000 ]
	idemp-outbox >/dev/null
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 0 ]
	[ "$(jget "$st" oldestWaitingMs)" = 0 ]
}

@test "the lag gauge is counted by the server, past the checkpoint, within IDEMKIT_OUTBOX_COUNT_MAX changes (waitingCapped when it stopped there)" {
	local st age
	for i in 1 2 3 4; do finish "$(uid "c$i")" DONE; done
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 4 ]
	[[ $st != *waitingCapped* ]]
	age=$(jget "$st" oldestWaitingMs)
	# each finish its own transaction (Begin, the message, Commit): a
	# bound of 3 changes counts the first one, and says it stopped
	st=$(IDEMKIT_OUTBOX_COUNT_MAX=3 idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 1 ]
	[[ $st == *'"waitingCapped":true'* ]]
	[ "$(jget "$st" oldestWaitingMs)" -ge "$age" ]   # the oldest's age all the same
	[ "$(jget "$(IDEMKIT_OUTBOX_COUNT_MAX=0 idemp-outbox --stats)" waiting)" = 4 ]
	# one published and checkpointed; the slot, advanced only before the
	# relay's next read, still holds it: counted from the checkpoint on
	run -137 env IDEMKIT_TEST_RELAY_CRASH=after-checkpoint idemp-outbox --batch 1
	[ "$(jget "$(idemp-outbox --stats)" waiting)" = 3 ]
	run -78 --separate-stderr env IDEMKIT_OUTBOX_COUNT_MAX=10k idemp-outbox --stats
	[[ $stderr == *"IDEMKIT_OUTBOX_COUNT_MAX=10k: not a number of WAL changes"* ]]
	# a relay that writes the gauge says so before it starts, not at each write
	run -78 --separate-stderr env IDEMKIT_OUTBOX_COUNT_MAX=10k idemp-outbox --follow \
		--metrics "$BATS_TEST_TMPDIR/outbox.prom"
	[[ $stderr == *"IDEMKIT_OUTBOX_COUNT_MAX=10k: not a number of WAL changes"* ]]
}

@test "a server restart under a following relay: it carries on, every event published once" {
	idemp-outbox --follow --poll 50ms > "$BATS_TEST_TMPDIR/relay" 2>/dev/null 3>&- &
	RELAYS=$!
	charges a 40
	for _ in $(seq 300); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 40 ] && break; sleep 0.1; done
	pg_restart
	charges b 40
	for _ in $(seq 600); do [ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -ge 80 ] && break; sleep 0.1; done
	[ "$(wc -l < "$BATS_TEST_TMPDIR/relay")" -eq 80 ]
	kill -0 "$RELAYS"
	all_ids > "$BATS_TEST_TMPDIR/ids"
	[ "$(sort -u "$BATS_TEST_TMPDIR/ids" | wc -l)" -eq 80 ]
}

@test "a failover to a streaming standby: no slot there; the relay says so (78), claims wait for idemp-init, then what the WAL lost is re-published from the records" {
	# the standby: a base backup streaming from the primary
	STANDBY=$PG_DIR/standby
	pg_as "$PG_BIN/pg_basebackup" -h "$PG_DIR" -p "$PG_PORT" -U postgres -c fast -D "$STANDBY" -R -X stream \
		>/dev/null 2>&1
	PORT2=$(free_port)
	pg_as "$PG_BIN/pg_ctl" -D "$STANDBY" -l "$PG_DIR/standby.log" -o "-p $PORT2" -w -t 30 start >/dev/null
	charges p 10
	run -0 --separate-stderr idemp-outbox
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/first"
	charges q 5                   # finished on the primary, not yet published
	env=$(ev "$(uid late)" | idemp-claim 2>/dev/null)    # claimed there, finished after
	# wait until the standby has replayed it all, then fail over
	lsn=$(pg_sql "SELECT pg_current_wal_lsn()")
	for _ in $(seq 300); do
		[ "$(psql -X -At -h "$PG_DIR" -p "$PORT2" -U postgres -d idemkit -c "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ] && break
		sleep 0.1
	done
	pg_halt
	pg_as "$PG_BIN/pg_ctl" -D "$STANDBY" -w promote >/dev/null
	export IDEMKIT_STORE="postgres://idemkit:$PG_PASSWORD@127.0.0.1:$PORT2/idemkit?table=$TBL"
	# the relay's row came across (the checkpoint), the slot did not
	run -78 --separate-stderr idemp-outbox
	[[ "$stderr" == *"does not exist"*"failover"* ]]
	run -78 idemp-claim < <(ev "$(uid r1)")
	# a finish is never refused (the money moved); its event is in the gap
	run -0 idemp-done --state DONE <<<"$env"
	run -0 idemp-init
	charges r 3
	[ "$(waiting)" -ge 9 ]
	run -0 --separate-stderr idemp-outbox
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/second"
	sqs-recv --queue "$IDEMKIT_OUTBOX" --max 10 --visibility 600 > /dev/null 2>&1 || true
	python3 - "$BATS_TEST_TMPDIR/first" "$BATS_TEST_TMPDIR/second" "$(uid q)" "$(uid r)" "$(uid late)" <<'PY'
import collections, json, sys
first = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
second = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
q, r, late = sys.argv[3:6]
by = collections.Counter(e["chargeId"].rstrip("0123456789") for e in second)
# every event the WAL lost (5 finished on the old primary after the last
# checkpoint, 1 on the new one before its slot) and the 3 after it, once
assert by[q] == 5 and by[r] == 3 and by[late] == 1, by
assert len({e["eventId"] for e in second}) == len(second)
# copies of what was published before the failover carry its eventIds
ids = {e["chargeId"]: e["eventId"] for e in first}
for e in second:
    if e["chargeId"] in ids:
        assert ids[e["chargeId"]] == e["eventId"], e
# the window first (written before what the new slot decodes)
assert [e["chargeId"].startswith(r) for e in second][-3:] == [True] * 3
PY
	run -1 idemp-outbox
	[ "$(waiting)" = 0 ]
	pg_as "$PG_BIN/pg_ctl" -D "$STANDBY" -m fast -w stop >/dev/null
	STANDBY=
	pg_resume
}

@test "a server that never answers the relay's read (the connection left open): 75 within IDEMKIT_PG_TIMEOUT, nothing published, nothing lost; the next run publishes every event once" {
	charges silent 3
	silent_relay pg_logical_slot_peek
	IDEMKIT_STORE=$relayed IDEMKIT_PG_TIMEOUT=1500ms run --separate-stderr timeout -k 5 60 idemp-outbox --once
	echo "$output $stderr"
	[ "$status" -eq 75 ]
	[[ $stderr == *"no answer from the server within 1500 ms (IDEMKIT_PG_TIMEOUT)"* ]]
	[ -z "$(queued_ids)" ]
	run --separate-stderr idemp-outbox --once
	[ "$status" -eq 0 ]
	ids=$(queued_ids)
	[ "$(sort -u <<<"$ids" | wc -l)" -eq 3 ]
	[ "$(wc -l <<<"$ids")" -eq 3 ]
}
