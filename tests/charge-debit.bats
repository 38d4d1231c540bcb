#!/usr/bin/env bats
# charge-debit against a real bank-sim on loopback: every classification
# path, idempotency through the bank's ledger, credentials, TLS.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

teardown() {
	bank_stop
}

# debit_run ENVELOPE [options...]: runs charge-debit one-shot.
debit_run() {
	local e=$1; shift
	run --separate-stderr charge-debit "$@" <<<"$e"
}

@test "--help lists the exit codes; --version" {
	run charge-debit --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"usage: charge-debit"* ]]
	for c in "0  OK" "20  DECLINED" "65  DATAERR" "70  SOFTWARE" "75  TEMPFAIL" "78  CONFIG"; do
		[[ "$output" == *"$c"* ]]
	done
	run charge-debit --version
	[ "$status" -eq 0 ]
	[[ "$output" == "charge-debit (idemkit) "* ]]
}

@test "bad options and two envelopes in one-shot are 64" {
	run charge-debit --bogus
	[ "$status" -eq 64 ]
	[[ "$output" == *"usage: charge-debit"* ]]
	run charge-debit --timeout soon
	[ "$status" -eq 64 ]
	[[ "$output" == *"--timeout"* ]]
	run charge-debit extra
	[ "$status" -eq 64 ]
	run charge-debit < <(envelope C1; envelope C2)
	[ "$status" -eq 64 ]
	[[ "$output" == *"--stream"* ]]
}

@test "2xx: OK with the bank's reference, the chargeId as the idempotency key" {
	bank_start
	debit_run "$(envelope CHG-1)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.outcome)" = OK ]
	[ "$(jget "$output" debit.ref)" = TXN-00000001 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	[ -z "$(jget "$output" debit.replayed)" ]
	run bank_get /debits/CHG-1
	[[ "$output" == *'"key":"CHG-1"'*'"accountId":"ACC-1","amount":2500,"currency":"INR","chargeType":"SMS_ALERT_FEE"'* ]]
}

