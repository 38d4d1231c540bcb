#!/usr/bin/env bats
# idemp-claim: options, modes and the exit codes the store suite does not
# reach (the claim outcomes themselves are in store.bats).

bats_require_minimum_version 1.5.0
load helper
load lock

@test "--help lists the exit codes; --version" {
	run idemp-claim --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"usage: idemp-claim"* ]]
	for c in "0  OK" "10  DUP_DONE" "11  DUP_IN_PROGRESS" "12  DUP_FAILED" "14  PAYLOAD_MISMATCH" "16  STALE_EVENT" "65  DATAERR" "75  TEMPFAIL" "78  CONFIG"; do
		[[ "$output" == *"$c"* ]]
	done
	run idemp-claim --version
	[ "$status" -eq 0 ]
	[[ "$output" == "idemp-claim (idemkit) "* ]]
}

@test "bad options are 64 with the usage" {
	run idemp-claim --bogus
	[ "$status" -eq 64 ]
	[[ "$output" == *"usage: idemp-claim"* ]]
	run idemp-claim --lease soon
	[ "$status" -eq 64 ]
	[[ "$output" == *"--lease"* ]]
	run idemp-claim extra-arg
	[ "$status" -eq 64 ]
}

@test "works with no configuration at all: the default store in the state directory, mode 0600" {
	run --separate-stderr idemp-claim < <(ev CHG-DEF)
	[ "$status" -eq 0 ]
	[ -f "$IDEMKIT_STATE_DIR/idempotency.db" ]
	[ "$(stat -c %a "$IDEMKIT_STATE_DIR/idempotency.db")" = 600 ]
	[ "$(stat -c %a "$IDEMKIT_STATE_DIR")" = 700 ]
}

@test "accepts an envelope and keeps its fields" {
	sent=$(date +%s%3N)   # a recent copy: an old one with no record is STALE_EVENT (below)
	env='{"v":1,"queue":"q","messageId":"m-1","receipt":"r-1","receiveCount":2,"sentAt":'$sent',"body":"{\"chargeId\":\"CHG-E\",\"accountId\":\"A\",\"amount\":5,\"currency\":\"INR\",\"chargeType\":\"X\"}"}'
	run --separate-stderr idemp-claim <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" messageId)" = m-1 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
	[ "$(jget "$output" sentAt)" = "$sent" ]
	[ "$(jget "$output" claim.chargeId)" = CHG-E ]
}

@test "an envelope already claimed upstream passes through untouched" {
	env=$(ev CHG-P | idemp-claim 2>/dev/null)
	run --separate-stderr idemp-claim <<<"$env"
	[ "$status" -eq 0 ]
	[ "$output" = "$env" ]
}

@test "one-shot: empty stdin is 1 (EMPTY, nothing to do), blank lines too; two envelopes are 64 and nothing is claimed" {
	run --separate-stderr idemp-claim </dev/null
	[ "$status" -eq 1 ]
	[ "$stderr" = "idemp-claim: stdin: no envelope or event: nothing to do" ]
	[ -z "$output" ]
	run --separate-stderr idemp-claim <<<$'\n\n'
	[ "$status" -eq 1 ]
	# every step alike (core/step.c)
	for step in charge-debit charge-notify idemp-done sqs-ack; do
		run --separate-stderr "$step" </dev/null
		[ "$status" -eq 1 ] || { echo "$step: $status"; return 1; }
	done
	run --separate-stderr idemp-claim < <(ev CHG-T1; ev CHG-T2)
	[ "$status" -eq 64 ]
	[[ "$stderr" == *"use --stream"* ]]
	run idemp-show CHG-T1   # not even a store was made
	[ "$status" -eq 78 ]
	[[ "$output" == *"no store at sqlite:"* ]]
}

