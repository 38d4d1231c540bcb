#!/bin/sh
# valgrind.sh: memcheck over a sample run of every C command on the
# embedded default (make valgrind).  Each run must end with the exit code
# the sample expects; valgrind turns any memory error or definite leak into
# exit 99, so a clean run is the expected code and nothing else.
# With node and dynalite present (or CI=true), the store commands also run
# once against DynamoDB (dynalite on loopback), which exercises lib/aws/ and
# lib/conn/http.c.  Usage: IDEMKIT_BIN=build/bin sh tests/valgrind.sh

set -u
BIN=${IDEMKIT_BIN:?set IDEMKIT_BIN}
SRC=${IDEMKIT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
t=$(mktemp -d "${TMPDIR:-/tmp}/idemkit-vg.XXXXXX") || exit 70
DYN_PID=
cleanup() {
	[ -z "$DYN_PID" ] || { kill "$DYN_PID" 2>/dev/null; wait "$DYN_PID" 2>/dev/null; }
	[ -z "${BANK_PID:-}" ] || { kill "$BANK_PID" 2>/dev/null; wait "$BANK_PID" 2>/dev/null; }
	rm -rf "$t"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export IDEMKIT_STATE_DIR="$t/state" IDEMKIT_LOG=warn
unset IDEMKIT_STORE IDEMKIT_QUEUE IDEMKIT_DLQ IDEMKIT_LEASE IDEMKIT_BANK_URL IDEMKIT_NOTIFY_URL

VG="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --track-fds=no --quiet"
n=0 failed=0

# vg WANT IN OUT CMD ARGS...: one run under memcheck; stdin from IN
# (/dev/null for none), stdout to OUT (kept for the next step).
vg() {
	want=$1 in=$2 out=$3 cmd=$BIN/$4
	shift 4
	n=$((n + 1))
	rc=0
	# shellcheck disable=SC2086
	$VG --log-file="$t/vg.$n" "$cmd" "$@" < "$in" > "$out" 2> "$t/err.$n" || rc=$?
	if [ "$rc" -eq "$want" ] && ! [ -s "$t/vg.$n" ]; then
		echo "ok $n - ${cmd##*/} $* -> $rc"
	else
		echo "not ok $n - ${cmd##*/} $* -> $rc (want $want)"
		sed 's/^/#   /' "$t/vg.$n" "$t/err.$n" | head -60
		failed=$((failed + 1))
	fi
}

ev() {  # ev CHARGEID [AMOUNT]
	printf '{"chargeId":"%s","accountId":"ACC-0042","amount":%s,"currency":"INR","chargeType":"SMS_ALERT_FEE","dueDate":"2026-11-30"}\n' \
		"$1" "${2:-2500}"
}

# store_sample: the store commands through their paths, on $IDEMKIT_STORE
# or the default.  PREFIX keeps chargeIds apart between backends.
store_sample() {
	p=$1
	ev "$p-1" > "$t/e1"; ev "$p-1" 9999 > "$t/e1x"; ev "$p-2" > "$t/e2"
	{ ev "$p-3"; ev "$p-4"; echo 'not json'; ev "$p-5"; } > "$t/many"
	printf '{"chargeId":"%s","amount":1.5}\n' "$p-6" > "$t/bad"
	vg 0 /dev/null "$t/o" idemp-init
	vg 0 "$t/e1" "$t/c1" idemp-claim --lease 1s
	vg 0 "$t/e2" "$t/c2" idemp-claim
	vg 11 "$t/e2" "$t/o" idemp-claim
	vg 65 "$t/bad" "$t/o" idemp-claim
	vg 0 "$t/many" "$t/cm" idemp-claim --stream
	sleep 1
	vg 0 "$t/e1" "$t/c1b" idemp-claim --lease 30s
	vg 13 "$t/c1" "$t/o" idemp-done --state DONE
	vg 0 "$t/c1b" "$t/o" idemp-done --state DONE
	vg 0 "$t/c2" "$t/o" idemp-done --state DEBITED_NOTIFICATION_FAILED
	vg 0 "$t/cm" "$t/o" idemp-done --stream --state FAILED
	vg 10 "$t/e1" "$t/o" idemp-claim
	vg 14 "$t/e1x" "$t/o" idemp-claim
	ev "$p-3" > "$t/e3"
	vg 12 "$t/e3" "$t/o" idemp-claim
	vg 0 /dev/null "$t/o" idemp-show "$p-1" "$p-2"
	vg 0 /dev/null "$t/o" idemp-show --json "$p-1"
	vg 1 /dev/null "$t/o" idemp-show "$p-nope"
	vg 0 /dev/null "$t/o" idemp-list
	vg 0 /dev/null "$t/o" idemp-list --state DONE --format event
	vg 0 /dev/null "$t/l" idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope
	vg 0 "$t/l" "$t/o" idemp-done --renotified
	vg 1 /dev/null "$t/o" idemp-list --expired
}

store_sample V
vg 0 /dev/null "$t/o" idemkit-code
vg 0 /dev/null "$t/o" idemkit-code 75 DUP_DONE
vg 1 /dev/null "$t/o" idemkit-code NOPE
for c in idemp-claim idemp-done idemp-show idemp-list idemp-init idemkit-code; do
	vg 0 /dev/null "$t/o" "$c" --help
	vg 64 /dev/null "$t/o" "$c" --no-such-option
done
vg 78 /dev/null "$t/o" idemp-init --store redis:x

# The queue commands, the bank simulator (itself under memcheck, stopped
# with SIGTERM) and the debit and notification steps against it.
Q="sqlite:$t/queue.db#vg"
ev Q-1 > "$t/q1"; { ev Q-2; ev Q-3; echo 'poison'; } > "$t/q2"
vg 0 "$t/q1" "$t/o" sqs-send --queue "$Q"
vg 0 "$t/q2" "$t/o" sqs-send --queue "$Q" --attr k=v --delay 0
vg 0 /dev/null "$t/o" sqs-stat --queue "$Q"
vg 0 /dev/null "$t/r1" sqs-recv --queue "$Q" --max 1
vg 0 /dev/null "$t/rm" sqs-recv --queue "$Q" --max 10 --drain
vg 1 /dev/null "$t/o" sqs-recv --queue "$Q" --max 1
vg 78 /dev/null "$t/o" sqs-recv --queue "nope:x"
BANK_PID=
$VG --log-file="$t/vg.bank" "$BIN/bank-sim" --port 0 --port-file "$t/bank.port" \
	--db "$t/bank.db" --decline ACC-DECL > "$t/bank.out" 2> "$t/bank.err" &
BANK_PID=$!
i=0
while [ $i -lt 200 ] && ! [ -s "$t/bank.port" ]; do sleep 0.05; i=$((i + 1)); done
B=http://127.0.0.1:$(cat "$t/bank.port")
export IDEMKIT_BANK_URL="$B/debits" IDEMKIT_NOTIFY_URL="$B/notifications"
vg 0 "$t/r1" "$t/c1" idemp-claim
vg 0 "$t/c1" "$t/d1" charge-debit --timeout 5s
vg 0 "$t/d1" "$t/n1" charge-notify --timeout 5s
vg 0 "$t/n1" "$t/f1" idemp-done
vg 0 "$t/f1" "$t/o" sqs-ack --queue "$Q"
vg 0 "$t/rm" "$t/cm" idemp-claim --stream
vg 0 "$t/cm" "$t/dm" charge-debit --stream --timeout 5s
vg 0 "$t/dm" "$t/nm" charge-notify --stream --timeout 5s
vg 0 "$t/nm" "$t/fm" idemp-done --stream
vg 0 "$t/fm" "$t/o" sqs-ack --stream --queue "$Q"
ev Q-D 100 | sed 's/ACC-0042/ACC-DECL/' > "$t/qd"
vg 0 "$t/qd" "$t/cd" idemp-claim
vg 20 "$t/cd" "$t/o" charge-debit --timeout 5s
vg 0 /dev/null "$t/o" sqs-stat --queue "$Q-dlq"
kill -TERM "$BANK_PID"
rc=0; wait "$BANK_PID" || rc=$?; BANK_PID=
n=$((n + 1))
if [ "$rc" -eq 0 ] && ! [ -s "$t/vg.bank" ]; then
	echo "ok $n - bank-sim (served the debits above, stopped by SIGTERM) -> 0"
else
	echo "not ok $n - bank-sim -> $rc"; sed 's/^/#   /' "$t/vg.bank" "$t/bank.err" | head -60
	failed=$((failed + 1))
fi
vg 75 "$t/c1" "$t/o" charge-debit --timeout 1s
for c in sqs-send sqs-recv sqs-ack sqs-stat charge-debit charge-notify bank-sim; do
	vg 0 /dev/null "$t/o" "$c" --help
	vg 64 /dev/null "$t/o" "$c" --no-such-option
done
unset IDEMKIT_BANK_URL IDEMKIT_NOTIFY_URL

if command -v node >/dev/null 2>&1 && [ -e "$SRC/node_modules/dynalite/cli.js" ]; then
	export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	export AWS_EC2_METADATA_DISABLED=true AWS_SHARED_CREDENTIALS_FILE=/nonexistent
	export AWS_CONFIG_FILE=/nonexistent IDEMKIT_AWS_MAX_BACKOFF=100ms
	unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_CONTAINER_CREDENTIALS_RELATIVE_URI \
		AWS_CONTAINER_CREDENTIALS_FULL_URI AWS_CA_BUNDLE
	for _ in 1 2 3 4 5; do
		port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
		node "$SRC/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$port" \
			--createTableMs 20 > "$t/dyn.log" 2>&1 &
		DYN_PID=$!
		i=0
		while [ $i -lt 100 ] && ! grep -q listening "$t/dyn.log"; do
			kill -0 "$DYN_PID" 2>/dev/null || break
			sleep 0.05; i=$((i + 1))
		done
		grep -q listening "$t/dyn.log" && break
		kill "$DYN_PID" 2>/dev/null; wait "$DYN_PID" 2>/dev/null; DYN_PID=
	done
	if [ -n "$DYN_PID" ]; then
		export AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:$port" IDEMKIT_STORE=dynamodb:vg-idem
		store_sample D
		unset IDEMKIT_STORE
	else
		echo "not ok - dynalite did not start"; failed=$((failed + 1))
	fi
elif [ "${CI:-}" = true ]; then
	echo "not ok - node is required under CI"; failed=$((failed + 1))
else
	echo "# skip: dynamodb sample (node or dynalite not installed)"
fi

echo "valgrind: $n runs, $failed failed"
[ "$failed" -eq 0 ]
