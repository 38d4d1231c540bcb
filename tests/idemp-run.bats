#!/usr/bin/env bats
# idemp-run(1): any command once per key, on every store
# (IDEMKIT_TEST_BACKEND, as tests/store.bats; the Makefile's check target
# runs this file on each).  Real processes against the real store servers;
# leases of 2-6 s keep it fast, and every wait is on a condition.

bats_require_minimum_version 1.5.0
# one server for the file, which some tests stop, freeze or cut the
# connections of: the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

load helper

setup_file() { store_backend_setup_file; }
teardown_file() { store_backend_teardown_file; }
setup() {
	store_backend_setup
	# pg_halt, pg_resume for the outage (setup_file's functions stay there)
	[ "${IDEMKIT_TEST_BACKEND:-}" != postgres ] || . "$IDEMKIT_SRC/tests/pg_helper.bash"
	LOG=$BATS_TEST_TMPDIR/runs.log
	: > "$LOG"
	# job.sh LOG NAME SECONDS: the command; appends "start NAME MS" and
	# "end NAME MS HOW" to LOG (HOW: ok, or term when signalled).
	JOB=$BATS_TEST_TMPDIR/job.sh
	cat > "$JOB" <<-'EOF'
	#!/bin/sh
	log=$1 name=$2
	# (the trap before the start line: a test that signals once it sees
	# that line must find the trap set; a loaded run once did not)
	trap 'echo "end $name $(date +%s%3N) term" >> "$log"; exit 143' TERM
	echo "start $name $(date +%s%3N) $IDEMP_ATTEMPT" >> "$log"
	sleep "$3" & wait $!
	echo "end $name $(date +%s%3N) ok" >> "$log"
	EOF
	chmod +x "$JOB"
}
teardown() {
	store_thaw
	# the command a killed idemp-run left behind (the SIGKILL test)
	[ ! -s "$BATS_TEST_TMPDIR/orphan.pid" ] || kill "$(cat "$BATS_TEST_TMPDIR/orphan.pid")" 2>/dev/null || true
	# the groups of stubborn commands a failed test left behind
	for f in "$BATS_TEST_TMPDIR"/*.stubborn; do
		[ ! -s "$f" ] || kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
	done
}

key() { printf 'RUN-%s-%s-%s' "${BATS_SUITE_TEST_NUMBER:-0}" "$$" "${1:-x}"; }

# wait_for CMD...: until CMD succeeds, at most 30 s.
wait_for() {
	local i
	for i in $(seq 300); do
		"$@" && return 0
		sleep 0.1
	done
	echo "timed out waiting for: $*" >&2
	return 1
}
has() { grep -q "$1" "$2" 2>/dev/null; }

# store_freeze / store_thaw: a store outage.  SQLite: another process holds
# the write lock (BEGIN EXCLUSIVE); PostgreSQL: the server stopped; Redis and
# the DynamoDB emulators: the server's process stopped (SIGSTOP).
store_freeze() {
	FROZEN=${IDEMKIT_TEST_BACKEND:-sqlite}
	case $FROZEN in
	sqlite|sqlite-cache)
		python3 -c 'import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
open(sys.argv[2] + ".locked", "w").close()
for _ in range(1200):
    if os.path.exists(sys.argv[2]):
        break
    time.sleep(0.05)' "${IDEMKIT_STORE#sqlite:}" "$BATS_TEST_TMPDIR/thaw" &
		LOCKER=$!
		wait_for test -e "$BATS_TEST_TMPDIR/thaw.locked" ;;
	postgres) pg_halt ;;
	redis) kill -STOP "$REDIS_PID" ;;
	dynamodb) kill -STOP "$DYNALITE_PID" ;;
	dynamodb-local) kill -STOP "$DDBLOCAL_PID" ;;
	esac
}
store_thaw() {
	case ${FROZEN:-} in
	'') return 0 ;;
	sqlite|sqlite-cache) touch "$BATS_TEST_TMPDIR/thaw"; wait "$LOCKER" || true ;;
	postgres) pg_resume ;;
	redis) kill -CONT "$REDIS_PID" ;;
	dynamodb) kill -CONT "$DYNALITE_PID" ;;
	dynamodb-local) kill -CONT "$DDBLOCAL_PID" ;;
	esac
	FROZEN=
}

# no_overlap LOG: every run's [start, end] apart from every other's.
no_overlap() {
	python3 - "$1" <<-'EOF'
	import sys
	runs = {}
	for line in open(sys.argv[1]):
	    f = line.split()
	    runs.setdefault(f[1], {})[f[0]] = int(f[2])
	iv = sorted((r["start"], r.get("end"), n) for n, r in runs.items())
	for (s1, e1, n1), (s2, e2, n2) in zip(iv, iv[1:]):
	    if e1 is None or e1 >= s2:
	        sys.exit(f"{n1} [{s1}, {e1}] overlaps {n2} from {s2}")
	print(len(iv), "runs, no overlap")
	EOF
}

@test "runs once: DONE with exit status, duration and renewals in the history; again DUP_DONE; another fingerprint PAYLOAD_MISMATCH" {
	k=$(key once)
	run --separate-stderr idemp-run --key "$k" --fingerprint 'fees for 2026-11' --lease 10s -- \
		sh -c 'echo "key=$IDEMP_KEY attempt=$IDEMP_ATTEMPT token=$IDEMP_TOKEN"'
	echo "$stderr"
	[ "$status" -eq 0 ]
	# the owner token: 128 random bits, then the holder (host:pid)
	[[ "$output" =~ ^key=$k\ attempt=1\ token=[0-9a-f]{32}@[^:]+:[0-9]+$ ]]
	[[ "$stderr" == *'"msg":"ran"'*'"outcome":"DONE"'* ]]

	run --separate-stderr idemp-run --key "$k" --fingerprint 'fees for 2026-11' -- sh -c 'echo ran again'
	[ "$status" -eq 10 ]
	[ -z "$output" ]
	[[ "$stderr" == *'"outcome":"DUP_DONE"'* ]]
	run --separate-stderr idemp-run --key "$k" --fingerprint 'fees for 2026-12' -- sh -c 'echo ran again'
	[ "$status" -eq 14 ]
	[ -z "$output" ]

	run idemp-show --json "$k"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" state)" = DONE ]
	# renewals: 0 unless the claim itself took a third of the lease (a
	# loaded machine's fsync: then the first renewal is due at once)
	[[ "$(jget "$output" debitRef)" =~ ^exit=0\ durationMs=[0-9]+\ renewals=[0-9]+$ ]]
	[ "$(jget "$output" history.0.op)" = claim ]
	[ "$(jget "$output" history.1.op)" = finish ]
	[ "$(jget "$output" event)" = "{\"idempRun\":{\"key\":\"$k\",\"fingerprint\":\"fees for 2026-11\",\"command\":[\"sh\",\"-c\",\"echo \\\"key=\$IDEMP_KEY attempt=\$IDEMP_ATTEMPT token=\$IDEMP_TOKEN\\\"\"]}}" ]
	# shown as a command run once, not as a charge
	run -0 idemp-show "$k"
	[[ "$output" == *"finish     DONE, result exit=0 durationMs="* ]]
	[[ "$output" == *"kind         idemp-run: a command run once for this key"* ]]
	[[ "$output" == *"command      sh -c 'echo \"key=\$IDEMP_KEY attempt=\$IDEMP_ATTEMPT token=\$IDEMP_TOKEN\"'"$'\n'* ]]
	[[ "$output" == *"ran          yes: it exited 0"* ]]
	[[ "$output" != *debited* && "$output" != *"bank ref"* ]]
	run idemp-list --state DONE
	[[ "$output" == *"\"chargeId\":\"$k\""* ]]
	# the store counts it with the others (behind the Redis fast path too,
	# which passes stats through to the store)
	run idemp-stats --json
	[ "$status" -eq 0 ]
	[[ "$output" == *"\"states\":"* ]]
}

@test "idemp-show writes a run's command with control bytes as \\xNN in \$'...', never raw to the terminal; the shell reads it back the same" {
	k=$(key esc)
	run -0 --separate-stderr idemp-run --key "$k" -- printf '%s' $'x\033[31mRED\t'
	run -0 idemp-show "$k"
	line=$(printf '%s\n' "$output" | grep '^  command ')
	[ "$line" = "  command      printf %s \$'x\\x1b[31mRED\\x09'" ]
	[[ "$output" != *$'\033'* ]]
	eval "set -- ${line#  command      }"
	[ "$3" = $'x\033[31mRED\t' ]
}

@test "a failed command: released by default (the next run runs it); --on-failure record is FAILED; exit 75 releases with 75" {
	k=$(key fail)
	run --separate-stderr idemp-run --key "$k" -- sh -c 'exit 3'
	[ "$status" -eq 17 ]
	[[ "$stderr" == *'claim released for a later run'*'exit=3'* ]]
	run -0 idemp-show "$k"
	[[ "$output" == *"ran          not to the end: the last run failed and released its claim"* ]]
	[[ "$output" == *"the next run may take it over"* ]]
	run --separate-stderr idemp-run --key "$k" -- sh -c 'kill -9 $$'
	[ "$status" -eq 17 ]
	[[ "$stderr" == *'signal=9'* ]]
	run --separate-stderr idemp-run --key "$k" -- sh -c 'exit 75'
	[ "$status" -eq 75 ]
	run --separate-stderr idemp-run --key "$k" --on-failure record -- sh -c 'exit 75'
	[ "$status" -eq 75 ]
	run --separate-stderr idemp-run --key "$k" --on-failure record -- sh -c 'echo attempt $IDEMP_ATTEMPT; exit 4'
	[ "$status" -eq 17 ]
	[ "$output" = "attempt 5" ]
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = FAILED ]
	[ "$(jget "$output" lastError)" = "the command exited 4" ]
	[ "$(jget "$output" history.-1.op)" = finish ]
	[ "$(jget "$output" history.-2.op)" = claim ]
	run -0 idemp-show "$k"
	[[ "$output" == *"ran          yes, and failed (last error)"* ]]
	# the command the record was made with (its first claim's)
	[[ "$output" == *"command      sh -c 'exit 3'"$'\n'* ]]
	run --separate-stderr idemp-run --key "$k" -- true
	[ "$status" -eq 12 ]
}

@test "--check: 0 from inside the command, 13 once the run is finished or for another token" {
	k=$(key check)
	run --separate-stderr idemp-run --key "$k" -- sh -c 'idemp-run --check && echo held; echo "$IDEMP_TOKEN" > "$0"' "$BATS_TEST_TMPDIR/token"
	[ "$status" -eq 0 ]
	[ "$output" = held ]
	IDEMP_TOKEN=$(cat "$BATS_TEST_TMPDIR/token") run --separate-stderr idemp-run --check --key "$k"
	[ "$status" -eq 13 ]
	[[ "$stderr" == *"this token no longer holds the key (DONE)"* ]]
	IDEMP_TOKEN=0123 run --separate-stderr idemp-run --check --key "$(key nothing)"
	[ "$status" -eq 13 ]
	run --separate-stderr env -u IDEMP_KEY -u IDEMP_TOKEN idemp-run --check
	[ "$status" -eq 64 ]
}

@test "usage: no key, key and --each, no command, a bad key, a command that cannot run" {
	run --separate-stderr idemp-run -- true
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-run --key a --each -- true
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-run --key a
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-run --key a --lease 2s --grace 2s -- true
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-run --key 'a b' -- true
	[ "$status" -eq 65 ]
	[[ "$stderr" == *'key: character 2 of "a b" is not in [A-Za-z0-9._:-]'* ]]
	k=$(key noexec)
	run --separate-stderr idemp-run --key "$k" -- /nonexistent/cmd
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"/nonexistent/cmd: No such file or directory"* ]]
	run --separate-stderr idemp-run --key "$k" -- true   # the claim was released
	[ "$status" -eq 0 ]
}

@test "50 processes racing on one key run the command once" {
	k=$(key race)
	pids=()
	for i in $(seq 50); do
		idemp-run --key "$k" --lease 10s -- sh -c 'echo "ran $0" >> "$1"; sleep 1' "$i" "$LOG" \
			>/dev/null 2>&1 &
		pids+=($!)
	done
	got=''
	for p in "${pids[@]}"; do
		st=0
		wait "$p" || st=$?
		got="$got $st"
	done
	echo "statuses:$got"
	[ "$(wc -l < "$LOG")" -eq 1 ]
	[ "$(tr ' ' '\n' <<<"$got" | grep -cx 0)" -eq 1 ]
	[ -z "$(tr ' ' '\n' <<<"$got" | grep -vx -e 0 -e 10 -e 11 -e '')" ]
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" attempts)" = 1 ]
}

@test "a command that runs 3 x its lease keeps running: renewals counted in its finish" {
	k=$(key long)
	# a 6 s lease (renewed every 2 s): an emulator that stalls a few seconds
	# on a loaded machine still renews in time; the command runs 3 x that
	run --separate-stderr idemp-run --key "$k" --lease 6s -- "$JOB" "$LOG" a 18.5
	echo "$stderr"
	[ "$status" -eq 0 ]
	grep -q '^end a [0-9]* ok$' "$LOG"
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = DONE ]
	ref=$(jget "$output" debitRef)
	n=${ref##*renewals=}
	echo "$ref"
	[ "$n" -ge 6 ]
	[ "$(jget "$output" attempts)" = 1 ]
}

@test "a store outage longer than the lease kills the command before its lease ends; a second host then runs it, no overlap" {
	k=$(key outage)
	IDEMKIT_LOG=debug idemp-run --key "$k" --lease 3s -- "$JOB" "$LOG" a 60 \
		2>"$BATS_TEST_TMPDIR/a.err" &
	apid=$!
	wait_for has '^start a' "$LOG"
	wait_for has '"lease renewed"' "$BATS_TEST_TMPDIR/a.err"
	store_freeze
	wait_for has '^end a' "$LOG"
	grep -q '^end a [0-9]* term$' "$LOG"
	# The kill came before the lease the store holds could end: the last
	# claim or renewal logged before it, sent at sentAt, got at least
	# sentAt + 3 s from the store.
	end=$(awk '$1 == "end" { print $3 }' "$LOG")
	python3 - "$BATS_TEST_TMPDIR/a.err" "$end" <<-'EOF'
	import json, sys
	end = int(sys.argv[2])
	logs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
	sent = [l["sentAt"] for l in logs
	        if l.get("msg") in ("claimed", "lease renewed") and l["ts"] <= end]
	print("last renewal sent", sent[-1], "lease to", sent[-1] + 3000, "killed at", end)
	assert end < sent[-1] + 3000
	EOF
	# until the lease's end, end + 3 s (one sleep to a deadline: a poll
	# would start a process ten times a second)
	left=$(( end + 3000 - $(date +%s%3N) ))
	[ "$left" -le 0 ] || sleep "$(( left / 1000 )).$(printf '%03d' $(( left % 1000 )))"
	[ "$(date +%s%3N)" -ge $(( end + 3000 )) ]
	store_thaw
	st=0
	wait "$apid" || st=$?
	cat "$BATS_TEST_TMPDIR/a.err"
	[ "$st" -eq 13 ]
	grep -q 'no lease renewal succeeded in time' "$BATS_TEST_TMPDIR/a.err"
	# a second host: runs it now (the lease ended, or was released)
	run --separate-stderr idemp-run --key "$k" --wait=30s --lease 3s -- "$JOB" "$LOG" b 0.2
	[ "$status" -eq 0 ]
	run no_overlap "$LOG"
	echo "$output"
	[ "$status" -eq 0 ]
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" attempts)" = 2 ]
}

@test "a renewal refused because another holder took the key kills the command: LEASE_LOST" {
	k=$(key takeover)
	# The command hands its claim away (releases it with its own token, as
	# idemp-done does for LEASE_SHORT), so another run takes the key while
	# idemp-run still renews: its next renewal is refused.
	cat > "$BATS_TEST_TMPDIR/handover.sh" <<-'EOF'
	#!/bin/sh
	echo "start a $(date +%s%3N)" >> "$1"
	trap 'echo "end a $(date +%s%3N) term" >> "$1"; exit 143' TERM
	printf '{"v":1,"body":"{}","claim":{"outcome":"ACQUIRED","chargeId":"%s","token":"%s"},"debit":{"outcome":"LEASE_SHORT"}}\n' \
		"$IDEMP_KEY" "$IDEMP_TOKEN" | idemp-done >/dev/null
	echo released >> "$1.released"
	sleep 60 & wait $!
	EOF
	chmod +x "$BATS_TEST_TMPDIR/handover.sh"
	# a's lease is 30 s, so its first renewal (10 s in) comes after b took
	# the key (a renewal after the release alone is refused too, since the
	# release: the next test); b runs past it, so that renewal meets b's
	# live claim, and is refused
	idemp-run --key "$k" --lease 30s -- "$BATS_TEST_TMPDIR/handover.sh" "$LOG" \
		2>"$BATS_TEST_TMPDIR/a.err" &
	apid=$!
	wait_for test -e "$LOG.released"
	run --separate-stderr idemp-run --key "$k" --lease 6s -- "$JOB" "$LOG" b 14
	echo "b: $status $stderr"
	[ "$status" -eq 0 ]
	st=0
	wait "$apid" || st=$?
	cat "$BATS_TEST_TMPDIR/a.err" "$LOG"
	[ "$st" -eq 13 ]
	grep -q '^end a [0-9]* term$' "$LOG"
	# stopped while b still ran, not after b finished
	[ "$(awk '$1 == "end" && $2 == "a" { print $3 }' "$LOG")" -lt \
	  "$(awk '$1 == "end" && $2 == "b" { print $3 }' "$LOG")" ]
	grep -q 'lease taken by another holder' "$BATS_TEST_TMPDIR/a.err"
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" attempts)" = 2 ]
}

@test "a claim the command released itself is not renewed: the next renewal is refused (LEASE_LOST, 13) and the command stopped, though nobody took the key" {
	k=$(key released)
	# The command releases its claim with its own token (as idemp-done does
	# for LEASE_SHORT) and runs on; a renewal that took the lease back would
	# hold off the run the release let in (CI once saw exactly that: the
	# other run DUP_IN_PROGRESS behind a renewal after the release).
	cat > "$BATS_TEST_TMPDIR/release.sh" <<-'EOF'
	#!/bin/sh
	trap 'echo "end term" >> "$1"; exit 143' TERM
	echo releasing >> "$1"
	printf '{"v":1,"body":"{}","claim":{"outcome":"ACQUIRED","chargeId":"%s","token":"%s"},"debit":{"outcome":"LEASE_SHORT"}}\n' \
		"$IDEMP_KEY" "$IDEMP_TOKEN" | idemp-done >/dev/null
	sleep 20 & wait $!
	echo "end done" >> "$1"
	EOF
	chmod +x "$BATS_TEST_TMPDIR/release.sh"
	run --separate-stderr idemp-run --key "$k" --lease 6s -- "$BATS_TEST_TMPDIR/release.sh" "$LOG"
	cat "$LOG"
	[ "$status" -eq 13 ]
	# (the marker goes before idemp-done: the refusal may come while a
	# sanitized idemp-done is still exiting after the release, and stop
	# the script before a line after it; 13 with nobody else on the key,
	# and the key free below, say the release was made)
	grep -q '^releasing$' "$LOG"
	grep -q '^end term$' "$LOG"
	run ! grep -q '^end done$' "$LOG"
	# the key is free: the next run runs at once
	run --separate-stderr idemp-run --key "$k" --lease 6s -- "$JOB" "$LOG" c 0
	[ "$status" -eq 0 ]
}

# in_group PGID: the processes of group PGID that still live (zombies are
# dead), "pid (comm) state" a line; /proc read by bash, no process started.
in_group() {
	local f pid comm st pgrp
	for f in /proc/[0-9]*/stat; do
		read -r pid comm st _ pgrp _ 2>/dev/null < "$f" || continue
		[ "$pgrp" = "$1" ] && [ "$st" != Z ] && [ "$st" != X ] && echo "$pid $comm $st"
	done
	return 0
}

