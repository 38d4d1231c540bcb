# tests/helper.bash: loaded by every suite (`load helper`).
# Puts the built commands first on PATH and gives each test a throwaway
# state directory, so nothing touches the user's own state.

IDEMKIT_SRC=${IDEMKIT_SRC:-$(cd "$BATS_TEST_DIRNAME/.." && pwd)}
IDEMKIT_BIN=${IDEMKIT_BIN:-$IDEMKIT_SRC/build/bin}
IDEMKIT_TEST_BIN=${IDEMKIT_TEST_BIN:-$IDEMKIT_SRC/build/test}
# Inside a test (bats sources this file again for each one, BATS_TEST_NAME
# set): make san-cover keeps each test's gcov data apart from its file's
# (DIR/N/t/NAME: tests/sancover.py's units), and make test SANITIZE=1 runs
# the tests its set cover left out on the plain build (IDEMKIT_SAN_PLAIN_TESTS,
# "RUN<TAB>NAME" lines, from tests/sancover.py select); a test not listed,
# and setup_file's servers, stay on the build the run was given.
if [ -n "${BATS_TEST_NAME:-}" ] && [ -z "${_ik_test_env:-}" ]; then
	_ik_test_env=1
	if [ -n "${GCOV_PREFIX:-}" ] && [ -n "${IDEMKIT_TEST_GCOV:-}" ]; then
		GCOV_PREFIX=$GCOV_PREFIX/t/$BATS_TEST_NAME
		mkdir -p "$GCOV_PREFIX" && echo "$BATS_TEST_NUMBER" > "$GCOV_PREFIX/number"
		export GCOV_PREFIX
	fi
	if [ -n "${IDEMKIT_SAN_PLAIN_TESTS:-}" ] && [ -n "${IDEMKIT_PLAIN_BIN:-}" ] &&
	    grep -Fqx -- "${IDEMKIT_TEST_RUN:-}	$BATS_TEST_NAME" "$IDEMKIT_SAN_PLAIN_TESTS"; then
		IDEMKIT_BIN=$IDEMKIT_PLAIN_BIN IDEMKIT_TEST_BIN=${IDEMKIT_PLAIN_TEST_BIN:-$IDEMKIT_TEST_BIN}
	fi
fi
export IDEMKIT_SRC IDEMKIT_BIN IDEMKIT_TEST_BIN
PATH=$IDEMKIT_BIN:$PATH
# Debian's python3 (the one mk/deps.sh installs, with the modules the
# suites use) ahead of any other on PATH: a version manager's shim (pyenv's
# is a bash script that execs another) costs ~0.1 s a start against 0.02 s,
# and the suites start python3 thousands of times.
if [ -x /usr/bin/python3 ] && [ "$(command -v python3)" != /usr/bin/python3 ]; then
	_ik_py=${BATS_RUN_TMPDIR:-$BATS_TEST_TMPDIR}/debian-python3
	[ -e "$_ik_py/python3" ] || { mkdir -p "$_ik_py" && ln -sf /usr/bin/python3 "$_ik_py/python3"; }
	PATH=$_ik_py:$PATH
fi

# sleep as a builtin of the test's shell (Debian's bash-builtins, which
# mk/deps.sh installs): the suites' waits poll with a sleep a round, tens of
# thousands of them a run, and each external sleep is a fork and an exec
# (~8 ms of CPU on CI's machines, where a page fault is dear).  The same
# intervals, suffixes included; only seq and the like stay external (their
# builtins count down where GNU seq prints nothing).  Where the file is
# missing, /usr/bin/sleep as before.
[ ! -r /usr/lib/bash/sleep ] || enable -f /usr/lib/bash/sleep sleep 2>/dev/null || true

