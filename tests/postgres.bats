#!/usr/bin/env bats
# The PostgreSQL store against a real PostgreSQL 15 started for this file
# (pg_helper.bash: throwaway directory, loopback port, SCRAM passwords,
# TLS with a CA made here): URL forms and the password kept out of every
# message, idemp-init (versioned migrations, many hosts at once, the purge),
# the recovery list on its partial index (the server's own plans, via
# auto_explain), group commit in --stream and its one-by-one redo,
# serialization failures retried then 75, the server down -> 75.  The
# claim/finish contract itself is tests/store.bats with
# IDEMKIT_TEST_BACKEND=postgres.

bats_require_minimum_version 1.5.0
load helper
load pg_helper

# one server for the file, which some tests stop and restart: the tests
# run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

# reason_stub_start: a loopback HTTP stub standing in for a bank and a
# notification gateway that answer with awkward reasons (python3: no
# emulator answers so).  POST /ok is 201 {"ref":"TXN-R1"}; /cut-503 and
# /cut-402 answer 503 / 402 with a JSON reason whose 200th byte is the
# first of a 3-byte character (199 x or y, then U+20B9 three times);
# /raw-503 and /raw-402 a body that is neither JSON nor UTF-8 (Latin-1
# bytes, a stray continuation byte, an overlong '/').  Sets STUB_URL.
reason_stub_start() {
	local d=$BATS_TEST_TMPDIR/stub
	mkdir -p "$d"
	python3 -c '
import http.server, json, os, sys
d = sys.argv[1]
def body(p):
    if p == "/ok": return 201, b"{\"ref\":\"TXN-R1\"}"
    st = int(p[-3:])
    if p.startswith("/cut-"):
        c = "x" if st == 503 else "y"
        return st, json.dumps({"reason": c * 199 + "\u20b9" * 3}, ensure_ascii=False).encode()
    return st, b"gateway says: caf\xe9 \x80 \xc0\xaf end"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        st, out = body(self.path)
        self.send_response(st); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(d + "/port.tmp", "w").write(str(s.server_address[1])); os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
' "$d" 2>"$d/log" 3>&- &
	STUB_PID=$!
	for _ in $(seq 100); do [ -s "$d/port" ] && break; sleep 0.05; done
	STUB_URL=http://127.0.0.1:$(cat "$d/port")
}
reason_stub_stop() {
	[ -n "${STUB_PID:-}" ] || return 0
	kill "$STUB_PID" 2>/dev/null || true
	wait "$STUB_PID" 2>/dev/null || true
	STUB_PID=
}

# last_error KEY: the record's lastError as the server holds it (psql's
# client encoding is UTF8), on one line.
last_error() { pg_sql "SELECT last_error FROM $TBL WHERE key = '$1'"; }

setup_file() {
	require_pg
	local d
	d=$(mktemp -d /tmp/idemkit-pgtls.XXXXXX)
	export TLS_DIR=$d
	# A CA of our own and a server certificate for localhost (only).
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=idemkit-test-ca \
		-keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca \
		-keyout "$d/other.key" -out "$d/other.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout "$d/server.key" \
		-out "$d/server.csr" 2>/dev/null
	printf 'subjectAltName=DNS:localhost\n' > "$d/ext"
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
		-CAcreateserial -days 2 -extfile "$d/ext" -out "$d/server.crt" 2>/dev/null
	pg_own "$d/server.key" "$d/server.crt"
	chmod 600 "$d/server.key"
	chmod 755 "$d"
	export PG_EXTRA_CONF="ssl = on
ssl_cert_file = '$d/server.crt'
ssl_key_file = '$d/server.key'"
	pg_start
}
teardown_file() {
	pg_stop
	rm -rf "$TLS_DIR"
}
setup() {
	export TBL=t_${BATS_TEST_NUMBER}_$RANDOM
	export IDEMKIT_STORE="$PG_URL?table=$TBL"
}
teardown() {
	reason_stub_stop
	standby_stop
	[ -z "${RELAY_PID:-}" ] || { kill "$RELAY_PID" 2>/dev/null; wait "$RELAY_PID" 2>/dev/null || true; }
}

# standby_start: a streaming standby of the file's server (pg_basebackup
# over the socket, -R; -c fast: the default spread checkpoint kept it
# waiting 95 s), in $PG_DIR/standby on a free loopback port, and
# waits until the primary lists it in pg_stat_replication.  standby_stop
# makes the primary asynchronous again first (with '*' named and no
# standby, every later commit would wait), then stops and removes it.
standby_start() {
	local _i
	pg_as "$PG_BIN/pg_basebackup" -h "$PG_DIR" -p "$PG_PORT" -U postgres -c fast \
		-D "$PG_DIR/standby" -R -X stream >"$PG_DIR/basebackup.log" 2>&1 ||
		{ cat "$PG_DIR/basebackup.log" >&2; return 1; }
	STANDBY_PORT=$(free_port)
	pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -l "$PG_DIR/standby.log" \
		-o "-p $STANDBY_PORT" -w -t 30 start >/dev/null || { tail "$PG_DIR/standby.log" >&2; return 1; }
	for _i in $(seq 300); do
		[ "$(pg_sql "SELECT count(*) FROM pg_stat_replication" postgres)" = 1 ] && return 0
		sleep 0.1
	done
	echo "the standby never streamed" >&2
	return 1
}
standby_stop() {
	[ -d "${PG_DIR:-}/standby" ] || return 0
	pg_sql "ALTER SYSTEM RESET synchronous_standby_names" postgres >/dev/null
	pg_sql "SELECT pg_reload_conf()" postgres >/dev/null
	pg_sql "ALTER ROLE idemkit RESET synchronous_commit" postgres >/dev/null
	pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -m immediate -w stop >/dev/null 2>&1 || true
	rm -rf "$PG_DIR/standby"
}

@test "idemp-init creates the table, prints the URL with the password as ***, and is idempotent" {
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[ "$output" = "postgres://idemkit:***@127.0.0.1:$PG_PORT/idemkit?table=$TBL" ]
	[[ $stderr != *"$PG_PASSWORD"* ]]
	[[ $stderr == *'"migrated"'*'"version":"1"'* ]]
	[[ $stderr == *'"migrated"'*'"version":"2"'* ]]
	[[ $stderr == *'"migrated"'*'"version":"3"'* ]]
	[ "$(pg_sql "SELECT version FROM idemkit_schema WHERE tbl = '$TBL'")" = 3 ]
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr != *'"migrated"'* ]]
	[[ $stderr != *NOTICE* ]]   # the server's notices are not printed
	run --separate-stderr idemp-claim < <(ev "$(uid a)")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
}