# stubborn: writes $BATS_TEST_TMPDIR/stubborn.sh PIDFILE HOW [release], a
# command that forks two children into its group (their output closed, so
# a survivor holds no test's pipe), writes its pid (its group's) into
# PIDFILE (NAME.stubborn: teardown kills that group), and ignores SIGTERM,
# it and its children (HOW leader-ignores), or all but itself
# (leader-dies); with "release" it then releases its own claim (the next
# renewal is refused); it runs until killed.
stubborn() {
	cat > "$BATS_TEST_TMPDIR/stubborn.sh" <<-'EOF'
	#!/bin/sh
	trap '' TERM
	for i in 1 2; do
		( while :; do echo "tick $i" >> "$1.ticks"; sleep 0.05; done ) </dev/null >/dev/null 2>&1 3>&- &
	done
	echo $$ > "$1"
	[ "$2" = leader-ignores ] || trap 'exit 143' TERM
	[ "$3" != release ] || printf '{"v":1,"body":"{}","claim":{"outcome":"ACQUIRED","chargeId":"%s","token":"%s"},"debit":{"outcome":"LEASE_SHORT"}}\n' \
		"$IDEMP_KEY" "$IDEMP_TOKEN" | idemp-done >/dev/null
	while :; do sleep 0.05; done
	EOF
	chmod +x "$BATS_TEST_TMPDIR/stubborn.sh"
}

