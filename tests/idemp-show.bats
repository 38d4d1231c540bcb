#!/usr/bin/env bats
# idemp-show and idemp-list: the operator's and cron's view of the store.

bats_require_minimum_version 1.5.0
load helper
load redis_helper
load bank_helper

setup() { export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db; }
teardown() { redis_stop cache; bank_stop; }   # the tests that start them

@test "idemp-show: human view answers debited, holder, attempts, bank ref" {
	env=$(ev CHG-H1 | idemp-claim 2>/dev/null)
	run idemp-show CHG-H1
	[ "$status" -eq 0 ]
	[[ "$output" == *"state        IN_PROGRESS"* ]]
	tok=$(jget "$env" claim.token)
	[[ "$output" == *"held by $(hostname | cut -c1-63) pid "*" (token ${tok:0:8}), "*" left"* ]]
	[[ "$output" == *"attempts     1"* ]]
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-9\"},\"notify\":{\"outcome\":\"OK\"}}" | idemp-done >/dev/null
	run idemp-show CHG-H1
	[[ "$output" == *"debited      yes"* ]]
	[[ "$output" == *"bank ref     TXN-9"* ]]
}

@test "idemp-show writes a stored text with control bytes (a bank's reason, its reference) as \\xNN, never raw: an escape sequence in a decline reaches the operator's terminal as text" {
	env=$(ev CHG-ESC1 | idemp-claim 2>/dev/null)
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"DECLINED\",\"ref\":\"R\\u001b[2J\",\"error\":\"insufficient funds \\u001b]0;owned\\u0007 \\u001b[31mred\\\\x\"}}" |
		idemp-done --state FAILED >/dev/null 2>&1
	# stored as the bank sent it
	[[ "$(jget "$(idemp-show --json CHG-ESC1)" lastError)" == *$'\e]0;owned\a'* ]]
	run -0 idemp-show CHG-ESC1
	[[ "$output" != *$'\e'* ]]; [[ "$output" != *$'\a'* ]]
	[[ "$output" == *'last error   '*'insufficient funds \x1b]0;owned\x07 \x1b[31mred\\x'* ]]
	# the timeline's finish line too
	[[ "$output" == *'finish     FAILED, bank ref '*', error insufficient funds \x1b]0;owned\x07 \x1b[31mred\\x'* ]]
	# plain text stays as it is
	[[ "$output" == *"state        FAILED"* ]]
}

@test "idemp-show --json, several ids, stdin, unknown -> 1" {
	ev CHG-H2 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show --json CHG-H2 CHG-NOPE
	[ "$status" -eq 1 ]
	[ "$(jget "${lines[0]}" chargeId)" = CHG-H2 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "$stderr" == *"CHG-NOPE: no record"* ]]
	run --separate-stderr idemp-show --json <<<"CHG-H2"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" state)" = IN_PROGRESS ]
}

@test "idemp-show: '-' reads chargeIds from stdin in its place; CRLF lines too" {
	ev CHG-H3 | idemp-claim >/dev/null 2>&1
	ev CHG-H4 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show --json CHG-H3 - <<<$'CHG-H4\r\n\nCHG-NOPE'
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" chargeId)" = CHG-H3 ]
	[ "$(jget "${lines[1]}" chargeId)" = CHG-H4 ]
	[ "$stderr" = "idemp-show: CHG-NOPE: no record in $IDEMKIT_STORE" ]
}

@test "idemp-show and idemp-forget refuse an empty chargeId: 64 before any lookup" {
	ev CHG-H5 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-show CHG-H5 ''
	[ "$status" -eq 64 ]
	[ -z "$output" ]
	[ "$stderr" = "idemp-show: empty chargeId (argument 2)" ]
	run --separate-stderr idemp-forget ''
	[ "$status" -eq 64 ]
	[ "$stderr" = "idemp-forget: empty chargeId (argument 1)" ]
	# the store is not opened either: a bad one is not what is reported
	run --separate-stderr idemp-show --store nope: ''
	[ "$status" -eq 64 ]
}

@test "idemp-show: help, version, bad option, bad store" {
	run idemp-show --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"1  EMPTY"* ]]
	run idemp-show --version
	[ "$status" -eq 0 ]
	run idemp-show --nope
	[ "$status" -eq 64 ]
	run idemp-show --store x:y CHG
	[ "$status" -eq 78 ]
}

