#!/usr/bin/env bats
# idemp-claim and idemp-done --stream on the PostgreSQL store: claims and
# finishes in flight in libpq's pipeline mode (lib/store/postgres/pg_conn.c), each
# still its own conditional statement with its own outcome, a batch one
# implicit transaction.  Against a real throwaway PostgreSQL
# (pg_helper.bash).  Envelopes leave in the order the answers come, so the
# checks match outputs to inputs by chargeId, never by position.

bats_require_minimum_version 1.5.0
# one server for the file, which some tests stop, freeze or cut the
# connections of: the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

load helper
load pg_helper
load bank_helper

setup_file() {
	require_pg
	pg_start
}
teardown_file() { pg_stop; }
setup() {
	export TBL=f_${BATS_TEST_NUMBER}_$RANDOM
	export IDEMKIT_STORE="$PG_URL?table=$TBL"
	idemp-init >/dev/null 2>&1
}
teardown() {
	[ -z "${HOLD_PID:-}" ] || pg_sql "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'" >/dev/null 2>&1 || true
	[ -z "${CLAIM_PID:-}" ] || { kill "$CLAIM_PID" 2>/dev/null; wait "$CLAIM_PID" 2>/dev/null; } || true
	[ -z "${RELAY_PID:-}" ] || { kill "$RELAY_PID" 2>/dev/null; wait "$RELAY_PID" 2>/dev/null; } || true
}

# events PREFIX N [AMOUNT]: N events PREFIX-1 .. PREFIX-N, one a line.
events() {
	local i
	for i in $(seq "$2"); do ev "$1-$i" "${3:-2500}"; done
}
xid() { pg_sql "SELECT pg_current_xact_id()"; }

@test "200 claims in flight: one connection, no BEGIN, far fewer commits than claims; --inflight 1: one each" {
	id=$(uid many)
	events "$id" 200 > "$BATS_TEST_TMPDIR/ev"
	pg_sql "ALTER ROLE idemkit SET log_statement = 'all'"
	: > "$PG_DIR/server.log"
	x0=$(xid)
	run --separate-stderr idemp-claim --stream --inflight 64 < "$BATS_TEST_TMPDIR/ev"
	x1=$(xid)
	pg_sql "ALTER ROLE idemkit RESET log_statement"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 200 ]
	echo "write transactions for 200 claims: $((x1 - x0 - 1))"
	[ $((x1 - x0 - 1)) -le 40 ]
	[ "$(grep -c 'connection authorized: user=idemkit' "$PG_DIR/server.log")" -eq 1 ]
	# the pipeline's implicit transactions: no BEGIN sent (the group path's)
	[ "$(grep -c 'statement: BEGIN' "$PG_DIR/server.log")" -eq 0 ]
	[ "$(grep -c 'execute ik' "$PG_DIR/server.log")" -ge 200 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/claimed"
	x0=$(xid)
	run --separate-stderr idemp-done --stream --inflight 64 --state DONE < "$BATS_TEST_TMPDIR/claimed"
	x1=$(xid)
	[ "$status" -eq 0 ]
	[ "$(grep -c '"done":{"outcome":"OK","state":"DONE"' <<<"$output")" -eq 200 ]
	[ $((x1 - x0 - 1)) -le 40 ]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE state = 'DONE'")" -eq 200 ]
	# one in flight: each claim its own commit
	events "$id-one" 30 > "$BATS_TEST_TMPDIR/ev1"
	x0=$(xid)
	run --separate-stderr idemp-claim --stream --inflight 1 < "$BATS_TEST_TMPDIR/ev1"
	x1=$(xid)
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 30 ]
	[ $((x1 - x0 - 1)) -eq 30 ]
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
	python3 - "$BATS_TEST_TMPDIR/both" > "$BATS_TEST_TMPDIR/owners" <<'PY'
import collections, json, sys
acq, seen = collections.Counter(), collections.Counter()
for l in open(sys.argv[1]):
    e = json.loads(l)
    cid = json.loads(e["body"])["chargeId"]
    seen[cid] += 1
    o = e["claim"]["outcome"]
    # a deadlock between the two batches answers TEMPFAIL once retried out
    assert o in ("ACQUIRED", "DUP_IN_PROGRESS"), (cid, e["claim"])
    if o == "ACQUIRED":
        acq[cid] += 1
        print(cid, e["claim"]["token"])
