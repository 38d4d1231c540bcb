#!/usr/bin/env bats
# --metrics FILE (charge-worker, charge-recover) and idemkit-metrics: the
# file is parsed by a real Prometheus text parser (python3-prometheus-
# client's), the outcomes add up to the messages received, the store and
# DLQ gauges agree with idemp-stats and sqs-stat, the file is replaced
# atomically (a reader never sees a partial one), and a failed run keeps
# the last-success time.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

# Debian's python3, where python3-prometheus-client is installed.
PY=/usr/bin/python3

setup() {
	$PY -c 'import prometheus_client' 2>/dev/null || {
		[ "${CI:-}" != true ] || { echo "python3-prometheus-client is required under CI"; return 1; }
		skip "python3-prometheus-client not installed"
	}
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=warn
	M=$BATS_TEST_TMPDIR/textfile/idemkit_worker.prom
	mkdir -p "${M%/*}"
}
teardown() { bank_stop; }

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 0 --lease 15s)

# prom FILE EXPR: EXPR evaluated over the parsed file, where
# v("name", label=value, ...) is one sample's value (None when absent).
prom() { $PY - "$1" "$2" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(open(sys.argv[1]).read()))
samples = [s for f in fams for s in f.samples]
def v(name, **labels):
    for s in samples:
        if s.name == name and all(s.labels.get(k) == x for k, x in labels.items()):
            return s.value
    return None
def vs(name):
    return [s for s in samples if s.name == name]
print(eval(sys.argv[2]))
PY
}

@test "idemkit-metrics: usage (64), no summary on stdin (65), a directory it cannot write (78), --clock" {
	run idemkit-metrics --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"65  DATAERR"* ]]
	run idemkit-metrics --file "$M" --job worker --started 1
	[ "$status" -eq 64 ]
	run idemkit-metrics --file "$M" --job 'Bad"Job' --started 1 --status 0
	[ "$status" -eq 64 ]
	run idemkit-metrics --file "$M" --job worker --started x --status 0
	[ "$status" -eq 64 ]
	run --separate-stderr idemkit-metrics --file "$M" --job worker --started 1 --status 0 <<<'{"not":"a summary"}'
	[ "$status" -eq 65 ]
	[[ "$stderr" == *'no {"summary":true'* ]]
	[ ! -e "$M" ]
	run --separate-stderr idemkit-metrics --file "$BATS_TEST_TMPDIR/nodir/x.prom" --job worker \
		--started 1 --status 0 <<<'{"summary":true,"received":0}'
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"metrics $BATS_TEST_TMPDIR/nodir/x.prom: create a temporary file: No such file or directory"* ]]
	run idemkit-metrics --clock
	[ "$status" -eq 0 ]
	[[ "$output" =~ ^[0-9]{13}$ ]]
}

