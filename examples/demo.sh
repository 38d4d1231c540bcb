#!/bin/sh
# make demo: the whole job on the embedded default, on loopback only.
# make demo-aws (DEMO_BACKEND=aws): the same on DynamoDB and SQS, played by
# the emulators pinned in package-lock.json (dynalite, local-aws-sqs).
# make demo-postgres (DEMO_BACKEND=postgres): the store on PostgreSQL, a
# throwaway server run as the postgres user on a loopback port (root
# needed), or the one in DEMO_PG_URL; the queue stays embedded.
# Resets its state, starts the bank simulator, enqueues 20 charges with
# about 30% of them sent again under the same chargeId (plus one poison
# message), drains the queue with charge-worker -j 4, and checks against the
# bank's own ledger that every chargeId was debited exactly once.
set -eu

BIN=${IDEMKIT_BIN:-$(pwd)/build/bin}
PATH=$BIN:$PATH
DEMO=${IDEMKIT_DEMO_DIR:-$(pwd)/build/demo}
N=20

rm -rf "$DEMO"
mkdir -p "$DEMO"
export IDEMKIT_STATE_DIR="$DEMO/state"
export IDEMKIT_LOG=warn
unset IDEMKIT_STORE IDEMKIT_QUEUE IDEMKIT_DLQ

PIDS=
PGDEMO=
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	if [ -n "$PGDEMO" ]; then
		(cd / && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDEMO/data" -m fast -w stop) >/dev/null 2>&1 || true
		rm -rf "$PGDEMO"
	fi
	return 0
}
trap 'rc=$?; cleanup; exit $rc' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "${DEMO_BACKEND:-sqlite}" = aws ]; then
	command -v node >/dev/null || { echo "demo-aws: needs Node.js (make deps; npm ci)" >&2; exit 1; }
	[ -d node_modules/dynalite ] || npm ci --no-audit --no-fund --loglevel=error
	export AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
	# Their own sessions: a Node.js server that forwards its SIGTERM to its
	# process group would otherwise stop this script too.
	setsid node tests/sqs-server.js > "$DEMO/sqs.port" 2>"$DEMO/sqs.err" &
	PIDS="$PIDS $!"
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	setsid node node_modules/dynalite/cli.js --host 127.0.0.1 --port "$port" --createTableMs 20 \
		>"$DEMO/dynalite.log" 2>&1 &
	PIDS="$PIDS $!"
	i=0
	until [ -s "$DEMO/sqs.port" ] && grep -q listening "$DEMO/dynalite.log"; do
		i=$((i + 1))
		[ $i -lt 600 ] || { echo "demo-aws: emulators did not start" >&2; cat "$DEMO/sqs.err" "$DEMO/dynalite.log" >&2; exit 1; }
		sleep 0.05
	done
	AWS_ENDPOINT_URL_SQS="http://127.0.0.1:$(cat "$DEMO/sqs.port")"
	export AWS_ENDPOINT_URL_SQS
	export AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:$port"
	for q in charges charges-dlq; do
		curl -fsS -H 'X-Amz-Target: AmazonSQS.CreateQueue' -H 'Content-Type: application/x-amz-json-1.0' \
			-d "{\"QueueName\":\"$q\"}" "$AWS_ENDPOINT_URL_SQS/" >/dev/null
	done
	export IDEMKIT_QUEUE="$AWS_ENDPOINT_URL_SQS/123456789012/charges"
	export IDEMKIT_DLQ="$AWS_ENDPOINT_URL_SQS/123456789012/charges-dlq"
	export IDEMKIT_STORE=dynamodb:idemkit-demo
	idemp-init > /dev/null
	echo "DynamoDB (dynalite) on $AWS_ENDPOINT_URL_DYNAMODB, SQS (local-aws-sqs) on $AWS_ENDPOINT_URL_SQS"