assert len(seen) == 300 and set(seen.values()) == {2}, seen
assert len(acq) == 300 and set(acq.values()) == {1}, [k for k, v in acq.items() if v != 1]
PY
	for k in 7 150 299; do
		tok=$(awk -v k="$id-$k" '$1 == k { print $2 }' "$BATS_TEST_TMPDIR/owners")
		run idemp-show --json "$id-$k"
		[ "$(jget "$output" owner)" = "$tok" ]
		[ "$(jget "$output" attempts)" = 1 ]
	done
}

@test "a claim batch and a finish batch meeting the same rows in opposite orders wait for each other's commit, never deadlock (each batch locks in key order)" {
	# A refused INSERT ... ON CONFLICT DO UPDATE still locks its row, so
	# copies claimed while their originals are finished lock the rows the
	# finishes update.  Unsorted, these batches (600 rows each, one
	# ascending, one descending) deadlocked 31 times in 3 rounds, and the
	# server broke each after deadlock_timeout (1 s), holding both steps.
	: > "$PG_DIR/server.log"
	for round in 1 2 3; do
		id=$(uid order$round)
		events "$id" 600 > "$BATS_TEST_TMPDIR/ev"
		idemp-claim --stream --inflight 1024 < "$BATS_TEST_TMPDIR/ev" > "$BATS_TEST_TMPDIR/claimed" 2>/dev/null
		[ "$(grep -c '"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/claimed")" -eq 600 ]
		tac "$BATS_TEST_TMPDIR/claimed" > "$BATS_TEST_TMPDIR/desc"
		idemp-done --stream --inflight 1024 --state DONE < "$BATS_TEST_TMPDIR/desc" \
			> "$BATS_TEST_TMPDIR/done" 2>"$BATS_TEST_TMPDIR/done.err" &
		d=$!
		idemp-claim --stream --inflight 1024 < "$BATS_TEST_TMPDIR/ev" > "$BATS_TEST_TMPDIR/copies" 2>/dev/null
		wait "$d"
		[ "$(grep -c '"done":{"outcome":"OK"' "$BATS_TEST_TMPDIR/done")" -eq 600 ]
		[ "$(grep -c '"outcome":"DUP_IN_PROGRESS"\|"outcome":"DUP_DONE"' "$BATS_TEST_TMPDIR/copies")" -eq 600 ]
	done
	grep -c 'deadlock detected' "$PG_DIR/server.log" || true
	run ! grep -q 'deadlock detected' "$PG_DIR/server.log"
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE state = 'DONE' AND attempts = 1")" -eq 1800 ]
}

@test "one stream, every kind of claim in flight together, a duplicate next to its original: each gets its own outcome" {
	id=$(uid mix)
	for k in $(seq 1 10); do ev "$id-done-$k"; ev "$id-failed-$k"; ev "$id-busy-$k"; ev "$id-gone-$k"; done \
		| idemp-claim --stream > "$BATS_TEST_TMPDIR/pre"
	grep -e "-done-" "$BATS_TEST_TMPDIR/pre" | idemp-done --stream --state DONE >/dev/null
	grep -e "-failed-" "$BATS_TEST_TMPDIR/pre" | idemp-done --stream --state FAILED >/dev/null
	# the gone-k leases ended: taken over, attempt 2
	pg_sql "UPDATE $TBL SET lease_until = 0 WHERE key LIKE '$id-gone-%'"
	{
		for k in $(seq 1 10); do
			ev "$id-new-$k"               # ACQUIRED
			ev "$id-twin-$k"              # ACQUIRED, and its copy next to it:
			ev "$id-twin-$k"              # DUP_IN_PROGRESS
			ev "$id-done-$k"              # DUP_DONE
			ev "$id-failed-$k"            # DUP_FAILED
			ev "$id-busy-$k"              # DUP_IN_PROGRESS
			ev "$id-busy-$k" 9999         # PAYLOAD_MISMATCH
			ev "$id-gone-$k"              # ACQUIRED, attempt 2
			ev "$id-bad-$k" 1.5           # DATAERR (never sent)
		done
	} > "$BATS_TEST_TMPDIR/ev"
	run --separate-stderr idemp-claim --stream --inflight 64 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out"
	python3 - "$BATS_TEST_TMPDIR/ev" "$BATS_TEST_TMPDIR/out" <<'PY'
import collections, json, re, sys
want = {"new": "ACQUIRED", "done": "DUP_DONE", "failed": "DUP_FAILED", "busy": "DUP_IN_PROGRESS",
        "gone": "ACQUIRED"}
ins = [l for l in open(sys.argv[1]).read().split("\n") if l]
outs = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(e["body"] for e in outs) == sorted(ins), "not one envelope per line"
twins = collections.Counter()
for e in outs:
    ev = json.loads(e["body"])
    cid, kind, got = ev["chargeId"], ev["chargeId"].split("-")[-2], e["claim"]["outcome"]
    if kind == "bad":
        assert got == "DATAERR", (cid, got)
    elif kind == "twin":
        twins[got] += 1
    else:
        exp = "PAYLOAD_MISMATCH" if ev["amount"] == 9999 else want[kind]
        assert got == exp, (cid, ev["amount"], e["claim"], exp)
    if got == "ACQUIRED":
        assert e["claim"]["attempt"] == (2 if kind == "gone" else 1), e["claim"]
        assert re.fullmatch(r"[0-9a-f]{32}@[A-Za-z0-9._-]+:[0-9]+", e["claim"]["token"]), e["claim"]
    if got == "DUP_DONE":
        assert e["claim"]["state"] == "DONE", e["claim"]
assert twins == {"ACQUIRED": 10, "DUP_IN_PROGRESS": 10}, twins
PY
	line=$(grep -m1 -e "-gone-3\"" "$BATS_TEST_TMPDIR/out")
	run idemp-show --json "$id-gone-3"
	[ "$(jget "$output" owner)" = "$(jget "$line" claim.token)" ]
	[ "$(jget "$output" attempts)" = 2 ]
}

