# bank_helper.bash: start and stop a bank-sim for one test (load after
# helper).  bank_start [bank-sim options...] sets BANK_PID, BANK_PORT,
# BANK_URL (base), IDEMKIT_BANK_URL and IDEMKIT_NOTIFY_URL; bank_stop
# ends it (call it from teardown).  bank_get/bank_post talk to it with
# curl.  Loopback only, port chosen by bank-sim itself (--port 0), so
# parallel suites never collide.

bank_start() {
	BANK_DIR=$BATS_TEST_TMPDIR/bank
	mkdir -p "$BANK_DIR"
	rm -f "$BANK_DIR/port"
	# 3>&- : bats waits on fd 3; a server holding it would hang the suite.
	bank-sim --port 0 --db "$BANK_DIR/ledger.db" --port-file "$BANK_DIR/port" \
		"$@" >"$BANK_DIR/out" 2>"$BANK_DIR/err" 3>&- &
	BANK_PID=$!
	local i
	for i in $(seq 200); do
		[ -s "$BANK_DIR/port" ] && grep -q '^listening ' "$BANK_DIR/out" && break
		if ! kill -0 "$BANK_PID" 2>/dev/null; then
			cat "$BANK_DIR/err" >&2
			BANK_PID=
			return 1
		fi
		sleep 0.05
	done
	BANK_PORT=$(cat "$BANK_DIR/port")
	BANK_URL=$(sed -n 's/^listening //p' "$BANK_DIR/out")
	export IDEMKIT_BANK_URL=$BANK_URL/debits
	export IDEMKIT_NOTIFY_URL=$BANK_URL/notifications
}

bank_stop() {
	[ -n "${BANK_PID:-}" ] || return 0
	kill -TERM "$BANK_PID" 2>/dev/null || true
	BANK_RC=0
	wait "$BANK_PID" || BANK_RC=$?
	BANK_PID=
	# A crash or a sanitizer report in the server fails the test too.
	if [ "$BANK_RC" -ne 0 ] || { [ -f "${BANK_DIR:-}/err" ] && grep -q Sanitizer "$BANK_DIR/err"; }; then
		echo "bank-sim exited $BANK_RC:" >&2
		tail -20 "$BANK_DIR/err" >&2
		return 1
	fi
}

# bank_get PATH [curl options...]: body on stdout.
bank_get() {
	local p=$1; shift
	curl -sS --max-time 5 "$@" "$BANK_URL$p"
}

# bank_post PATH JSON [curl options...]
bank_post() {
	local p=$1 body=$2; shift 2
	curl -sS --max-time 5 -H 'Content-Type: application/json' \
		--data-binary "$body" "$@" "$BANK_URL$p"
}

