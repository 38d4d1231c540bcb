#!/usr/bin/env bats
# bank-sim: the ledger's idempotency, the faults, auth, TLS, and the
# exit codes it documents (0 on SIGTERM, 64 usage, 78 config).

bats_require_minimum_version 1.5.0
load helper
load bank_helper

teardown() {
	capture_stop
	bank_stop
}

debit() {   # debit KEY BODY [curl options...]: "<status> <body>"
	local k=$1 b=$2; shift 2
	curl -sS --max-time 5 -o "$BATS_TEST_TMPDIR/resp" -w '%{http_code}' \
		-H "Idempotency-Key: $k" --data-binary "$b" "$@" "$BANK_URL/debits"
	printf ' %s\n' "$(cat "$BATS_TEST_TMPDIR/resp")"
}

@test "bank-sim --help lists options and exit codes; --version" {
	run bank-sim --help
	[ "$status" -eq 0 ]
	[[ "$output" == *"usage: bank-sim"* ]]
	[[ "$output" == *"--token-file"* ]]
	[[ "$output" == *"78  CONFIG"* ]]
	run bank-sim --version
	[ "$status" -eq 0 ]
	[[ "$output" == "bank-sim (idemkit) "* ]]
}

@test "bank-sim: bad options are usage errors (64)" {
	run bank-sim --port 70000
	[ "$status" -eq 64 ]
	[[ "$output" == *"usage: bank-sim"* ]]
	run bank-sim --error-rate 1.5
	[ "$status" -eq 64 ]
	run bank-sim --bogus
	[ "$status" -eq 64 ]
	run bank-sim extra-arg
	[ "$status" -eq 64 ]
}

@test "bank-sim: bad configuration exits 78" {
	run bank-sim --port 0 --listen not-an-address
	[ "$status" -eq 78 ]
	[[ "$output" == *"not a numeric"* ]]
	run bank-sim --port 0 --token-file "$BATS_TEST_TMPDIR/missing"
	[ "$status" -eq 78 ]
	[[ "$output" == *"token file"* ]]
	run bank-sim --port 0 --tls-cert "$BATS_TEST_TMPDIR/x"
	[ "$status" -eq 78 ]
	[[ "$output" == *"both"* ]]
	: >"$BATS_TEST_TMPDIR/empty"
	run bank-sim --port 0 --token-file "$BATS_TEST_TMPDIR/empty"
	[ "$status" -eq 78 ]
	[[ "$output" == *"empty"* ]]
}

@test "bank-sim: a port in use is a config error (78)" {
	bank_start
	run bank-sim --port "$BANK_PORT" --db "$BATS_TEST_TMPDIR/other.db"
	[ "$status" -eq 78 ]
	[[ "$output" == *"cannot listen"* ]]
}

@test "bank-sim: binds loopback, prints the port, stops cleanly on SIGTERM" {
	bank_start
	[[ "$BANK_URL" == "http://127.0.0.1:$BANK_PORT" ]]
	[ "$BANK_PORT" -gt 0 ]
	run bank_get /health
	[ "$output" = '{"status":"UP"}' ]
	[ "$(stat -c %a "$BANK_DIR/ledger.db")" = 600 ]
	bank_stop
	[ "${BANK_RC:-0}" -eq 0 ]
	[ ! -e "$BANK_DIR/port" ]
	run curl -sS --max-time 2 "$BANK_URL/health"
	[ "$status" -ne 0 ]
}

@test "bank-sim: default ledger lives in the state directory" {
	bank-sim --port 0 --port-file "$BATS_TEST_TMPDIR/p" >/dev/null 2>&1 3>&- &
	BANK_PID=$!
	for i in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/p" ] && break; sleep 0.05; done
	[ -f "$IDEMKIT_STATE_DIR/bank-sim.db" ]
	bank_stop
	[ "${BANK_RC:-0}" -eq 0 ]
}