@test "--stream: one envelope out per line, outcomes inside, exit 0; the copy of a charge claimed in this same stream leaves last (held for its original, here never finished, until 1 s before the 2 s lease ends)" {
	run --separate-stderr idemp-claim --stream --lease 2s < <(ev CHG-S1; ev CHG-S1; echo 'not json'; ev CHG-S2)
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 4 ]
	[ "$(jget "${lines[0]}" claim.outcome)" = ACQUIRED ]
	[ "$(jget "${lines[1]}" claim.outcome)" = DATAERR ]
	[ "$(jget "${lines[1]}" body)" = "not json" ]
	[ "$(jget "${lines[2]}" claim.outcome)" = ACQUIRED ]
	[ "$(jget "${lines[3]}" claim.outcome)" = DUP_IN_PROGRESS ]
	[ "$(jget "${lines[3]}" claim.chargeId)" = CHG-S1 ]
}

@test "store busy -> 75 TEMPFAIL, recorded in the envelope" {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/busy.db
	ev CHG-B0 | idemp-claim >/dev/null 2>&1
	hold_write_lock "$BATS_TEST_TMPDIR/busy.db"
	IDEMKIT_BUSY_TIMEOUT=200ms run --separate-stderr idemp-claim < <(ev CHG-B1)
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	[[ "$stderr" == *"database is locked"* ]]
}

@test "bad store URL or unusable path -> 78 CONFIG" {
	run --separate-stderr idemp-claim --store bogus:x < <(ev CHG-C1)
	[ "$status" -eq 78 ]
	[ "$(jget "$output" claim.outcome)" = CONFIG ]
	[[ "$stderr" == *"unknown scheme"* ]]
	run --separate-stderr idemp-claim --store sqlite:/nonexistent/dir/x.db < <(ev CHG-C2)
	[ "$status" -eq 78 ]
	IDEMKIT_STORE=sqlite: run --separate-stderr idemp-claim < <(ev CHG-C3)
	[ "$status" -eq 78 ]
}

@test "a store from a newer idemkit is refused (78), not migrated down" {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/new.db
	ev CHG-N0 | idemp-claim >/dev/null 2>&1
	python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("PRAGMA user_version=99"); c.commit()' "$BATS_TEST_TMPDIR/new.db"
	run --separate-stderr idemp-claim < <(ev CHG-N1)
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"schema version 99 is newer"* ]]
}

@test "stdout closed: the failure is reported, not silent" {
	rc=0
	ev CHG-O | idemp-claim >&- 2>"$BATS_TEST_TMPDIR/err" || rc=$?
	[ "$rc" -eq 70 ]
	grep -q "stdout" "$BATS_TEST_TMPDIR/err"
}

# stale_env CHARGE AGE_MS [ATTR]: an envelope whose message was first sent
# AGE_MS ago, by the idemkit.firstSentAt attribute (ATTR=attr, default) or
# by its own sentAt (ATTR=sentAt).
stale_env() {
	python3 -c 'import json, sys, time
now = int(time.time() * 1000); first = now - int(sys.argv[3])
e = {"v": 1, "messageId": "m-" + sys.argv[1], "receipt": "r", "receiveCount": 2,
     "sentAt": now, "body": sys.argv[2]}
if sys.argv[4] == "attr":
    e["attributes"] = {"idemkit.firstSentAt": str(first)}
else:
    e["sentAt"] = first
print(json.dumps(e))' "$1" "$(ev "$1")" "$2" "${3:-attr}"
}

