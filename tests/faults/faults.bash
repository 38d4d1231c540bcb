# tests/faults/faults.bash: shared set-up for the fault suites (make faults).
# Loads the main helper (PATH, throwaway state) and the bank helper, and
# adds: a short-visibility embedded queue, charge generators, a drain loop
# and the checks every fault test ends with (ledger, queue, records).

IDEMKIT_SRC=${IDEMKIT_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
export IDEMKIT_SRC
bats_require_minimum_version 1.5.0
load ../helper
load ../bank_helper

# Short leases and timeouts: charge-worker refuses a lease shorter than
# debit + notify timeouts + 10s, so 12s is the floor with these.
WORKER_OPTS=(--lease 12s --debit-timeout 1 --notify-timeout 1 --notify-retries 0)
# A backoff that can grow past the drain's wait (one lease, 12 s): a drain
# during an outage looks again at what it left while it is due back within
# its wait, so with a cap under the wait it would look until the outage ends.
export IDEMKIT_LOG=warn IDEMKIT_BACKOFF_BASE=1 IDEMKIT_BACKOFF_CAP=30

# embedded_queue [VISIBILITY]: a fresh SQLite queue and DLQ in the test's
# directory (IDEMKIT_QUEUE, IDEMKIT_DLQ exported) and the default store.
embedded_queue() {
	local db=$BATS_TEST_TMPDIR/queue.db
	export IDEMKIT_QUEUE="sqlite:$db#charges?visibility=${1:-2}"
	export IDEMKIT_DLQ="sqlite:$db#charges-dlq"
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/idem.db
}

# charges N FILE [PREFIX]: N valid ChargeDueEvents, one per line.
charges() {
	python3 - "$1" "$2" "${3:-CHG}" <<'PY'
import sys
n, out, p = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(out, "w") as f:
    for i in range(1, n + 1):
        f.write('{"chargeId":"%s-%06d","accountId":"ACC-%04d","amount":%d,"currency":"INR",'
                '"chargeType":"SMS_ALERT_FEE","dueDate":"2026-11-30"}\n' % (p, i, i % 97, 100 + i))
PY
}

# deliveries IN OUT SEED: every line of IN 1-5 times, shuffled (seeded).
deliveries() {
	python3 - "$1" "$2" "$3" <<'PY'
import random, sys
r = random.Random(int(sys.argv[3]))
lines = [l for l in open(sys.argv[1]) if l.strip()]
out = [l for l in lines for _ in range(r.randint(1, 5))]
r.shuffle(out)
open(sys.argv[2], "w").writelines(out)
PY
}

# qdepth [QUEUE]: visible + in flight + delayed messages.  local-aws-sqs
# counts a message in flight in ApproximateNumberOfMessages too (every
# message not delayed; real SQS counts the visible ones only), so on an
# http queue (the emulator here) in flight is not added again.
qdepth() {
	local s q=${1:-${IDEMKIT_QUEUE:-}}
	s=$(sqs-stat ${1:+--queue "$1"}) || return 1
	python3 -c 'import json,sys; s=json.loads(sys.argv[1]); sqs=sys.argv[2].startswith("http")
print(s["visible"]+(0 if sqs else s["inflight"])+s["delayed"])' "$s" "$q"
}

# bank_ensure: restarts bank-sim on the same port and ledger when it is
# gone.  On this shared machine pids wrap quickly (pid_max 32768) and any
# suite's `kill $STALE_PID` can hit our server; the ledger is durable, so
# a restart loses nothing, and the test says it happened.
bank_ensure() {
	[ -n "${BANK_PID:-}" ] && kill -0 "$BANK_PID" 2>/dev/null && return 0
	if [ -n "${BANK_PID:-}" ]; then   # not stopped by the test: it vanished
		local how=0
		wait "$BANK_PID" 2>/dev/null || how=$?
		echo "bank-sim (pid $BANK_PID) vanished (exit $how); restarting it on port $BANK_PORT" >&2
		tail -3 "$BANK_DIR/err" >&2
		# a crash of the server itself (not a signal from outside) fails the test
		case $how in 137|143|129) ;; *) return 1 ;; esac
		report "note: bank-sim vanished (exit $how: a signal from outside) during: ${BATS_TEST_DESCRIPTION:0:50}; restarted"
	fi
	bank-sim --port "$BANK_PORT" --db "$BANK_DIR/ledger.db" ${BANK_OPTS:-} \
		>>"$BANK_DIR/out" 2>>"$BANK_DIR/err" 3>&- &
	BANK_PID=$!
	local i
	for i in $(seq 100); do
		curl -fsS --max-time 1 "$BANK_URL/health" >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	return 1
}

