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
	run --separate-stderr idemp-claim < <(ev "$(uid a)")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
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
	[ "$output" = "postgres://idemkit@127.0.0.1:$PG_PORT/idemkit?password=***&table=$TBL" ]
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

@test "--stream: one connection, the waiting envelopes in one transaction; a failing one is redone alone, the others pass" {
	idemp-init >/dev/null 2>&1
	for i in $(seq 1 20); do ev "$(uid "g$i")"; done > "$BATS_TEST_TMPDIR/evs"
	pg_sql "ALTER ROLE idemkit SET log_statement = 'all'"
	: > "$PG_DIR/server.log"
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/evs"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 20 ]
	begins=$(grep -c 'statement: BEGIN' "$PG_DIR/server.log" || true)
	echo "BEGINs for 20 claims: $begins"
	[ "$begins" -ge 1 ] && [ "$begins" -lt 20 ]
	# one connection for the whole stream
	[ "$(grep -c 'connection authorized: user=idemkit' "$PG_DIR/server.log")" -eq 1 ]
	pg_sql "ALTER ROLE idemkit RESET log_statement"
	run --separate-stderr idemp-done --stream --state DONE <<<"$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"state":"DONE"' <<<"$output")" -eq 20 ]
	# a body the server refuses (not UTF-8) fails its group: the group is
	# redone one by one, and only that envelope fails, DATAERR (to the DLQ)
	{ ev "$(uid h1)"; printf '{"chargeId":"%s","accountId":"ACC-1","amount":100,"currency":"INR","chargeType":"X","note":"\xff\xfe"}\n' "$(uid bad)"; ev "$(uid h2)"; } > "$BATS_TEST_TMPDIR/evs2"
	run --separate-stderr idemp-claim --stream < "$BATS_TEST_TMPDIR/evs2"
	echo "$output"; echo "$stderr"
	[ "$status" -eq 0 ]
	[ "$(grep -c '"outcome":"ACQUIRED"' <<<"$output")" -eq 2 ]
	[[ $stderr == *"redoing each alone"* ]]
	[ "$(jget "${lines[1]}" claim.outcome)" = DATAERR ]
	[[ $(jget "${lines[1]}" claim.error) == *"invalid byte sequence"* ]]
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