@test "charge-worker --metrics: parsed by Prometheus' parser; outcomes add up to received; stats and DLQ gauges" {
	bank_start --decline ACC-BAD
	for i in 1 2 3; do event "CHG-M$i" | sqs-send >/dev/null; done
	event CHG-M1 | sqs-send >/dev/null                # a duplicate
	event CHG-MX ACC-BAD | sqs-send >/dev/null        # declined: FAILED, DLQ
	printf 'not json' | sqs-send >/dev/null           # invalid: DLQ
	run --separate-stderr charge-worker --drain "${fast[@]}" --metrics "$M"
	[ "$status" -eq 0 ]
	summary=$(grep '"summary"' <<<"$stderr")
	[ "$(jget "$summary" received)" -eq 6 ]
	[ "$(prom "$M" 'v("idemkit_worker_received_total", idemkit_job="worker")')" = 6.0 ]
	[ "$(prom "$M" 'sum(s.value for s in vs("idemkit_worker_messages_total"))')" = 6.0 ]
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="debited")')" = 3.0 ]
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="dup_done")')" = 1.0 ]
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="declined")')" = 1.0 ]
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="invalid")')" = 1.0 ]
	[ "$(prom "$M" 'len(vs("idemkit_worker_messages_total"))')" = 12 ]
	# the store gauges are idemp-stats's
	stats=$(idemp-stats --json)
	[ "$(prom "$M" 'int(v("idemkit_records", state="DONE"))')" = "$(jget "$stats" states.DONE)" ]
	[ "$(prom "$M" 'int(v("idemkit_records", state="FAILED"))')" = 1 ]
	[ "$(prom "$M" 'int(v("idemkit_stuck_records"))')" = 0 ]
	[ "$(prom "$M" 'int(v("idemkit_dnf_backlog"))')" = 0 ]
	[ "$(prom "$M" 'int(v("idemkit_store_stats_up"))')" = 1 ]
	# the DLQ holds the declined and the invalid message
	[ "$(prom "$M" 'int(v("idemkit_dlq_messages", kind="visible"))')" = 2 ]
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 0 ]
	[ "$(prom "$M" 'v("idemkit_last_success_timestamp_seconds") == v("idemkit_last_run_end_timestamp_seconds")')" = True ]
	[ "$(prom "$M" 'v("idemkit_run_duration_seconds") > 0')" = True ]
	# readable by node_exporter's user; no temporary file left
	[ "$(stat -c %a "$M")" = 644 ]
	[ "$(ls "${M%/*}")" = idemkit_worker.prom ]
	# the counters go on across runs
	event CHG-M4 | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" --metrics "$M" 2>/dev/null
	[ "$(prom "$M" 'v("idemkit_worker_received_total")')" = 7.0 ]
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="debited")')" = 4.0 ]
}

@test "the age gauges are in seconds: a DNF record an hour old, a stuck claim two hours old" {
	event CHG-AGE-D | idemp-claim 2>/dev/null |
		sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-1"}}/' | idemp-done >/dev/null
	event CHG-AGE-S | idemp-claim --lease 1s >/dev/null 2>&1
	[ "$(jget "$(idemp-show --json CHG-AGE-D)" state)" = DEBITED_NOTIFICATION_FAILED ]
	# records of a known age: last updated 3 600 s and 7 200 s ago, the
	# claim's lease long over (written as the store keeps them, epoch ms)
	now=$(date +%s%3N)
	sqlite3 "$BATS_TEST_TMPDIR/store.db" \
		"UPDATE records SET updated_at = $now - 3600000 WHERE key = 'CHG-AGE-D';
		 UPDATE records SET updated_at = $now - 7200000, lease_until = $now - 7000000 WHERE key = 'CHG-AGE-S';"
	started=$(idemkit-metrics --clock)
	echo '{"summary":true,"received":0}' |
		idemkit-metrics --file "$M" --job worker --started "$started" --status 1
	[ "$(prom "$M" 'int(v("idemkit_stuck_records"))')" = 1 ]
	[ "$(prom "$M" 'int(v("idemkit_dnf_backlog"))')" = 1 ]
	# the age in seconds, give or take the seconds this test takes
	[ "$(prom "$M" '3600 <= v("idemkit_oldest_dnf_age_seconds") < 3660')" = True ]
	[ "$(prom "$M" '7200 <= v("idemkit_oldest_stuck_age_seconds") < 7260')" = True ]
	# and idemp-stats says the same, in its own unit (ms)
	stats=$(idemp-stats --json)
	[ "$(jget "$stats" oldestDnfMs)" -ge 3600000 ]
	[ "$(jget "$stats" oldestDnfMs)" -lt 3660000 ]
	[ "$(jget "$stats" oldestStuckMs)" -ge 7200000 ]
}

@test "a failed run keeps the last-success time; its own end and status are recorded" {
	bank_start
	event CHG-F1 | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" --metrics "$M" 2>/dev/null
	ok=$(prom "$M" 'v("idemkit_last_success_timestamp_seconds")')
	bank_stop
	sleep 0.01
	event CHG-F2 | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain "${fast[@]}" --metrics "$M"
	[ "$status" -eq 75 ]
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 75 ]
	[ "$(prom "$M" 'v("idemkit_last_success_timestamp_seconds")')" = "$ok" ]
	[ "$(prom "$M" "v('idemkit_last_run_end_timestamp_seconds') > $ok")" = True ]
	# (a drain looks again at what it left: each receive has one outcome)
	[ "$(prom "$M" 'v("idemkit_worker_messages_total", outcome="left") >= 1')" = True ]
	[ "$(prom "$M" 'sum(s.value for s in vs("idemkit_worker_messages_total")) == v("idemkit_worker_received_total")')" = True ]
	# the charge the failed run left is stuck: IN_PROGRESS (its lease is live)
	[ "$(prom "$M" 'int(v("idemkit_records", state="IN_PROGRESS"))')" = 1 ]
	# an empty queue (1) is a success (another queue: the copy the failed
	# run left is due back after its backoff, which a loaded machine can
	# spend before this run starts; received then, it would be 75)
	IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/empty.db#charges" IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/empty.db#charges-dlq" \
		run --separate-stderr charge-worker --drain "${fast[@]}" --metrics "$M" --wait 0
	[ "$status" -eq 1 ]
	[ "$(prom "$M" "v('idemkit_last_success_timestamp_seconds') > $ok")" = True ]
}

@test "the file is replaced atomically: a reader polling it never sees a partial file" {
	summary='{"summary":true,"received":3,"debited":3}'
	idemkit-metrics --file "$M" --job worker --started 1 --status 0 <<<"$summary"
	# the reader parses every version it can open, until told to stop
	$PY - "$M" "$BATS_TEST_TMPDIR/stop" > "$BATS_TEST_TMPDIR/reads" <<'PY' &
import os, sys
from prometheus_client.parser import text_string_to_metric_families
n = bad = 0
while not os.path.exists(sys.argv[2]) or n < 50:
    text = open(sys.argv[1]).read()
    n += 1
    try:
        names = {f.name for f in text_string_to_metric_families(text)}
    except Exception:
        names = set()
    # the last family written is there: the whole file was
    if not text.endswith("\n") or "idemkit_dlq_up" not in names:
        bad += 1
print(n, bad)
PY
	reader=$!
	for i in $(seq 150); do
		idemkit-metrics --file "$M" --job worker --started 1 --status 0 <<<"$summary" || break
	done
	touch "$BATS_TEST_TMPDIR/stop"
	wait "$reader"
	read -r reads bad < "$BATS_TEST_TMPDIR/reads"
	echo "reads $reads, partial $bad"
	[ "$reads" -ge 50 ]
	[ "$bad" -eq 0 ]
	[ "$(prom "$M" 'v("idemkit_worker_received_total")')" = "$((3 * 151)).0" ]
	[ "$(ls "${M%/*}")" = idemkit_worker.prom ]
}

@test "charge-recover --renotify --metrics: the recovery counts, under its own job label" {
	bank_start --notify-fail
	event CHG-RM | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>/dev/null
	bank_stop
	bank_start
	sleep 0.05
	R=${M%/*}/idemkit_recover_renotify.prom
	run --separate-stderr charge-recover --renotify --older-than 10ms --notify-retries 0 --metrics "$R"
	[ "$status" -eq 0 ]
	[ "$(prom "$R" 'v("idemkit_recover_found_total", idemkit_job="recover-renotify")')" = 1.0 ]
	[ "$(prom "$R" 'v("idemkit_recover_records_total", outcome="renotified")')" = 1.0 ]
	[ "$(prom "$R" 'v("idemkit_recover_records_total", outcome="stillFailed")')" = 0.0 ]
	[ "$(prom "$R" 'int(v("idemkit_dnf_backlog"))')" = 0 ]
	# nothing left to do (1): still a success, and a file
	run --separate-stderr charge-recover --renotify --metrics "$R"
	[ "$status" -eq 1 ]
	[ "$(prom "$R" 'int(v("idemkit_run_exit_status"))')" = 1 ]
	[ "$(prom "$R" 'v("idemkit_recover_found_total")')" = 1.0 ]
}

@test "--metrics on every exit: a refusal to start (78) and a held lock (1) rewrite the status and the end time (issue 29 item 4)" {
	bank_start
	event CHG-E1 | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" --metrics "$M" 2>/dev/null
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 0 ]
	end0=$(prom "$M" 'v("idemkit_last_run_end_timestamp_seconds")')
	sleep 0.01
	IDEMKIT_STORE=nope: run --separate-stderr charge-worker --drain "${fast[@]}" --metrics "$M"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"configuration refused"* ]]
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 78 ]
	[ "$(prom "$M" "v('idemkit_last_run_end_timestamp_seconds') > $end0")" = True ]
	[ "$(prom "$M" "v('idemkit_last_success_timestamp_seconds') <= $end0")" = True ]
	# the counters go on: the refused run received nothing
	[ "$(prom "$M" 'int(v("idemkit_worker_received_total"))')" = 1 ]
	end1=$(prom "$M" 'v("idemkit_last_run_end_timestamp_seconds")')
	sleep 0.01
	# another run holds the lock: 1 (nothing to do), written too
	exec 8>>"$BATS_TEST_TMPDIR/w.lock"
	flock -n 8
	run --separate-stderr charge-worker --drain "${fast[@]}" --lock "$BATS_TEST_TMPDIR/w.lock" --metrics "$M"
	exec 8>&-
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"another run holds"* ]]
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 1 ]
	[ "$(prom "$M" "v('idemkit_last_run_end_timestamp_seconds') > $end1")" = True ]
	[ "$(prom "$M" 'int(v("idemkit_worker_received_total"))')" = 1 ]
}

@test "a run without --drain or --once rewrites its metrics every --metrics-every seconds while it runs, and its status at the stop; nothing counted twice (issue 29 item 4)" {
	bank_start
	run charge-worker --metrics-every 0 --metrics "$M"
	[ "$status" -eq 64 ]
	[[ "$output" == *"--metrics-every: want whole seconds, at least 1, got '0'"* ]]
	event CHG-T1 | sqs-send >/dev/null
	charge-worker --wait 1 "${fast[@]}" --metrics "$M" --metrics-every 1 \
		2>"$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	# until_received N: wait (bounded) for a periodic write counting N
	until_received() {
		local i
		for i in $(seq 300); do
			[ -s "$M" ] && [ "$(prom "$M" 'int(v("idemkit_worker_received_total") or 0)')" = "$1" ] && return 0
			sleep 0.1
		done
		return 1
	}
	until_received 1
	kill -0 "$pid"   # still running: the write was a periodic one
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 0 ]
	[ "$(prom "$M" 'int(v("idemkit_worker_messages_total", outcome="debited"))')" = 1 ]
	[ "$(prom "$M" 'v("idemkit_last_success_timestamp_seconds") > 0')" = True ]
	event CHG-T2 | sqs-send >/dev/null
	until_received 2
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 143 ]
	[ "$(prom "$M" 'int(v("idemkit_run_exit_status"))')" = 143 ]
	[ "$(prom "$M" 'int(v("idemkit_worker_received_total"))')" = 2 ]
	[ "$(prom "$M" 'int(v("idemkit_worker_messages_total", outcome="debited"))')" = 2 ]
	# the summary line keeps the run's totals
	grep -q '"summary":true,"received":2,"debited":2,' "$BATS_TEST_TMPDIR/err"
}
