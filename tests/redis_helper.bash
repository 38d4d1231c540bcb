# tests/redis_helper.bash: a throwaway redis-server for the suites that
# need one (`load redis_helper`, after helper).  redis_start [NAME]
# [--option value ...] starts one on a free loopback port with a durable
# append-only file (appendonly yes, appendfsync always) in redis-NAME
# (emptied first) under the test's directory, or the file's from
# setup_file (tests of one file may run at once: each its own server and
# files), retried when the port was taken; extra options override those.
# It sets REDIS_PORT_NAME / REDIS_PID_NAME / REDIS_DIR_NAME (NAME
# defaults to "main", exported as REDIS_PORT / REDIS_PID too).
# redis_stop [NAME] ends it; redis_kill9 NAME kills it hard; redis_restart
# NAME starts it again on the same port and directory.

require_redis() {
	if ! command -v redis-server >/dev/null 2>&1; then
		[ "${CI:-}" = true ] && { echo "redis-server is required under CI" >&2; return 1; }
		skip "redis-server not installed (Debian: redis-server)"
	fi
}

# _redis_launch NAME PORT [options...]: one server; 0 once it answers (with
# its own pid: on a shared machine another test may take a port freed by a
# kill -9 before the restart).
_redis_launch() {
	local name=$1 port=$2 dir i pid
	eval "dir=\$REDIS_DIR_$name"
	shift 2
	mkdir -p "$dir"
	redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
		--appendonly yes --appendfsync always --save '' \
		--daemonize no --logfile "$dir/log" --protected-mode yes "$@" \
		</dev/null >/dev/null 2>&1 3>&- &
	pid=$!
	for i in $(seq 200); do
		# ours, not another server that took the port meanwhile
		if redis-cli -p "$port" INFO server 2>/dev/null | grep -q "^process_id:$pid"; then
			eval "REDIS_PID_$name=$pid REDIS_PORT_$name=$port"
			# (also in its directory: a server of setup_file that a
			# test restarted has a pid teardown_file never saw)
			echo "$pid" > "$dir/pid"
			export "REDIS_PID_$name" "REDIS_PORT_$name"
			: > "$dir/args"; [ $# -eq 0 ] || printf "%s\n" "$@" > "$dir/args"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null || true
	return 1
}

redis_start() {
	local name=main try port dir
	if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then name=$1; shift; fi
	# a fresh directory: a server started again by a later test of the
	# file must not replay the append-only file of an earlier one
	dir=${BATS_TEST_TMPDIR:-$BATS_FILE_TMPDIR}/redis-$name
	eval "REDIS_DIR_$name=\$dir"
	export "REDIS_DIR_$name"
	rm -rf "$dir"
	for try in 1 2 3 4 5; do
		port=$(free_port)
		if _redis_launch "$name" "$port" "$@"; then
			if [ "$name" = main ]; then
				export REDIS_PID=$REDIS_PID_main REDIS_PORT=$REDIS_PORT_main
			fi
			return 0
		fi
	done
	echo "redis-server did not start: $(cat "$dir/log" 2>/dev/null)" >&2
	return 1
}

# _redis_pid NAME: the pid of the server NAME last started, restarts by a
# test included.
_redis_pid() {
	local dir pid
	eval "dir=\${REDIS_DIR_$1:-} pid=\${REDIS_PID_$1:-}"
	[ -n "$dir" ] && [ -s "$dir/pid" ] && pid=$(cat "$dir/pid")
	echo "$pid"
}

redis_stop() {
	local name=${1:-main} pid
	pid=$(_redis_pid "$name")
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null
		_redis_gone "$pid"
	fi
	return 0
}

# _redis_gone PID: waits (up to 10 s) until the server has exited, also
# when this shell is not its parent (a server of setup_file, stopped by a
# test, which may then start it again on its port).
_redis_gone() {
	local i
	wait "$1" 2>/dev/null || true
	for i in $(seq 200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
}

redis_kill9() {
	local name=${1:-main} pid
	pid=$(_redis_pid "$name")
	kill -9 "$pid" 2>/dev/null
	_redis_gone "$pid"
	return 0
}

# Same port, same directory (so the append-only file is replayed).
redis_restart() {
	local name=${1:-main} port dir args=()
	eval "port=\$REDIS_PORT_$name dir=\$REDIS_DIR_$name"
	mapfile -t args < "$dir/args"
	_redis_launch "$name" "$port" "${args[@]}" || {
		echo "redis-server did not restart: $(tail -5 "$dir/log")" >&2
		return 1
	}
	[ "$name" = main ] && export REDIS_PID=$REDIS_PID_main
	return 0
}

# rcli [NAME] ARGS...: redis-cli against a started server.
rcli() {
	local name=main port
	if [ $# -gt 0 ] && eval "[ -n \"\${REDIS_PORT_$1:-}\" ]"; then name=$1; shift; fi
	eval "port=\$REDIS_PORT_$name"
	redis-cli -p "$port" "$@"
}
