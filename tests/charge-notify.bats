#!/usr/bin/env bats
# charge-notify against a real bank-sim gateway: OK, bounded retries then
# NOTIFY_FAILED, no retry on 4xx, config errors, pass-through, --stream.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

teardown() {
	stubs_stop
	capture_stop
	conn_counter_stop
	bank_stop
}

notify_run() {
	local e=$1; shift
	run --separate-stderr charge-notify "$@" <<<"$e"
}

@test "--help lists the exit codes; --version" {
	run charge-notify --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"usage: charge-notify"* ]]
	for c in "0  OK" "21  NOTIFY_FAILED" "65  DATAERR" "78  CONFIG"; do
		[[ "$output" == *"$c"* ]]
	done
	run charge-notify --version
	[ "$status" -eq 0 ]
	[[ "$output" == "charge-notify (idemkit) "* ]]
}

@test "bad options are 64" {
	run charge-notify --retries many
	[ "$status" -eq 64 ]
	[[ "$output" == *"--retries"* ]]
	run charge-notify --backoff soon
	[ "$status" -eq 64 ]
	run charge-notify --bogus
	[ "$status" -eq 64 ]
	[[ "$output" == *"usage: charge-notify"* ]]
}

@test "a debited envelope is notified once, with <chargeId>:notify as the key and the debit ref" {
	bank_start
	notify_run "$(debited "$(envelope CHG-1)")"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" notify.outcome)" = OK ]
	[ "$(jget "$output" notify.attempts)" = 1 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000042 ]
	run bank_get /notifications
	[[ "$output" == *'"key":"CHG-1:notify","count":1'* ]]
	[ "$(jget "$output" body.debitRef)" = TXN-00000042 ]
	[ "$(jget "$output" body.chargeId)" = CHG-1 ]
	[ "$(jget "$output" body.amount)" = 2500 ]
	[ "$(bank_stat notificationAttempts)" -eq 1 ]
}

@test "a 2xx whose body is over 1 MiB or cut short is a sent notification: OK at once, never retried" {
	# A misbehaving gateway (tests/bankstub.py): bank-sim never answers so.
	for m in big short; do
		stub_start "$m" bankstub.py "$m"
		notify_run "$(debited "$(envelope CHG-$m)")" --url "http://127.0.0.1:$STUB_PORT/n"
		[ "$status" -eq 0 ] || { echo "$m: $output"; return 1; }
		[ "$(jget "$output" notify.outcome)" = OK ]
		[ "$(jget "$output" notify.attempts)" = 1 ]
		[ "$(jget "$output" debit.ref)" = TXN-00000042 ]
		[[ "$stderr" == *'"a 2xx whose body did not arrive whole: the status stands"'* ]]
		[ "$(wc -l <"$BATS_TEST_TMPDIR/$m/log")" -eq 1 ]
	done
}

@test "a proxy in the environment never carries a notification (plain http), nor its token" {
	stub_start proxy proxystub.py
	P=http://127.0.0.1:$STUB_PORT
	export http_proxy=$P HTTP_PROXY=$P all_proxy=$P ALL_PROXY=$P
	unset no_proxy NO_PROXY
	bank_start
	IDEMKIT_NOTIFY_TOKEN=sekrit-N-77 notify_run "$(debited "$(envelope CHG-PX)")"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	[ ! -s "$BATS_TEST_TMPDIR/proxy/log" ]
	[ "$(sqlite3 "$BANK_DIR/ledger.db" "SELECT count(*) FROM notifications WHERE key = 'CHG-PX:notify'")" -eq 1 ]
	IDEMKIT_NOTIFY_PROXY=$P run charge-notify --check
	[ "$status" -eq 78 ]
	[[ "$output" == *"IDEMKIT_NOTIFY_PROXY is set but the URL is plain http://"* ]]
}