elif [ "${DEMO_BACKEND:-sqlite}" = postgres ]; then
	export IDEMKIT_DLQ="sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq"
	if [ -n "${DEMO_PG_URL:-}" ]; then
		IDEMKIT_STORE=$DEMO_PG_URL
	else
		PGBIN=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -1)
		[ -x "$PGBIN/initdb" ] || { echo "demo-postgres: needs PostgreSQL (apt-get install postgresql), or DEMO_PG_URL" >&2; exit 1; }
		[ "$(id -u)" -eq 0 ] || { echo "demo-postgres: run as root (the server runs as the postgres user), or set DEMO_PG_URL" >&2; exit 1; }
		PGDEMO=$(mktemp -d /tmp/idemkit-demo-pg.XXXXXX)
		chown postgres: "$PGDEMO"
		pw=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
		printf '%s\n' "$pw" > "$PGDEMO/pw"
		chown postgres: "$PGDEMO/pw"
		(cd / && runuser -u postgres -- "$PGBIN/initdb" -D "$PGDEMO/data" -U postgres --auth-local=trust \
			--auth-host=scram-sha-256 --pwfile="$PGDEMO/pw" --no-instructions) >"$DEMO/initdb.log" 2>&1
		port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
		printf "listen_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nport = %s\n" "$PGDEMO" "$port" \
			>> "$PGDEMO/data/postgresql.conf"
		(cd / && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDEMO/data" -l "$PGDEMO/server.log" -w start) >/dev/null
		"$PGBIN/psql" -X -q -h "$PGDEMO" -p "$port" -U postgres -d postgres \
			-c "CREATE ROLE idemkit LOGIN PASSWORD '$pw'" -c "CREATE DATABASE idemkit OWNER idemkit"
		# The password in a file, as in production (never in the URL).
		printf '127.0.0.1:%s:idemkit:idemkit:%s\n' "$port" "$pw" > "$DEMO/pgpass"
		chmod 600 "$DEMO/pgpass"
		export PGPASSFILE="$DEMO/pgpass"
		IDEMKIT_STORE="postgres://idemkit@127.0.0.1:$port/idemkit"
	fi
	export IDEMKIT_STORE
	echo "PostgreSQL store: $(idemp-init)"
else
	export IDEMKIT_DLQ="sqlite:$IDEMKIT_STATE_DIR/queue.db#charges-dlq"
fi

bank-sim --port 0 --db "$DEMO/bank-ledger.db" --port-file "$DEMO/bank.port" \
	>"$DEMO/bank.out" 2>"$DEMO/bank.err" &
PIDS="$PIDS $!"
i=0
while [ ! -s "$DEMO/bank.port" ]; do
	i=$((i + 1))
	[ $i -lt 100 ] || { echo "demo: bank-sim did not start" >&2; cat "$DEMO/bank.err" >&2; exit 1; }
	sleep 0.05
done
BANK_URL=http://127.0.0.1:$(cat "$DEMO/bank.port")
export IDEMKIT_BANK_URL="$BANK_URL/debits" IDEMKIT_NOTIFY_URL="$BANK_URL/notifications"
echo "bank simulator on $BANK_URL"

# 20 charges; every third one is sent twice (30%), then a poison message.
: > "$DEMO/messages"
i=1
while [ $i -le $N ]; do
	id=$(printf 'CHG-2026-11-%06d' $i)
	printf '{"chargeId":"%s","accountId":"ACC-%04d","amount":%d,"currency":"INR","chargeType":"SMS_ALERT_FEE","dueDate":"2026-11-30"}\n' \
		"$id" $((i % 7 + 1)) $((500 + i * 25)) >> "$DEMO/messages"
	i=$((i + 1))
done
cp "$DEMO/messages" "$DEMO/charges"
awk 'NR % 3 == 0' "$DEMO/charges" > "$DEMO/resent"
cat "$DEMO/resent" >> "$DEMO/messages"
echo '{"chargeId":"CHG-BROKEN","accountId":"ACC-1","amount":12.5,"currency":"INR","chargeType":"SMS_ALERT_FEE"}' >> "$DEMO/messages"
sqs-send < "$DEMO/messages" > /dev/null
echo "enqueued $(wc -l < "$DEMO/messages") messages: $N charges, $(wc -l < "$DEMO/resent") of them resent, 1 poison"

# Drain.  A duplicate that met a live claim (DUP_IN_PROGRESS) comes back
# when that claim's lease ends, so drain again until nothing is in flight.
lease=15s
rounds=0
while :; do
	rounds=$((rounds + 1))
	rc=0
	charge-worker -j 4 --drain --lease $lease --debit-timeout 2 --notify-timeout 1 \
		--notify-retries 1 --metrics "$DEMO/idemkit.prom" 2>>"$DEMO/worker.log" || rc=$?
	case $rc in 0|1) ;; *) echo "demo: charge-worker exited $rc" >&2; tail -5 "$DEMO/worker.log" >&2; exit 1 ;; esac
	stat=$(sqs-stat)
	case $stat in *'"visible":0,"inflight":0,"delayed":0'*) break ;; esac
	[ $rounds -lt 20 ] || { echo "demo: queue not drained: $stat" >&2; exit 1; }
	sleep 1