@test "idemp-done --stream: fenced finishes in flight, a lease-lost one among them" {
	id=$(uid fin)
	events "$id" 40 | idemp-claim --stream > "$BATS_TEST_TMPDIR/claimed"
	[ "$(grep -c '"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/claimed")" -eq 40 ]
	# another worker takes over key 17 once our lease ran out
	pg_sql "UPDATE $TBL SET lease_until = 0 WHERE key = '$id-17'"
	run --separate-stderr idemp-claim < <(ev "$id-17")
	[ "$status" -eq 0 ]
	newtok=$(jget "$output" claim.token)
	python3 - "$BATS_TEST_TMPDIR/claimed" > "$BATS_TEST_TMPDIR/results" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    k = int(e["claim"]["chargeId"].rsplit("-", 1)[1])
    if k % 3 == 0:
        e["debit"] = {"outcome": "DECLINED", "error": "HTTP 402: no funds"}
    else:
        e["debit"] = {"outcome": "OK", "ref": "TXN-%d" % k}
        e["notify"] = {"outcome": "OK" if k % 3 == 1 else "NOTIFY_FAILED"}
    print(json.dumps(e))
PY
	run --separate-stderr idemp-done --stream --inflight 8 < "$BATS_TEST_TMPDIR/results"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out"
	python3 - "$BATS_TEST_TMPDIR/out" "$id-17" <<'PY'
import json, sys
n = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    cid = e["claim"]["chargeId"]
    k = int(cid.rsplit("-", 1)[1])
    assert e["done"]["state"] == ["FAILED", "DONE", "DEBITED_NOTIFICATION_FAILED"][k % 3], (cid, e["done"])
    assert e["done"]["outcome"] == ("LEASE_LOST" if cid == sys.argv[2] else "OK"), e["done"]
    n += 1
assert n == 40, n
PY
	run idemp-show --json "$id-17"
	[ "$(jget "$output" state)" = IN_PROGRESS ]
	[ "$(jget "$output" owner)" = "$newtok" ]
	run idemp-show --json "$id-4"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" debitRef)" = TXN-4 ]
	run idemp-show --json "$id-6"
	[ "$(jget "$output" state)" = FAILED ]
	run idemp-show --json "$id-5"
	[ "$(jget "$output" state)" = DEBITED_NOTIFICATION_FAILED ]
}

# debited ID N: N claimed charges ID-1..N, each debited and notified.
debited() {
	events "$1" "$2" | idemp-claim --stream 2>/dev/null | python3 -c 'import json, sys
for l in sys.stdin:
    e = json.loads(l)
    assert e["claim"]["outcome"] == "ACQUIRED", e
    e["debit"] = {"outcome": "OK", "ref": "TXN-" + e["claim"]["chargeId"]}
    e["notify"] = {"outcome": "OK"}
    print(json.dumps(e))'
}