# bank_stat NAME: one counter from GET /stats.  _bank_stat NAME: the
# same into BANK_N, no process at all where it can (an HTTP/1.0 GET over
# bash's /dev/tcp: bank-sim on plain loopback, no credentials), which
# until_bank polls every 50 ms: a curl and a sed cost ~30 ms of CPU here
# each time; else curl as bank_get.  BANK_N is empty when there is no
# answer, or no such counter in a 200's body.
_bank_stat() {
	local fd body=
	BANK_N=
	if [ ${#BANK_AUTH[@]} -eq 0 ] && [[ $BANK_URL =~ ^http://127\.0\.0\.1:([0-9]+)$ ]]; then
		{ exec {fd}<>"/dev/tcp/127.0.0.1/${BASH_REMATCH[1]}"; } 2>/dev/null || return 0
		# (a bank gone since the connect is EPIPE, not a SIGPIPE that would
		# end the test's shell; no process starts while PIPE is ignored)
		trap '' PIPE
		printf 'GET /stats HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd" 2>/dev/null || true
		trap - PIPE
		IFS= read -r -d '' -t 5 -u "$fd" body || true
		exec {fd}>&-
		[[ $body == "HTTP/1."?" 200 "* ]] || return 0
	else
		body=$(bank_get /stats "${BANK_AUTH[@]}") || return 0
	fi
	[[ $body =~ \"$1\":([0-9]+) ]] && BANK_N=${BASH_REMATCH[1]}
	return 0
}
bank_stat() {
	_bank_stat "$1"
	[ -z "$BANK_N" ] || echo "$BANK_N"
}

# until_bank NAME N [PID]: wait (at most 20 s) until bank-sim's counter
# NAME >= N; with PID, 2 as soon as that process is gone (a worker that
# stopped will move no counter: no 20 s of polling for nothing).
until_bank() {
	for _ in $(seq 1 400); do
		_bank_stat "$1"
		[ "${BANK_N:-0}" -ge "$2" ] && return 0
		[ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 2
		sleep 0.05
	done
	echo "bank $1 never reached $2" >&2
	return 1
}

BANK_AUTH=()

# ledger_debits: how many debits bank-sim's ledger holds (read from its file).
ledger_debits() {
	sqlite3 "$BANK_DIR/ledger.db" "SELECT count(*) FROM debits"
}

# ledger_counter NAME: a counter read from bank-sim's ledger file itself
# (no HTTP, so no bearer token is needed or spent).
ledger_counter() {
	sqlite3 "$BANK_DIR/ledger.db" "SELECT coalesce((SELECT n FROM counters WHERE name = '$1'), 0)"
}

EVENT='{"chargeId":"CHG-1","accountId":"ACC-1","amount":2500,"currency":"INR","chargeType":"SMS_ALERT_FEE"}'

# event ID [ACCOUNT] [AMOUNT]: a ChargeDueEvent body.
event() {
	printf '{"chargeId":"%s","accountId":"%s","amount":%s,"currency":"INR","chargeType":"SMS_ALERT_FEE","dueDate":"2026-11-30"}' \
		"$1" "${2:-ACC-1}" "${3:-2500}"
}

# self_signed DIR: cert.pem and key.pem for 127.0.0.1/localhost in DIR.
self_signed() {
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
		-addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' \
		-keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
}

# boot_ms: this machine's boot clock (CLOCK_BOOTTIME, which /proc/uptime
# reads) in ms, rounded down: a claim's sentBootMs (envelope.h).
boot_ms() {
	local up
	read -r up _ < /proc/uptime
	echo $(( ${up%.*} * 1000 + 10#${up#*.} * 10 ))
}

# lease_proof MS [BOOT_MS]: the fields by which an ACQUIRED claim proves
# its lease (leaseMs, sentBootMs, bootId; envelope.h), as idemp-claim
# writes them: a lease of MS granted when the boot clock read BOOT_MS
# (default now), on this boot.
lease_proof() {
	printf '"leaseMs":%s,"sentBootMs":%s,"bootId":"%s"' "$1" "${2:-$(boot_ms)}" \
		"$(cat /proc/sys/kernel/random/boot_id)"
}

# envelope ID [ACCOUNT] [AMOUNT] [CLAIM_OUTCOME]: one envelope line whose
# claim is ACQUIRED (or the outcome given), as idemp-claim would write it:
# a lease of LEASE_MS (default 120 s) granted now, or at LEASE_BOOT.
envelope() {
	local b
	b=$(event "$1" "${2:-ACC-1}" "${3:-2500}" | sed 's/"/\\"/g')
	printf '{"v":1,"messageId":"m-%s","body":"%s","claim":{"outcome":"%s","chargeId":"%s",%s}}\n' \
		"$1" "$b" "${4:-ACQUIRED}" "$1" "$(lease_proof "${LEASE_MS:-120000}" "${LEASE_BOOT:-}")"
}

# envelope_of EVENT_JSON [ATTEMPT]: an ACQUIRED envelope around any event body.
envelope_of() {
	local b
	b=$(printf '%s' "$1" | sed 's/"/\\"/g')
	printf '{"v":1,"messageId":"m-x","body":"%s","claim":{"outcome":"ACQUIRED","attempt":%s,%s}}\n' \
		"$b" "${2:-1}" "$(lease_proof 120000)"
}

# lease_from_now: LEASE_FROM (epoch ms) and LEASE_FROM_BOOT (boot clock
# ms) of this moment, for leased.
lease_from_now() {
	LEASE_FROM_BOOT=$(boot_ms)
	LEASE_FROM=$(date +%s%3N)
}

# lease_now_on MS: stdin's envelopes, made by leased ID MS with
# LEASE_FROM=0 LEASE_FROM_BOOT=0, given one lease of MS granted now
# (lease_from_now): made first and stamped in one pass, so that however
# long a loaded machine takes to make them, none of the lease is spent
# before the step that reads them starts.
lease_now_on() {
	lease_from_now
	sed -e "s/\"leaseUntil\":$1,/\"leaseUntil\":$((LEASE_FROM + $1)),/" \
	    -e "s/\"sentBootMs\":0,/\"sentBootMs\":$LEASE_FROM_BOOT,/"
}

# leased ID MS [ACCOUNT]: an ACQUIRED envelope whose claim's lease of MS
# milliseconds was granted now, or at LEASE_FROM / LEASE_FROM_BOOT when
# set (lease_from_now), so that a batch of envelopes share one lease end
# (claim.leaseMs and sentBootMs, which the steps check; claim.leaseUntil,
# epoch ms, for the tests that compare it with the bank's times).
leased() {
	local until
	until=$(( ${LEASE_FROM:-$(date +%s%3N)} + $2 ))
	LEASE_MS=$2 LEASE_BOOT=${LEASE_FROM_BOOT:-} envelope "$1" "${3:-ACC-1}" |
		sed "s/\"claim\":{/\"claim\":{\"leaseUntil\":$until,/"
}

# debited ENVELOPE_JSON: the envelope after a successful debit.
debited() {
	printf '%s' "$1" | sed 's/}$/,"debit":{"outcome":"OK","ref":"TXN-00000042"}}/'
}

# absent STRING FILE...: fails when STRING is in any FILE (a bare
# `! grep` never fails a bats test).
absent() {
	local s=$1 f; shift
	for f in "$@"; do
		if grep -qaF -- "$s" "$f"; then
			echo "found in $f" >&2
			return 1
		fi
	done
}

# conn_counter_start: a loopback listener that counts the connections it
# accepts (into $CONN_DIR/count) and answers nothing useful.  Used as
# http_proxy, it proves a command made no connection at all: libcurl
# sends every http:// request through it, whatever the host.
conn_counter_start() {
	CONN_DIR=$BATS_TEST_TMPDIR/conn
	mkdir -p "$CONN_DIR"
	python3 -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + "/port.tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + "/port.tmp", sys.argv[1] + "/port")
n = 0
while True:
    c, _ = s.accept(); n += 1
    open(sys.argv[1] + "/count", "w").write(str(n))
    c.close()
' "$CONN_DIR" 3>&- &
	CONN_PID=$!
	local i
	for i in $(seq 100); do
		[ -s "$CONN_DIR/port" ] && break
		sleep 0.05
	done
	CONN_PORT=$(cat "$CONN_DIR/port")
}

conn_counter_stop() {
	[ -n "${CONN_PID:-}" ] || return 0
	kill "$CONN_PID" 2>/dev/null || true
	wait "$CONN_PID" 2>/dev/null || true
	CONN_PID=
}

# conn_count: how many connections the counter accepted.
conn_count() {
	cat "$CONN_DIR/count" 2>/dev/null || echo 0
}

# capture_start: a loopback HTTP server that records every request as one
# JSON line {method, path, headers, body} in $CAP_DIR/log and answers 201
# {"ref":"TXN-CAP"}; sets CAP_URL.  capture_stop ends it.
capture_start() {
	CAP_DIR=$BATS_TEST_TMPDIR/cap
	mkdir -p "$CAP_DIR"
	python3 -c '
import http.server, json, os, sys
d = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode()
        with open(d + "/log", "a") as f:
            f.write(json.dumps({"method": "POST", "path": self.path,
                                "headers": dict(self.headers.items()), "body": body}) + "\n")
        out = b"{\"ref\":\"TXN-CAP\"}"
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(d + "/port.tmp", "w").write(str(s.server_address[1]))
os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
' "$CAP_DIR" 3>&- &
	CAP_PID=$!
	local i
	for i in $(seq 100); do
		[ -s "$CAP_DIR/port" ] && break
		sleep 0.05
	done
	CAP_URL=http://127.0.0.1:$(cat "$CAP_DIR/port")
}

capture_stop() {
	[ -n "${CAP_PID:-}" ] || return 0
	kill "$CAP_PID" 2>/dev/null || true
	wait "$CAP_PID" 2>/dev/null || true
	CAP_PID=
}

# hmac_v2 KEY METHOD PATH IDEMKEY UNIX BODY: the signature as charge-debit(1)
# documents it, computed with openssl (not with our code).
hmac_v2() {
	local bh
	bh=$(printf '%s' "$6" | openssl dgst -sha256 -r | cut -d' ' -f1)
	printf 'IDEMKIT-HMAC-SHA256\n%s\n%s\n%s\n%s\n%s' "$2" "$3" "$4" "$5" "$bh" |
		openssl dgst -sha256 -hmac "$1" -r | cut -d' ' -f1
}

# mtls_certs DIR: a client CA (ca.pem), a client certificate it signed
# (client.pem, client.key, mode 0600) and one it did not (other.pem,
# other.key), beside the server's self_signed cert.pem/key.pem.
# mtls_server_start DIR 1.2|1.3 REF: a loopback HTTPS server with the
# certificates of mtls_certs DIR that requires a client certificate
# (Python's ssl, CERT_REQUIRED) and answers 201 {"ref":REF}.  TLS 1.2
# refuses a missing certificate inside the handshake; TLS 1.3 after it, so
# the refusal races the request.  Sets MTLS_PID and MTLS_PORT.
mtls_server_start() {
	local d=$1 i
	rm -f "$d/port"
	python3 -c '
import http.server, ssl, sys, os
d, version, ref = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = ("{\"ref\":\"%s\"}" % ref).encode()
        self.send_response(201); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/cert.pem", d + "/key.pem")
ctx.verify_mode = ssl.CERT_REQUIRED
if version == "1.3":
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
else:
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
ctx.load_verify_locations(d + "/ca.pem")
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
open(d + "/port.tmp", "w").write(str(s.server_address[1])); os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
' "$d" "$2" "$3" 2>"$d/server.log" 3>&- &
	MTLS_PID=$!
	for i in $(seq 100); do [ -s "$d/port" ] && break; sleep 0.05; done
	MTLS_PORT=$(cat "$d/port")
}

mtls_certs() {
	local d=$1
	self_signed "$d"
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-client-ca \
		-keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj /CN=idemkit-worker \
		-keyout "$d/client.key" -out "$d/client.csr" 2>/dev/null
	openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" \
		-CAcreateserial -days 2 -out "$d/client.pem" 2>/dev/null
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=stranger \
		-keyout "$d/other.key" -out "$d/other.pem" 2>/dev/null
	chmod 600 "$d"/*.key
}

# stub_start NAME SCRIPT [ARGS...]: python3 tests/SCRIPT on loopback with
# its directory $BATS_TEST_TMPDIR/NAME (its log: $BATS_TEST_TMPDIR/NAME/log);
# sets STUB_PORT.  stubs_stop (from teardown) ends every one started.
stub_start() {
	local name=$1 script=$2 d=$BATS_TEST_TMPDIR/$1
	shift 2
	mkdir -p "$d"
	rm -f "$d/port"
	python3 "$IDEMKIT_SRC/tests/$script" "$d" "$@" 2>"$d/err" 3>&- &
	STUB_PIDS="${STUB_PIDS:-} $!"
	for _ in $(seq 200); do [ -s "$d/port" ] && break; sleep 0.05; done
	STUB_PORT=$(cat "$d/port")
}

stubs_stop() {
	local p
	for p in ${STUB_PIDS:-}; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	STUB_PIDS=
}
