# tests/pg_helper.bash: a throwaway PostgreSQL 15 for the tests (Debian
# `postgresql`).  pg_start makes a cluster in a fresh directory, runs it as
# the postgres user (initdb refuses root; as ourselves when not root) on a free loopback port, socket in
# that directory, password (SCRAM) authentication over TCP, and creates a
# role and database `idemkit` with a random password.  It exports PG_PORT,
# PG_DIR, PG_PASSWORD and PG_URL (postgres://idemkit:PASSWORD@127.0.0.1:PORT/idemkit);
# wal_level is logical and the role has REPLICATION, as the outbox wants
# (a slot per table: store_postgres_outbox.c);
# pg_stop ends it and removes the directory; pg_restart / pg_halt / pg_resume
# stop and start the same cluster (data kept).  pg_sql runs SQL as the
# superuser over the socket.

PG_BIN=${PG_BIN:-$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -1)}

# require_pg: the server binaries are needed; skip outside CI only.
require_pg() {
	if [ ! -x "$PG_BIN/initdb" ]; then
		[ "${CI:-}" = true ] && { echo "postgresql is required under CI" >&2; return 1; }
		skip "postgresql not installed"
	fi
}

# pg_as CMD...: as the postgres user when we are root (initdb refuses
# root), else as ourselves.
pg_as() {
	if [ "$(id -u)" -eq 0 ]; then
		(cd / && runuser -u postgres -- "$@")
	else
		(cd / && "$@")
	fi
}
pg_own() { [ "$(id -u)" -ne 0 ] || chown postgres: "$@"; }

pg_start() {
	require_pg || return 1
	local _try
	PG_DIR=$(mktemp -d /tmp/idemkit-pg.XXXXXX) || return 1
	pg_own "$PG_DIR"
	chmod 700 "$PG_DIR"
	PG_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
	printf '%s\n' "$PG_PASSWORD" > "$PG_DIR/pw"
	pg_own "$PG_DIR/pw"
	pg_as "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth-local=trust \
		--auth-host=scram-sha-256 --pwfile="$PG_DIR/pw" -E UTF8 --no-instructions \
		>"$PG_DIR/initdb.log" 2>&1 || { cat "$PG_DIR/initdb.log" >&2; return 1; }
	cat >> "$PG_DIR/data/postgresql.conf" <<-EOF
	listen_addresses = '127.0.0.1'
	unix_socket_directories = '$PG_DIR'
	max_connections = 200
	shared_buffers = 64MB
	session_preload_libraries = 'auto_explain'
	auto_explain.log_min_duration = -1
	log_connections = on
	wal_level = logical
	max_replication_slots = 100
	${PG_EXTRA_CONF:-}
	EOF
	for _try in 1 2 3 4 5; do
		PG_PORT=$(free_port)
		if pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" \
			-o "-p $PG_PORT" -w -t 30 start >/dev/null 2>&1; then
			break
		fi
		PG_PORT=
	done
	[ -n "$PG_PORT" ] || { tail -20 "$PG_DIR/server.log" >&2; return 1; }
	export PG_DIR PG_PORT PG_PASSWORD
	pg_sql "CREATE ROLE idemkit LOGIN REPLICATION PASSWORD '$PG_PASSWORD'" postgres >/dev/null &&
	pg_sql "CREATE DATABASE idemkit OWNER idemkit" postgres >/dev/null || return 1
	export PG_URL=postgres://idemkit:$PG_PASSWORD@127.0.0.1:$PG_PORT/idemkit
}

# pg_sql SQL [DB]: as the superuser over the socket; rows unaligned, no header.
pg_sql() {
	"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h "$PG_DIR" -p "$PG_PORT" -U postgres \
		-d "${2:-idemkit}" -c "$1"
}

pg_halt() { pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null; }
pg_resume() {
	pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -o "-p $PG_PORT" \
		-w -t 30 start >/dev/null
}
pg_restart() { pg_halt && pg_resume; }

pg_stop() {
	[ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR" ] || return 0
	pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
	rm -rf "$PG_DIR"
	PG_DIR=
	return 0
}

# silent_relay MARK [reset-once]: tests/pgsilent.py in front of the file's
# server (the one started before ends), its answers dropped once a client
# sent MARK (reset-once: that connection's answer dropped, then the
# connection reset, once); sets RELAY_PID and relayed, this test's store
# URL through it (no TLS: the relay looks for MARK in the bytes).
silent_relay() {
	local d=$BATS_TEST_TMPDIR
	[ -z "${RELAY_PID:-}" ] || { kill "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null || true; }
	rm -f "$d/relay.port"
	python3 "$IDEMKIT_SRC/tests/pgsilent.py" "$PG_PORT" "$d/relay.port" "$1" ${2:-} 3>&- &
	RELAY_PID=$!
	for _ in $(seq 100); do [ -s "$d/relay.port" ] && break; sleep 0.05; done
	relayed=${IDEMKIT_STORE/:$PG_PORT\//:$(cat "$d/relay.port")/}\&sslmode=disable
}