# A lighter trace for failures.  bats (1.8) sets a DEBUG trap that runs a
# function for every command a test runs, in every subshell (set -T):
# it copies the call stack into arrays each time so that a failure can
# name its line.  Here that costs ~0.25 ms a command and 1-2 ms a fork
# (charge-debit.bats: 82 CPU-s with it, 72 with this one).  The same
# report for less: the DEBUG trap keeps two scalars (the line
# and file of the last command and of the one before, as bats keeps two
# stacks: bash 4.4+ runs DEBUG once more after a failed [[ ]] with a
# wrong line), and the stack is made once, in the ERR trap, from bash's
# own (its outer frames are right there, only the innermost line may not
# be).  bats --trace (BATS_TRACE_LEVEL), which prints from bats' own
# trap, and IDEMKIT_TEST_FULL_TRACE=1 keep that one.  A teardown's
# failure (bats runs teardown under ||: no ERR) is named without a line.
# tests/ci.bats compares the two reports.  Installed after
# bats_setup_tracing, which bats runs after sourcing the test file; left
# alone where bats has no such function (another bats than 1.8's).
if [ -n "${BATS_TEST_NAME:-}" ] && [ "${BATS_TRACE_LEVEL:-0}" -eq 0 ] && [ -z "${IDEMKIT_TEST_FULL_TRACE:-}" ] &&
    declare -F bats_setup_tracing >/dev/null && declare -F bats_check_status_from_trap >/dev/null &&
    ! declare -F _ik_bats_setup_tracing >/dev/null; then
	eval "_ik_$(declare -f bats_setup_tracing)"
	bats_setup_tracing() {
		_ik_bats_setup_tracing "$@"
		_ik_at= _ik_at_before=
		# (one line: $LINENO in a trap's string counts that string's lines)
		trap '[[ ${FUNCNAME[0]-} == _ik_error_trap || $BASH_SOURCE == "$BATS_ROOT"/lib*/bats-core/* ]] || { _ik_at_before=$_ik_at; _ik_at="$LINENO ${FUNCNAME[0]-} $BASH_SOURCE"; }' DEBUG
		trap _ik_error_trap ERR
		# no stale frames (a failure the ERR trap does not see, in a
		# teardown, has none)
		BATS_DEBUG_LAST_STACK_TRACE=() BATS_DEBUG_LASTLAST_STACK_TRACE=()
	}
	_ik_error_trap() {
		bats_check_status_from_trap
		local i at=$_ik_at
		# the DEBUG trap's last stop is where ERR says it is: the one
		# before is the failed command (see bats_debug_trap's tables)
		[ "$at" != "${BASH_LINENO[0]} ${FUNCNAME[1]} ${BASH_SOURCE[1]}" ] || at=$_ik_at_before
		[ "${at#* }" = "${FUNCNAME[1]} ${BASH_SOURCE[1]}" ] || at=${BASH_LINENO[0]}
		BATS_DEBUG_LAST_STACK_TRACE=("${at%% *} ${FUNCNAME[1]} ${BASH_SOURCE[1]}")
		for ((i = 2; i < ${#FUNCNAME[@]}; i++)); do
			case ${FUNCNAME[i - 1]} in
			"${BATS_TEST_NAME-}" | setup | teardown | setup_file | teardown_file) break ;;
			esac
			BATS_DEBUG_LAST_STACK_TRACE+=("${BASH_LINENO[i - 1]} ${FUNCNAME[i]} ${BASH_SOURCE[i]}")
		done
		BATS_DEBUG_LAST_STACK_TRACE_IS_VALID=1
	}
fi

export IDEMKIT_STATE_DIR=$BATS_TEST_TMPDIR/state
export IDEMKIT_LOG=${IDEMKIT_LOG:-info}
unset IDEMKIT_STORE IDEMKIT_QUEUE IDEMKIT_DLQ IDEMKIT_LEASE

# A unique chargeId per test, so suites can share one store (the DynamoDB
# run shares a table across a file).
uid() {
	printf 'CHG-%s-%s-%s' "${BATS_SUITE_TEST_NUMBER:-0}" "$$" "${1:-x}"
}

# ev CHARGEID [AMOUNT] [ACCOUNT] [CURRENCY] [TYPE]: a ChargeDueEvent line.
ev() {
	printf '{"chargeId":"%s","accountId":"%s","amount":%s,"currency":"%s","chargeType":"%s","dueDate":"2026-11-30"}\n' \
		"$1" "${3:-ACC-0042}" "${2:-2500}" "${4:-INR}" "${5:-SMS_ALERT_FEE}"
}

# jget JSON PATH: a value out of a JSON line, as Python's json prints it
# (tests/tools/jget.c: C for the plain cases, python3 for the rest).
jget() {
	"$IDEMKIT_TEST_BIN/jget" "$2" <<<"$1"
}

# require_node: node is needed; skip outside CI only.
require_node() {
	if ! command -v node >/dev/null 2>&1; then
		[ "${CI:-}" = true ] && { echo "node is required under CI" >&2; return 1; }
		skip "node not installed"
	fi
}

# free_port: a loopback port nobody listens on right now (the caller still
# retries if it is taken before it binds).
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# aws_test_env: fake credentials and no path to any real AWS account or
# metadata service; only loopback endpoints are used.
aws_test_env() {
	unset AWS_PROFILE AWS_DEFAULT_PROFILE AWS_SESSION_TOKEN AWS_DEFAULT_REGION \
		AWS_ENDPOINT_URL AWS_CONTAINER_CREDENTIALS_RELATIVE_URI \
		AWS_CONTAINER_CREDENTIALS_FULL_URI AWS_CONTAINER_AUTHORIZATION_TOKEN \
		AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE AWS_CA_BUNDLE AWS_MAX_ATTEMPTS \
		AWS_ROLE_ARN AWS_WEB_IDENTITY_TOKEN_FILE AWS_ROLE_SESSION_NAME AWS_ENDPOINT_URL_STS
	export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	export AWS_EC2_METADATA_DISABLED=true IDEMKIT_AWS_MAX_BACKOFF=100ms
	export AWS_SHARED_CREDENTIALS_FILE=/nonexistent/credentials
	export AWS_CONFIG_FILE=/nonexistent/config
}

# dynalite_start: dynalite on a free loopback port (retried when the port
# was taken meanwhile); sets DYNALITE_PID, DYNALITE_URL and
# AWS_ENDPOINT_URL_DYNAMODB.  dynalite_stop ends it.
dynalite_start() {
	local try i port log
	for try in 1 2 3 4 5; do
		port=$(free_port)
		log=$BATS_FILE_TMPDIR/dynalite.$port.log
		node "$IDEMKIT_SRC/node_modules/dynalite/cli.js" --host 127.0.0.1 \
			--port "$port" --createTableMs 20 --deleteTableMs 20 \
			>"$log" 2>&1 3>&- &
		DYNALITE_PID=$!
		for i in $(seq 100); do
			if grep -q listening "$log" 2>/dev/null; then
				export DYNALITE_PID DYNALITE_URL=http://127.0.0.1:$port
				export AWS_ENDPOINT_URL_DYNAMODB=$DYNALITE_URL
				return 0
			fi
			kill -0 "$DYNALITE_PID" 2>/dev/null || break
			sleep 0.05
		done
		kill "$DYNALITE_PID" 2>/dev/null
		wait "$DYNALITE_PID" 2>/dev/null
	done
	echo "dynalite did not start: $(cat "$log")" >&2
	return 1
}
dynalite_stop() {
	if [ -n "${DYNALITE_PID:-}" ]; then
		kill "$DYNALITE_PID" 2>/dev/null
		wait "$DYNALITE_PID" 2>/dev/null
	fi
	return 0
}

# DynamoDB Local (AWS's emulator, on Java): ddblocal_start, ddb_emulator_start.
source "$IDEMKIT_SRC/tests/ddblocal_helper.bash"

# store_backend_setup_file / store_backend_setup: the store the suite runs
# against.  IDEMKIT_TEST_BACKEND=sqlite (default) uses a file per test;
# dynamodb starts one dynalite and one table for the whole file (tests
# use unique chargeIds: uid); dynamodb-local the same on DynamoDB Local;
# postgres starts one throwaway server and one table for the file
# (pg_helper.bash); redis one redis-server (redis_helper.bash);
# sqlite-cache the embedded store behind the Redis fast path
# (IDEMKIT_CACHE, store_cache.c), its cache emptied before each test.
store_backend_setup_file() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) ;;
	dynamodb|dynamodb-local)
		aws_test_env
		ddb_emulator_start || return 1
		export IDEMKIT_TEST_TABLE=idem-$$-$RANDOM
		idemp-init --store "dynamodb:$IDEMKIT_TEST_TABLE" >/dev/null || return 1
		;;
	redis|sqlite-cache) . "$IDEMKIT_SRC/tests/redis_helper.bash"; require_redis; redis_start || return 1 ;;
	postgres)
		# shellcheck source=tests/pg_helper.bash
		. "$IDEMKIT_SRC/tests/pg_helper.bash"
		pg_start || return 1
		export IDEMKIT_TEST_TABLE=idem_$$_$RANDOM
		IDEMKIT_STORE="$PG_URL?table=$IDEMKIT_TEST_TABLE" idemp-init >/dev/null || return 1
		;;
	*) echo "unknown IDEMKIT_TEST_BACKEND=$IDEMKIT_TEST_BACKEND" >&2; return 1 ;;
	esac
}
store_backend_teardown_file() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	dynamodb|dynamodb-local) ddb_emulator_stop ;;
	redis|sqlite-cache) redis_stop ;;
	postgres) pg_stop ;;
	esac
}
store_backend_setup() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db ;;
	dynamodb|dynamodb-local) export IDEMKIT_STORE=dynamodb:$IDEMKIT_TEST_TABLE ;;
	redis) export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT ;;
	sqlite-cache)
		export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db
		export IDEMKIT_CACHE=redis://127.0.0.1:$REDIS_PORT/1
		redis-cli -p "$REDIS_PORT" -n 1 FLUSHDB >/dev/null
		;;
	postgres) export IDEMKIT_STORE=$PG_URL?table=$IDEMKIT_TEST_TABLE ;;
	esac
}