@test "finishes whose connection was reset after the server made them (the answers lost): sent again on a new connection, the record decides: OK, one finish each; in flight and one-shot" {
	id=$(uid rst)
	debited "$id" 6 > "$BATS_TEST_TMPDIR/debited"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/debited")" -eq 6 ]
	silent_relay "$id-3" reset-once
	IDEMKIT_STORE=$relayed run --separate-stderr idemp-done --stream < "$BATS_TEST_TMPDIR/debited"
	echo "$stderr"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 6 ]
	[ "$(printf '%s\n' "$output" | grep -c '"done":{"outcome":"OK"')" -eq 6 ]
	[[ $stderr == *"finishes in flight when the connection went: sending them again"* ]]
	for i in 1 2 3 4 5 6; do
		s=$(idemp-show --json "$id-$i")
		[ "$(jget "$s" state)" = DONE ]
		[ "$(printf '%s' "$s" | grep -o '"op":"finish"' | wc -l)" -eq 1 ]
	done
	# one-shot: the blocking finish, the same
	debited "$id-one" 1 > "$BATS_TEST_TMPDIR/one"
	silent_relay "$id-one-1" reset-once
	IDEMKIT_STORE=$relayed run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/one"
	echo "$stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[[ $stderr == *"the finish's connection went before its answer; sending it again"* ]]
	s=$(idemp-show --json "$id-one-1")
	[ "$(jget "$s" state)" = DONE ]
	[ "$(printf '%s' "$s" | grep -o '"op":"finish"' | wc -l)" -eq 1 ]
	kill "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null || true
	RELAY_PID=
}

@test "serialization failures in a batch are sent again; past the bound each answers 75 naming the state" {
	pg_sql "CREATE SEQUENCE ${TBL}_n;
		CREATE FUNCTION ${TBL}_flaky() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN
			IF nextval('${TBL}_n') <= current_setting('idemkit.fail')::int THEN
				RAISE EXCEPTION 'test: could not serialize' USING ERRCODE = 'serialization_failure';
			END IF;
			RETURN NEW;
		END \$\$;
		CREATE TRIGGER flaky BEFORE INSERT ON $TBL FOR EACH ROW EXECUTE FUNCTION ${TBL}_flaky();
		GRANT USAGE ON SEQUENCE ${TBL}_n TO idemkit"
	pg_sql "ALTER DATABASE idemkit SET idemkit.fail = 3"
	id=$(uid ser)
	events "$id" 10 > "$BATS_TEST_TMPDIR/ev"
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/ev"
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 10 ]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE attempts = 1")" -eq 10 ]
	pg_sql "ALTER SEQUENCE ${TBL}_n RESTART; ALTER DATABASE idemkit SET idemkit.fail = 100000"
	events "$id-x" 3 > "$BATS_TEST_TMPDIR/ev2"
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/ev2"
	pg_sql "ALTER DATABASE idemkit RESET idemkit.fail"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"TEMPFAIL"' <<<"$output")" -eq 3 ]
	[[ $stderr == *"could not serialize"*40001* ]]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE key LIKE '$id-x-%'")" -eq 0 ]
}

