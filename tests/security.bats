#!/usr/bin/env bats
# The guarantees SECURITY.md makes, each with the test that proves it:
# SQL only as constant prepared text; DynamoDB data only as expression
# attribute values; TLS verification on; SQLite files 0600; no secret
# taken on the command line, none in `ps`, logs or error messages.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

src() { printf '%s\n' "$IDEMKIT_SRC"; }

# C sources of the product (not the tests).
product_c() {
	find "$IDEMKIT_SRC/lib" "$IDEMKIT_SRC/cmd" "$IDEMKIT_SRC/examples" -name '*.c' 2>/dev/null
}

teardown() {
	stubs_stop
}

# absent STRING FILE...: fails when STRING is in any FILE.
absent() {
	local s=$1 f
	shift
	for f in "$@"; do
		if grep -qaF -- "$s" "$f"; then
			echo "'$s' found in $f:" >&2
			grep -naF -- "$s" "$f" | head -3 >&2
			return 1
		fi
	done
}

@test "SQL: every sqlite3_prepare/exec in the product takes constant text; nothing formats SQL" {
	local files
	files=$(product_c)
	[ -n "$files" ]
	# the checker really sees calls (not vacuous)
	# shellcheck disable=SC2086
	[ "$(cat $files | grep -c 'sqlite3_prepare\|sqlite3_exec')" -ge 3 ]
	# shellcheck disable=SC2086
	run python3 "$IDEMKIT_SRC/tests/sqlcheck.py" $files
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "SQL checker: refuses formatted SQL, data in a helper, a ternary or a reassigned variable; accepts the constant forms" {
	local f
	for f in "$IDEMKIT_SRC"/tests/sqlcheck/bad*.c; do
		run python3 "$IDEMKIT_SRC/tests/sqlcheck.py" "$f"
		echo "$f: $output"
		[ "$status" -eq 1 ]
		[ -n "$output" ]
	done
	run python3 "$IDEMKIT_SRC/tests/sqlcheck.py" "$IDEMKIT_SRC/tests/sqlcheck/good.c"
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "SQL: hostile text in every field is stored verbatim and the store still works" {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db
	local id=CHG-SQLI-1 body
	body='{"chargeId":"CHG-SQLI-1","accountId":"ACC-1","amount":100,"currency":"INR","chargeType":"FEE","note":"x'"'"'); DROP TABLE records; --"}'
	run --separate-stderr idemp-claim <<<"$body"
	[ "$status" -eq 0 ]
	env=$output
	printf '%s\n' "${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"R'); DELETE FROM records; --\"},\"notify\":{\"outcome\":\"NOTIFY_FAILED\",\"error\":\"e' OR '1'='1\"}}" > "$BATS_TEST_TMPDIR/env"
	run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/env"
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-show --json "$id"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" event)" = "$body" ]
	[ "$(jget "$output" debitRef)" = "R'); DELETE FROM records; --" ]
	[ "$(jget "$output" lastError)" = "e' OR '1'='1" ]
	[ "$(sqlite3 "$BATS_TEST_TMPDIR/s.db" 'SELECT count(*) FROM records')" -eq 1 ]
}

@test "DynamoDB: data reaches the table only as attribute values, never inside an expression" {
	require_node
	aws_test_env
	dynalite_start
	local log=$BATS_TEST_TMPDIR/ddb.log i
	python3 "$IDEMKIT_SRC/tests/recproxy.py" "$DYNALITE_URL" "$BATS_TEST_TMPDIR/proxy.port" "$log" 3>&- &
	PROXY_PID=$!
	for i in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/proxy.port" ] && break; sleep 0.05; done
	export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/proxy.port")
	export IDEMKIT_STORE=dynamodb:sec-idem
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	body='{"chargeId":"CHG-MARK-7f3a","accountId":"ACC-MARKACCT","amount":100,"currency":"INR","chargeType":"FEE","note":"EVMARK :x #y = OR attribute_exists(pk)"}'
	run --separate-stderr idemp-claim --lease 1s <<<"$body"
	[ "$status" -eq 0 ]
	first=$output
	sleep 1.1
	run --separate-stderr idemp-claim <<<"$body"
	[ "$status" -eq 0 ]
	printf '%s\n' "${output%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"REFMARK99\"},\"notify\":{\"outcome\":\"NOTIFY_FAILED\",\"error\":\"ERRMARK99 :v OR #k\"}}" > "$BATS_TEST_TMPDIR/env"
	run --separate-stderr idemp-done --state DONE < <(printf '%s\n' "$first")
	echo "$stderr"
	[ "$status" -eq 13 ]
	run --separate-stderr idemp-done < "$BATS_TEST_TMPDIR/env"
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-claim <<<"${body/100/999}"
	[ "$status" -eq 14 ]
	run --separate-stderr idemp-show --json CHG-MARK-7f3a
	[ "$status" -eq 0 ]
	[ "$(jget "$output" lastError)" = "ERRMARK99 :v OR #k" ]
	idemp-list --state DEBITED_NOTIFICATION_FAILED --older-than 0s >/dev/null 2>&1 || true
	idemp-list --expired >/dev/null 2>&1 || true
	idemp-list --format envelope --state DEBITED_NOTIFICATION_FAILED > "$BATS_TEST_TMPDIR/l" 2>/dev/null
	run --separate-stderr idemp-done --renotified < "$BATS_TEST_TMPDIR/l"
	[ "$status" -eq 0 ]
	kill "$PROXY_PID"
	wait "$PROXY_PID" 2>/dev/null || true
	dynalite_stop || true
	run python3 "$IDEMKIT_SRC/tests/ddbcheck.py" "$log" CHG-MARK-7f3a ACC-MARKACCT EVMARK REFMARK99 ERRMARK99
	echo "$output"
	[ "$status" -eq 0 ]
	# the whole command set spoke through the proxy (listing: Query on the index)
	for op in CreateTable UpdateItem GetItem Query; do grep -q "DynamoDB_20120810.$op" "$log"; done
}

@test "DynamoDB check: an expression carrying data is caught" {
	printf '%s\n' '{"target":"DynamoDB_20120810.UpdateItem","body":{"Key":{"pk":{"S":"CHG-X"}},"ConditionExpression":"#k = :k AND #e = CHG-X","ExpressionAttributeValues":{":k":{"S":"CHG-X"}}}}' > "$BATS_TEST_TMPDIR/log"
	run python3 "$IDEMKIT_SRC/tests/ddbcheck.py" "$BATS_TEST_TMPDIR/log" CHG-X
	echo "$output"
	[ "$status" -eq 1 ]
	[[ $output == *"holds data 'CHG-X'"* ]]
	printf '%s\n' '{"target":"x","body":{"UpdateExpression":"SET #a = \"v\""}}' > "$BATS_TEST_TMPDIR/log"
	run python3 "$IDEMKIT_SRC/tests/ddbcheck.py" "$BATS_TEST_TMPDIR/log"
	[ "$status" -eq 1 ]
}

@test "TLS: only lib/conn/http.c drives curl, and it never turns verification off" {
	local files f
	files=$(product_c)
	for f in $files; do
		case $f in */lib/conn/http.c) continue ;; esac
		# (lib/dl/curl_dl.c names the symbols it loads; it calls none of them)
		if grep -nE '(curl_easy_setopt|curl_easy_init|easy_setopt|easy_init)[[:space:]]*\(|CURLOPT_' "$f"; then
			echo "curl used outside lib/conn/http.c: $f" >&2
			return 1
		fi
	done
	grep -q 'CURLOPT_SSL_VERIFYPEER, 1L' "$IDEMKIT_SRC/lib/conn/http.c"
	grep -q 'CURLOPT_SSL_VERIFYHOST, 2L' "$IDEMKIT_SRC/lib/conn/http.c"
	# shellcheck disable=SC2086
	run ! grep -nE 'SSL_VERIFY(PEER|HOST|STATUS)[^;]*, *0|CURLSSLOPT_NO_REVOKE|CURLOPT_SSL_VERIFY[A-Z]*, *[a-z_]' $files
	[ -z "$output" ] || { echo "TLS verification switched off: $output"; return 1; }
}