@test "idemp-init warns, exit 0, when a failover (or a crash) could lose finished records: synchronous_standby_names empty with a standby streaming, synchronous_commit off, local or remote_write" {
	# no standby, synchronous_commit on: nothing to say
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr != *synchronous_* ]]
	# synchronous_commit off for idemkit's role: a crash loses the last commits
	pg_sql "ALTER ROLE idemkit SET synchronous_commit = off" postgres
	run --separate-stderr idemp-init
	pg_sql "ALTER ROLE idemkit RESET synchronous_commit" postgres
	[ "$status" -eq 0 ]
	[ "$output" = "postgres://idemkit:***@127.0.0.1:$PG_PORT/idemkit?table=$TBL" ]
	[[ $stderr == *'"level":"warn"'*'"setting":"synchronous_commit","value":"off"'* ]]
	[[ $stderr != *synchronous_standby_names* ]]
	# a standby streaming asynchronously (the default: no names)
	standby_start
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr == *'"level":"warn"'*'"setting":"synchronous_standby_names","standbys":"1"'* ]]
	[[ $stderr != *'"setting":"synchronous_commit"'* ]]
	[[ $stderr != *"$PG_PASSWORD"* ]]
	# named, and synchronous: nothing to say
	pg_sql "ALTER SYSTEM SET synchronous_standby_names = '*'" postgres
	pg_sql "SELECT pg_reload_conf()" postgres
	for _ in $(seq 300); do
		[ "$(pg_sql "SELECT sync_state FROM pg_stat_replication" postgres)" = sync ] && break
		sleep 0.1
	done
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr != *synchronous_* ]]
	# named, but a commit returns once the standby has it in memory
	pg_sql "ALTER ROLE idemkit SET synchronous_commit = remote_write" postgres
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr == *'"setting":"synchronous_commit","value":"remote_write","standbys":"1"'* ]]
	[[ $stderr != *'"setting":"synchronous_standby_names"'* ]]
}

@test "postgresql:// and a bare postgres: with the PG* environment and a password file" {
	IDEMKIT_STORE="postgresql://idemkit:$PG_PASSWORD@127.0.0.1:$PG_PORT/idemkit?table=$TBL" \
		run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[ "$output" = "postgresql://idemkit:***@127.0.0.1:$PG_PORT/idemkit?table=$TBL" ]
	printf '127.0.0.1:%s:idemkit:idemkit:%s\n' "$PG_PORT" "$PG_PASSWORD" > "$BATS_TEST_TMPDIR/pgpass"
	chmod 600 "$BATS_TEST_TMPDIR/pgpass"
	PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=idemkit PGDATABASE=idemkit \
	PGPASSFILE=$BATS_TEST_TMPDIR/pgpass IDEMKIT_STORE="postgres:?table=$TBL" \
		run --separate-stderr idemp-claim < <(ev "$(uid bare)")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	# the default table name
	PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=idemkit PGDATABASE=idemkit \
	PGPASSFILE=$BATS_TEST_TMPDIR/pgpass run --separate-stderr idemp-init --store postgres:
	[ "$status" -eq 0 ]
	[ "$output" = postgres: ]
	[ "$(pg_sql "SELECT count(*) FROM idemkit_schema WHERE tbl = 'idemkit_records'")" = 1 ]
	# bare postgres: without a password anywhere -> 78, naming where one goes
	PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=idemkit PGDATABASE=idemkit \
	PGPASSFILE=/nonexistent run --separate-stderr idemp-init --store postgres:
	[ "$status" -eq 78 ]
	[[ $stderr == *"a password is needed"*"~/.pgpass"* ]]
}

@test "the URL's password is in no message: wrong password, unknown scheme, bad table, bad URL, --help" {
	bad=postgres://idemkit:WRONG-s3cret@127.0.0.1:$PG_PORT/idemkit?table=$TBL
	# on the command line a password is refused before anything (argv is public)
	run --separate-stderr idemp-init --store "$bad"
	[ "$status" -eq 78 ]
	[[ $stderr == *"password on the command line"*"IDEMKIT_STORE"* ]]
	[[ $stderr != *WRONG-s3cret* ]]
	run --separate-stderr idemp-init --store "postgres://idemkit@127.0.0.1:$PG_PORT/idemkit?password=WRONG-s3cret"
	[ "$status" -eq 78 ]
	[[ $stderr == *"password on the command line"* ]]
	[[ $stderr != *WRONG-s3cret* ]]
	IDEMKIT_STORE=$bad run --separate-stderr idemp-init
	[ "$status" -eq 78 ]
	[[ $stderr == *"password authentication failed"* ]]
	[[ $stderr != *WRONG-s3cret* ]]
	IDEMKIT_STORE=$bad run --separate-stderr idemp-claim < <(ev "$(uid pw)")
	[ "$status" -eq 78 ]
	[[ "$output$stderr" != *WRONG-s3cret* ]]
	for url in "mysql://root:WRONG-s3cret@db/x" "mongodb://:WRONG-s3cret@h:27017" "WRONG-s3cret"; do
		IDEMKIT_STORE=$url run --separate-stderr idemp-init
		[ "$status" -eq 78 ]
		[[ $stderr == *"unknown scheme"* || $stderr == *"no scheme"* ]]
		[[ $stderr != *WRONG-s3cret* ]]
	done
	IDEMKIT_STORE="postgres://u:WRONG-s3cret@h/db?table=No-Such" run --separate-stderr idemp-init
	[ "$status" -eq 78 ]
	[[ $stderr == *"table="*"[a-z0-9_]"* ]]
	[[ $stderr != *WRONG-s3cret* ]]
	IDEMKIT_STORE="postgres://u:WRONG-s3cret@h/db?sslmode=sometimes" run --separate-stderr idemp-init
	[ "$status" -eq 78 ]
	[[ $stderr == *sslmode* ]]
	[[ $stderr != *WRONG-s3cret* ]]
	IDEMKIT_STORE="postgres://idemkit@127.0.0.1:$PG_PORT/idemkit?password=$PG_PASSWORD&table=$TBL" \
		run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	# shown as libpq parsed it: the password in its place in the URL, as ***
	[ "$output" = "postgres://idemkit:***@127.0.0.1:$PG_PORT/idemkit?table=$TBL" ]
	[[ $stderr != *"$PG_PASSWORD"* ]]
	IDEMKIT_STORE=$bad run idemp-init --help
	[ "$status" -eq 0 ]
	[[ $output != *WRONG-s3cret* ]]
}