@test "debit: 201 with a ref; the same key again is a replay, never a second debit" {
	bank_start
	run debit CHG-1 "$EVENT"
	[[ "$output" == '201 {"ref":"TXN-00000001","status":"DEBITED",'* ]]
	run curl -sS -i -H 'Idempotency-Key: CHG-1' --data-binary "$EVENT" "$BANK_URL/debits"
	[[ "$output" == *"HTTP/1.1 200"* ]]
	[[ "$output" == *"Idempotent-Replayed: true"* ]]
	[[ "$output" == *'"ref":"TXN-00000001"'*'"replayed":true'* ]]
	# Same fields in another order and spacing: still the same request.
	run debit CHG-1 '{ "chargeType":"SMS_ALERT_FEE", "currency":"INR", "amount":2500, "accountId":"ACC-1", "chargeId":"CHG-1" }'
	[[ "$output" == '200 {"ref":"TXN-00000001"'* ]]
	run bank_get /ledger
	[ "${#lines[@]}" -eq 1 ]
	[[ "${lines[0]}" == *'"key":"CHG-1","ref":"TXN-00000001"'*'"amount":2500'*'"replays":2'* ]]
	[ "$(bank_stat attempts)" -eq 3 ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat replays)" -eq 2 ]
	run bank_get /debits/CHG-1
	[[ "$output" == *'"ref":"TXN-00000001"'* ]]
	run curl -sS -o /dev/null -w '%{http_code}' "$BANK_URL/debits/CHG-404"
	[ "$output" = 404 ]
}

@test "debit: the ledger survives a restart; refs keep counting" {
	bank_start
	run debit CHG-1 "$EVENT"
	[[ "$output" == 201* ]]
	bank_stop
	bank_start
	run debit CHG-1 "$EVENT"
	[[ "$output" == '200 {"ref":"TXN-00000001"'* ]]
	run debit CHG-2 "$(event CHG-2)"
	[[ "$output" == '201 {"ref":"TXN-00000002"'* ]]
}

@test "debit: the same key with a different request is 422, nothing debited" {
	bank_start
	debit CHG-1 "$EVENT" >/dev/null
	run debit CHG-1 "$(event CHG-1 ACC-1 9999)"
	[[ "$output" == '422 '*'idempotency key reused with a different request'* ]]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat mismatches)" -eq 1 ]
	run bank_get /ledger
	[[ "$output" == *'"amount":2500'* ]]
}

@test "debit: missing key, bad JSON, fractional amount are 400" {
	bank_start
	run curl -sS -w ' %{http_code}' --data-binary "$EVENT" "$BANK_URL/debits"
	[[ "$output" == *"missing or invalid Idempotency-Key"*' 400' ]]
	run debit K1 'not json'
	[[ "$output" == '400 '* ]]
	run debit K2 "$(event CHG-2 ACC-1 25.5)"
	[[ "$output" == '400 '*amount* ]]
	[ "$(bank_stat badRequests)" -eq 3 ]
	[ "$(bank_stat debits)" -eq 0 ]
}