@test "idemp-list: empty store -> 1; help; bad options -> 64" {
	idemp-init >/dev/null
	run --separate-stderr idemp-list
	[ "$status" -eq 1 ]
	run idemp-list --help
	[ "$status" -eq 0 ]
	run idemp-list --state NOPE
	[ "$status" -eq 64 ]
	run idemp-list --older-than soon
	[ "$status" -eq 64 ]
	run idemp-list --store x:y
	[ "$status" -eq 78 ]
}

@test "idemp-list: one JSON record per line with the stored event" {
	ev CHG-L1 | idemp-claim >/dev/null 2>&1
	ev CHG-L2 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-list --state IN_PROGRESS
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "$(jget "${lines[0]}" event)" amount)" = 2500 ]
}

@test "idemp-list --format event gives the stored bodies; bad format is 64" {
	ev CHG-F1 | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-list --format event
	[ "$status" -eq 0 ]
	[ "$output" = "$(ev CHG-F1)" ]
	run idemp-list --format xml
	[ "$status" -eq 64 ]
}

@test "idemp-show: the history as a UTC timeline, one line per transition; --json has the same entries" {
	env=$(ev CHG-T1 | idemp-claim --lease 60s 2>/dev/null)
	tok=$(jget "$env" claim.token)
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-T1\"},\"notify\":{\"outcome\":\"NOTIFY_FAILED\",\"error\":\"HTTP 503\"}}" | idemp-done >/dev/null
	json=$(idemp-show --json CHG-T1)
	run --separate-stderr idemp-show CHG-T1
	[ "$status" -eq 0 ]
	[[ "$output" == *"history      UTC, oldest first"* ]]
	# the lines are the JSON's entries, times rendered by python from the JSON
	python3 - "$json" "$output" <<'PY'
import datetime, json, sys
h = json.loads(sys.argv[1])["history"]
lines = [l for l in sys.argv[2].splitlines() if l.startswith("    ")]
iso = lambda ms: datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (ms % 1000)
assert len(h) == 2 and len(lines) == 2, (h, lines)
c, f = h
# who: the host and pid the token names, and its first 8 hex digits
host, pid = c["owner"].split("@")[1].rsplit(":", 1)
who = ["by", host, "pid", pid, "(token", c["owner"][:8] + ")"]
assert lines[0].split() == [iso(c["at"]), "claim", "attempt", "1,", "lease", "until", iso(c["leaseUntil"]) + ","] + who, lines[0]
assert lines[1].split() == [iso(f["at"]), "finish", "DEBITED_NOTIFICATION_FAILED,", "bank", "ref", "TXN-T1,", "error", "HTTP", "503,"] + who, lines[1]
PY
	[ "${tok:0:8}" = "$(jget "$json" owner | cut -c1-8)" ]
	# times beside now in one form, past and future: days once there is one
	re=$'\n  created      [-0-9T:.]+Z \\(0h00m0[0-9]s ago\\)\n'
	[[ "$output" =~ $re ]]
	re=$'\n  expires      [-0-9T:.]+Z \\(in 29d23h5[0-9]m[0-9][0-9]s\\)\n'
	[[ "$output" =~ $re ]]
}

@test "a chargeId outside the chargeId alphabet is quoted in messages, so no two read alike; a plain one as it is" {
	ev CHG-Q1 | idemp-claim >/dev/null 2>&1
	run -1 --separate-stderr idemp-show 'CHG "a b' CHG-Q2
	[ "${stderr_lines[0]}" = "idemp-show: \"CHG \\\"a b\": no record in $IDEMKIT_STORE" ]
	[ "${stderr_lines[1]}" = "idemp-show: CHG-Q2: no record in $IDEMKIT_STORE" ]
	run -1 --separate-stderr idemp-forget $'CHG-1\x1b[2J'
	[ "$stderr" = 'idemp-forget: "CHG-1\u001b[2J": no record' ]
}