@test "503 is retried, then 21 NOTIFY_FAILED after the bounded attempts; the debit is untouched" {
	bank_start --notify-fail
	in=$(debited "$(envelope CHG-F)")
	notify_run "$in" --retries 2 --backoff 10ms
	[ "$status" -eq 21 ]
	[ "$(jget "$output" notify.outcome)" = NOTIFY_FAILED ]
	[ "$(jget "$output" notify.error)" = "HTTP 503: injected notification failure after 3 attempts" ]
	[ "$(jget "$output" debit)" = "$(jget "$in" debit)" ]
	[ "$(bank_stat notificationAttempts)" -eq 3 ]
	[ "$(bank_stat debits)" -eq 0 ]
	# the audit line's attempts is a JSON number, not a string
	printf '%s\n' "$stderr" | python3 -c 'import json,sys
l=[json.loads(x) for x in sys.stdin if x.startswith("{")]
n=[o for o in l if o.get("msg") == "notify"]
assert len(n) == 1 and n[0]["attempts"] == 3 and type(n[0]["attempts"]) is int, l'
	notify_run "$in" --retries 0
	[ "$status" -eq 21 ]
	[ "$(jget "$output" notify.error)" = "HTTP 503: injected notification failure" ]
	[ "$(bank_stat notificationAttempts)" -eq 4 ]
}

@test "a failure rate: the retries get it through" {
	bank_start --notify-fail-rate 0.5 --seed 3
	for i in 1 2 3 4 5 6; do
		notify_run "$(debited "$(envelope "CHG-R$i")")" --retries 10 --backoff 1ms
		[ "$status" -eq 0 ]
	done
	[ "$(bank_stat notifications)" -eq 6 ]
	[ "$(bank_stat notificationFailures)" -gt 0 ]
}

# notify_expect CODE OUTCOME ATTEMPTS STATUS...: one notification per
# status, answered STATUS by bank-sim every time.
notify_expect() {
	local code=$1 outcome=$2 attempts=$3 s suffix; shift 3
	for s in "$@"; do
		bank_post /control "{\"notifyFailStatus\":$s}" >/dev/null
		notify_run "$(debited "$(envelope CHG-N$s)")" --retries 1 --backoff 1ms
		[ "$status" -eq "$code" ] || { echo "HTTP $s: exit $status, want $code"; return 1; }
		suffix=
		[ "$attempts" -eq 1 ] || suffix=" after $attempts attempts"
		[ "$(jget "$output" notify.outcome)" = "$outcome" ]
		[ "$(jget "$output" notify.attempts)" = "$attempts" ]
		[ "$(jget "$output" notify.error)" = "HTTP $s: injected notification failure$suffix" ]
		[ "$(jget "$output" debit.ref)" = TXN-00000042 ]
	done
}

@test "gateway statuses: 402/422 NOTIFY_FAILED at once, 408/409/425/429/5xx retried then NOTIFY_FAILED, other 4xx CONFIG at once" {
	bank_start --notify-fail
	notify_expect 21 NOTIFY_FAILED 1 402 422
	notify_expect 21 NOTIFY_FAILED 2 408 409 425 429 500 502 503 504 507
	notify_expect 78 CONFIG 1 301 400 401 403 404 405 410 413 415 421 431 451
	[ "$(bank_stat notifications)" -eq 0 ]
	[ "$(bank_stat debits)" -eq 0 ]
	# The lists are the gateway's own.
	bank_post /control '{"notifyFailStatus":404}' >/dev/null
	notify_run "$(debited "$(envelope CHG-L)")" --declined-status 404 --backoff 1ms
	[ "$status" -eq 21 ]
	IDEMKIT_NOTIFY_RETRY=404 notify_run "$(debited "$(envelope CHG-L)")" --retries 2 --backoff 1ms
	[ "$status" -eq 21 ]
	[ "$(jget "$output" notify.attempts)" = 3 ]
	IDEMKIT_NOTIFY_DECLINED=x notify_run "$(debited "$(envelope CHG-L)")"
	[ "$status" -eq 78 ]
	[[ "$(jget "$output" notify.error)" == "IDEMKIT_NOTIFY_DECLINED: "* ]]
	run charge-notify --retry-status 200
	[ "$status" -eq 64 ]
}

@test "a wrong path or a missing key header is 78 CONFIG at once, without a retry" {
	bank_start
	notify_run "$(debited "$(envelope CHG-4)")" --url "$BANK_URL/nope" --backoff 10ms
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.outcome)" = CONFIG ]
	[ "$(jget "$output" notify.error)" = "HTTP 404: no such endpoint" ]
	[ "$(jget "$output" notify.attempts)" = 1 ]
	notify_run "$(debited "$(envelope CHG-4)")" --key-header X-Other
	[ "$status" -eq 78 ]
	[[ "$(jget "$output" notify.error)" == "HTTP 400: "* ]]
	[ "$(bank_stat notificationAttempts)" -eq 1 ]   # the 404 never reached /notifications
}