@test "a refused renewal: the command's whole group is gone before idemp-run exits 13 -- a leader and children that ignore SIGTERM, a leader that dies on it leaving children that ignore it (issue 45)" {
	stubborn
	for how in leader-ignores leader-dies; do
		k=$(key "$how")
		pids=$BATS_TEST_TMPDIR/$how.stubborn
		run --separate-stderr idemp-run --key "$k" --lease 3s --grace 300ms -- \
			"$BATS_TEST_TMPDIR/stubborn.sh" "$pids" "$how" release
		echo "$how: $status $stderr"
		left=$(in_group "$(cat "$pids")")
		[ "$status" -eq 13 ]
		[ -s "$pids.ticks" ]              # the children ran
		[ -z "$left" ] || { echo "still running after idemp-run's exit: $left"; false; }
		# the key is free: the next run runs at once, alone
		run --separate-stderr idemp-run --key "$k" --lease 3s -- true
		[ "$status" -eq 0 ]
	done
}

@test "SIGTERM to idemp-run, a leader that dies on it leaving children that ignore it: they are killed before the claim is released and idemp-run exits 143 (issue 45)" {
	stubborn
	k=$(key stop-group)
	pids=$BATS_TEST_TMPDIR/stop.stubborn
	idemp-run --key "$k" --lease 30s -- "$BATS_TEST_TMPDIR/stubborn.sh" "$pids" leader-dies \
		2>"$BATS_TEST_TMPDIR/a.err" 3>&- &
	apid=$!
	wait_for test -s "$pids.ticks"
	wait_for test -s "$pids"
	kill -TERM "$apid"
	st=0
	wait "$apid" || st=$?
	left=$(in_group "$(cat "$pids")")
	cat "$BATS_TEST_TMPDIR/a.err"
	[ "$st" -eq 143 ]
	[ -z "$left" ] || { echo "still running after idemp-run's exit: $left"; false; }
	grep -q 'command stopped; claim released' "$BATS_TEST_TMPDIR/a.err"
	# released: the next run runs at once, and alone
	run --separate-stderr idemp-run --key "$k" --lease 3s -- true
	[ "$status" -eq 0 ]
}