@test "16 STALE_EVENT: no record and first sent longer ago than records are kept; later copies DUP_FAILED" {
	export IDEMKIT_RETENTION=10h   # margin: a tenth, 1h
	run --separate-stderr idemp-claim <<<"$(stale_env CHG-OLD $((9 * 3600000 + 60000)))"
	[ "$status" -eq 16 ]
	[ "$(jget "$output" claim.outcome)" = STALE_EVENT ]
	[[ "$(jget "$output" claim.error)" == "no record, and the message was first sent "*" s ago (records are kept 36000 s, less a margin of 3600 s): its record may have expired"* ]]
	[[ "$stderr" == *'"msg":"stale event refused"'*'"chargeId":"CHG-OLD"'* ]]
	# the refusal is recorded (FAILED, fenced on the claim's token): every
	# later copy is DUP_FAILED, never a fresh claim once the lease is over
	run idemp-show --json CHG-OLD
	[ "$(jget "$output" state)" = FAILED ]
	[[ "$(jget "$output" lastError)" == "no record, and the message"* ]]
	run --separate-stderr idemp-claim --lease 1s <<<"$(stale_env CHG-OLD $((9 * 3600000 + 60000)))"
	[ "$status" -eq 12 ]
	# its own sentAt counts when there is no attribute (a copy never forwarded)
	run --separate-stderr idemp-claim <<<"$(stale_env CHG-OLD2 $((9 * 3600000 + 60000)) sentAt)"
	[ "$status" -eq 16 ]
	# sqs-ack sends it to the DLQ, as the table says
	[ "$(sqs-ack --actions | awk -F'\t' '$1 == 16 { print $3 }')" = dlq ]
}

@test "a copy younger than the retention less the margin, or a bare event, is claimed" {
	export IDEMKIT_RETENTION=10h
	run --separate-stderr idemp-claim <<<"$(stale_env CHG-YOUNG $((9 * 3600000 - 60000)))"
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-claim < <(ev CHG-BARE)
	[ "$status" -eq 0 ]
}

@test "a stale copy that finds its record is decided by the record, as any copy" {
	export IDEMKIT_RETENTION=10h
	# (a 3 s lease: the refusal below must come while it lives, on a loaded
	# machine too)
	run --separate-stderr idemp-claim --lease 3s < <(ev CHG-LIVE)
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-claim <<<"$(stale_env CHG-LIVE $((10 * 3600000)))"
	[ "$status" -eq 11 ]
	# once the lease ended, the stale copy takes the live record over
	for _ in $(seq 100); do
		run --separate-stderr idemp-claim <<<"$(stale_env CHG-LIVE $((10 * 3600000)))"
		[ "$status" -eq 11 ] || break
		sleep 0.1
	done
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 2 ]
}

@test "--stream: a stale copy is refused inside a group, its neighbours claimed" {
	export IDEMKIT_RETENTION=10h
	{ ev CHG-G1; stale_env CHG-G2 $((10 * 3600000)); ev CHG-G3; } >"$BATS_TEST_TMPDIR/in"
	run --separate-stderr idemp-claim --stream <"$BATS_TEST_TMPDIR/in"
	[ "$status" -eq 0 ]
	got=$(for l in "${lines[@]}"; do printf '%s ' "$(jget "$l" claim.outcome)"; done)
	[ "$got" = "ACQUIRED STALE_EVENT ACQUIRED " ]
	[ "$(jget "$(idemp-show --json CHG-G2)" state)" = FAILED ]
}

@test "the lease is 1s to 24h: a bad --lease is 64 naming it, a bad IDEMKIT_LEASE 78 naming the variable, nothing claimed (issue 24 item 11)" {
	for l in 9999999999d 99999999999d 25h 999ms soon; do
		run --separate-stderr idemp-claim --lease "$l" < <(ev CHG-L1)
		[ "$status" -eq 64 ]
		[ "$stderr" = "idemp-claim: --lease: \"$l\" is not a duration from 1000ms to 86400s (e.g. 500ms, 30s, 5m)" ]
		[ -z "$output" ]
		IDEMKIT_LEASE=$l run --separate-stderr idemp-claim < <(ev CHG-L1)
		[ "$status" -eq 78 ]
		[ "$stderr" = "idemp-claim: IDEMKIT_LEASE: \"$l\" is not a duration from 1000ms to 86400s (e.g. 500ms, 30s, 5m)" ]
		[ -z "$output" ]
	done
	run idemp-show CHG-L1   # not even a store was made
	[ "$status" -eq 78 ]
	# --lease wins over the variable; the longest lease is granted as asked
	IDEMKIT_LEASE=soon run --separate-stderr idemp-claim --lease 24h < <(ev CHG-L1)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.leaseMs)" = 86400000 ]
	IDEMKIT_LEASE=90s run --separate-stderr idemp-claim < <(ev CHG-L2)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.leaseMs)" = 90000 ]
	[ "$(jget "$output" claim.bootId)" = "$(cat /proc/sys/kernel/random/boot_id)" ]
	[[ "$(jget "$output" claim.sentBootMs)" =~ ^[0-9]+$ ]]
}