@test "a hanging gateway times out and is retried, then NOTIFY_FAILED" {
	bank_start --notify-hang
	notify_run "$(debited "$(envelope CHG-H)")" --timeout 200ms --retries 1 --backoff 1ms
	[ "$status" -eq 21 ]
	[[ "$(jget "$output" notify.error)" == *"imed out"*"after 2 attempts" ]]
	[ "$(bank_stat hangs)" -eq 2 ]
}

@test "plain http:// to a host that is not loopback is 78 before any connection" {
	conn_counter_start
	export http_proxy=http://127.0.0.1:$CONN_PORT
	unset no_proxy NO_PROXY
	IDEMKIT_NOTIFY_URL=http://192.0.2.1/notifications notify_run "$(debited "$(envelope CHG-1)")"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.outcome)" = CONFIG ]
	[ "$(jget "$output" notify.attempts)" = 0 ]
	[[ "$(jget "$output" notify.error)" == "IDEMKIT_NOTIFY_URL: plain http:// only to loopback"* ]]
	[ "$(conn_count)" -eq 0 ]
	# The counter works: a loopback URL reaches it (directly: plain http
	# never goes through the proxy in the environment).
	notify_run "$(debited "$(envelope CHG-1)")" --url "http://127.0.0.1:$CONN_PORT/n" --retries 0 --timeout 1s
	[ "$(conn_count)" -eq 1 ]
}

@test "the lease must cover every attempt, its backoffs and the margin: else 15 LEASE_SHORT, nothing sent" {
	bank_start
	# 4 attempts x 2s + backoffs 10+20+40ms + 2s margin = 10.07s; 6s left
	# covers one attempt and its margin, not the retries.
	notify_run "$(debited "$(leased CHG-1 6000)")" --timeout 2s --retries 3 --backoff 10ms
	[ "$status" -eq 15 ]
	[ "$(jget "$output" notify.outcome)" = LEASE_SHORT ]
	[ "$(jget "$output" notify.attempts)" = 0 ]
	[[ "$(jget "$output" notify.error)" =~ ^"the claim's lease has "[0-9]+"ms left; the call needs 8070ms plus a 2000ms margin: nothing was sent"$ ]]
	[ "$(jget "$output" debit.ref)" = TXN-00000042 ]
	# A lease ending in 1s, the default 10s timeout.
	notify_run "$(debited "$(leased CHG-1 1000)")"
	[ "$status" -eq 15 ]
	[ "$(bank_stat notificationAttempts)" -eq 0 ]
	# Enough left; or the margin given up; or no leaseUntil (the re-notify path).
	notify_run "$(debited "$(leased CHG-1 15000)")" --timeout 2s --retries 3 --backoff 10ms
	[ "$status" -eq 0 ]
	notify_run "$(debited "$(leased CHG-2 15000)")" --timeout 2s --retries 3 --backoff 10ms --lease-margin 10s
	[ "$status" -eq 15 ]
	[[ "$(jget "$output" notify.error)" == *"needs 8070ms plus a 10000ms margin"* ]]
	notify_run "$(debited "$(leased CHG-2 15000)")" --timeout 2s --retries 3 --backoff 10ms --lease-margin 0
	[ "$status" -eq 0 ]
	notify_run "$(debited "$(envelope CHG-3 | sed 's/,"claim":{[^}]*}//')")"
	[ "$status" -eq 0 ]
	[ "$(bank_stat notificationAttempts)" -eq 3 ]
}

@test "configuration errors are 78, never a false NOTIFY_FAILED" {
	unset IDEMKIT_NOTIFY_URL
	notify_run "$(debited "$(envelope CHG-C)")"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.outcome)" = CONFIG ]
	[[ "$(jget "$output" notify.error)" == *IDEMKIT_NOTIFY_URL* ]]
	self_signed "$BATS_TEST_TMPDIR"
	bank_start --tls-cert "$BATS_TEST_TMPDIR/cert.pem" --tls-key "$BATS_TEST_TMPDIR/key.pem"
	notify_run "$(debited "$(envelope CHG-C)")"
	[ "$status" -eq 78 ]
	notify_run "$(debited "$(envelope CHG-C)")" --cacert "$BATS_TEST_TMPDIR/cert.pem"
	[ "$status" -eq 0 ]
}