@test "a table idemp-init never made -> 78 naming idemp-init; a schema newer than this idemkit -> 78" {
	run --separate-stderr idemp-claim < <(ev "$(uid nt)")
	[ "$status" -eq 78 ]
	[ "$(jget "$output" claim.outcome)" = CONFIG ]
	[[ $stderr == *"does not exist"*"run idemp-init"* ]]
	run --separate-stderr idemp-stats
	[ "$status" -eq 78 ]
	[[ $stderr == *"does not exist"*"run idemp-init"* ]]
	idemp-init >/dev/null 2>&1
	pg_sql "UPDATE idemkit_schema SET version = 99 WHERE tbl = '$TBL'"
	run --separate-stderr idemp-init
	[ "$status" -eq 78 ]
	[[ $stderr == *"schema version 99 is newer than this idemkit (3)"* ]]
}

@test "idemp-init from 8 hosts at once: all 0, each migration applied once; an old schema (v1) is migrated" {
	pids=
	for i in 1 2 3 4 5 6 7 8; do
		( rc=0; idemp-init >/dev/null 2>"$BATS_TEST_TMPDIR/err$i" || rc=$?; echo $rc > "$BATS_TEST_TMPDIR/rc$i" ) &
		pids="$pids $!"
	done
	# shellcheck disable=SC2086
	wait $pids   # (not a bare wait: bats' own timeout watchdog is a child too)
	cat "$BATS_TEST_TMPDIR"/err*
	[ "$(cat "$BATS_TEST_TMPDIR"/rc* | sort -u)" = 0 ]
	[ "$(cat "$BATS_TEST_TMPDIR"/err* | grep -c '"migrated"')" -eq 3 ]
	[ "$(pg_sql "SELECT version FROM idemkit_schema WHERE tbl = '$TBL'")" = 3 ]
	# back to version 1 (no indexes, no history), then idemp-init applies only v2 and v3
	pg_sql "DROP INDEX ${TBL}_recover; DROP INDEX ${TBL}_expires; ALTER TABLE $TBL DROP COLUMN history; UPDATE idemkit_schema SET version = 1 WHERE tbl = '$TBL'"
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr == *'"version":"2"'*'"version":"3"'* ]]
	[[ $stderr != *'"version":"1"'* ]]
	[ "$(pg_sql "SELECT count(*) FROM pg_indexes WHERE tablename = '$TBL'")" = 3 ]
}

@test "a table from before the history column (v2) keeps working, with a warning; idemp-init migrates it (v3) and its records gain a history" {
	idemp-init >/dev/null 2>&1
	old=$(uid old)
	ev "$old" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	# the schema an idemkit before history made
	pg_sql "ALTER TABLE $TBL DROP COLUMN history; UPDATE idemkit_schema SET version = 2 WHERE tbl = '$TBL'"
	mid=$(uid mid)
	run --separate-stderr idemp-claim < <(ev "$mid")
	[ "$status" -eq 0 ]
	[[ $stderr == *'"level":"warn"'*"no history column"*"idemp-init"* ]]
	printf '%s\n' "$output" | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null 2>&1
	run --separate-stderr idemp-show --json "$mid"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" state)" = DEBITED_NOTIFICATION_FAILED ]
	[ "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["history"])' "$output")" = "[]" ]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 1 ]
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	# migrated: the old rows get an empty history, the next transition is kept
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr == *'"migrated"'*'"version":"3"'* ]]
	[[ $stderr != *"no history column"* ]]
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE history = '[]'")" = 2 ]
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope \
		| sed 's/}$/,"notify":{"outcome":"OK"}}/' | idemp-done --renotified >/dev/null 2>&1
	python3 - "$(idemp-show --json "$mid")" "$(idemp-show --json "$old")" <<'PY'
import json, sys
m, o = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert m["state"] == "DONE" and [e["op"] for e in m["history"]] == ["renotified"], m
assert o["state"] == "DONE" and o["history"] == [], o
PY
}

@test "purge: idemp-init deletes expired records in batches, keeps the rest" {
	idemp-init >/dev/null 2>&1
	live=$(uid live)
	ev "$live" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	pg_sql "INSERT INTO $TBL (key, state, fingerprint, created_at, updated_at, expires_at)
		SELECT 'OLD-' || g, 'DONE', 'fp', 0, 0, 1000 + g FROM generate_series(1, 2500) g"
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[[ $stderr == *'"purged expired records"'*'"deleted":"2500"'* ]]
	[ "$(pg_sql "SELECT count(*) FROM $TBL")" = 1 ]
	[ "$(jget "$(idemp-show --json "$live")" state)" = DONE ]
}

@test "recovery lists use the partial index, never a sequential scan (the server's plans, auto_explain)" {
	idemp-init >/dev/null 2>&1
	pg_sql "INSERT INTO $TBL (key, state, owner, lease_until, fingerprint, created_at, updated_at, expires_at)
		SELECT 'K-' || g, CASE WHEN g % 1000 = 0 THEN 'FAILED' WHEN g % 1000 = 1 THEN 'DEBITED_NOTIFICATION_FAILED'
			WHEN g % 1000 = 2 THEN 'IN_PROGRESS' ELSE 'DONE' END, 'o', 0, 'fp', g, g, 4000000000
		FROM generate_series(1, 200000) g; ANALYZE $TBL"
	pg_sql "ALTER ROLE idemkit SET auto_explain.log_min_duration = 0"
	for args in "--state FAILED" "--state DEBITED_NOTIFICATION_FAILED" "--state IN_PROGRESS" "--expired" "--state FAILED --older-than 1h"; do
		: > "$PG_DIR/server.log"
		# shellcheck disable=SC2086
		run --separate-stderr idemp-list $args
		[ "$status" -eq 0 ]
		[ "${#lines[@]}" -eq 200 ]
		plan=$(sed -n '/Query Text: SELECT key, state/,$p' "$PG_DIR/server.log")
		echo "$args: $plan"
		[[ $plan == *"Index Scan"*"${TBL}_recover"* ]]
		[[ $plan != *"Seq Scan"* ]]
	done
	# idemp-stats: one statement, on the same index; DONE from the estimate
	: > "$PG_DIR/server.log"
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	plan=$(sed -n '/Query Text: WITH n AS/,$p' "$PG_DIR/server.log")
	echo "stats: $output $plan"
	[[ $plan == *"Index"*"Scan"*"${TBL}_recover"* ]]
	[[ $plan != *"Seq Scan"* ]]
	pg_sql "ALTER ROLE idemkit RESET auto_explain.log_min_duration"
	python3 - "$output" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
assert s["states"]["IN_PROGRESS"] == 200 and s["states"]["FAILED"] == 200, s
assert s["states"]["DEBITED_NOTIFICATION_FAILED"] == 200 and s["dnfBacklog"] == 200, s
assert s["stuck"] == 200, s   # every lease 0: all ended
# reltuples after ANALYZE, less the 600 open records: 199400, within 1%
assert abs(s["states"]["DONE"] - 199400) < 2000, s
PY
}