@test "SIGTERM to idemp-run: passed to the command's group, claim released, 143; the next run runs it at once" {
	k=$(key sigterm)
	idemp-run --key "$k" --lease 30s -- "$JOB" "$LOG" a 60 2>"$BATS_TEST_TMPDIR/a.err" &
	apid=$!
	wait_for has '^start a' "$LOG"
	kill -TERM "$apid"
	st=0
	wait "$apid" || st=$?
	[ "$st" -eq 143 ]
	grep -q '^end a [0-9]* term$' "$LOG"
	grep -q 'command stopped; claim released' "$BATS_TEST_TMPDIR/a.err"
	run idemp-show --json "$k"
	[ "$(jget "$output" state)" = IN_PROGRESS ]
	[ "$(jget "$output" history.1.op)" = release ]
	run --separate-stderr idemp-run --key "$k" -- "$JOB" "$LOG" b 0
	[ "$status" -eq 0 ]
	grep -q '^start b [0-9]* 2$' "$LOG"
}

@test "SIGKILL of idemp-run: the command outlives it (the known limit) and fences itself with --check once another run took the key" {
	k=$(key sigkill)
	cat > "$BATS_TEST_TMPDIR/fenced.sh" <<-'EOF'
	#!/bin/sh
	echo $$ > "$2"
	echo "start a $(date +%s%3N)" >> "$1"
	for i in $(seq 600); do
		idemp-run --check 2>/dev/null || { echo "fenced a $(date +%s%3N)" >> "$1"; exit 0; }
		sleep 0.1
	done
	EOF
	chmod +x "$BATS_TEST_TMPDIR/fenced.sh"
	idemp-run --key "$k" --lease 2s -- "$BATS_TEST_TMPDIR/fenced.sh" "$LOG" "$BATS_TEST_TMPDIR/orphan.pid" 2>/dev/null &
	apid=$!
	wait_for has '^start a' "$LOG"
	kill -KILL "$apid"
	wait "$apid" || true
	run --separate-stderr idemp-run --key "$k" --wait=30s --lease 2s -- "$JOB" "$LOG" b 0.5
	[ "$status" -eq 0 ]
	wait_for has '^fenced a' "$LOG"
	grep -q '^start b [0-9]* 2$' "$LOG"
}