@test "libpq and hiredis: only their adapters drive them; the lib/dl/ loaders name symbols and call none" {
	local f bad=0
	for f in $(product_c); do
		case $f in
		*/lib/store/postgres/*.c) ;;   # the PostgreSQL adapter's own folder
		*) if grep -nE '(^|[^A-Za-z_])PQ[a-zA-Z]+[[:space:]]*\(' "$f"; then
			echo "libpq called outside lib/store/postgres/: $f" >&2
			bad=1
		   fi ;;
		esac
		case $f in
		*/lib/conn/redis.c|*/lib/store/redis/*.c|*/lib/store/cache/*.c) ;;   # the client, the Redis store, the cache
		*) if grep -nE '(^|[^A-Za-z_])(redis[A-Z][a-zA-Z]*|freeReplyObject)[[:space:]]*\(' "$f"; then
			echo "hiredis called outside lib/conn/redis.c, lib/store/redis/, lib/store/cache/: $f" >&2
			bad=1
		   fi ;;
		esac
	done
	[ "$bad" -eq 0 ]
	# Their own headers only through the loaders' (a direct include would
	# call the library by name, and the link would need it again).
	run grep -lE '#include <(curl/curl|libpq-fe|hiredis/hiredis)\.h>' $(product_c) $(find "$IDEMKIT_SRC/lib" -name '*.h')
	[ "$(printf '%s\n' "$output" | sed 's#.*/##' | sort | tr '\n' ' ')" = "curl_dl.h pq_dl.h redis_dl.h " ]
}