@test "the connection killed between batches: found before the next batch is sent, which reconnects and passes; killed with a batch out: that batch answers 75 (never replayed blindly), the next reconnects and passes" {
	id=$(uid kill)
	mkfifo "$BATS_TEST_TMPDIR/in"
	idemp-claim --stream < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" &
	CLAIM_PID=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	# lines N: wait (bounded) until the stream wrote N envelopes
	lines() {
		for _ in $(seq 200); do [ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -ge "$1" ] && break; sleep 0.05; done
		[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq "$1" ]
	}
	kill_backend() {
		[ "$(pg_sql "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'idemkit'")" -eq 1 ]
	}
	events "$id-a" 5 >&5
	lines 5
	# between batches: nothing is due on the connection, so its end is
	# seen before anything is sent
	kill_backend
	# one write (under PIPE_BUF): the stream reads the five at once, one batch
	events "$id-b" 5 > "$BATS_TEST_TMPDIR/b"
	cat "$BATS_TEST_TMPDIR/b" >&5
	lines 10
	# with a batch out: the table locked, so the batch waits on the server
	# until its connection is killed
	pg_sql "BEGIN; LOCK TABLE $TBL IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(5); COMMIT" >/dev/null 5>&- &
	lock_pid=$!
	for _ in $(seq 100); do
		[ "$(pg_sql "SELECT count(*) FROM pg_locks WHERE relation = '$TBL'::regclass AND granted AND mode = 'AccessExclusiveLock'")" -eq 1 ] && break
		sleep 0.05
	done
	events "$id-c" 5 > "$BATS_TEST_TMPDIR/c"
	cat "$BATS_TEST_TMPDIR/c" >&5
	for _ in $(seq 100); do
		[ "$(pg_sql "SELECT count(*) FROM pg_stat_activity WHERE usename = 'idemkit' AND wait_event_type = 'Lock'")" -eq 1 ] && break
		sleep 0.05
	done
	kill_backend
	lines 15
	wait "$lock_pid"
	events "$id-d" 5 >&5
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	cat "$BATS_TEST_TMPDIR/err"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 20 ]
	for b in a b d; do
		[ "$(grep -e "-$b-" "$BATS_TEST_TMPDIR/out" | grep -c '"outcome":"ACQUIRED"')" -eq 5 ]
	done
	[ "$(grep -e "-c-" "$BATS_TEST_TMPDIR/out" | grep -c '"outcome":"TEMPFAIL"')" -eq 5 ]
	[ "$(grep -c 'connection lost with statements in flight' "$BATS_TEST_TMPDIR/err")" -ge 1 ]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE key LIKE '$id-%'")" -eq 15 ]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE key LIKE '$id-c-%'")" -eq 0 ]
}

@test "a claim that waited for the server to come back goes with its whole lease: its sentBootMs is read when it is sent, not when it was read (the debit's proof of the lease)" {
	id=$(uid late)
	stream_start
	ev "$id-a" >&5
	stream_lines 1
	# the server stopped, back 2 s later: the next claim is read at once
	# and sent once the connection is made again
	pg_halt
	{ sleep 2; pg_resume; } 5>&- &
	back=$!
	b_read=$(awk '{ printf "%d", $1 * 1000 }' /proc/uptime)
	ev "$id-b" >&5
	wait "$back"
	stream_lines 2
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	b=$(grep -e "$id-b" "$BATS_TEST_TMPDIR/out")
	[ "$(jget "$b" claim.outcome)" = ACQUIRED ]
	sent=$(jget "$b" claim.sentBootMs)
	echo "read at $b_read, sentBootMs $sent"
	# read before the server was back, sent after: over a second later
	[ "${sent%.*}" -ge $((b_read + 1000)) ]
	grep -q "store connection lost; reconnected" "$BATS_TEST_TMPDIR/err"
}