@test "--each: 200 keys, 3 runners at once with -P 4: every key ran exactly once; the summaries add up" {
	p=$(key each)
	seq 200 | sed "s/^/$p-/" > "$BATS_TEST_TMPDIR/keys"
	for r in 1 2 3; do
		idemp-run --each -P 4 --lease 20s -- sh -c 'echo "$1" >> "$0"' "$LOG" '{}' \
			< "$BATS_TEST_TMPDIR/keys" 2>"$BATS_TEST_TMPDIR/r$r.err" &
		eval "pid$r=$!"
	done
	for r in 1 2 3; do
		eval "p1=\$pid$r"
		st=0
		wait "$p1" || st=$?
		echo "runner $r: $st $(grep summary "$BATS_TEST_TMPDIR/r$r.err")"
		[ "$st" -eq 0 ] || [ "$st" -eq 11 ]
	done
	[ "$(wc -l < "$LOG")" -eq 200 ]
	[ "$(sort -u "$LOG" | wc -l)" -eq 200 ]
	cmp <(sort "$LOG") <(sort "$BATS_TEST_TMPDIR/keys")
	ran=0
	for r in 1 2 3; do
		s=$(grep '"each: summary"' "$BATS_TEST_TMPDIR/r$r.err")
		[ "$(jget "$s" keys)" -eq 200 ]
		[ "$(jget "$s" failed)" -eq 0 ]
		ran=$((ran + $(jget "$s" ran)))
	done
	[ "$ran" -eq 200 ]
	# again: all already done
	run --separate-stderr idemp-run --each -- sh -c 'echo "$1" >> "$0"' "$LOG" '{}' < "$BATS_TEST_TMPDIR/keys"
	[ "$status" -eq 0 ]
	[ "$(wc -l < "$LOG")" -eq 200 ]
	[[ "$stderr" == *'"keys":200,"ran":0,"alreadyDone":200,"heldElsewhere":0,"failed":0'* ]]
	run --separate-stderr idemp-run --each -- true < /dev/null
	[ "$status" -eq 1 ]
}