# tls_server DIR: an HTTPS server on loopback with a self-signed cert for
# 127.0.0.1; logs each request path to DIR/log; sets TLS_PID, TLS_URL.
tls_server() {
	local d=$1 i
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
		-addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' \
		-keyout "$d/key.pem" -out "$d/cert.pem" 2>/dev/null
	python3 - "$d" 3>&- <<'PY' &
import http.server, json, os, ssl, sys
d = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0); self.rfile.read(n)
        with open(d + "/log", "a") as f: f.write(self.path + "\n")
        out = b'{"Table":{"TableName":"t"}}'
        self.send_response(200); self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
    do_GET = do_POST
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(d + "/cert.pem", d + "/key.pem")
s.socket = ctx.wrap_socket(s.socket, server_side=True)
open(d + "/port.tmp", "w").write(str(s.server_address[1])); os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
PY
	TLS_PID=$!
	for i in $(seq 100); do [ -s "$d/port" ] && break; sleep 0.05; done
	TLS_URL=https://127.0.0.1:$(cat "$d/port")
	: > "$d/log"
}

@test "TLS: a certificate nobody vouches for is refused before any request (78); the configured CA bundle is trusted" {
	aws_test_env
	local d=$BATS_TEST_TMPDIR/tls
	mkdir -p "$d"
	tls_server "$d"
	AWS_ENDPOINT_URL_DYNAMODB=$TLS_URL/ok run --separate-stderr "$IDEMKIT_TEST_BIN/aws_probe" dynamodb DynamoDB_20120810.DescribeTable '{"TableName":"t"}'
	echo "$output $stderr"
	[ "$status" -eq 78 ]
	[ ! -s "$d/log" ]
	AWS_ENDPOINT_URL_DYNAMODB=$TLS_URL/ok run --separate-stderr idemp-show --store dynamodb:t CHG-1
	[ "$status" -eq 78 ]
	[ ! -s "$d/log" ]
	AWS_CA_BUNDLE=$d/cert.pem AWS_ENDPOINT_URL_DYNAMODB=$TLS_URL/ok \
		run --separate-stderr "$IDEMKIT_TEST_BIN/aws_probe" dynamodb DynamoDB_20120810.DescribeTable '{"TableName":"t"}'
	echo "$output $stderr"
	kill "$TLS_PID"; wait "$TLS_PID" 2>/dev/null || true
	[ "$status" -eq 0 ]
	[ "$(cat "$d/log")" = /ok ]
}