@test "bearer token and signature for the gateway come from IDEMKIT_NOTIFY_*" {
	tok=ntok-$RANDOM$RANDOM
	printf '%s' "$tok" >"$BATS_TEST_TMPDIR/token"
	chmod 600 "$BATS_TEST_TMPDIR/token"
	printf 'hk' >"$BATS_TEST_TMPDIR/hk"
	chmod 600 "$BATS_TEST_TMPDIR/hk"
	bank_start --token-file "$BATS_TEST_TMPDIR/token" --hmac-key-file "$BATS_TEST_TMPDIR/hk"
	notify_run "$(debited "$(envelope CHG-T)")" --retries 0
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.outcome)" = CONFIG ]
	[[ "$(jget "$output" notify.error)" == "HTTP 401: "* ]]
	IDEMKIT_NOTIFY_TOKEN=$tok IDEMKIT_NOTIFY_HMAC_KEY_FILE=$BATS_TEST_TMPDIR/hk \
		notify_run "$(debited "$(envelope CHG-T)")"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output" "$stderr" >"$BATS_TEST_TMPDIR/seen"
	absent "$tok" "$BATS_TEST_TMPDIR/seen" "$BANK_DIR/err"
}

@test "pass-through: an envelope whose debit is not OK is untouched, nothing sent" {
	bank_start
	in=$(envelope CHG-P | sed 's/}$/,"debit":{"outcome":"DECLINED","error":"HTTP 402: insufficient funds"}}/')
	notify_run "$in"
	[ "$status" -eq 20 ]
	[ "$output" = "$in" ]
	in=$(envelope CHG-P ACC-1 2500 DUP_DONE)
	notify_run "$in"
	[ "$status" -eq 10 ]
	[ "$output" = "$in" ]
	[ "$(bank_stat notificationAttempts)" -eq 0 ]
}

@test "--stream: several envelopes, outcomes in the envelopes, exit 0" {
	bank_start
	# --inflight 1: in order (tests/inflight.bats has many in flight)
	run --separate-stderr charge-notify --stream --inflight 1 < <(
		debited "$(envelope S1)"; echo
		envelope S2 ACC-1 2500 DUP_DONE
		debited "$(envelope S3)"; echo)
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[ "$(jget "${lines[0]}" notify.outcome)" = OK ]
	[ -z "$(jget "${lines[1]}" notify)" ]
	[ "$(jget "${lines[2]}" notify.outcome)" = OK ]
	[ "$(bank_stat notifications)" -eq 2 ]
}

@test "the whole chain: claim, debit, notify against one bank-sim" {
	bank_start
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db
	run --separate-stderr sh -c 'idemp-claim | charge-debit | charge-notify' < <(event CHG-W)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000001 ]
	[ "$(jget "$output" notify.outcome)" = OK ]
	run bank_get /notifications
	[[ "$output" == *'"key":"CHG-W:notify"'* ]]
}

@test "--check: the gateway configuration without any network call, 0 or 78 with the reason" {
	conn_counter_start
	export http_proxy=http://127.0.0.1:$CONN_PORT https_proxy=http://127.0.0.1:$CONN_PORT
	unset no_proxy NO_PROXY
	run --separate-stderr charge-notify --check </dev/null
	[ "$status" -eq 78 ]
	[ "$stderr" = "charge-notify: no URL: set IDEMKIT_NOTIFY_URL or --url" ]
	export IDEMKIT_NOTIFY_URL=https://notify.example/n
	run --separate-stderr charge-notify --check </dev/null
	[ "$status" -eq 0 ]
	[ -z "$output" ]; [ -z "$stderr" ]
	IDEMKIT_NOTIFY_URL=http://192.0.2.1/n run charge-notify --check
	[ "$status" -eq 78 ]
	[[ "$output" == "charge-notify: IDEMKIT_NOTIFY_URL: plain http:// only to loopback"* ]]
	IDEMKIT_NOTIFY_TOKEN_FILE=$BATS_TEST_TMPDIR/missing run charge-notify --check
	[ "$status" -eq 78 ]
	[[ "$output" == *"IDEMKIT_NOTIFY_TOKEN_FILE"* ]]
	IDEMKIT_NOTIFY_DECLINED=402,503 run charge-notify --check
	[ "$status" -eq 78 ]
	[[ "$output" == *"status 503 is in both"* ]]
	run charge-notify --check --retries many
	[ "$status" -eq 64 ]
	[ "$(conn_count)" -eq 0 ]
}