# idemkit_conns: connections made to the file's PostgreSQL by our commands
# (log_connections is on: a line each, at its authorization); 0 elsewhere.
idemkit_conns() {
	if [ "${IDEMKIT_TEST_BACKEND:-}" = postgres ]; then
		grep -c 'connection authorized.*application_name=idemkit' "$PG_DIR/server.log" || true
	else
		echo 0
	fi
}

@test "--each: -P N workers each run many keys, keeping the store's connection from key to key (PostgreSQL: N connections for 40 keys)" {
	p=$(key pool)
	seq 40 | sed "s/^/$p-/" > "$BATS_TEST_TMPDIR/keys"
	before=$(idemkit_conns)
	# the command's parent is the worker that ran its key
	run --separate-stderr idemp-run --each -P 3 -- sh -c 'echo "$PPID $1" >> "$0"' "$LOG" '{}' \
		< "$BATS_TEST_TMPDIR/keys"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"keys":40,"ran":40,"alreadyDone":0,"heldElsewhere":0,"failed":0'* ]]
	cmp <(cut -d' ' -f2 "$LOG" | sort) <(sort "$BATS_TEST_TMPDIR/keys")
	workers=$(cut -d' ' -f1 "$LOG" | sort -u | wc -l)
	echo "workers: $workers"
	[ "$workers" -ge 1 ]
	[ "$workers" -le 3 ]
	if [ "${IDEMKIT_TEST_BACKEND:-}" = postgres ]; then
		echo "connections: $before -> $(idemkit_conns)"
		[ "$(( $(idemkit_conns) - before ))" -le 3 ]
	fi
}