# hold_key KEY: another session's uncommitted insert of KEY, held (in the
# background: HOLD_PID) until release_key rolls it back (cancels its
# sleep); returns once the insert is in.
hold_key() {
	pg_sql "BEGIN; INSERT INTO $TBL (key, state, fingerprint, created_at, updated_at, expires_at)
		VALUES ('$1', 'IN_PROGRESS', 'held', 0, 0, 0); SELECT pg_sleep(120); ROLLBACK" >/dev/null 2>&1 5>&- &
	HOLD_PID=$!
	for _ in $(seq 300); do
		[ "$(pg_sql "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%''$1''%'")" = 1 ] && return 0
		sleep 0.1
	done
	echo "the insert of $1 was never held" >&2; return 1
}
release_key() {
	pg_sql "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%''$1''%'" >/dev/null
	wait "$HOLD_PID" || true    # (cancelled: psql fails, the insert rolled back)
	HOLD_PID=
}
# until_lock_wait: until a session of the test's database waits for a lock
# (the claim behind hold_key's insert), at most 30 s.
until_lock_wait() {
	for _ in $(seq 300); do
		[ "$(pg_sql "SELECT count(*) FROM pg_stat_activity WHERE datname = 'idemkit' AND wait_event_type = 'Lock'")" -ge 1 ] && return 0
		sleep 0.1
	done
	echo "no claim ever waited for the held insert" >&2; return 1
}

@test "a claim that waits at the server behind another session's uncommitted insert for longer than its lease: its sentBootMs is read before it left (bounded from above), so the debit is LEASE_SHORT, nothing sent; one-shot and in the pipeline (issue 45)" {
	for mode in one-shot stream; do
		k=$(uid "held-$mode")
		hold_key "$k"
		t0=$(boot_ms)
		if [ "$mode" = stream ]; then a=--stream; else a=; fi
		ev "$k" | idemp-claim $a --lease 2s > "$BATS_TEST_TMPDIR/c" 2> "$BATS_TEST_TMPDIR/c.err" &
		CLAIM_PID=$!
		until_lock_wait
		seen=$(boot_ms)
		# held past its lease of 2 s (one sleep to that deadline), then let go
		sleep 2.2
		release_key "$k"
		wait "$CLAIM_PID"
		CLAIM_PID=
		c=$(cat "$BATS_TEST_TMPDIR/c")
		sent=$(jget "$c" claim.sentBootMs)
		echo "$mode: started $t0, seen waiting $seen, sentBootMs $sent, answered by $(boot_ms)"
		[ "$(jget "$c" claim.outcome)" = ACQUIRED ]
		# sent after the claim started and before it was seen waiting at
		# the server: its lease began no earlier than that
		[ "${sent%.*}" -ge "$t0" ]
		[ "${sent%.*}" -le "$seen" ]
		# the lease of 2 s went by while it waited: nothing to the bank
		# (nothing listens there: a call would be 75, not 15)
		run -15 --separate-stderr charge-debit --url "http://127.0.0.1:$(free_port)/debits" \
			--timeout 500ms --lease-margin 100ms <<<"$c"
		[ "$(jget "$output" debit.outcome)" = LEASE_SHORT ]
		[[ "$(jget "$output" debit.error)" == *"nothing was sent"* ]]
	done
}

@test "a copy meeting its original in flight in the same stream is held until the original's finish is recorded: DUP_DONE, not left on the queue" {
	id=$(uid hold)
	# another process's claim: its copy here is DUP_IN_PROGRESS at once
	ev "$id-other" | idemp-claim >/dev/null 2>&1
	stream_start
	{ ev "$id-1"; ev "$id-1"; } > "$BATS_TEST_TMPDIR/pair"
	cat "$BATS_TEST_TMPDIR/pair" >&5
	stream_lines 1
	orig=$(sed -n 1p "$STREAM_OUT")
	[ "$(jget "$orig" claim.outcome)" = ACQUIRED ]
	ev "$id-other" >&5
	stream_lines 2
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.chargeId)" = "$id-other" ]
	# the original's finish is recorded downstream: the held copy follows
	run --separate-stderr idemp-done --state DONE <<<"$orig"
	[ "$status" -eq 0 ]
	stream_lines 3
	copy=$(sed -n 3p "$STREAM_OUT")
	[ "$(jget "$copy" claim.chargeId)" = "$id-1" ]
	[ "$(jget "$copy" claim.outcome)" = DUP_DONE ]
	[ "$(jget "$copy" claim.state)" = DONE ]
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	run idemp-show --json "$id-1"
	[ "$(jget "$output" attempts)" = 1 ]
	[ "$(jget "$output" owner)" = "$(jget "$orig" claim.token)" ]
}

@test "a held copy is passed on DUP_IN_PROGRESS before its original's lease ends (never takes it over), after 5 s at most, and at a stop signal at once" {
	id=$(uid holdlease)
	stream_start --lease 2s
	{ ev "$id-1"; ev "$id-1"; } > "$BATS_TEST_TMPDIR/pair"
	cat "$BATS_TEST_TMPDIR/pair" >&5
	stream_lines 1
	orig=$(sed -n 1p "$STREAM_OUT")
	[ "$(jget "$orig" claim.outcome)" = ACQUIRED ]
	stream_lines 2      # never finished: passed on within the lease
	copy=$(sed -n 2p "$STREAM_OUT")
	[ "$(jget "$copy" claim.outcome)" = DUP_IN_PROGRESS ]
	run idemp-show --json "$id-1"
	[ "$(jget "$output" attempts)" = 1 ]
	[ "$(jget "$output" owner)" = "$(jget "$orig" claim.token)" ]
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	# a long lease: held 5 s at most (sqs-recv's --max-age), then passed on
	rm -f "$BATS_TEST_TMPDIR/in"
	stream_start --lease 120s
	{ ev "$id-3"; ev "$id-3"; } > "$BATS_TEST_TMPDIR/pair"
	cat "$BATS_TEST_TMPDIR/pair" >&5
	stream_lines 1
	t0=$(date +%s%N)
	stream_lines 2
	t1=$(date +%s%N)
	echo "held for $(( (t1 - t0) / 1000000 )) ms"
	[ $(( (t1 - t0) / 1000000 )) -lt 9000 ]
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	# a stop signal passes a held copy on at once
	rm -f "$BATS_TEST_TMPDIR/in"
	stream_start --lease 120s
	{ ev "$id-2"; ev "$id-2"; } > "$BATS_TEST_TMPDIR/pair"
	cat "$BATS_TEST_TMPDIR/pair" >&5
	stream_lines 1
	kill -TERM "$CLAIM_PID"
	st=0
	wait "$CLAIM_PID" || st=$?
	CLAIM_PID=
	exec 5>&-
	[ "$st" -eq 143 ]
	[ "$(wc -l < "$STREAM_OUT")" -eq 2 ]
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
}