@test "on a new table every keyed write plans on the primary key, never the _recover index (the server's plans, auto_explain): one-shot and a stream's prepared statements" {
	# A plan made on a new table took the partial _recover index (state,
	# updated_at, key) for "key = \$1 AND state = 'IN_PROGRESS'": every
	# finish read all IN_PROGRESS entries, live and dead, and a stream
	# kept that plan until the table was next analyzed.
	idemp-init >/dev/null 2>&1
	pg_sql "ALTER ROLE idemkit SET auto_explain.log_min_duration = 0"
	: > "$PG_DIR/server.log"
	id=$(uid keyed)
	ev "$id-done" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null 2>&1
	ev "$id-dnf" | idemp-claim 2>/dev/null | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null 2>&1
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope 2>/dev/null \
		| sed 's/}$/,"notify":{"outcome":"OK"}}/' | idemp-done --renotified >/dev/null 2>&1
	ev "$id-failed" | idemp-claim 2>/dev/null | idemp-done --state FAILED >/dev/null 2>&1
	idemp-forget "$id-failed" >/dev/null 2>&1
	# past the 5 custom plans: the stream's prepared statements go generic
	for i in $(seq 30); do ev "$id-s$i"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	pg_sql "ALTER ROLE idemkit RESET auto_explain.log_min_duration"
	[ "$(pg_sql "SELECT state, count(*) FROM $TBL GROUP BY state")" = "DONE|32" ]
	python3 - "$PG_DIR/server.log" "$TBL" <<'PY'
import re, sys
log, tbl = open(sys.argv[1]).read(), sys.argv[2]
# one auto_explain entry per "duration:" line; the keyed writes are the
# UPDATEs and DELETEs by key (the listing's plan rightly takes _recover)
entries = re.split(r"\n(?=\S.*LOG:  duration: )", log)
keyed = [e for e in entries if re.search(r"Query Text: .*(UPDATE|DELETE FROM) .*\bkey = \$1", e)]
print("keyed writes planned:", len(keyed))
assert len(keyed) >= 34, len(keyed)
for e in keyed:
    assert "Index Scan using %s_pkey" % tbl in e and "_recover" not in e, e
PY
}

@test "sslmode=verify-full with our CA: connects; another CA or another host name -> 78" {
	idemp-init >/dev/null 2>&1
	url="postgres://idemkit:$PG_PASSWORD@localhost:$PG_PORT/idemkit?table=$TBL&sslmode=verify-full"
	IDEMKIT_STORE="$url&sslrootcert=$TLS_DIR/ca.crt" run --separate-stderr idemp-claim < <(ev "$(uid tls)")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	IDEMKIT_STORE="$url&sslrootcert=$TLS_DIR/other.crt" run --separate-stderr idemp-claim < <(ev "$(uid tls2)")
	[ "$status" -eq 78 ]
	[[ $stderr == *"certificate verify failed"* ]]
	IDEMKIT_STORE="postgres://idemkit:$PG_PASSWORD@127.0.0.1:$PG_PORT/idemkit?table=$TBL&sslmode=verify-full&sslrootcert=$TLS_DIR/ca.crt" \
		run --separate-stderr idemp-claim < <(ev "$(uid tls3)")
	[ "$status" -eq 78 ]
	[[ $stderr == *"does not match host name"* ]]
	[[ $stderr != *"$PG_PASSWORD"* ]]
}

@test "--stream: one connection, the waiting claims in flight sharing a few commits; a failing one fails alone, the others pass" {
	idemp-init >/dev/null 2>&1
	for i in $(seq 1 20); do ev "$(uid "g$i")"; done > "$BATS_TEST_TMPDIR/evs"
	: > "$PG_DIR/server.log"
	# each write transaction takes one transaction id: 20 claims share
	# far fewer than 20 (the probes take one each).  The connection is made
	# before the first line is read, so the first claim goes out alone and
	# the rest with the batches after it, as they are parsed: two or three
	# here, eight under the sanitizer build's slower parsing
	x0=$(pg_sql "SELECT pg_current_xact_id()")
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/evs"
	x1=$(pg_sql "SELECT pg_current_xact_id()")
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 20 ]
	echo "transactions for 20 claims: $((x1 - x0 - 1))"
	[ $((x1 - x0 - 1)) -ge 1 ]; [ $((x1 - x0 - 1)) -le 10 ]
	# one connection for the whole stream
	[ "$(grep -c 'connection authorized: user=idemkit' "$PG_DIR/server.log")" -eq 1 ]
	run --separate-stderr idemp-done --stream --state DONE <<<"$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"state":"DONE"' <<<"$output")" -eq 20 ]
	# a body the server refuses (not UTF-8) aborts its batch: the others
	# are sent again, and only that envelope fails, DATAERR (to the DLQ).
	# A batch goes out sorted by key: "a1" is answered before "bad" fails
	# (its claim rolled back with the batch), "z2" after.
	{ ev "$(uid z2)"; printf '{"chargeId":"%s","accountId":"ACC-1","amount":100,"currency":"INR","chargeType":"X","note":"\xff\xfe"}\n' "$(uid bad)"; ev "$(uid a1)"; } > "$BATS_TEST_TMPDIR/evs2"
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/evs2"
	echo "$output"; echo "$stderr"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 2 ]
	bad=$(grep -a -e "-bad" <<<"$output")
	[ "$(jget "$bad" claim.outcome)" = DATAERR ]
	[[ $(jget "$bad" claim.error) == *"invalid byte sequence"* ]]
	for k in a1 z2; do
		[ "$(jget "$(idemp-show --json "$(uid $k)")" state)" = IN_PROGRESS ]
	done
	[ -z "$(idemp-show --json "$(uid bad)" 2>/dev/null)" ]
}