@test "a retention not longer than the lease is 78 before anything is claimed, and so is one that is not a duration; --check says so with nothing opened (issue 24 item 15)" {
	IDEMKIT_RETENTION=2s run --separate-stderr idemp-claim --lease 10s < <(ev CHG-R1)
	[ "$status" -eq 78 ]
	[ "$stderr" = "idemp-claim: IDEMKIT_RETENTION (2s) is not longer than the lease (10s): a record would expire while its claim is live and a second worker claim it afresh" ]
	[ -z "$output" ]
	IDEMKIT_RETENTION=10s run --separate-stderr idemp-claim --lease 10s < <(ev CHG-R1)
	[ "$status" -eq 78 ]
	IDEMKIT_RETENTION=forever run --separate-stderr idemp-claim < <(ev CHG-R1)
	[ "$status" -eq 78 ]
	[ "$stderr" = 'idemp-claim: IDEMKIT_RETENTION: "forever" is not a duration up to 3650d' ]
	[ ! -e "$IDEMKIT_STATE_DIR/idempotency.db" ]
	# the default lease (120s) against a retention: --check opens nothing
	IDEMKIT_RETENTION=1m run --separate-stderr idemp-claim --check
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"IDEMKIT_RETENTION (60s) is not longer than the lease (120s)"* ]]
	IDEMKIT_RETENTION=1h IDEMKIT_LEASE=2h run --separate-stderr idemp-claim --check
	[ "$status" -eq 78 ]
	IDEMKIT_LEASE=2h run --separate-stderr idemp-claim --check --inflight 0
	[ "$status" -eq 64 ]
	run --separate-stderr idemp-claim --check
	[ "$status" -eq 0 ]
	[ -z "$output" ]
	[ ! -e "$IDEMKIT_STATE_DIR/idempotency.db" ]
	IDEMKIT_RETENTION=11s run --separate-stderr idemp-claim --lease 10s < <(ev CHG-R1)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
}

@test "--stream (the group path): a copy held for its original is passed on DUP_IN_PROGRESS before the original's lease ends (never takes it over), after 5 s at most, at a stop signal at once, and at end of input only when its time is up" {
	# a lease of 2 s: passed on within it (its margin is 1 s), never finished
	stream_start --lease 2s
	{ ev CHG-HL-1; ev CHG-HL-1; } >&5
	stream_lines 2
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
	exec 5>&-
	wait "$CLAIM_PID"
	run idemp-show --json CHG-HL-1
	[ "$(jget "$output" attempts)" = 1 ]
	[ "$(jget "$output" owner)" = "$(jget "$(sed -n 1p "$STREAM_OUT")" claim.token)" ]
	# a long lease: 5 s at most; end of input does not cut it short
	stream_start --lease 120s
	{ ev CHG-HL-2; ev CHG-HL-2; } >&5
	exec 5>&-
	t0=$(date +%s%N)
	wait "$CLAIM_PID"
	t1=$(date +%s%N)
	echo "held for $(( (t1 - t0) / 1000000 )) ms"
	[ $(( (t1 - t0) / 1000000 )) -ge 3000 ]; [ $(( (t1 - t0) / 1000000 )) -lt 9000 ]
	[ "$(wc -l < "$STREAM_OUT")" -eq 2 ]
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
	# a stop signal passes it on at once
	stream_start --lease 120s
	{ ev CHG-HL-3; ev CHG-HL-3; } >&5
	stream_lines 1
	kill -TERM "$CLAIM_PID"
	st=0
	wait "$CLAIM_PID" || st=$?
	exec 5>&-
	[ "$st" -eq 143 ]
	[ "$(wc -l < "$STREAM_OUT")" -eq 2 ]
	[ "$(jget "$(sed -n 2p "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
}