# slow_or_skip CMD: when CMD is built with AddressSanitizer, whose start-up
# deadlocks under libfaketime's preload (0.9.10 with clang 14's runtime:
# every command hangs before main), the test runs the plain build's
# commands instead (IDEMKIT_PLAIN_BIN: make sanitize builds it and names
# it), or is skipped where there is none.
slow_or_skip() {
	if grep -qa __asan_init "$(command -v "$1")"; then
		if [ -x "${IDEMKIT_PLAIN_BIN:-}/$1" ] && ! grep -qa __asan_init "$IDEMKIT_PLAIN_BIN/$1"; then
			PATH=$IDEMKIT_PLAIN_BIN:$PATH
		else
			skip "libfaketime hangs an ASan build at start-up; run in the plain build"
		fi
	fi
}

# slow CMD...: CMD with its wall clock 30 s behind (libfaketime), its
# monotonic and boot clocks left alone: libfaketime 0.9.10 (Debian 12)
# fakes those too unless DONT_FAKE_MONOTONIC=1, and an NTP step or a
# skewed host moves the wall clock only.
slow() {
	local lib
	lib=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -1)
	[ -n "$lib" ] || { echo "libfaketime not installed (Debian: faketime)" >&2; return 1; }
	LD_PRELOAD=$lib FAKETIME=-30s DONT_FAKE_MONOTONIC=1 "$@"
}