# drain MAXSECS [charge-worker options...]: charge-worker --drain rounds
# until the queue is empty (a duplicate that met a live claim comes back
# when the lease ends, so one round is not always enough).  Fails after
# MAXSECS.  The rounds' stderr goes to $BATS_TEST_TMPDIR/worker.log.
#
# On RabbitMQ the queue's count is its ready messages only: a delivery a
# holder keeps (its receiver gone: a killed loop, or a duplicate left for
# its backoff) is in no count, and comes back when its visibility ends.
# The drain ends there once no holder of the queue is alive (held_none)
# and then the queue is empty, twice in a row: a holder's last return
# (basic.reject) has no answer, and the count the broker gives the moment
# the holder has ended may not have it yet; the round between the two
# receives it if so.
drain() {
	local max=$1 start=$SECONDS rc empty=0
	shift
	while :; do
		rc=0
		bank_ensure
		charge-worker --drain "${WORKER_OPTS[@]}" "$@" 2>>"$BATS_TEST_TMPDIR/worker.log" || rc=$?
		case $rc in 0|1|75) ;; *) echo "charge-worker exited $rc" >&2; tail -5 "$BATS_TEST_TMPDIR/worker.log" >&2; return 1 ;; esac
		if held_none && [ "$(qdepth)" -eq 0 ]; then
			case ${IDEMKIT_QUEUE:-} in amqp://*|amqps://*) ;; *) return 0 ;; esac
			[ "$empty" -eq 1 ] && return 0
			empty=1
			continue
		fi
		empty=0
		if [ $((SECONDS - start)) -ge "$max" ]; then
			echo "queue not drained after ${max}s: $(sqs-stat)" >&2
			return 1
		fi
		sleep 0.5
	done
}

# held_none: true unless the queue is RabbitMQ's and a holder of it is
# alive (idemkit(7) "RabbitMQ": a holder ends once its receiver has gone
# and it holds nothing; what it held went back to the queue before).  A
# holder is a fork of sqs-recv with the receiver's environment: found by
# its name and IDEMKIT_QUEUE in /proc, no process started.  Not the
# broker's unacknowledged count: rabbitmqctl list_queues reports a quorum
# queue's counts as of its last metrics tick (seconds old: 0 unacked while
# deliveries were held ended the drain early, 12-16 of 20 debited), and
# costs a second of CPU.
held_none() {
	case ${IDEMKIT_QUEUE:-} in amqp://*|amqps://*) ;; *) return 0 ;; esac
	local c comm
	for c in /proc/[0-9]*/comm; do
		read -r comm 2>/dev/null < "$c" || continue
		[ "$comm" = sqs-recv ] || continue
		! grep -qszxF "IDEMKIT_QUEUE=$IDEMKIT_QUEUE" "${c%comm}environ" || return 1
	done
}

# bank_stats: bank-sim's counters.  Retried on a failed connection: in a
# storm 8 workers' debits and notifications in flight can fill the bank's
# 256 connections, and it resets a new one (curl 56) until one frees, more
# so on a loaded machine (faults/postgres.bats 2 read nothing for a
# minute beside the model); a GET changes nothing, so a retry is safe.
bank_stats() { bank_get /stats --retry 30 --retry-delay 1 --retry-all-errors; }
stat_of() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], 0))' "$1" "$2"; }