@test "--each on PostgreSQL restarted mid-run: the workers' kept connections are made again, every key runs once" {
	[ "${IDEMKIT_TEST_BACKEND:-}" = postgres ] || skip "a server restart under kept connections: PostgreSQL's (pg_halt, pg_resume)"
	p=$(key restart)
	seq 30 | sed "s/^/$p-/" > "$BATS_TEST_TMPDIR/keys"
	idemp-run --each -P 2 -- sh -c 'sleep 0.2; echo "$1" >> "$0"' "$LOG" '{}' \
		< "$BATS_TEST_TMPDIR/keys" 2>"$BATS_TEST_TMPDIR/each.err" &
	pid=$!
	wait_for test -s "$LOG"
	pg_halt
	pg_resume
	st=0
	wait "$pid" || st=$?
	grep -v '"level":"info"' "$BATS_TEST_TMPDIR/each.err"
	# a key whose claim met the server down is 75, left for the next run
	[ "$st" -eq 0 ] || [ "$st" -eq 75 ]
	run --separate-stderr idemp-run --each -P 2 -- sh -c 'echo "$1" >> "$0"' "$LOG" '{}' \
		< "$BATS_TEST_TMPDIR/keys"
	[ "$status" -eq 0 ]
	cmp <(sort "$LOG") <(sort "$BATS_TEST_TMPDIR/keys")
}