@test "--request / IDEMKIT_NOTIFY_REQUEST: the gateway's body with \$ref, \$key, \$amountMajor; --reason" {
	capture_start
	prog='{to: .accountId, text: "Debited \($amountMajor) \(.currency), ref \($ref)", id: $key}'
	notify_run "$(debited "$(envelope CHG-1)")" --url "$CAP_URL/sms" --request "$prog"
	[ "$status" -eq 0 ]
	[ "$(jget "$(tail -1 "$CAP_DIR/log")" body)" = '{"to":"ACC-1","text":"Debited 25.00 INR, ref TXN-00000042","id":"CHG-1:notify"}' ]
	IDEMKIT_NOTIFY_REQUEST='{r: $ref}' notify_run "$(debited "$(envelope CHG-2)")" --url "$CAP_URL/sms"
	[ "$status" -eq 0 ]
	[ "$(jget "$(tail -1 "$CAP_DIR/log")" body)" = '{"r":"TXN-00000042"}' ]
	notify_run "$(debited "$(envelope CHG-3)")" --url "$CAP_URL/sms" --request 'error("x")'
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.error)" = "--request: jq error: x" ]
	[ "$(wc -l <"$CAP_DIR/log")" -eq 2 ]
	capture_stop
	bank_start --notify-fail --notify-fail-status 422
	IDEMKIT_NOTIFY_REASON='"gateway: " + .reason' notify_run "$(debited "$(envelope CHG-4)")"
	[ "$status" -eq 21 ]
	[ "$(jget "$output" notify.error)" = "HTTP 422: gateway: injected notification failure" ]
}

@test "IDEMKIT_NOTIFY_* OAuth2 and mutual TLS: the gateway's own credentials" {
	mtls_certs "$BATS_TEST_TMPDIR"
	d=$BATS_TEST_TMPDIR
	printf 'nsecret\n' >"$d/nsecret"
	chmod 600 "$d/nsecret"
	bank_start --tls-cert "$d/cert.pem" --tls-key "$d/key.pem" --tls-client-ca "$d/ca.pem" \
		--oauth-client-id notifier --oauth-client-secret-file "$d/nsecret"
	export IDEMKIT_NOTIFY_CACERT=$d/cert.pem IDEMKIT_NOTIFY_OAUTH_TOKEN_URL=$BANK_URL/oauth/token \
		IDEMKIT_NOTIFY_OAUTH_CLIENT_ID=notifier IDEMKIT_NOTIFY_OAUTH_CLIENT_SECRET_FILE=$d/nsecret
	# No client certificate: the token endpoint itself says 403: CONFIG.
	notify_run "$(debited "$(envelope CHG-1)")"
	[ "$status" -eq 78 ]
	[ "$(jget "$output" notify.error)" = "OAuth2 token: HTTP 403" ]
	export IDEMKIT_NOTIFY_CLIENT_CERT=$d/client.pem IDEMKIT_NOTIFY_CLIENT_KEY=$d/client.key
	run --separate-stderr charge-notify --stream < <(debited "$(envelope CHG-1)"; echo; debited "$(envelope CHG-2)"; echo)
	[ "$status" -eq 0 ]
	[ "$(jget "${lines[0]}" notify.outcome)" = OK ]
	[ "$(jget "${lines[1]}" notify.outcome)" = OK ]
	[ "$(ledger_counter tokensIssued)" -eq 1 ]
	[ "$(sqlite3 "$BANK_DIR/ledger.db" 'SELECT count(*) FROM notifications')" -eq 2 ]
	printf '%s\n' "$output" "$stderr" >"$d/seen"
	absent nsecret "$d/seen"
}
