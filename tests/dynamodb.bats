#!/usr/bin/env bats
# The DynamoDB store against an emulator on a loopback port: idemp-init,
# configuration and transport failures, the race, fencing, and the claim
# decision on both paths.  IDEMKIT_TEST_BACKEND picks the emulator:
# dynamodb (default) is dynalite, which never returns the old item, so a
# refused claim is decided from a GetItem there; dynamodb-local is AWS's
# DynamoDB Local, which returns it with ALL_OLD as DynamoDB does, so no
# second request is made.  The C unit test covers both paths on recorded
# answers.  A claim whose response is lost (tests/recproxy.py resets the
# connection after DynamoDB applied it) is retried and finds its own token.

bats_require_minimum_version 1.5.0
load helper

BACKEND=${IDEMKIT_TEST_BACKEND:-dynamodb}

# one emulator and table for the file: the tests run one at a time
# (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	aws_test_env
	ddb_emulator_start "$BACKEND"
	export DDB_TABLE=idem-$$-$RANDOM
	idemp-init --store "dynamodb:$DDB_TABLE" >/dev/null
}
teardown_file() { ddb_emulator_stop; }
setup() { export IDEMKIT_STORE=dynamodb:$DDB_TABLE; }
teardown() { recproxy_stop; }

# The requests that decide a refused claim: none more on DynamoDB Local
# (the old item comes back with the refusal), one GetItem on dynalite.
refusal_reads() { if [ "$BACKEND" = dynamodb-local ]; then echo 0; else echo 1; fi; }

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
	export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:1 AWS_MAX_ATTEMPTS=2
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
	pids=
	for i in $(seq 50); do
		( rc=0; idemp-claim < "$BATS_TEST_TMPDIR/ev" >/dev/null 2>"$BATS_TEST_TMPDIR/err.$i" || rc=$?
		  echo $rc > "$BATS_TEST_TMPDIR/rc.$i" ) &
		pids="$pids $!"
	done
	# shellcheck disable=SC2086
	wait $pids   # (not a bare wait: bats' own timeout watchdog is a child too)
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

@test "PAYLOAD_MISMATCH decided on the refusal path (ALL_OLD on DynamoDB Local, GetItem on dynalite)" {
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

@test "a duplicate is decided from the refused write's old item (DynamoDB Local: no GetItem; dynalite: one)" {
	id=$(uid allold)
	recproxy_start ddb "$DDB_URL"
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 0 ]
	first=$output
	: > "$BATS_TEST_TMPDIR/ddb.log"
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 11 ]
	[ "$(jget "$output" claim.leaseUntil)" = "$(jget "$first" claim.leaseUntil)" ]
	idemp-done --state DONE <<<"$first" >/dev/null
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 10 ]
	[ "$(jget "$output" claim.state)" = DONE ]
	run --separate-stderr idemp-claim < <(ev "$id" 9999)
	[ "$status" -eq 14 ]
	ops ddb
	# 3 refused claims and one finish; the refusals read nothing more on
	# DynamoDB Local
	[ "$(ops ddb UpdateItem)" -eq 4 ]
	[ "$(ops ddb GetItem)" -eq $((3 * $(refusal_reads))) ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ddb.log")" -eq $((4 + 3 * $(refusal_reads))) ]
	if [ "$BACKEND" = dynamodb-local ]; then
		grep -q '"ReturnValuesOnConditionCheckFailure": "ALL_OLD"' "$BATS_TEST_TMPDIR/ddb.log"
	fi
}

@test "a claim whose response was lost is retried and finds its own token: ACQUIRED, attempt 1 (issue 11 item 9)" {
	id=$(uid lost)
	recproxy_start ddb "$DDB_URL" '[{"op":"UpdateItem","times":1,"do":"lose-response"}]'
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	run --separate-stderr idemp-claim < <(ev "$id")
	echo "$stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$output" claim.attempt)" = 1 ]
	env=$output token=$(jget "$output" claim.token)
	lease=$(jget "$output" claim.leaseUntil)
	ops ddb
	# the first UpdateItem took effect and its answer was lost; the retry
	# was refused by the condition and decided by our own token
	[ "$(ops ddb UpdateItem)" -eq 2 ]
	[ "$(ops ddb GetItem)" -eq "$(refusal_reads)" ]
	[ "$(grep -c '"fault": "lose-response"' "$BATS_TEST_TMPDIR/ddb.log")" -eq 1 ]
	python3 - "$BATS_TEST_TMPDIR/ddb.log" "$token" <<'PY'
import json, sys
ups = [json.loads(l) for l in open(sys.argv[1]) if "UpdateItem" in l]
assert [u["body"]["ExpressionAttributeValues"][":tok"]["S"] for u in ups] == [sys.argv[2]] * 2, ups
PY
	export AWS_ENDPOINT_URL_DYNAMODB=$DDB_URL
	run idemp-show --json "$id"
	[ "$(jget "$output" attempts)" = 1 ]
	[ "$(jget "$output" owner)" = "$token" ]
	[ "$(jget "$output" leaseUntil)" = "$lease" ]
	[ "$(jget "$output" state)" = IN_PROGRESS ]
	# and the claim it holds is a real one: it finishes
	run --separate-stderr idemp-done --state DONE <<<"$env"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
}