done

# Check against the bank's ledger, one line per chargeId.
curl -fsS "$BANK_URL/ledger" > "$DEMO/ledger.ndjson"
printf '\n%-20s %5s  %-12s %-14s %s\n' chargeId sent state "bank ref" "debits at bank"
bad=0
while read -r line; do
	id=$(printf '%s' "$line" | sed 's/.*"chargeId":"\([^"]*\)".*/\1/')
	sent=$(grep -c "\"chargeId\":\"$id\"" "$DEMO/messages")
	debits=$(grep -c "\"chargeId\":\"$id\"" "$DEMO/ledger.ndjson" || true)
	rec=$(idemp-show --json "$id" 2>/dev/null || true)
	state=$(printf '%s' "$rec" | sed -n 's/.*"state":"\([A-Z_]*\)".*/\1/p')
	ref=$(printf '%s' "$rec" | sed -n 's/.*"debitRef":"\([^"]*\)".*/\1/p')
	mark=
	if [ "$debits" -ne 1 ] || [ "$state" != DONE ] || \
	   ! grep -q "\"ref\":\"$ref\",\"chargeId\":\"$id\"" "$DEMO/ledger.ndjson"; then
		mark='  <-- NOT EXACTLY ONCE'
		bad=$((bad + 1))
	fi
	printf '%-20s %5s  %-12s %-14s %s%s\n' "$id" "$sent" "$state" "${ref:--}" "$debits" "$mark"
done < "$DEMO/charges"

stats=$(curl -fsS "$BANK_URL/stats")
num() { printf '%s' "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
dlq=$(sqs-stat --queue "$IDEMKIT_DLQ")
echo
echo "worker runs:        $rounds (charge-worker -j 4 --drain)"
echo "bank:               $(num "$stats" debits) debits, $(num "$stats" replays) replays absorbed, $(num "$stats" attempts) debit calls"
echo "dead-letter queue:  $(num "$dlq" visible) message(s) (the poison one, body intact, reason in its attributes)"
grep '"summary":true' "$DEMO/worker.log" | sed 's/^/worker summary:     /'
echo
echo "the store (idemp-stats):"
idemp-stats | sed 's/^/  /'
echo
echo "one charge's record and its history (idemp-show $(head -1 "$DEMO/resent" | sed 's/.*"chargeId":"\([^"]*\)".*/\1/')):"
idemp-show "$(head -1 "$DEMO/resent" | sed 's/.*"chargeId":"\([^"]*\)".*/\1/')" | sed 's/^/  /'
echo
echo "the metrics file for node_exporter's textfile collector ($DEMO/idemkit.prom), its samples:"
grep -v '^#' "$DEMO/idemkit.prom" | grep -E 'messages_total|stuck|dnf|last_success' | sed 's/^/  /'
echo
if [ $bad -ne 0 ] || [ "$(num "$stats" debits)" -ne $N ] || [ "$(num "$dlq" visible)" -ne 1 ]; then
	echo "demo: FAILED: $bad chargeId(s) not debited exactly once" >&2
	exit 1
fi
echo "demo: OK: every one of the $N chargeIds was debited exactly once, though $(wc -l < "$DEMO/resent") were delivered twice."