# The store of the previous release: the records table without a history
# column (its v1 schema, made by hand here).
old_store() {
	python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.executescript("""
PRAGMA journal_mode = WAL;
CREATE TABLE records (key TEXT PRIMARY KEY NOT NULL,
 state TEXT NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE', 'FAILED', 'DEBITED_NOTIFICATION_FAILED')),
 owner TEXT, lease_until INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
 fingerprint TEXT NOT NULL, event TEXT, debit_ref TEXT, last_error TEXT,
 created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX records_state ON records (state, updated_at);
PRAGMA user_version = 1;
""")
fp = "243d21ec76d04362e7f3f90d52ed9b52b45bf51641592c23ab31402081d37c46"
ev = '{"chargeId":"%s","accountId":"ACC-0042","amount":2500,"currency":"INR","chargeType":"SMS_ALERT_FEE","dueDate":"2026-11-30"}'
c.execute("INSERT INTO records VALUES ('CHG-OLD1', 'DONE', 'aaaa', 1, 1, ?, ?, 'TXN-OLD', NULL, 1000, 2000, 4102444800)", (fp, ev % "CHG-OLD1"))
c.execute("INSERT INTO records VALUES ('CHG-OLD2', 'IN_PROGRESS', 'bbbb', 1, 3, ?, ?, NULL, NULL, 1000, 2000, 4102444800)", (fp, ev % "CHG-OLD2"))
c.commit()
PY
}

columns() { sqlite3 "$1" "SELECT group_concat(name, ' ') FROM pragma_table_info('records')"; }

@test "a store from the previous release (no history column) is migrated on open and by idemp-init; its records then gain history" {
	db=$BATS_TEST_TMPDIR/old.db
	old_store "$db"
	[[ "$(columns "$db")" != *history* ]]
	export IDEMKIT_STORE=sqlite:$db
	# a record written before: no history, shown as such
	run --separate-stderr idemp-show CHG-OLD1
	[ "$status" -eq 0 ]
	[[ "$output" == *"bank ref     TXN-OLD"* ]]
	[[ "$output" == *"history      -"* ]]
	[[ "$(columns "$db")" == *history* ]]
	[ "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["history"])' "$(idemp-show --json CHG-OLD1)")" = "[]" ]
	# its expired claim is taken over: attempt 4, the first entry
	env=$(ev CHG-OLD2 | idemp-claim 2>/dev/null)
	[ "$(jget "$env" claim.attempt)" = 4 ]
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-O2\"},\"notify\":{\"outcome\":\"OK\"}}" | idemp-done >/dev/null
	python3 - "$(idemp-show --json CHG-OLD2)" "$(jget "$env" claim.token)" <<'PY'
import json, sys
r, tok = json.loads(sys.argv[1]), sys.argv[2]
h = r["history"]
assert [e["op"] for e in h] == ["claim", "finish"], h
assert h[0]["attempt"] == 4 and h[0]["owner"] == tok and h[1]["debitRef"] == "TXN-O2", h
assert r["state"] == "DONE" and r["attempts"] == 4, r
PY
	# a history that is not JSON (edited by hand) starts afresh rather than
	# failing the transition
	env=$(ev CHG-BRK | idemp-claim 2>/dev/null)
	sqlite3 "$db" "UPDATE records SET history = 'not json' WHERE key = 'CHG-BRK'"
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"LEASE_SHORT\"}}" | idemp-done >/dev/null
	python3 - "$(idemp-show --json CHG-BRK)" "$(jget "$env" claim.token)" <<'PY'
import json, sys
r, tok = json.loads(sys.argv[1]), sys.argv[2]
assert r["history"] == [{"at": r["updatedAt"], "op": "release", "owner": tok}], r["history"]
PY
	# the version is unchanged: the previous release still opens the file
	[ "$(sqlite3 "$db" 'PRAGMA user_version')" = 1 ]
	# idemp-init migrates too, and again is a no-op
	db2=$BATS_TEST_TMPDIR/old2.db
	old_store "$db2"
	run --separate-stderr idemp-init --store "sqlite:$db2"
	[ "$status" -eq 0 ]
	[[ "$(columns "$db2")" == *history* ]]
	run --separate-stderr idemp-init --store "sqlite:$db2"
	[ "$status" -eq 0 ]
	[ "$(columns "$db2" | grep -o history | wc -l)" -eq 1 ]
}

@test "history through the port: the entry of each op, the bound of 20, the DynamoDB List read back with the claims' attempts (C unit test)" {
	run "$IDEMKIT_TEST_BIN/history"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = PASSED ]
	[ "$(grep -c '^ok ' <<<"$output")" -eq 10 ]
}

