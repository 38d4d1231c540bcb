#!/usr/bin/env bats
# The DynamoDB store against dynalite on a loopback port: idemp-init,
# configuration and transport failures, the race, fencing, and the claim
# decision on both paths (the ALL_OLD path by a C unit test, since dynalite
# never returns the old item; the GetItem fallback here).

bats_require_minimum_version 1.5.0
load helper

setup_file() {
	require_node
	aws_test_env
	dynalite_start
	export DDB_TABLE=idem-$$-$RANDOM
	idemp-init --store "dynamodb:$DDB_TABLE" >/dev/null
}
teardown_file() { dynalite_stop; }
setup() { export IDEMKIT_STORE=dynamodb:$DDB_TABLE; }

@test "claim decision on the ALL_OLD item and on the GetItem fallback (C unit test)" {
	run "$IDEMKIT_TEST_BIN/ddb_claim"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = PASSED ]
	if grep -q '^not ok' <<<"$output"; then false; fi
}

@test "idemp-init creates a table and is idempotent" {
	t=idem-init-$$-$RANDOM
	run --separate-stderr idemp-init --store "dynamodb:$t"
	[ "$status" -eq 0 ]
	[ "$output" = "dynamodb:$t" ]
	grep -q '"created table"' <<<"$stderr"
	run --separate-stderr idemp-init --store "dynamodb:$t"
	[ "$status" -eq 0 ]
	[ "$output" = "dynamodb:$t" ]
	if grep -q '"created table"' <<<"$stderr"; then false; fi
	IDEMKIT_STORE=dynamodb:$t run --separate-stderr idemp-claim < <(ev "$(uid init)")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
}

@test "idemp-init: another key attribute name gets its own schema (IDEMKIT_DYNAMODB_KEY)" {
	t=idem-key-$$-$RANDOM
	IDEMKIT_DYNAMODB_KEY=chargeId run idemp-init --store "dynamodb:$t"
	[ "$status" -eq 0 ]
	IDEMKIT_DYNAMODB_KEY=chargeId IDEMKIT_STORE=dynamodb:$t run --separate-stderr idemp-claim < <(ev "$(uid key)")
	[ "$status" -eq 0 ]
}

@test "wrong key schema -> 78, for idemp-init and for a claim" {
	IDEMKIT_DYNAMODB_KEY=id run --separate-stderr idemp-init --store "dynamodb:$DDB_TABLE"
	[ "$status" -eq 78 ]
	[[ $stderr == *"key schema is pk"*"want a single HASH key id"* ]]
	IDEMKIT_DYNAMODB_KEY=id run --separate-stderr idemp-claim < <(ev "$(uid schema)")
	[ "$status" -eq 78 ]
	[ "$(jget "$output" claim.outcome)" = CONFIG ]
	[[ $stderr == *"dynamodb UpdateItem: ValidationException"*"IDEMKIT_DYNAMODB_KEY"* ]]
}

@test "missing table -> 78 naming idemp-init" {
	IDEMKIT_STORE=dynamodb:no-such-table run --separate-stderr idemp-claim < <(ev "$(uid nt)")
	[ "$status" -eq 78 ]
	[[ $stderr == *"ResourceNotFoundException"*"idemp-init"* ]]
}

@test "bad table name -> 78; bad usage -> 64; --help lists the codes" {
	run --separate-stderr idemp-init --store dynamodb:x
	[ "$status" -eq 78 ]
	[[ $stderr == *"table name"* ]]
	run --separate-stderr idemp-init extra
	[ "$status" -eq 64 ]
	[[ $stderr == *"usage: idemp-init"* ]]
	run --separate-stderr idemp-init --bogus
	[ "$status" -eq 64 ]
	run idemp-init --help
	[ "$status" -eq 0 ]
	for c in 0 64 75 78; do grep -qw "$c" <<<"$output"; done
}

@test "server down -> 75 (closed port), after the configured attempts" {
	export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(free_port) AWS_MAX_ATTEMPTS=2
	run --separate-stderr idemp-claim < <(ev "$(uid down)")
	[ "$status" -eq 75 ]
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	[[ $stderr == *"dynamodb UpdateItem: 127.0.0.1:"*"(2 tries)"* ]]
	run --separate-stderr idemp-init --store "dynamodb:$DDB_TABLE"
	[ "$status" -eq 75 ]
}

@test "no credentials -> 78, with a clear message and no secret" {
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
	run --separate-stderr idemp-claim < <(ev "$(uid nocred)")
	[ "$status" -eq 78 ]
	[[ $stderr == *"no AWS credentials"* ]]
	run --separate-stderr idemp-init
	[ "$status" -eq 78 ]
	export AWS_ACCESS_KEY_ID=test
	run --separate-stderr idemp-show x
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"* ]]
}

@test "no region -> 78" {
	unset AWS_REGION
	run --separate-stderr idemp-show x
	[ "$status" -eq 78 ]
	[[ $stderr == *"no AWS region"* ]]
}

@test "50 concurrent idemp-claim on one chargeId: exactly one 0, the rest 11" {
	id=$(uid race)
	ev "$id" > "$BATS_TEST_TMPDIR/ev"
	for i in $(seq 50); do
		( rc=0; idemp-claim < "$BATS_TEST_TMPDIR/ev" >/dev/null 2>"$BATS_TEST_TMPDIR/err.$i" || rc=$?
		  echo $rc > "$BATS_TEST_TMPDIR/rc.$i" ) &
	done
	wait
	cat "$BATS_TEST_TMPDIR"/rc.* | sort | uniq -c
	cat "$BATS_TEST_TMPDIR"/err.* | grep -v DUP_IN_PROGRESS || true
	[ "$(cat "$BATS_TEST_TMPDIR"/rc.* | grep -cx 0)" -eq 1 ]
	[ "$(cat "$BATS_TEST_TMPDIR"/rc.* | grep -cx 11)" -eq 49 ]
	run idemp-show --json "$id"
	[ "$(jget "$output" attempts)" = 1 ]
}

@test "fencing: after a lease takeover the old token's idemp-done is 13 and changes nothing" {
	id=$(uid fence)
	old=$(ev "$id" | idemp-claim --lease 1s 2>/dev/null)
	sleep 1.1
	new=$(ev "$id" | idemp-claim --lease 60s 2>/dev/null)
	[ "$(jget "$new" claim.attempt)" = 2 ]
	run --separate-stderr idemp-done --state DONE <<<"$old"
	[ "$status" -eq 13 ]
	[ "$(jget "$output" done.outcome)" = LEASE_LOST ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = IN_PROGRESS ]
	[ "$(jget "$output" owner)" = "$(jget "$new" claim.token)" ]
	run --separate-stderr idemp-done --state DONE <<<"$new"
	[ "$status" -eq 0 ]
}

@test "PAYLOAD_MISMATCH on the GetItem fallback path (dynalite sends no ALL_OLD item)" {
	id=$(uid mm)
	ev "$id" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	run --separate-stderr idemp-claim < <(ev "$id" 9999)
	[ "$status" -eq 14 ]
	[ "$(jget "$output" claim.outcome)" = PAYLOAD_MISMATCH ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 10 ]
}

@test "expiresAt is epoch seconds, retention from IDEMKIT_RETENTION" {
	id=$(uid ttl)
	IDEMKIT_RETENTION=20d run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 0 ]
	run idemp-show --json "$id"
	exp=$(jget "$output" expiresAt)
	now=$(date +%s)
	[ "$exp" -gt $((now + 20*86400 - 60)) ]
	[ "$exp" -lt $((now + 20*86400 + 60)) ]
}