# finish_across CMD...: one idemp-done --stream finishes two charges claimed
# here (uid rs1 and rs2) with CMD run between them (a server restart),
# with the step's fifos closed for it, so that a server CMD starts does not
# hold the step's input open.  Sets first and second, the step's two
# answers; its stderr is left in $BATS_TEST_TMPDIR/err.
finish_across() {
	local a b pid
	a=$(ev "$(uid rs1)" | idemp-claim 2>/dev/null)
	b=$(ev "$(uid rs2)" | idemp-claim 2>/dev/null)
	mkfifo "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out"
	idemp-done --stream --state DONE < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" \
		2> "$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	exec 6< "$BATS_TEST_TMPDIR/out"
	printf '%s\n' "$a" >&5
	IFS= read -r -t 10 -u 6 first
	"$@" 5>&- 6<&-
	printf '%s\n' "$b" >&5
	IFS= read -r -t 10 -u 6 second
	exec 5>&- 6<&-
	wait "$pid"
}

# stream_start [ARGS...]: idemp-claim --stream ARGS on a fifo (fd 5 open on
# it: write envelopes with >&5, close with exec 5>&-), its output in
# STREAM_OUT, its pid CLAIM_PID; stream_lines N waits (bounded) until it
# wrote N envelopes, and fails unless it wrote exactly N.
stream_start() {
	rm -f "$BATS_TEST_TMPDIR/in"
	mkfifo "$BATS_TEST_TMPDIR/in"
	STREAM_OUT=$BATS_TEST_TMPDIR/out
	idemp-claim --stream "$@" < "$BATS_TEST_TMPDIR/in" > "$STREAM_OUT" 2> "$BATS_TEST_TMPDIR/err" 3>&- &
	CLAIM_PID=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
}
stream_lines() {
	for _ in $(seq 300); do [ "$(wc -l < "$STREAM_OUT")" -ge "$1" ] && break; sleep 0.05; done
	[ "$(wc -l < "$STREAM_OUT")" -eq "$1" ]
}