@test "TTL: idemp-init enables it on expiresAt where the server has it (DynamoDB Local), warns where not (dynalite)" {
	t=idem-ttl-$$-$RANDOM
	run --separate-stderr idemp-init --store "dynamodb:$t"
	[ "$status" -eq 0 ]
	run --separate-stderr "$IDEMKIT_TEST_BIN/aws_probe" dynamodb DynamoDB_20120810.DescribeTimeToLive "{\"TableName\":\"$t\"}"
	echo "$output"
	if [ "$BACKEND" = dynamodb-local ]; then
		[ "$status" -eq 0 ]
		grep -q '"TimeToLiveStatus":"ENABLED"' <<<"$output"
		grep -q '"AttributeName":"expiresAt"' <<<"$output"
		# a second init finds it enabled and changes nothing
		run --separate-stderr idemp-init --store "dynamodb:$t"
		[ "$status" -eq 0 ]
		if grep -q 'does not support TTL' <<<"$stderr"; then false; fi
	else
		run --separate-stderr idemp-init --store "dynamodb:$t"
		[ "$status" -eq 0 ]
		grep -q 'does not support TTL' <<<"$stderr"
	fi
}

@test "a finish whose reason is not valid UTF-8 (cut inside a character, raw bytes) is recorded with U+FFFD, never refused as a bad request" {
	env=$(ev "$(uid utf8)" | idemp-claim 2>/dev/null)
	[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
	run --separate-stderr idemp-done < <(printf '%s\n' "$env" |
		sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-9"},"notify":{"outcome":"NOTIFY_FAILED","error":"HTTP 503: d\xc3\xa9j\xe0 \xe2\x82"}}/')
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[ "$(jget "$output" done.state)" = DEBITED_NOTIFICATION_FAILED ]
	run --separate-stderr idemp-show --json "$(uid utf8)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" lastError)" = "HTTP 503: déj� ��" ]
}

@test "a finish whose response was lost is retried and finds its own finish: OK, not LEASE_LOST; another token or state is still 13 (issue 24 item 11)" {
	id=$(uid lostfin)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	token=$(jget "$env" claim.token)
	[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
	recproxy_start ddb "$DDB_URL" '[{"op":"UpdateItem","times":1,"do":"lose-response"}]'
	export AWS_ENDPOINT_URL_DYNAMODB=$RECPROXY_URL
	run --separate-stderr idemp-done --state DONE <<<"$env"
	echo "$stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[ "$(jget "$output" done.state)" = DONE ]
	ops ddb
	# the first UpdateItem took effect and its answer was lost; the retry
	# was refused by the condition and decided by our own token on the
	# DONE record (from ALL_OLD on DynamoDB Local, a GetItem on dynalite)
	[ "$(ops ddb UpdateItem)" -eq 2 ]
	[ "$(ops ddb GetItem)" -eq "$(refusal_reads)" ]
	[ "$(grep -c '"fault": "lose-response"' "$BATS_TEST_TMPDIR/ddb.log")" -eq 1 ]
	[ "$(grep UpdateItem "$BATS_TEST_TMPDIR/ddb.log" | grep -c '"ReturnValuesOnConditionCheckFailure": "ALL_OLD"')" -eq 2 ]
	export AWS_ENDPOINT_URL_DYNAMODB=$DDB_URL
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" owner)" = "$token" ]
	# still fenced: a finish to another state, or under another token, is 13
	run --separate-stderr idemp-done --state FAILED <<<"$env"
	[ "$status" -eq 13 ]
	[ "$(jget "$output" done.outcome)" = LEASE_LOST ]
	other=$(sed "s/$token/0123456789abcdef0123456789abcdef/" <<<"$env")
	run --separate-stderr idemp-done --state DONE <<<"$other"
	[ "$status" -eq 13 ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" owner)" = "$token" ]
}

@test "the reason a TEMPFAIL or CONFIG debit left a claim is noted in the record, fenced by the owner token: lease, updatedAt and history untouched (issue 29 item 1)" {
	k=$(uid note)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
	before=$(idemp-show --json "$k")
	# a stale token's note changes nothing
	printf '%s\n' "${env/\"token\":\"/\"token\":\"0}" |
		sed 's/}$/,"debit":{"outcome":"TEMPFAIL","error":"HTTP 503 stale"}}/' | idemp-done >/dev/null 2>&1 || true
	[ "$(jget "$(idemp-show --json "$k")" lastError)" = "" ]
	# the bank's reason raw, cut inside a character: noted with U+FFFD
	run --separate-stderr idemp-done < <(printf '%s\n' "$env" |
		sed 's/}$/,"debit":{"outcome":"TEMPFAIL","error":"HTTP 503: d\xc3\xa9j\xe0 \xe2\x82"}}/')
	[ "$(jget "$output" done.outcome)" != OK ]
	after=$(idemp-show --json "$k")
	[ "$(jget "$after" lastError)" = "TEMPFAIL from the bank: HTTP 503: déj� �� (the lease decides the retry)" ]
	for f in state owner leaseUntil updatedAt attempts history; do
		[ "$(jget "$after" "$f")" = "$(jget "$before" "$f")" ] || { echo "$f changed"; return 1; }
	done
	# the holder finishes as usual, and the finish's reason replaces it
	run -0 idemp-done --state DONE < <(printf '%s\n' "$env" |
		sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-N"},"notify":{"outcome":"OK"}}/')
	[ "$(jget "$(idemp-show --json "$k")" lastError)" = "" ]
}