@test "idemp-done --renotified --stream, the blocking group path: a write the server refuses fails alone; the group's others, before and after it, are redone alone and recorded (issue 45)" {
	idemp-init >/dev/null 2>&1
	id=$(uid rg)
	for k in a bad z; do ev "$id-$k"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DEBITED_NOTIFICATION_FAILED >/dev/null 2>&1
	[ "$(pg_sql "SELECT count(*) FROM $TBL WHERE key LIKE '$id-%' AND state = 'DEBITED_NOTIFICATION_FAILED'")" = 3 ]
	# the re-notifications, in key order (a's write comes before the
	# refused one, z's after it), one group
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope 2>/dev/null \
		| sed 's/}$/,"notify":{"outcome":"OK"}}/' > "$BATS_TEST_TMPDIR/all"
	for k in a bad z; do grep -F -- "$id-$k" "$BATS_TEST_TMPDIR/all"; done > "$BATS_TEST_TMPDIR/in"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/in")" -eq 3 ]
	pg_sql "CREATE FUNCTION ${TBL}_rg() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN IF NEW.key = '$id-bad' THEN RAISE EXCEPTION 'test: refused' USING ERRCODE = 'invalid_text_representation'; END IF;
		RETURN NEW; END \$\$;
		CREATE TRIGGER rg BEFORE UPDATE ON $TBL FOR EACH ROW EXECUTE FUNCTION ${TBL}_rg()"
	run --separate-stderr idemp-done --renotified --stream < "$BATS_TEST_TMPDIR/in"
	pg_sql "DROP TRIGGER rg ON $TBL"
	echo "$output"; echo "$stderr"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[[ $stderr == *"group commit failed; redoing each alone"* ]]
	for k in a z; do
		[ "$(jget "$(grep -F -- "$id-$k" <<<"$output")" done.outcome)" = OK ]
		[ "$(pg_sql "SELECT state FROM $TBL WHERE key = '$id-$k'")" = DONE ]
	done
	[ "$(jget "$(grep -F -- "$id-bad" <<<"$output")" done.outcome)" = SOFTWARE ]
	[ "$(pg_sql "SELECT state FROM $TBL WHERE key = '$id-bad'")" = DEBITED_NOTIFICATION_FAILED ]
}

@test "serialization failures are retried; past the bound -> 75 naming the tries" {
	idemp-init >/dev/null 2>&1
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
	run --separate-stderr idemp-claim < <(ev "$(uid ser)")
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 1 ]
	pg_sql "ALTER SEQUENCE ${TBL}_n RESTART; ALTER DATABASE idemkit SET idemkit.fail = 100"
	run --separate-stderr idemp-claim < <(ev "$(uid ser2)")
	pg_sql "ALTER DATABASE idemkit RESET idemkit.fail"
	[ "$status" -eq 75 ]
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	echo "$stderr"
	[[ $stderr == *"could not serialize"*40001*"after 5 tries"* ]]
	[ -z "$(idemp-show --json "$(uid ser2)" 2>/dev/null)" ]
}

@test "server stopped -> 75 for claim and done, nothing written; back up -> the same envelopes pass" {
	idemp-init >/dev/null 2>&1
	env=$(ev "$(uid down)" | idemp-claim 2>/dev/null)
	pg_halt
	run --separate-stderr idemp-claim < <(ev "$(uid down2)")
	st=$status; out=$output; err=$stderr
	run --separate-stderr idemp-done --state DONE <<<"$env"
	st2=$status
	pg_resume
	[ "$st" -eq 75 ]
	[ "$(jget "$out" claim.outcome)" = TEMPFAIL ]
	[[ $err == *"connect"* ]]
	[ "$st2" -eq 75 ]
	[ "$(jget "$(idemp-show --json "$(uid down)")" state)" = IN_PROGRESS ]
	run --separate-stderr idemp-done --state DONE <<<"$env"
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-claim < <(ev "$(uid down2)")
	[ "$status" -eq 0 ]
}

@test "a server restarted between two envelopes of one idemp-done --stream: the closed connection is found before the second is sent, both finishes recorded (the charge never goes to the bank again)" {
	idemp-init >/dev/null 2>&1
	finish_across pg_restart
	[ "$(jget "$first" done.outcome)" = OK ]
	[ "$(jget "$second" done.outcome)" = OK ]
	[ "$(jget "$(idemp-show --json "$(uid rs1)")" state)" = DONE ]
	[ "$(jget "$(idemp-show --json "$(uid rs2)")" state)" = DONE ]
	run ! grep -q "closed the connection\|connection lost with\|connection lost inside" "$BATS_TEST_TMPDIR/err"
	[ "$(grep -c '"store connection lost; reconnected"' "$BATS_TEST_TMPDIR/err")" -eq 1 ]
}

