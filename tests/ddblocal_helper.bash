# tests/ddblocal_helper.bash: AWS's own DynamoDB Local (the jar inside the
# npm package amplify-dynamodb-simulator, pinned in package-lock.json) on a
# free loopback port, beside dynalite (helper.bash).  Unlike dynalite it
# returns the old item on a failed condition (ReturnValuesOnCondition-
# CheckFailure=ALL_OLD), as real DynamoDB does, and supports TTL.
#
# Started with -sharedDb (one set of tables whatever the access key and
# region, as the suites use fake ones), -inMemory and -disableTelemetry
# (it would otherwise phone home).  The JVM takes seconds to start: start
# it once per file (setup_file), not per test.  Needs java (Debian:
# openjdk-17-jre-headless) and node_modules; skipped when either is absent
# outside CI (require_java), a failure under CI.

DDBLOCAL_DIR=$IDEMKIT_SRC/node_modules/amplify-dynamodb-simulator/emulator

require_java() {
	if ! command -v java >/dev/null 2>&1 || [ ! -f "$DDBLOCAL_DIR/DynamoDBLocal.jar" ]; then
		[ "${CI:-}" = true ] && { echo "java and DynamoDB Local (npm ci) are required under CI" >&2; return 1; }
		skip "java or DynamoDB Local (npm ci) not installed"
	fi
}

# ddblocal_start: DynamoDB Local on a free loopback port (retried when the
# port was taken meanwhile), waited for until it answers an unsigned
# request (with its 400); sets DDBLOCAL_PID, DDBLOCAL_URL and
# AWS_ENDPOINT_URL_DYNAMODB.  It listens on every interface (it has no
# host option); the tests talk to it on 127.0.0.1 only.
# ddblocal_stop ends it.
ddblocal_start() {
	local try i port log code
	for try in 1 2 3 4 5; do
		port=$(free_port)
		log=${BATS_FILE_TMPDIR:-$BATS_TEST_TMPDIR}/ddblocal.$port.log
		(cd "$DDBLOCAL_DIR" && exec java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
			-Djava.library.path=DynamoDBLocal_lib -jar DynamoDBLocal.jar \
			-inMemory -sharedDb -disableTelemetry -port "$port") >"$log" 2>&1 3>&- &
		DDBLOCAL_PID=$!
		# Up when it answers at all (400 MissingAuthenticationToken to curl).
		for i in $(seq 600); do
			code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/" 2>/dev/null)
			if [ "$code" = 400 ]; then
				export DDBLOCAL_PID DDBLOCAL_URL=http://127.0.0.1:$port
				export AWS_ENDPOINT_URL_DYNAMODB=$DDBLOCAL_URL
				return 0
			fi
			kill -0 "$DDBLOCAL_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill "$DDBLOCAL_PID" 2>/dev/null
		wait "$DDBLOCAL_PID" 2>/dev/null || true
	done
	echo "DynamoDB Local did not start: $(cat "$log")" >&2
	return 1
}
ddblocal_stop() {
	if [ -n "${DDBLOCAL_PID:-}" ]; then
		kill "$DDBLOCAL_PID" 2>/dev/null
		wait "$DDBLOCAL_PID" 2>/dev/null || true
		DDBLOCAL_PID=
	fi
	return 0
}

# ddb_emulator_start [BACKEND]: the DynamoDB emulator BACKEND names
# (dynamodb = dynalite, dynamodb-local = DynamoDB Local; default
# $IDEMKIT_TEST_BACKEND, else dynalite).  Sets DDB_URL and
# AWS_ENDPOINT_URL_DYNAMODB.  ddb_emulator_stop ends whichever runs.
ddb_emulator_start() {
	case ${1:-${IDEMKIT_TEST_BACKEND:-dynamodb}} in
	dynamodb-local)
		require_java || return 1
		ddblocal_start || return 1
		DDB_URL=$DDBLOCAL_URL ;;
	*)
		require_node || return 1
		dynalite_start || return 1
		DDB_URL=$DYNALITE_URL ;;
	esac
	export DDB_URL
}
ddb_emulator_stop() {
	ddblocal_stop
	dynalite_stop
}

# recproxy_start NAME UPSTREAM [RULES-JSON]: tests/recproxy.py in front of
# UPSTREAM, logging every request to $BATS_TEST_TMPDIR/NAME.log, with the
# fault rules RULES-JSON (see recproxy.py) when given.  Sets RECPROXY_URL;
# recproxy_stop ends every proxy the test started.
recproxy_start() {
	local name=$1 up=$2 d=$BATS_TEST_TMPDIR i
	rm -f "$d/$name.port"
	: > "$d/$name.log"
	if [ -n "${3:-}" ]; then
		printf '%s\n' "$3" > "$d/$name.rules"
		RECPROXY_FAULTS=$d/$name.rules python3 "$IDEMKIT_SRC/tests/recproxy.py" \
			"$up" "$d/$name.port" "$d/$name.log" 3>&- &
	else
		python3 "$IDEMKIT_SRC/tests/recproxy.py" "$up" "$d/$name.port" "$d/$name.log" 3>&- &
	fi
	RECPROXY_PIDS="${RECPROXY_PIDS:-} $!"
	for i in $(seq 100); do [ -s "$d/$name.port" ] && break; sleep 0.05; done
	[ -s "$d/$name.port" ] || { echo "recproxy $name did not start" >&2; return 1; }
	RECPROXY_URL=http://127.0.0.1:$(cat "$d/$name.port")
}
recproxy_stop() {
	local p
	for p in ${RECPROXY_PIDS:-}; do
		kill "$p" 2>/dev/null
		wait "$p" 2>/dev/null || true
	done
	RECPROXY_PIDS=
	return 0
}

# ops NAME [OP]: the operations recproxy NAME saw, one per line; with OP,
# how many of that operation.
ops() {
	local o
	o=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(json.loads(l)["target"].rsplit(".", 1)[-1])' "$BATS_TEST_TMPDIR/$1.log")
	if [ -n "${2:-}" ]; then grep -cx "$2" <<<"$o" || true; else printf '%s\n' "$o"; fi
}
