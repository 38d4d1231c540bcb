# tests/helper.bash: loaded by every suite (`load helper`).
# Puts the built commands first on PATH and gives each test a throwaway
# state directory, so nothing touches the user's own state.

IDEMKIT_SRC=${IDEMKIT_SRC:-$(cd "$BATS_TEST_DIRNAME/.." && pwd)}
IDEMKIT_BIN=${IDEMKIT_BIN:-$IDEMKIT_SRC/build/bin}
IDEMKIT_TEST_BIN=${IDEMKIT_TEST_BIN:-$IDEMKIT_SRC/build/test}
export IDEMKIT_SRC IDEMKIT_BIN IDEMKIT_TEST_BIN
PATH=$IDEMKIT_BIN:$PATH

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

# jget JSON PATH: a value out of a JSON line (python3 is on every Debian).
jget() {
	printf '%s' "$1" | python3 -c 'import json,sys
v=json.loads(sys.stdin.read())
for k in sys.argv[1].split("."):
    v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
print("" if v is None else (json.dumps(v) if isinstance(v,(dict,list)) else v))' "$2"
}

# require_node: node is needed; skip outside CI only.
require_node() {
	if ! command -v node >/dev/null 2>&1; then
		[ "${CI:-}" = true ] && { echo "node is required under CI" >&2; return 1; }
		skip "node not installed"
	fi
}

# store_backend_setup_file / store_backend_setup: the store the suite runs
# against.  IDEMKIT_TEST_BACKEND=sqlite (default) uses a file per test.
store_backend_setup_file() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) ;;
	*) echo "unknown IDEMKIT_TEST_BACKEND=$IDEMKIT_TEST_BACKEND" >&2; return 1 ;;
	esac
}
store_backend_teardown_file() { :; }
store_backend_setup() {
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite) export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db ;;
	esac
}