@test "a server whose answer never comes (the connection left open): 75 within IDEMKIT_PG_TIMEOUT, the connection dropped; the claim it made holds until its lease ends, then the charge goes on" {
	idemp-init >/dev/null 2>&1
	local k
	k=$(uid silent)
	silent_relay "$k"
	[ "$relayed" != "$IDEMKIT_STORE" ]
	# the claim reaches the server and commits; its answer is lost
	t0=$(date +%s%3N)
	IDEMKIT_STORE=$relayed IDEMKIT_PG_TIMEOUT=2s run --separate-stderr idemp-claim --lease 6s < <(ev "$k")
	took=$(($(date +%s%3N) - t0))
	echo "status $status: $output $stderr"
	[ "$status" -eq 75 ]
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	[[ $stderr == *"claim: no answer from the server within 2000 ms (IDEMKIT_PG_TIMEOUT)"* ]]
	echo "took $took ms"
	[ "$took" -ge 2000 ]; [ "$took" -lt 30000 ]
	# the server saw the client go: no session of it is left
	for _ in $(seq 50); do
		[ "$(pg_sql "SELECT count(*) FROM pg_stat_activity WHERE usename = 'idemkit' AND application_name = 'idemkit'")" = 0 ] && break
		sleep 0.1
	done
	[ "$(pg_sql "SELECT count(*) FROM pg_stat_activity WHERE usename = 'idemkit' AND application_name = 'idemkit'")" = 0 ]
	# the claim it could not hear about holds the record for its lease
	run --separate-stderr idemp-claim --lease 6s < <(ev "$k")
	[ "$status" -eq 11 ]
	[ "$(jget "$output" claim.outcome)" = DUP_IN_PROGRESS ]
	# a finish whose answer is lost: 75 too, and the record is what the
	# server made of it (DONE: the next delivery is a DUP_DONE)
	sleep 6
	env=$(ev "$k" | idemp-claim --lease 30s)
	[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
	IDEMKIT_STORE=$relayed IDEMKIT_PG_TIMEOUT=1500ms run --separate-stderr idemp-done --state DONE <<<"$env"
	[ "$status" -eq 75 ]
	[[ $stderr == *"no answer from the server within 1500 ms"* ]]
	[ "$(jget "$(idemp-show --json "$k")" state)" = DONE ]
	run --separate-stderr idemp-claim < <(ev "$k")
	[ "$(jget "$output" claim.outcome)" = DUP_DONE ]
	# --stream (claims in flight): each claim in the batch whose answers
	# are lost is 75, and the stream goes on
	k2=$(uid silent2)
	silent_relay "$k2"
	IDEMKIT_STORE=$relayed IDEMKIT_PG_TIMEOUT=1500ms run --separate-stderr idemp-claim --stream \
		< <(ev "$(uid before)"; sleep 1; ev "$k2")
	echo "$output"; echo "$stderr"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 2 ]
	[ "$(jget "${lines[0]}" claim.outcome)" = ACQUIRED ]
	[ "$(jget "${lines[1]}" claim.outcome)" = TEMPFAIL ]
	[[ $(jget "${lines[1]}" claim.error) == *"no answer from the server within 1500 ms"* ]]
	# an operator's list (and idemp-init's statements, the outbox relay's:
	# tests/outbox-postgres.bats) is bounded too
	silent_relay "ORDER BY updated_at"
	IDEMKIT_STORE=$relayed IDEMKIT_PG_TIMEOUT=1500ms run --separate-stderr idemp-list
	[ "$status" -eq 75 ]
	[[ $stderr == *"list: no answer from the server within 1500 ms"* ]]
	kill "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null || true
	RELAY_PID=
	# a bad value is 78
	IDEMKIT_PG_TIMEOUT=soon run --separate-stderr idemp-claim < <(ev "$(uid t78)")
	[ "$status" -eq 78 ]
	[[ $stderr == *"IDEMKIT_PG_TIMEOUT: want a duration up to 10m"* ]]
}

@test "make demo-postgres: the demo on a throwaway PostgreSQL of its own, password in a pgpass file" {
	[ "$(id -u)" -eq 0 ] || skip "the demo runs its server as the postgres user: root only"
	cd "$IDEMKIT_SRC"
	run env IDEMKIT_DEMO_DIR="$BATS_TEST_TMPDIR/demo-pg" DEMO_BACKEND=postgres sh examples/demo.sh
	echo "$output" | tail -5
	[ "$status" -eq 0 ]
	[[ "$output" == *"PostgreSQL store: postgres://idemkit@127.0.0.1:"* ]]
	[[ "$output" == *"demo: OK: every one of the 20 chargeIds was debited exactly once"* ]]
	# its server is gone: no demo cluster still running on its port (other
	# demos may run on the machine meanwhile, each on its own port)
	port=$(sed -n 's/.*PostgreSQL store: postgres:\/\/idemkit@127\.0\.0\.1:\([0-9]*\).*/\1/p' <<<"$output" | head -1)
	[ -n "$port" ]
	for pid in /tmp/idemkit-demo-pg.*/data/postmaster.pid; do
		[ -e "$pid" ] || continue
		[ "$(sed -n 4p "$pid" 2>/dev/null)" != "$port" ]
	done
}

@test "a reason cut inside a UTF-8 character or with raw invalid bytes (notify 503, debit 402): DEBITED_NOTIFICATION_FAILED / FAILED, never DATAERR; no debited charge in the DLQ" {
	idemp-init >/dev/null 2>&1
	reason_stub_start
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	w=(--debit-timeout 2 --notify-timeout 2 --notify-retries 0 --lease 15s)
	for kind in cut raw; do
		ev "$(uid "n$kind")" | sqs-send >/dev/null
		IDEMKIT_BANK_URL=$STUB_URL/ok IDEMKIT_NOTIFY_URL=$STUB_URL/$kind-503 \
			run --separate-stderr charge-worker --drain "${w[@]}"
		echo "$stderr" | tail -3
		[ "$status" -eq 0 ]
		[[ $stderr != *DATAERR* ]]
		[ "$(jget "$(idemp-show --json "$(uid "n$kind")")" state)" = DEBITED_NOTIFICATION_FAILED ]
		ev "$(uid "d$kind")" | sqs-send >/dev/null
		IDEMKIT_BANK_URL=$STUB_URL/$kind-402 IDEMKIT_NOTIFY_URL=$STUB_URL/ok \
			run --separate-stderr charge-worker --drain "${w[@]}"
		echo "$stderr" | tail -3
		[ "$status" -eq 0 ]
		[[ $stderr != *DATAERR* ]]
		[ "$(jget "$(idemp-show --json "$(uid "d$kind")")" state)" = FAILED ]
	done
	# the queue is empty; the DLQ holds the two declined charges only
	[ "$(jget "$(sqs-stat)" visible)" -eq 0 ]
	[ "$(jget "$(sqs-stat)" inflight)" -eq 0 ]
	[ "$(jget "$(sqs-stat --queue "$IDEMKIT_DLQ")" visible)" -eq 2 ]
	[ "$(sqs-recv --queue "$IDEMKIT_DLQ" --max 10 | grep -c "$(uid d)")" -eq 2 ]
	# cut on the character boundary: 199 bytes, no U+20B9 half, no U+FFFD
	[ "$(last_error "$(uid ncut)")" = "HTTP 503: $(printf 'x%.0s' $(seq 199))" ]
	[ "$(last_error "$(uid dcut)")" = "HTTP 402: $(printf 'y%.0s' $(seq 199))" ]
	# raw bytes: each invalid one recorded as U+FFFD
	[ "$(last_error "$(uid nraw)")" = "HTTP 503: gateway says: caf� � �� end" ]
	[ "$(last_error "$(uid draw)")" = "HTTP 402: gateway says: caf� � �� end" ]
	# and the history's finish says the same
	[ "$(pg_sql "SELECT history->-1->>'error' FROM $TBL WHERE key = '$(uid nraw)'")" = "HTTP 503: gateway says: caf� � �� end" ]
}

