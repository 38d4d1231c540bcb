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
	for c in "0  OK" "10  DUP_DONE" "11  DUP_IN_PROGRESS" "12  DUP_FAILED" "14  PAYLOAD_MISMATCH" "65  DATAERR" "75  TEMPFAIL" "78  CONFIG"; do
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
	env='{"v":1,"queue":"q","messageId":"m-1","receipt":"r-1","receiveCount":2,"sentAt":1764460800000,"body":"{\"chargeId\":\"CHG-E\",\"accountId\":\"A\",\"amount\":5,\"currency\":\"INR\",\"chargeType\":\"X\"}"}'
	run --separate-stderr idemp-claim <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" messageId)" = m-1 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
	[ "$(jget "$output" sentAt)" = 1764460800000 ]
	[ "$(jget "$output" claim.chargeId)" = CHG-E ]
}

@test "an envelope already claimed upstream passes through untouched" {
	env=$(ev CHG-P | idemp-claim 2>/dev/null)
	run --separate-stderr idemp-claim <<<"$env"
	[ "$status" -eq 0 ]
	[ "$output" = "$env" ]
}

@test "one-shot: empty stdin is 65; two envelopes are 64 and nothing is claimed" {
	run --separate-stderr idemp-claim </dev/null
	[ "$status" -eq 65 ]
	[[ "$stderr" == *"no envelope"* ]]
	run --separate-stderr idemp-claim < <(ev CHG-T1; ev CHG-T2)
	[ "$status" -eq 64 ]
	[[ "$stderr" == *"use --stream"* ]]
	run idemp-show CHG-T1
	[ "$status" -eq 1 ]
}

@test "--stream: one envelope out per line, outcomes inside, exit 0" {
	run --separate-stderr idemp-claim --stream < <(ev CHG-S1; ev CHG-S1; echo 'not json'; ev CHG-S2)
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 4 ]
	[ "$(jget "${lines[0]}" claim.outcome)" = ACQUIRED ]
	[ "$(jget "${lines[1]}" claim.outcome)" = DUP_IN_PROGRESS ]
	[ "$(jget "${lines[2]}" claim.outcome)" = DATAERR ]
	[ "$(jget "${lines[2]}" body)" = "not json" ]
	[ "$(jget "${lines[3]}" claim.outcome)" = ACQUIRED ]
}

@test "store busy -> 75 TEMPFAIL, recorded in the envelope" {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/busy.db
	ev CHG-B0 | idemp-claim >/dev/null 2>&1
	hold_write_lock "$BATS_TEST_TMPDIR/busy.db" 3
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