starts() { [ "$(grep -c '^start' "$LOG")" -eq "$1" ]; }

@test "--each: a worker killed -9 on its key fails that key alone (70), the keys after it run on a new worker; SIGTERM mid-run: the commands stopped, their claims released, 143" {
	p=$(key dies)
	seq 12 | sed "s/^/$p-/" > "$BATS_TEST_TMPDIR/keys"
	run --separate-stderr idemp-run --each -P 2 -- sh -c \
		'case $1 in *-5) kill -KILL "$PPID"; sleep 1 ;; esac; echo "$PPID $1" >> "$0"' "$LOG" '{}' \
		< "$BATS_TEST_TMPDIR/keys"
	echo "$stderr" | grep summary
	[ "$status" -eq 70 ]
	[[ "$stderr" == *'"keys":12,"ran":11,"alreadyDone":0,"heldElsewhere":0,"failed":1'* ]]
	# key 5's command outlived its worker and wrote its line; every key once
	wait_for has "$p-5\$" "$LOG"
	cmp <(cut -d' ' -f2 "$LOG" | sort) <(sort "$BATS_TEST_TMPDIR/keys")
	[ "$(cut -d' ' -f1 "$LOG" | sort -u | wc -l)" -ge 2 ]

	# SIGTERM: passed to the workers, and by them to their commands
	: > "$LOG"
	q=$(key term)
	seq 6 | sed "s/^/$q-/" > "$BATS_TEST_TMPDIR/keys2"
	idemp-run --each -P 3 --lease 20s -- "$JOB" "$LOG" '{}' 30 \
		< "$BATS_TEST_TMPDIR/keys2" 2>"$BATS_TEST_TMPDIR/term.err" &
	pid=$!
	wait_for starts 3
	kill -TERM "$pid"
	st=0
	wait "$pid" || st=$?
	cat "$BATS_TEST_TMPDIR/term.err"
	[ "$st" -eq 143 ]
	[ "$(grep -c '^start' "$LOG")" -eq 3 ]
	[ "$(grep -c ' term$' "$LOG")" -eq 3 ]
	# released: all 6 run now, none held by the stopped ones
	run --separate-stderr idemp-run --each -P 3 -- true < "$BATS_TEST_TMPDIR/keys2"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"keys":6,"ran":6,'* ]]
}

@test "--wait: waits for the holder and answers as the record says; a released claim runs; a short wait is DUP_IN_PROGRESS" {
	k=$(key wait)
	# a runs 5 s: the short wait below must meet it still running (1.5 s
	# was not enough at load 25: a had finished, the answer was DUP_DONE)
	idemp-run --key "$k" --lease 5s -- "$JOB" "$LOG" a 5 2>/dev/null &
	apid=$!
	wait_for has '^start a' "$LOG"
	run --separate-stderr idemp-run --key "$k" --wait=200ms -- "$JOB" "$LOG" b 0
	[ "$status" -eq 11 ]
	run --separate-stderr idemp-run --key "$k" --wait -- "$JOB" "$LOG" b 0
	[ "$status" -eq 10 ]
	wait "$apid"
	[ "$(grep -c 'start b' "$LOG")" -eq 0 ]

	k=$(key waitrel)
	idemp-run --key "$k" --lease 5s -- sh -c 'echo "start c $(date +%s%3N)" >> "$0"; sleep 1; exit 3' "$LOG" 2>/dev/null &
	apid=$!
	wait_for has '^start c' "$LOG"
	run --separate-stderr idemp-run --key "$k" --wait=30s -- "$JOB" "$LOG" d 0
	[ "$status" -eq 0 ]
	grep -q '^start d [0-9]* 2$' "$LOG"
	st=0
	wait "$apid" || st=$?
	[ "$st" -eq 17 ]
}