@test "a finish whose reason is not UTF-8, whoever wrote the envelope: recorded (U+FFFD), 0; a finish the server refuses is 70, never DATAERR" {
	idemp-init >/dev/null 2>&1
	for k in a b; do
		env=$(ev "$(uid "$k")" | idemp-claim 2>/dev/null)
		[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
		printf '%s\n' "$env" | sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-9"},"notify":{"outcome":"NOTIFY_FAILED","error":"HTTP 503: d\xc3\xa9j\xe0 \xe2\x82"}}/' \
			> "$BATS_TEST_TMPDIR/$k.env"
	done
	run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/a.env"
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[ "$(jget "$output" done.state)" = DEBITED_NOTIFICATION_FAILED ]
	[[ $stderr == *"not valid UTF-8"* ]]
	[ "$(last_error "$(uid a)")" = "HTTP 503: déj� ��" ]
	# the server refuses the finish for its data (a trigger here): our
	# fault, the message is left (70), never sent to the DLQ as bad (65)
	pg_sql "CREATE FUNCTION ${TBL}_no() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN RAISE EXCEPTION 'test: refused' USING ERRCODE = 'invalid_text_representation'; END \$\$;
		CREATE TRIGGER no BEFORE UPDATE ON $TBL FOR EACH ROW EXECUTE FUNCTION ${TBL}_no()"
	run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/b.env"
	echo "$output $stderr"
	[ "$status" -eq 70 ]
	[ "$(jget "$output" done.outcome)" = SOFTWARE ]
	[[ $stderr == *"test: refused"*22P02* ]]
	[ "$(jget "$(idemp-show --json "$(uid b)")" state)" = IN_PROGRESS ]
}

# no_secret TEXT WORD...: fails naming the first WORD found in TEXT.
no_secret() {
	local t=$1 w; shift
	for w in "$@"; do
		if [[ $t == *"$w"* ]]; then echo "secret piece \"$w\" shown: $t" >&2; return 1; fi
	done
}

@test "a password in the store (URL or key=value; spaces, quotes, @, /) is *** in idemp-init and idemp-stats and in no message; refused in --store; a misread or unparsable one quotes no piece of it" {
	command -v script >/dev/null || skip "script(1) not installed"
	# a role of its own whose password has everything awkward in it
	pw="LEFTPART@mid/dle w'q\"RIGHTPART"
	pg_sql "CREATE ROLE idemkit_sp LOGIN PASSWORD '${pw//\'/\'\'}'" postgres
	pg_sql "CREATE DATABASE idemkit_sp OWNER idemkit_sp" postgres
	enc=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$pw")
	kvpw=$(printf '%s' "$pw" | sed "s/[\\\\']/\\\\&/g")
	pieces=(LEFTPART RIGHTPART "mid/dle" "$enc")
	url="postgres://idemkit_sp:$enc@127.0.0.1:$PG_PORT/idemkit_sp?table=$TBL"
	kv="postgres:host=127.0.0.1 port=$PG_PORT user=idemkit_sp dbname=idemkit_sp password = '$kvpw' ?table=$TBL"
	want_url="postgres://idemkit_sp:***@127.0.0.1:$PG_PORT/idemkit_sp?table=$TBL"
	want_kv="postgres:user=idemkit_sp password=*** dbname=idemkit_sp host=127.0.0.1 port=$PG_PORT ?table=$TBL"
	for form in url kv; do
		s=${!form}; want=want_$form; want=${!want}
		IDEMKIT_STORE=$s run --separate-stderr idemp-init
		echo "$form: $status $output $stderr"
		[ "$status" -eq 0 ]
		[ "$output" = "$want" ]
		no_secret "$output$stderr" "${pieces[@]}"
		IDEMKIT_STORE=$s run script -qec "idemp-stats" /dev/null
		[ "$status" -eq 0 ]
		[[ $(tr -d '\r' <<<"$output") == *"store        $want"* ]]
		no_secret "$output" "${pieces[@]}"
		IDEMKIT_STORE=$s run --separate-stderr idemp-claim < <(ev "$(uid "$form")")
		[ "$status" -eq 0 ]
		no_secret "$output$stderr" "${pieces[@]}"
		# on the command line: refused before anything (argv is public)
		for cmd in idemp-init idemp-stats; do
			run --separate-stderr "$cmd" --store "$s"
			[ "$status" -eq 78 ]
			[[ $stderr == *"password on the command line"*PGPASSFILE* ]]
			no_secret "$output$stderr" "${pieces[@]}"
		done
	done
	# a wrong password: 78, the server's word, no piece of it
	for s in "postgres://idemkit_sp:LEFTPART%20RIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp" \
		"postgres:host=127.0.0.1 port=$PG_PORT user=idemkit_sp dbname=idemkit_sp password='LEFTPART RIGHTPART'"; do
		IDEMKIT_STORE=$s run --separate-stderr idemp-init
		[ "$status" -eq 78 ]
		[[ $stderr == *"password authentication failed"* ]]
		no_secret "$output$stderr" "${pieces[@]}"
	done
	# an '@' or '/' not encoded (libpq reads them as host, port, database),
	# a space not quoted, a bad %-escape: 78, quoting no piece of it
	for s in "postgres://idemkit_sp:LEFTPART@RIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp" \
		"postgres://idemkit_sp:LEFTPART/RIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp" \
		"postgres://idemkit_sp:123/RIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp" \
		"postgres:host=127.0.0.1 port=$PG_PORT user=idemkit_sp password=LEFTPART RIGHTPART" \
		"postgres://idemkit_sp:LEFTPART%zzRIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp"; do
		for cmd in idemp-init idemp-stats; do
			IDEMKIT_STORE=$s run --separate-stderr "$cmd"
			echo "$s: $status $stderr"
			[ "$status" -eq 78 ]
			no_secret "$output$stderr" "${pieces[@]}" 123/
		done
		IDEMKIT_STORE=$s run --separate-stderr idemp-claim < <(ev "$(uid bad)")
		[ "$status" -eq 78 ]
		no_secret "$output$stderr" "${pieces[@]}" 123/
	done
	IDEMKIT_STORE="postgres://idemkit_sp:LEFTPART@RIGHTPART@127.0.0.1:$PG_PORT/idemkit_sp" run --separate-stderr idemp-init
	[[ $stderr == *"percent-encoded (%40, %2F)"* ]]
}

@test "TLS asked for and not to be had is 78, never 75: no TLS on the server (sslmode=require), a CA file missing or not a certificate, another CA" {
	idemp-init >/dev/null 2>&1
	base="postgres://idemkit:$PG_PASSWORD@localhost:$PG_PORT/idemkit?table=$TBL"
	printf 'not a certificate\n' > "$BATS_TEST_TMPDIR/junk.crt"
	for q in "sslmode=verify-full&sslrootcert=$BATS_TEST_TMPDIR/none.crt" \
		"sslmode=verify-ca&sslrootcert=$BATS_TEST_TMPDIR/junk.crt" \
		"sslmode=verify-full&sslrootcert=$TLS_DIR/other.crt" \
		"sslmode=verify-full"; do
		HOME=$BATS_TEST_TMPDIR IDEMKIT_STORE="$base&$q" run --separate-stderr idemp-claim < <(ev "$(uid tls)")
		echo "$q: $status $stderr"
		[ "$status" -eq 78 ]
		[ "$(jget "$output" claim.outcome)" = CONFIG ]
		[[ $stderr == *"certificate"* ]]
		[[ $stderr != *"$PG_PASSWORD"* ]]
	done
	# the server without TLS: sslmode=require cannot be had
	pg_sql "ALTER SYSTEM SET ssl = off" && pg_sql "SELECT pg_reload_conf()" >/dev/null
	for _ in $(seq 100); do [ "$(pg_sql "SHOW ssl")" = off ] && break; sleep 0.1; done
	IDEMKIT_STORE="$base&sslmode=require" run --separate-stderr idemp-claim < <(ev "$(uid notls)")
	st=$status out=$output err=$stderr
	IDEMKIT_STORE="$base&sslmode=require" run --separate-stderr idemp-init
	st2=$status
	IDEMKIT_STORE="$base&sslmode=prefer" run --separate-stderr idemp-claim < <(ev "$(uid prefer)")
	st3=$status
	pg_sql "ALTER SYSTEM RESET ssl" && pg_sql "SELECT pg_reload_conf()" >/dev/null
	for _ in $(seq 100); do [ "$(pg_sql "SHOW ssl")" = on ] && break; sleep 0.1; done
	echo "require: $st $err"
	[ "$st" -eq 78 ]
	[ "$(jget "$out" claim.outcome)" = CONFIG ]
	[[ $err == *"SSL was required"* ]]
	[ "$st2" -eq 78 ]
	[ "$st3" -eq 0 ]
}

@test "a database not in UTF8 (LATIN1, SQL_ASCII) is refused, 78 saying how to make one; the client encoding is UTF8 whatever PGCLIENTENCODING says" {
	for enc in LATIN1 SQL_ASCII; do
		db=idemkit_$(tr 'A-Z' 'a-z' <<<"$enc")
		pg_sql "CREATE DATABASE $db OWNER idemkit ENCODING '$enc' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" postgres
		url="postgres://idemkit:$PG_PASSWORD@127.0.0.1:$PG_PORT/$db?table=$TBL"
		IDEMKIT_STORE=$url run --separate-stderr idemp-init
		echo "$enc: $status $stderr"
		[ "$status" -eq 78 ]
		[[ $stderr == *"encoding is $enc, not UTF8"*"createdb -E UTF8 -T template0"* ]]
		IDEMKIT_STORE=$url run --separate-stderr idemp-claim < <(ev "$(uid "$enc")")
		[ "$status" -eq 78 ]
		[ "$(jget "$output" claim.outcome)" = CONFIG ]
	done
	# on the UTF8 database a client told LATIN1 still sends and reads UTF-8
	idemp-init >/dev/null 2>&1
	env=$(ev "$(uid enc)" | PGCLIENTENCODING=LATIN1 idemp-claim 2>/dev/null)
	printf '%s\n' "$env" | sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-9"},"notify":{"outcome":"NOTIFY_FAILED","error":"HTTP 503: café ₹ 五"}}/' \
		> "$BATS_TEST_TMPDIR/env"
	PGCLIENTENCODING=LATIN1 run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/env"
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(last_error "$(uid enc)")" = "HTTP 503: café ₹ 五" ]
	[ "$(jget "$(PGCLIENTENCODING=LATIN1 idemp-show --json "$(uid enc)")" lastError)" = "HTTP 503: café ₹ 五" ]
}

@test "lib/core/utf8.c calls valid exactly what PostgreSQL accepts as UTF-8; repairs and cuts are valid to it (C unit test)" {
	cases=(41 c3a9 e282b9 f09f9880 efbfbd f48fbfbf c2 c0af c1bf e080af e09fbf eda080 edbfbf
		f08fbfbf f4908080 f5808080 f8 ff 80 bf e282 e241 f09f98 41e282b94142 4142434445e282b9)
	run "$IDEMKIT_TEST_BIN/utf8" "${cases[@]}"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq "${#cases[@]}" ]
	for l in "${lines[@]}"; do
		read -r hex verdict clean cut <<<"$l"
		pg=valid
		pg_sql "SELECT convert_from('\\x$hex'::bytea, 'UTF8')" >/dev/null 2>&1 || pg=invalid
		echo "$l (postgres: $pg)"
		[ "$verdict" = "$pg" ]
		for h in "$clean" "$cut"; do
			[ "$h" = - ] || pg_sql "SELECT convert_from('\\x$h'::bytea, 'UTF8')" >/dev/null
		done
	done
	# a cut keeps whole characters only; each invalid byte is one U+FFFD
	[[ "${lines[-1]}" == *" 4142434445" ]]
	[[ "${lines[-2]}" == *" 41e282b941" ]]
	[[ "${lines[7]}" == "c0af invalid efbfbdefbfbd efbfbd" ]]
}