@test "the same key twice: one debit in the ledger, the replay carries the original ref" {
	bank_start
	debit_run "$(envelope CHG-1)"
	[ "$status" -eq 0 ]
	debit_run "$(envelope CHG-1)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000001 ]
	[ "$(jget "$output" debit.replayed)" = True ] || [ "$(jget "$output" debit.replayed)" = true ]
	run bank_get /ledger
	[ "${#lines[@]}" -eq 1 ]
	[ "$(bank_stat attempts)" -eq 2 ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "402 declined: 20 with the bank's reason" {
	bank_start --decline ACC-9
	debit_run "$(envelope CHG-9 ACC-9)"
	[ "$status" -eq 20 ]
	[ "$(jget "$output" debit.outcome)" = DECLINED ]
	[ "$(jget "$output" debit.error)" = "HTTP 402: insufficient funds" ]
	[ "$(jget "$output" debit.status)" = 402 ]
	[[ "$stderr" == *'"outcome":"DECLINED"'* ]]
}

@test "400, 403, 404, 422 are 20 DECLINED" {
	bank_start
	# 422: the same chargeId with a different amount.
	debit_run "$(envelope CHG-1)"
	debit_run "$(envelope CHG-1 ACC-1 9999)"
	[ "$status" -eq 20 ]
	[ "$(jget "$output" debit.error)" = "HTTP 422: idempotency key reused with a different request" ]
	# 400: the key sent under another header name, so the bank has none.
	debit_run "$(envelope CHG-2)" --key-header X-Request-Id
	[ "$status" -eq 20 ]
	[ "$(jget "$output" debit.error)" = "HTTP 400: missing or invalid Idempotency-Key header" ]
	IDEMKIT_BANK_KEY_HEADER=X-Other debit_run "$(envelope CHG-2)"
	[ "$status" -eq 20 ]
	# 404
	debit_run "$(envelope CHG-3)" --url "$BANK_URL/nope"
	[ "$status" -eq 20 ]
	[ "$(jget "$output" debit.error)" = "HTTP 404: no such endpoint" ]
	# 403
	bank_post /control '{"errorRate":1,"errorStatus":403}' >/dev/null
	debit_run "$(envelope CHG-4)"
	[ "$status" -eq 20 ]
	[ "$(jget "$output" debit.error)" = "HTTP 403: injected failure" ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "408, 429, 500, 503 are 75 TEMPFAIL; nothing debited" {
	bank_start --error-rate 1
	for s in 408 429 500 503; do
		bank_post /control "{\"errorStatus\":$s}" >/dev/null
		debit_run "$(envelope CHG-T)"
		[ "$status" -eq 75 ]
		[ "$(jget "$output" debit.outcome)" = TEMPFAIL ]
		[[ "$(jget "$output" debit.error)" == "HTTP $s"* ]]
	done
	[ "$(bank_stat debits)" -eq 0 ]
	# The bank recovers: the retry with the same key debits once.
	bank_post /control '{"errorRate":0}' >/dev/null
	debit_run "$(envelope CHG-T)"
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "a bank that hangs is a timeout: 75" {
	bank_start --hang
	start=$(date +%s%N)
	debit_run "$(envelope CHG-H)" --timeout 300ms
	[ "$status" -eq 75 ]
	[ $(( ($(date +%s%N) - start) / 1000000 )) -lt 3000 ]
	[[ "$(jget "$output" debit.error)" == *"127.0.0.1:$BANK_PORT"*"imed out"* ]]
}

@test "connection refused: 75" {
	bank_start
	url=$IDEMKIT_BANK_URL
	bank_stop
	debit_run "$(envelope CHG-C)" --url "$url" --connect-timeout 500ms
	[ "$status" -eq 75 ]
	[ "$(jget "$output" debit.outcome)" = TEMPFAIL ]
}

@test "2xx without a reference: 70, never a recorded debit without the bank's ref" {
	bank_start --error-rate 1 --error-status 200
	debit_run "$(envelope CHG-N)"
	[ "$status" -eq 70 ]
	[ "$(jget "$output" debit.outcome)" = SOFTWARE ]
	[ "$(jget "$output" debit.error)" = "HTTP 200 without a reference" ]
}

@test "401: 78 CONFIG; token from the environment or a file works" {
	tok=tok-$RANDOM$RANDOM$RANDOM
	printf '%s\n' "$tok" >"$BATS_TEST_TMPDIR/token"
	bank_start --token-file "$BATS_TEST_TMPDIR/token"
	debit_run "$(envelope CHG-A)"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" debit.outcome)" = CONFIG ]
	[ "$(jget "$output" debit.error)" = "HTTP 401: unauthorized" ]
	IDEMKIT_BANK_TOKEN=wrong debit_run "$(envelope CHG-A)"
	[ "$status" -eq 78 ]
	IDEMKIT_BANK_TOKEN=$tok debit_run "$(envelope CHG-A)"
	[ "$status" -eq 0 ]
	[[ "$output$stderr" != *"$tok"* ]]
	IDEMKIT_BANK_TOKEN_FILE=$BATS_TEST_TMPDIR/token debit_run "$(envelope CHG-B)"
	[ "$status" -eq 0 ]
	[[ "$output$stderr" != *"$tok"* ]]
	IDEMKIT_BANK_TOKEN_FILE=$BATS_TEST_TMPDIR/missing debit_run "$(envelope CHG-C)"
	[ "$status" -eq 78 ]
	[[ "$(jget "$output" debit.error)" == *"IDEMKIT_BANK_TOKEN_FILE"* ]]
}

@test "the token is never in ps, /proc/PID/environ, stdout or stderr" {
	tok=tok-$RANDOM$RANDOM$RANDOM
	printf '%s' "$tok" >"$BATS_TEST_TMPDIR/token"
	bank_start --token-file "$BATS_TEST_TMPDIR/token" --latency 1500ms
	IDEMKIT_BANK_TOKEN=$tok charge-debit <<<"$(envelope CHG-P)" \
		>"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" &
	pid=$!
	sleep 0.5
	# bats keeps a subshell between us and the command: read the child.
	cpid=$(pgrep -P "$pid" -x charge-debit || echo "$pid")
	ps -eo pid,args >"$BATS_TEST_TMPDIR/ps"
	tr '\0' '\n' <"/proc/$cpid/environ" >"$BATS_TEST_TMPDIR/environ"
	wait "$pid"
	# The variable reached that process (so the check below means something)...
	grep -q '^IDEMKIT_BANK_TOKEN=' "$BATS_TEST_TMPDIR/environ"
	# ...and its value was wiped from it.
	grep -q charge-debit "$BATS_TEST_TMPDIR/ps"
	[ "$(jget "$(cat "$BATS_TEST_TMPDIR/out")" debit.outcome)" = OK ]
	absent "$tok" "$BATS_TEST_TMPDIR/ps" "$BATS_TEST_TMPDIR/environ" \
		"$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/err" "$BANK_DIR/err"
}

@test "HMAC signature: refused without the key (78), accepted with it" {
	printf 'hk-%s' "$RANDOM$RANDOM" >"$BATS_TEST_TMPDIR/hk"
	bank_start --hmac-key-file "$BATS_TEST_TMPDIR/hk"
	debit_run "$(envelope CHG-S)"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" debit.error)" = "HTTP 401: bad or missing signature" ]
	printf 'other' >"$BATS_TEST_TMPDIR/wrong"
	IDEMKIT_BANK_HMAC_KEY_FILE=$BATS_TEST_TMPDIR/wrong debit_run "$(envelope CHG-S)"
	[ "$status" -eq 78 ]
	IDEMKIT_BANK_HMAC_KEY_FILE=$BATS_TEST_TMPDIR/hk debit_run "$(envelope CHG-S)"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000001 ]
}

@test "TLS: a self-signed bank fails verification (78) without --cacert, passes with it" {
	self_signed "$BATS_TEST_TMPDIR"
	bank_start --tls-cert "$BATS_TEST_TMPDIR/cert.pem" --tls-key "$BATS_TEST_TMPDIR/key.pem"
	[[ "$IDEMKIT_BANK_URL" == https://* ]]
	debit_run "$(envelope CHG-TLS)"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" debit.outcome)" = CONFIG ]
	debit_run "$(envelope CHG-TLS)" --cacert "$BATS_TEST_TMPDIR/cert.pem"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000001 ]
	IDEMKIT_BANK_CACERT=$BATS_TEST_TMPDIR/cert.pem debit_run "$(envelope CHG-TLS)"
	[ "$status" -eq 0 ]
	debit_run "$(envelope CHG-TLS2)" --cacert "$BATS_TEST_TMPDIR/missing.pem"
	[ "$status" -eq 78 ]
}

@test "no URL configured: 78, recorded in the envelope" {
	unset IDEMKIT_BANK_URL
	debit_run "$(envelope CHG-U)"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" debit.outcome)" = CONFIG ]
	[[ "$(jget "$output" debit.error)" == *IDEMKIT_BANK_URL* ]]
	[[ "$stderr" == *"charge-debit: no URL"* ]]
}

@test "pass-through: an envelope whose claim is not ACQUIRED is untouched, nothing sent" {
	bank_start
	in=$(envelope CHG-D ACC-1 2500 DUP_DONE)
	debit_run "$in"
	[ "$status" -eq 10 ]
	[ "$output" = "$in" ]
	in=$(envelope CHG-D ACC-1 2500 DUP_IN_PROGRESS)
	debit_run "$in"
	[ "$status" -eq 11 ]
	[ "$output" = "$in" ]
	# Not claimed at all: passed through (wrapped), with a warning.
	debit_run "$(event CHG-D)"
	[ "$status" -eq 0 ]
	[ -z "$(jget "$output" debit)" ]
	[[ "$stderr" == *"not claimed"* ]]
	[ "$(bank_stat attempts)" -eq 0 ]
}

@test "a claimed envelope whose body is not a valid event is 65" {
	bank_start
	debit_run '{"v":1,"body":"{\"chargeId\":\"CHG-X\",\"amount\":1.5}","claim":{"outcome":"ACQUIRED"}}'
	[ "$status" -eq 65 ]
	[ "$(jget "$output" debit.outcome)" = DATAERR ]
	debit_run '{"v":1,"body":5}'
	[ "$status" -eq 65 ]
	[ "$(jget "$output" debit.outcome)" = DATAERR ]
	[ "$(bank_stat attempts)" -eq 0 ]
}

@test "--stream: one envelope out per line, outcomes in the envelopes, exit 0" {
	bank_start --decline ACC-9
	run --separate-stderr charge-debit --stream < <(
		envelope S1; envelope S2 ACC-9; envelope S3 ACC-1 2500 DUP_DONE; envelope S1)
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 4 ]
	[ "$(jget "${lines[0]}" debit.outcome)" = OK ]
	[ "$(jget "${lines[1]}" debit.outcome)" = DECLINED ]
	[ -z "$(jget "${lines[2]}" debit)" ]
	[ "$(jget "${lines[3]}" debit.ref)" = "$(jget "${lines[0]}" debit.ref)" ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "through idemp-claim: claim then debit, a redelivery is a duplicate" {
	bank_start
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db
	run --separate-stderr sh -c 'idemp-claim | charge-debit' < <(event CHG-I)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.outcome)" = OK ]
	run --separate-stderr sh -c 'idemp-claim | charge-debit' < <(event CHG-I)
	[ "$status" -eq 11 ]
	[ "$(bank_stat attempts)" -eq 1 ]
}