@test "held copies take no claim slot: with --inflight 1 the claims after a held copy go on while it waits" {
	id=$(uid holdslot)
	stream_start --inflight 1
	{ ev "$id-1"; ev "$id-1"; for k in 2 3 4 5 6; do ev "$id-$k"; done; } > "$BATS_TEST_TMPDIR/seven"
	cat "$BATS_TEST_TMPDIR/seven" >&5
	stream_lines 6
	[ "$(grep -c '"outcome":"ACQUIRED"' "$STREAM_OUT")" -eq 6 ]
	orig=$(grep -e "\"$id-1\"" "$STREAM_OUT")
	run --separate-stderr idemp-done --state DONE <<<"$orig"
	[ "$status" -eq 0 ]
	stream_lines 7
	[ "$(jget "$(sed -n 7p "$STREAM_OUT")" claim.outcome)" = DUP_DONE ]
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
}

@test "a stream's store steps connect and prepare at start, before their first envelope; with the server down at start the first envelope says why (75), as before" {
	id=$(uid warm)
	conns() { pg_sql "SELECT count(*) FROM pg_stat_activity WHERE usename = 'idemkit'"; }
	[ "$(conns)" -eq 0 ]
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	idemp-claim --stream < "$BATS_TEST_TMPDIR/fifo" > "$BATS_TEST_TMPDIR/out" 2>&1 3>&- &
	CLAIM_PID=$!
	exec 5> "$BATS_TEST_TMPDIR/fifo"
	# nothing sent yet: the connection is there (before: made by the first envelope)
	for _ in $(seq 100); do [ "$(conns)" -ge 1 ] && break; sleep 0.1; done
	[ "$(conns)" -eq 1 ]
	ev "$id-1" >&5
	for _ in $(seq 100); do grep -q ACQUIRED "$BATS_TEST_TMPDIR/out" && break; sleep 0.1; done
	exec 5>&-
	wait "$CLAIM_PID"
	CLAIM_PID=
	[ "$(grep -c '"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/out")" -eq 1 ]
	# the server down when the step starts: nothing to connect to, and the
	# first envelope is refused with the reason at once (not held for a
	# reconnect), the next one goes on once the server is back
	pg_halt
	: > "$BATS_TEST_TMPDIR/out"
	idemp-claim --stream < "$BATS_TEST_TMPDIR/fifo" > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" 3>&- &
	CLAIM_PID=$!
	exec 5> "$BATS_TEST_TMPDIR/fifo"
	ev "$id-2" >&5
	for _ in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/out" ] && break; sleep 0.1; done
	[ "$(jget "$(head -1 "$BATS_TEST_TMPDIR/out")" claim.outcome)" = TEMPFAIL ]
	grep -q 'connect' <<<"$(jget "$(head -1 "$BATS_TEST_TMPDIR/out")" claim.error)"
	pg_resume 5>&-             # the server must not hold the pipe open
	ev "$id-3" >&5
	for _ in $(seq 300); do [ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -ge 2 ] && break; sleep 0.1; done
	exec 5>&-
	wait "$CLAIM_PID" || true
	CLAIM_PID=
	[ "$(jget "$(sed -n 2p "$BATS_TEST_TMPDIR/out")" claim.outcome)" = ACQUIRED ]
}