@test "debit: declined accounts get 402 insufficient funds (flag and /control)" {
	bank_start --decline ACC-9,ACC-8
	run debit CHG-9 "$(event CHG-9 ACC-9)"
	[ "$output" = '402 {"status":"DECLINED","reason":"insufficient funds"}' ]
	run debit CHG-8 "$(event CHG-8 ACC-8)"
	[[ "$output" == '402 '* ]]
	run bank_post /control '{"decline":["ACC-7"]}'
	[[ "$output" == *'"decline":["ACC-7"]'* ]]
	run debit CHG-9 "$(event CHG-9 ACC-9)"
	[[ "$output" == '201 '* ]]
	run debit CHG-7 "$(event CHG-7 ACC-7)"
	[[ "$output" == '402 '* ]]
	[ "$(bank_stat declines)" -eq 3 ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "faults: error rate with a status, seeded; hang until the client gives up" {
	bank_start --error-rate 1
	run debit CHG-1 "$EVENT"
	[ "$output" = '503 {"reason":"injected failure"}' ]
	run bank_post /control '{"errorStatus":429}'
	run debit CHG-1 "$EVENT"
	[[ "$output" == '429 '* ]]
	[ "$(bank_stat errors)" -eq 2 ]
	[ "$(bank_stat debits)" -eq 0 ]
	# A fraction with a seed: the same seed gives the same sequence.
	bank_post /control '{"errorRate":0.5,"errorStatus":503,"seed":7}' >/dev/null
	a=$(for i in 1 2 3 4 5 6 7 8; do debit "S$i" "$(event "S$i")" | cut -c1-3; done | tr '\n' ' ')
	bank_post /control '{"seed":7}' >/dev/null
	b=$(for i in 1 2 3 4 5 6 7 8; do debit "S$i" "$(event "S$i")" | cut -c1-3; done | tr '\n' ' ' | sed 's/200/201/g')
	[ "$a" = "$b" ]
	[[ "$a" == *503* && "$a" == *201* ]]
	bank_post /control '{"errorRate":0,"hang":true}' >/dev/null
	start=$(date +%s%N)
	run curl -sS --max-time 1 -H 'Idempotency-Key: H1' --data-binary "$(event H1)" "$BANK_URL/debits"
	[ "$status" -eq 28 ]
	[ $(( ($(date +%s%N) - start) / 1000000 )) -ge 900 ]
	[ "$(bank_stat hangs)" -eq 1 ]
	# Other requests are still served while one hangs.
	run bank_get /health
	[ "$output" = '{"status":"UP"}' ]
}

@test "faults: latency delays the answer" {
	bank_start --latency 300ms
	start=$(date +%s%N)
	run debit CHG-1 "$EVENT"
	[[ "$output" == 201* ]]
	[ $(( ($(date +%s%N) - start) / 1000000 )) -ge 300 ]
	run bank_get /control
	[[ "$output" == *'"latencyMs":300'* ]]
}

@test "control: unknown fields and bad values are 400, nothing changes" {
	bank_start
	run curl -sS -w ' %{http_code}' --data-binary '{"errorRat":1}' "$BANK_URL/control"
	[[ "$output" == *'unknown field'*' 400' ]]
	run curl -sS -w ' %{http_code}' --data-binary '{"errorRate":2}' "$BANK_URL/control"
	[[ "$output" == *' 400' ]]
	run bank_get /control
	[[ "$output" == *'"errorRate":0,'* ]]
	run curl -sS -o /dev/null -w '%{http_code}' "$BANK_URL/nope"
	[ "$output" = 404 ]
	run curl -sS -o /dev/null -w '%{http_code}' "$BANK_URL/debits"
	[ "$output" = 405 ]
}

@test "notifications: 202 and counted per key; injected failures are 503" {
	bank_start
	run curl -sS -w ' %{http_code}' -H 'Idempotency-Key: CHG-1:notify' --data-binary "$EVENT" "$BANK_URL/notifications"
	[ "$output" = '{"status":"ACCEPTED","count":1} 202' ]
	run curl -sS -w ' %{http_code}' -H 'Idempotency-Key: CHG-1:notify' --data-binary "$EVENT" "$BANK_URL/notifications"
	[ "$output" = '{"status":"ACCEPTED","count":2} 202' ]
	run curl -sS -w ' %{http_code}' --data-binary "$EVENT" "$BANK_URL/notifications"
	[[ "$output" == *' 400' ]]
	bank_post /control '{"notifyFail":true}' >/dev/null
	run curl -sS -w ' %{http_code}' -H 'Idempotency-Key: CHG-2:notify' --data-binary "$EVENT" "$BANK_URL/notifications"
	[[ "$output" == *' 503' ]]
	run bank_get /notifications
	[ "${#lines[@]}" -eq 1 ]
	[[ "$output" == *'"key":"CHG-1:notify","count":2'* ]]
	[ "$(bank_stat notifications)" -eq 1 ]
	[ "$(bank_stat notificationAttempts)" -eq 4 ]
	[ "$(bank_stat notificationFailures)" -eq 1 ]
}

@test "auth: bearer token required when configured, on every endpoint but /health" {
	printf 'tok-%s\n' "$RANDOM$RANDOM" >"$BATS_TEST_TMPDIR/token"
	tok=$(cat "$BATS_TEST_TMPDIR/token")
	bank_start --token-file "$BATS_TEST_TMPDIR/token"
	run debit CHG-1 "$EVENT"
	[ "$output" = '401 {"reason":"unauthorized"}' ]
	run debit CHG-1 "$EVENT" -H "Authorization: Bearer wrong"
	[[ "$output" == 401* ]]
	run debit CHG-1 "$EVENT" -H "Authorization: Bearer $tok"
	[[ "$output" == 201* ]]
	run curl -sS -o /dev/null -w '%{http_code}' "$BANK_URL/ledger"
	[ "$output" = 401 ]
	run bank_get /health
	[ "$output" = '{"status":"UP"}' ]
	BANK_AUTH=(-H "Authorization: Bearer $tok")
	[ "$(bank_stat unauthorized)" -eq 3 ]
	absent "$tok" "$BANK_DIR/err" "$BANK_DIR/out"
}

@test "auth: the HMAC signature covers method, path, key, timestamp and the body's SHA-256" {
	printf 'k3y-%s' "$RANDOM" >"$BATS_TEST_TMPDIR/hk"
	chmod 600 "$BATS_TEST_TMPDIR/hk"
	key=$(cat "$BATS_TEST_TMPDIR/hk")
	bank_start --hmac-key-file "$BATS_TEST_TMPDIR/hk"
	t=$(date +%s)
	sig=$(hmac_v2 "$key" POST /debits CHG-1 "$t" "$EVENT")
	run debit CHG-1 "$EVENT"
	[[ "$output" == '401 '*signature* ]]
	# A wrong digest, the old body-only v1 form, no timestamp header.
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $t" -H "X-Idemkit-Signature: v2=0000${sig:4}"
	[[ "$output" == 401* ]]
	v1=$(printf '%s.%s' "$t" "$EVENT" | openssl dgst -sha256 -hmac "$key" -r | cut -d' ' -f1)
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Signature: t=$t,v1=$v1"
	[[ "$output" == 401* ]]
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Signature: v2=$sig"
	[[ "$output" == 401* ]]
	# Stale: correctly signed an hour ago.
	old=$((t - 3600))
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $old" \
		-H "X-Idemkit-Signature: v2=$(hmac_v2 "$key" POST /debits CHG-1 "$old" "$EVENT")"
	[[ "$output" == 401* ]]
	# Signed for another path, key or body.
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $t" \
		-H "X-Idemkit-Signature: v2=$(hmac_v2 "$key" POST /notifications CHG-1 "$t" "$EVENT")"
	[[ "$output" == 401* ]]
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $t" \
		-H "X-Idemkit-Signature: v2=$(hmac_v2 "$key" POST /debits CHG-2 "$t" "$EVENT")"
	[[ "$output" == 401* ]]
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $t" \
		-H "X-Idemkit-Signature: v2=$(hmac_v2 "$key" POST /debits CHG-1 "$t" "$EVENT ")"
	[[ "$output" == 401* ]]
	[ "$(bank_stat attempts)" -eq 0 ]
	run debit CHG-1 "$EVENT" -H "X-Idemkit-Timestamp: $t" -H "X-Idemkit-Signature: v2=$sig"
	[[ "$output" == 201* ]]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "auth: a request charge-debit signed, replayed with another Idempotency-Key, is refused" {
	printf 'k3y-%s' "$RANDOM" >"$BATS_TEST_TMPDIR/hk"
	chmod 600 "$BATS_TEST_TMPDIR/hk"
	key=$(cat "$BATS_TEST_TMPDIR/hk")
	capture_start
	# Capture what charge-debit really sends for CHG-1.
	IDEMKIT_BANK_HMAC_KEY_FILE=$BATS_TEST_TMPDIR/hk \
		run --separate-stderr charge-debit --url "$CAP_URL/debits" <<<"$(envelope CHG-1)"
	[ "$status" -eq 0 ]
	capture_stop
	req=$(head -1 "$CAP_DIR/log")
	h() { jget "$req" "headers.$1"; }
	body=$(jget "$req" body)
	ts=$(h X-Idemkit-Timestamp)
	sig=$(h X-Idemkit-Signature)
	[ "$(jget "$req" path)" = /debits ]
	[ "$(h Idempotency-Key)" = CHG-1 ]
	# It is exactly the documented scheme.
	[ "$sig" = "v2=$(hmac_v2 "$key" POST /debits CHG-1 "$ts" "$body")" ]
	bank_start --hmac-key-file "$BATS_TEST_TMPDIR/hk"
	replay() {
		curl -sS --max-time 5 -o /dev/null -w '%{http_code}' -H "Content-Type: application/json" \
			-H "Idempotency-Key: $1" -H "X-Idemkit-Timestamp: $ts" -H "X-Idemkit-Signature: $sig" \
			--data-binary "$body" "$BANK_URL/debits"
	}
	# The captured request replayed as it was: the bank's own idempotency.
	[ "$(replay CHG-1)" = 201 ]
	[ "$(replay CHG-1)" = 200 ]
	# The same bytes under another key: not a second, validly signed debit.
	[ "$(replay CHG-2)" = 401 ]
	[ "$(replay CHG-1:notify)" = 401 ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_get /ledger | wc -l)" -eq 1 ]
	[[ "$(bank_get /ledger)" == *'"key":"CHG-1"'* ]]
}

@test "TLS: serves HTTPS; verification fails without the CA and passes with it" {
	self_signed "$BATS_TEST_TMPDIR"
	bank_start --tls-cert "$BATS_TEST_TMPDIR/cert.pem" --tls-key "$BATS_TEST_TMPDIR/key.pem"
	[[ "$BANK_URL" == https://127.0.0.1:* ]]
	run curl -sS --max-time 5 "$BANK_URL/health"
	[ "$status" -eq 60 ]
	run curl -sS --max-time 5 --cacert "$BATS_TEST_TMPDIR/cert.pem" "$BANK_URL/health"
	[ "$status" -eq 0 ]
	[ "$output" = '{"status":"UP"}' ]
}

@test "concurrency: 32 parallel clients on one key make exactly one debit" {
	bank_start
	pids=()
	for i in $(seq 32); do
		curl -sS --max-time 10 -o /dev/null -w '%{http_code}\n' \
			-H 'Idempotency-Key: CHG-P' --data-binary "$(event CHG-P)" \
			"$BANK_URL/debits" >>"$BATS_TEST_TMPDIR/codes" &
		pids+=($!)
	done
	wait "${pids[@]}"
	[ "$(grep -c '^201$' "$BATS_TEST_TMPDIR/codes")" -eq 1 ]
	[ "$(grep -c '^200$' "$BATS_TEST_TMPDIR/codes")" -eq 31 ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat replays)" -eq 31 ]
	[ "$(bank_stat attempts)" -eq 32 ]
}

# A pkg-config that knows every library but libmicrohttpd: what a machine
# without libmicrohttpd-dev answers.
no_mhd_pkg_config() {
	cat >"$BATS_TEST_TMPDIR/pkg-config" <<'SH'
#!/bin/sh
for a in "$@"; do [ "$a" = libmicrohttpd ] && exit 1; done
exec pkg-config "$@"
SH
	chmod 755 "$BATS_TEST_TMPDIR/pkg-config"
}

@test "layout: the product builds without libmicrohttpd; only bank-sim needs it" {
	no_mhd_pkg_config
	# Every product command's compile and link line, on a machine with no
	# libmicrohttpd: none names it, and make does not refuse.
	run make -s -n -C "$IDEMKIT_SRC" O="$BATS_TEST_TMPDIR/b" PKG_CONFIG="$BATS_TEST_TMPDIR/pkg-config" product
	[ "$status" -eq 0 ]
	[[ "$output" == *"-o $BATS_TEST_TMPDIR/b/bin/charge-debit "* ]]
	[[ "$output" != *microhttpd* ]]
	[[ "$output" != *sim/* ]]
	# The simulator there says what to install.
	run make -s -C "$IDEMKIT_SRC" O="$BATS_TEST_TMPDIR/b" PKG_CONFIG="$BATS_TEST_TMPDIR/pkg-config" "$BATS_TEST_TMPDIR/b/obj/sim/bank-sim.o"
	[ "$status" -ne 0 ]
	[[ "$output" == *"bank-sim needs: apt-get install libmicrohttpd-dev"* ]]
	# What was built links libmicrohttpd in bank-sim only, and the product
	# library holds no simulator code.
	for b in "$IDEMKIT_BIN"/*; do
		file -b "$b" | grep -q ELF || continue
		if [ "$(basename "$b")" = bank-sim ]; then
			readelf -d "$b" | grep -q 'NEEDED.*libmicrohttpd'
		else
			run readelf -d "$b"
			[[ "$output" != *microhttpd* ]] || { echo "$b links libmicrohttpd"; return 1; }
		fi
	done
	run nm "$IDEMKIT_BIN/../lib/libidemkit.a"
	[ "$status" -eq 0 ]
	[[ "$output" != *MHD_* && "$output" != *banksim* && "$output" != *ik_ledger* ]]
	[ -z "$(find "$IDEMKIT_SRC"/lib -name 'banksim*'; ls "$IDEMKIT_SRC"/cmd/bank-sim.c 2>/dev/null)" ]
}

@test "layout: make install leaves the test double and its man page out" {
	dest=$BATS_TEST_TMPDIR/root
	run make -s -C "$IDEMKIT_SRC" install DESTDIR="$dest" PREFIX=/opt/idemkit
	[ "$status" -eq 0 ]
	[ -x "$dest/opt/idemkit/bin/charge-debit" ]
	[ ! -e "$dest/opt/idemkit/bin/bank-sim" ]
	[ -f "$dest/opt/idemkit/share/man/man1/charge-debit.1" ]
	[ ! -e "$dest/opt/idemkit/share/man/man1/bank-sim.1" ]
}