# check_exactly_once CHARGES: each chargeId in CHARGES debited exactly once
# at the bank (and nothing else debited), its record terminal (DONE), the
# queue and the DLQ empty (on RabbitMQ: and nothing held, held_none).  Prints the bank's replay count as REPLAYS.
check_exactly_once() {
	local want
	want=$(wc -l < "$1")
	bank_ensure
	bank_get /ledger > "$BATS_TEST_TMPDIR/ledger.ndjson"
	python3 - "$1" "$BATS_TEST_TMPDIR/ledger.ndjson" <<'PY'
import collections, json, sys
want = [json.loads(l)["chargeId"] for l in open(sys.argv[1]) if l.strip()]
led = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
c = collections.Counter(d["chargeId"] for d in led)
bad = [k for k in want if c[k] != 1]
extra = [k for k in c if k not in set(want)]
if bad or extra or len(led) != len(want):
    print("ledger: %d debits for %d charges; not once: %s; unexpected: %s"
          % (len(led), len(want), bad[:10], extra[:10]), file=sys.stderr)
    sys.exit(1)
PY
	held_none || { echo "a holder still holds deliveries of the queue" >&2; return 1; }
	[ "$(qdepth)" -eq 0 ] || { echo "queue not empty: $(sqs-stat)" >&2; return 1; }
	[ "$(qdepth "$IDEMKIT_DLQ")" -eq 0 ] || {
		echo "DLQ not empty: $(sqs-stat --queue "$IDEMKIT_DLQ"); the first, with their reasons:" >&2
		sqs-recv --queue "$IDEMKIT_DLQ" --max 3 --visibility 60 2>&1 |
			python3 -c 'import json, sys
for l in sys.stdin:
    try:
        e = json.loads(l)
        print(json.loads(e["body"]).get("chargeId"), json.dumps(e.get("attributes")))
    except ValueError:
        print(l.rstrip())' >&2
		return 1
	}
	local rc=0
	idemp-list --state IN_PROGRESS > "$BATS_TEST_TMPDIR/inprogress" 2>/dev/null || rc=$?
	[ "$rc" -eq 1 ] || { echo "records not terminal: $(head -3 "$BATS_TEST_TMPDIR/inprogress")" >&2; return 1; }
	[ "$(idemp-list --state DONE 2>/dev/null | wc -l)" -eq "$want" ]
	REPLAYS=$(stat_of "$(bank_stats)" replays)
}

# report LINE: a measured number, kept in build/faults-report.txt too.
report() {
	echo "# $*" >&3
	echo "$*" >> "${IDEMKIT_FAULTS_REPORT:-$IDEMKIT_SRC/build/faults-report.txt}"
}

# aws_queue_store [BACKEND]: dynalite (BACKEND dynamodb, the default) or
# DynamoDB Local (dynamodb-local) as the store and local-aws-sqs (queue and
# DLQ, visibility 2s) on loopback, fake credentials, and a fresh queue,
# DLQ and table (aws_fresh).  Sets SQS_PID; the store's emulator via
# helper.bash (DDB_URL).  Call aws_stop from teardown (or setup_file and
# teardown_file: the emulators then serve the whole file).
aws_queue_store() {
	require_node
	aws_test_env
	export IDEMKIT_AWS_MAX_BACKOFF=50ms
	ddb_emulator_start "${1:-dynamodb}" || return 1
	local d=${BATS_TEST_TMPDIR:-$BATS_FILE_TMPDIR} i
	(cd "$IDEMKIT_SRC" && exec node tests/sqs-server.js) >"$d/sqs.port" 2>"$d/sqs.log" 3>&- &
	SQS_PID=$!
	for i in $(seq 200); do [ -s "$d/sqs.port" ] && break; sleep 0.05; done
	[ -s "$d/sqs.port" ] || { cat "$d/sqs.log" >&2; return 1; }
	export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$(cat "$d/sqs.port")
	aws_fresh
}
# aws_fresh: a new queue, DLQ (IDEMKIT_QUEUE, IDEMKIT_DLQ) and table
# (IDEMKIT_STORE) on the running emulators.
aws_fresh() {
	local q=storm$$x$RANDOM
	curl -fsS -H 'X-Amz-Target: AmazonSQS.CreateQueue' -H 'Content-Type: application/x-amz-json-1.0' \
		-d "{\"QueueName\":\"$q-dlq\"}" "$AWS_ENDPOINT_URL_SQS/" >/dev/null
	curl -fsS -H 'X-Amz-Target: AmazonSQS.CreateQueue' -H 'Content-Type: application/x-amz-json-1.0' \
		-d "{\"QueueName\":\"$q\",\"Attributes\":{\"VisibilityTimeout\":\"2\"}}" "$AWS_ENDPOINT_URL_SQS/" >/dev/null
	export IDEMKIT_QUEUE=$AWS_ENDPOINT_URL_SQS/123456789012/$q
	export IDEMKIT_DLQ=$AWS_ENDPOINT_URL_SQS/123456789012/$q-dlq
	export IDEMKIT_STORE=dynamodb:storm-$$-$RANDOM
	idemp-init >/dev/null
}
aws_stop() {
	if [ -n "${SQS_PID:-}" ]; then
		kill "$SQS_PID" 2>/dev/null
		wait "$SQS_PID" 2>/dev/null
		SQS_PID=
	fi
	ddb_emulator_stop || true
}