@test "behind the Redis fast path (IDEMKIT_CACHE): idemp-show has the store's history; a duplicate the cache answered adds nothing" {
	require_redis
	redis_start cache
	export IDEMKIT_CACHE=redis://127.0.0.1:$REDIS_PORT_cache
	env=$(ev CHG-C1 | idemp-claim 2>/dev/null)
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-C1\"},\"notify\":{\"outcome\":\"OK\"}}" | idemp-done >/dev/null
	[ "$(rcli cache HGET idemkit:cache:CHG-C1 state)" = DONE ]
	IDEMKIT_LOG=debug run --separate-stderr idemp-claim < <(ev CHG-C1)
	[ "$status" -eq 10 ]
	[[ "$stderr" == *"claim answered by the cache"* ]]
	run --separate-stderr idemp-show --json CHG-C1
	[ "$status" -eq 0 ]
	python3 - "$output" <<'PY'
import json, sys
h = json.loads(sys.argv[1])["history"]
assert [e["op"] for e in h] == ["claim", "finish"] and h[1]["debitRef"] == "TXN-C1", h
PY
}

@test "idemp-show, idemp-list, idemp-stats never create a store: 78 naming where they looked and what chooses it (issue 29 item 2)" {
	unset IDEMKIT_STORE
	export IDEMKIT_STATE_DIR=$BATS_TEST_TMPDIR/wrong
	for cmd in "idemp-show CHG-X1" "idemp-list" "idemp-stats"; do
		run --separate-stderr $cmd
		[ "$status" -eq 78 ]
		[ -z "$output" ]
		[[ "$stderr" == *": no store at sqlite:$BATS_TEST_TMPDIR/wrong/idempotency.db (chosen by the default state directory: IDEMKIT_STATE_DIR, XDG_STATE_HOME, HOME; set IDEMKIT_STORE, or IDEMKIT_STATE_DIR"* ]]
	done
	[ ! -e "$BATS_TEST_TMPDIR/wrong" ]   # not the directory either
	# a store named by URL that is not there
	IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/nope.db run --separate-stderr idemp-show CHG-X1
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"no store at sqlite:$BATS_TEST_TMPDIR/nope.db (chosen by IDEMKIT_STORE or --store;"* ]]
	[ ! -e "$BATS_TEST_TMPDIR/nope.db" ]
	# once the store exists, a missing charge is "no record in" that store
	idemp-init >/dev/null
	run --separate-stderr idemp-show CHG-X1
	[ "$status" -eq 1 ]
	[ "$stderr" = "idemp-show: CHG-X1: no record in sqlite:$BATS_TEST_TMPDIR/wrong/idempotency.db" ]
	run --separate-stderr idemp-list
	[ "$status" -eq 1 ]
}

@test "a charge stuck behind a bank outage: idemp-show names the holder run (host, pid, token), says it exited, and why (issue 29 item 1)" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	bank_start
	bank_post /control '{"errorRate":1,"errorStatus":503}' >/dev/null
	printf '%s' "$(ev CHG-OUT1)" | sqs-send >/dev/null
	IDEMKIT_LOG=debug run --separate-stderr charge-worker --once --debit-timeout 2 \
		--notify-timeout 1 --notify-retries 0 --lease 60s
	bank_stop
	[ "$status" -eq 75 ]
	# the claim's log line carries the short token idemp-show prints
	claimlog=$(grep '"msg":"claim"' <<<"$stderr")
	tok=$(jget "$claimlog" token)
	[ "${#tok}" -eq 8 ]
	owner=$(jget "$(idemp-show --json CHG-OUT1)" owner)
	[ "${owner:0:8}" = "$tok" ]
	[[ "$owner" == *"@$(hostname | cut -c1-63 | tr -c 'A-Za-z0-9._\n-' _):"* ]]
	pid=${owner##*:}
	run --separate-stderr idemp-show CHG-OUT1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"state        IN_PROGRESS"* ]]
	[[ "$output" == *"lease        held by "*" pid $pid (token $tok), "*"s left"* ]]
	[[ "$output" == *"holder       exited: no process with that pid on this host"* ]]
	[[ "$output" == *"last error   TEMPFAIL from the bank: "*"503"*"(the lease decides the retry)"* ]]
	# on a live holder, on this host: running
	env=$(IDEMKIT_RUN_PID=$$ idemp-claim --lease 60s < <(ev CHG-OUT2))
	run idemp-show CHG-OUT2
	[[ "$output" == *"pid $$ (token "*"holder       running on this host"* ]]
}