@test "SQLite files are 0600 and the state directory 0700, whatever the umask (db, -wal, -shm)" {
	umask 000
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	db=$IDEMKIT_STATE_DIR/idempotency.db
	[ "$(stat -c %a "$db")" = 600 ]
	[ "$(stat -c %a "$IDEMKIT_STATE_DIR")" = 700 ]
	ev CHG-MODE-1 | idemp-claim >/dev/null 2>&1
	# hold a connection open so the WAL and shared-memory files exist
	run sqlite3 "$db" 'SELECT count(*) FROM records;' ".shell stat -c '%a %n' '$db-wal' '$db-shm'"
	echo "$output"
	[ "$status" -eq 0 ]
	grep -qx 1 <<<"$output"
	grep -qx "600 $db-wal" <<<"$output"
	grep -qx "600 $db-shm" <<<"$output"
	X=$BATS_TEST_TMPDIR/other.db
	IDEMKIT_STORE=sqlite:$X run --separate-stderr idemp-init
	[ "$(stat -c %a "$X")" = 600 ]
}

@test "no command takes a secret on its command line (only files or the environment)" {
	local c n=0
	for c in "$IDEMKIT_BIN"/*; do
		[ -x "$c" ] || continue
		n=$((n + 1))
		run "$c" --help
		[ "$status" -eq 0 ]
		# option lines naming a secret must take a FILE
		if grep -E '^\s*(-[A-Za-z], )?--' <<<"$output" | grep -iE 'secret|passw|token|credential|hmac|api.?key|access.?key' \
			| grep -vE -- '--[a-z-]*-file\b'; then
			echo "${c##*/} takes a secret on its command line" >&2
			return 1
		fi
	done
	[ "$n" -ge 6 ]
}

@test "secrets never reach argv (ps), stdout, stderr or the logs of a whole worker run, even at debug level" {
	require_node
	aws_test_env
	dynalite_start
	export AWS_ACCESS_KEY_ID=AKIDSECTEST AWS_SECRET_ACCESS_KEY=sekrit-AWS-7c1e9b AWS_SESSION_TOKEN=sekrit-SESSION-55aa
	export IDEMKIT_BANK_TOKEN=sekrit-BANK-0d0d IDEMKIT_NOTIFY_TOKEN=sekrit-NOTIFY-1e1e
	export IDEMKIT_LOG=debug IDEMKIT_STORE=dynamodb:sec-secrets
	idemp-init >/dev/null 2>&1
	# debit and notify stand-ins that look at every process's command line
	# while the worker is in the middle of a charge
	cat > "$BATS_TEST_TMPDIR/peek" <<'SH'
#!/bin/sh
ps -eww -o args >> "$PEEK_OUT"
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' >> "$PEEK_OUT"
sed "s/}\$/,\"$1\":{\"outcome\":\"OK\",\"ref\":\"TXN-1\"}}/"
SH
	chmod +x "$BATS_TEST_TMPDIR/peek"
	export PEEK_OUT=$BATS_TEST_TMPDIR/ps
	CHARGE_DEBIT_CMD="$BATS_TEST_TMPDIR/peek debit" CHARGE_NOTIFY_CMD="$BATS_TEST_TMPDIR/peek notify" \
		run --separate-stderr charge-worker --trace < <(ev CHG-SEC-1)
	echo "$stderr" > "$BATS_TEST_TMPDIR/stderr"
	echo "$output" > "$BATS_TEST_TMPDIR/stdout"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.state)" = DONE ]
	grep -q 'charge-worker' "$PEEK_OUT"
	grep -q '"level":"debug"\|debug' "$BATS_TEST_TMPDIR/stderr"
	# a failing call too: a table that does not exist
	run --separate-stderr idemp-show --store dynamodb:no-such-table CHG-SEC-1
	[ "$status" -eq 78 ]
	echo "$output $stderr" >> "$BATS_TEST_TMPDIR/stderr"
	dynalite_stop || true
	for s in sekrit-AWS-7c1e9b sekrit-SESSION-55aa sekrit-BANK-0d0d sekrit-NOTIFY-1e1e; do
		absent "$s" "$PEEK_OUT" "$BATS_TEST_TMPDIR/stderr" "$BATS_TEST_TMPDIR/stdout"
	done
}

@test "secret files group or others may read are refused (78), named with the fix, never shown; 0600 and 0400 are taken" {
	d=$BATS_TEST_TMPDIR
	export IDEMKIT_BANK_URL=https://bank.example/debits IDEMKIT_NOTIFY_URL=https://notify.example/n
	printf 'sekrit-TOKEN-4f4f\n' >"$d/token"
	printf 'sekrit-HMAC-5a5a' >"$d/hk"
	printf 'sekrit-OAUTH-6b6b\n' >"$d/osecret"
	for m in 644 640 604 660 606; do
		chmod "$m" "$d/token" "$d/hk" "$d/osecret"
		for p in BANK NOTIFY; do
			cmd=charge-debit; [ $p = NOTIFY ] && cmd=charge-notify
			for v in TOKEN_FILE:token HMAC_KEY_FILE:hk; do
				run env "IDEMKIT_${p}_${v%%:*}=$d/${v#*:}" "$cmd" --check
				[ "$status" -eq 78 ] || { echo "$p $v $m: $output"; return 1; }
				[ "$output" = "$cmd: IDEMKIT_${p}_${v%%:*}: $d/${v#*:}: readable by group or others (mode $m); chmod 600 it" ]
			done
			run env "IDEMKIT_${p}_OAUTH_TOKEN_URL=https://bank.example/token" "IDEMKIT_${p}_OAUTH_CLIENT_ID=w" \
				"IDEMKIT_${p}_OAUTH_CLIENT_SECRET_FILE=$d/osecret" "$cmd" --check
			[ "$status" -eq 78 ]
			[ "$output" = "$cmd: IDEMKIT_${p}_OAUTH_CLIENT_SECRET_FILE: $d/osecret: readable by group or others (mode $m); chmod 600 it" ]
		done
	done
	# The debit itself, recorded in the envelope: nothing sent, CONFIG.
	run --separate-stderr env IDEMKIT_BANK_TOKEN_FILE="$d/token" charge-debit < <(printf '%s\n' \
		'{"chargeId":"CHG-M","accountId":"ACC-1","amount":100,"currency":"INR","chargeType":"FEE"}' |
		idemp-claim --store "sqlite:$d/s.db")
	[ "$status" -eq 78 ]
	[[ "$(jget "$output" debit.error)" == *"readable by group or others (mode 606); chmod 600 it" ]]
	printf '%s\n' "$output" "$stderr" >"$d/seen"
	for s in sekrit-TOKEN-4f4f sekrit-HMAC-5a5a sekrit-OAUTH-6b6b; do absent "$s" "$d/seen"; done
	for m in 600 400; do
		chmod "$m" "$d/token" "$d/hk" "$d/osecret"
		run env IDEMKIT_BANK_TOKEN_FILE="$d/token" IDEMKIT_BANK_HMAC_KEY_FILE="$d/hk" charge-debit --check
		[ "$status" -eq 0 ] || { echo "$m: $output"; return 1; }
		run env IDEMKIT_NOTIFY_OAUTH_TOKEN_URL=https://n.example/t IDEMKIT_NOTIFY_OAUTH_CLIENT_ID=w \
			IDEMKIT_NOTIFY_OAUTH_CLIENT_SECRET_FILE="$d/osecret" charge-notify --check
		[ "$status" -eq 0 ] || { echo "$m: $output"; return 1; }
	done
}

@test "AWS: a plain http:// endpoint never goes through the environment's proxy (signed request, session token in cleartext)" {
	d=$BATS_TEST_TMPDIR
	python3 "$IDEMKIT_SRC/tests/awsfake.py" "$d/fake.port" "$d/fake.log" 3>&- &
	STUB_PIDS="${STUB_PIDS:-} $!"
	for _ in $(seq 100); do [ -s "$d/fake.port" ] && break; sleep 0.05; done
	stub_start proxy proxystub.py
	aws_test_env
	export AWS_SESSION_TOKEN=sekrit-SESSION-9c9c
	export http_proxy=http://127.0.0.1:$STUB_PORT HTTP_PROXY=http://127.0.0.1:$STUB_PORT \
		ALL_PROXY=http://127.0.0.1:$STUB_PORT all_proxy=http://127.0.0.1:$STUB_PORT
	unset no_proxy NO_PROXY
	AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(cat "$d/fake.port")/ok \
		run --separate-stderr "$IDEMKIT_TEST_BIN/aws_probe" dynamodb DynamoDB_20120810.GetItem
	[ "$status" -eq 0 ] || { echo "$output $stderr"; return 1; }
	[ ! -s "$d/proxy/log" ] || { cat "$d/proxy/log"; return 1; }
	grep -q sekrit-SESSION-9c9c "$d/fake.log"
}
