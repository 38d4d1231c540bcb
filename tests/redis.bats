#!/usr/bin/env bats
# The Redis store beyond the store suite (which runs unchanged with
# IDEMKIT_TEST_BACKEND=redis): durability checked on connect, TLS refused,
# the password kept secret, the server's clock, scripts reloaded after
# NOSCRIPT, WAIT, recovery lists from the state indexes (no SCAN).

bats_require_minimum_version 1.5.0
load helper
load redis_helper
load bank_helper

# one redis-server for the file, which some tests empty (FLUSHALL, SCRIPT
# FLUSH): the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	require_redis
	redis_start
}
teardown_file() { redis_stop; }
# servers a test starts for itself
teardown() {
	redis_stop lax
	redis_stop noconfig
}
setup() {
	export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
}

@test "a server without appendfsync always is refused (78); the message names the setting and the risk" {
	redis_start lax --appendfsync everysec
	run --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_lax idemp-claim < <(ev "$(uid lax)")
	[ "$status" -eq 78 ]
	[ "$(jget "$output" claim.outcome)" = CONFIG ]
	[[ "$stderr" == *"appendfsync is everysec, not always"*"debit again"*"durability=unsafe"* ]]
	rcli lax CONFIG SET appendonly no >/dev/null
	run --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_lax idemp-show x
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"appendonly is no, not yes"* ]]
	[ "$(rcli lax DBSIZE)" = 0 ]
}

@test "durability=unsafe accepts that server and warns on every start" {
	redis_start lax --appendonly no --appendfsync everysec
	url="redis://127.0.0.1:$REDIS_PORT_lax?durability=unsafe"
	for i in 1 2; do
		run --separate-stderr env IDEMKIT_STORE="$url" idemp-claim < <(ev "$(uid "unsafe$i")")
		echo "$status $output $stderr"
		[ "$status" -eq 0 ]
		[[ "$stderr" == *'"level":"warn"'*"durability=unsafe"*"only the bank's idempotency key"* ]]
	done
	run --separate-stderr env IDEMKIT_STORE="redis://127.0.0.1:$REDIS_PORT_lax?durability=maybe" idemp-show x
	[ "$status" -eq 78 ]
}

@test "CONFIG renamed away: the store says it cannot check durability and refuses (78)" {
	redis_start noconfig --rename-command CONFIG ""
	run --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_noconfig idemp-claim < <(ev "$(uid nc)")
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"cannot read the persistence settings"*"unknown command"*"allow CONFIG GET"* ]]
}

@test "rediss:// is refused with 78: hiredis 0.14 has no TLS; the man page's tunnel paragraph" {
	run --separate-stderr env IDEMKIT_STORE=rediss://127.0.0.1:6380 idemp-claim < <(ev "$(uid tls)")
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"hiredis 0.14 has no TLS"*"stunnel or spiped"*'"TLS to Redis" in idemkit(7)'* ]]
	man -l "$IDEMKIT_SRC/man/idemkit.7" 2>/dev/null | grep -q "TLS to Redis"
}

@test "the password is never shown: messages, logs, --help, --store, /proc/PID/cmdline" {
	pw='S3cret-pw%2Fx'   # percent-encoded in the URL: the password is S3cret-pw/x
	rcli ACL SETUSER app on '>S3cret-pw/x' '~*' '+@all' >/dev/null
	rcli ACL SETUSER noconf on '>S3cret-pw/x' '~*' '+@all' '-config' >/dev/null
	export IDEMKIT_STORE="redis://app:$pw@127.0.0.1:$REDIS_PORT"
	run --separate-stderr idemp-claim < <(ev "$(uid pw)")
	[ "$status" -eq 0 ]
	all="$output $stderr"
	run --separate-stderr env IDEMKIT_STORE="redis://app:wrong-$pw@127.0.0.1:$REDIS_PORT" idemp-claim < <(ev "$(uid pw2)")
	[ "$status" -eq 78 ]
	[[ "$stderr" == *WRONGPASS* ]]
	all="$all $output $stderr"
	run --separate-stderr env IDEMKIT_STORE="redis://noconf:$pw@127.0.0.1:$REDIS_PORT" idemp-claim < <(ev "$(uid pw3)")
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"cannot read the persistence settings"*NOPERM* ]]
	all="$all $output $stderr"
	run --separate-stderr env IDEMKIT_STORE="redis://app:$pw@127.0.0.1:1" idemp-claim < <(ev "$(uid pw4)")
	[ "$status" -eq 75 ]
	all="$all $output $stderr"
	run --separate-stderr env IDEMKIT_STORE="redis:/app:$pw@127.0.0.1:1" idemp-show x
	[ "$status" -eq 78 ]
	all="$all $output $stderr"
	run idemp-claim --help
	all="$all $output"
	# on the command line it would be in the process list: refused
	run --separate-stderr idemp-show --store "redis://app:$pw@127.0.0.1:$REDIS_PORT" x
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"process list"*IDEMKIT_STORE* ]]
	[[ "$all" != *S3cret* ]]
	[[ "$all" == *'redis 127.0.0.1:1/0'* ]]
	# a running stream step: neither its argv nor anything it printed
	mkfifo "$BATS_TEST_TMPDIR/in"
	IDEMKIT_LOG=debug idemp-claim --stream < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2>&1 &
	pid=$!
	exec 4> "$BATS_TEST_TMPDIR/in"
	ev "$(uid pw5)" >&4
	for _ in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/out" ] && break; sleep 0.05; done
	if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q S3cret; then false; fi
	exec 4>&-
	wait "$pid"
	grep -q ACQUIRED "$BATS_TEST_TMPDIR/out"
	[ "$(grep -c S3cret "$BATS_TEST_TMPDIR/out")" -eq 0 ]
}

@test "unreachable server is 75 (transient); bad URLs are 78" {
	run --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:1 idemp-claim < <(ev "$(uid down)")
	[ "$status" -eq 75 ]
	[[ "$stderr" == *"connect"* ]]
	for url in 'redis://127.0.0.1:0' 'redis://127.0.0.1:6379/x' 'redis://127.0.0.1:6379?foo=1' \
		'redis://:x%zz@127.0.0.1' 'redis://user@127.0.0.1' 'redis://[::1' "redis://127.0.0.1:$REDIS_PORT?wait=x"; do
		run --separate-stderr env IDEMKIT_STORE="$url" idemp-show x
		echo "$url -> $status $stderr"
		[ "$status" -eq 78 ]
	done
}

@test "the lease is set on the server's clock (TIME inside the script)" {
	id=$(uid clock)
	before=$(rcli TIME | python3 -c 'import sys; s,u=sys.stdin.read().split(); print(int(s)*1000+int(u)//1000)')
	run --separate-stderr idemp-claim --lease 60s < <(ev "$id")
	[ "$status" -eq 0 ]
	after=$(rcli TIME | python3 -c 'import sys; s,u=sys.stdin.read().split(); print(int(s)*1000+int(u)//1000)')
	lease=$(jget "$output" claim.leaseUntil)
	[ "$lease" -ge $((before + 60000)) ]
	[ "$lease" -le $((after + 60000)) ]
	[ "$(rcli HGET "idemkit:rec:$id" leaseUntil)" = "$lease" ]
	[ "$(rcli ZSCORE idemkit:idx:IN_PROGRESS "$id")" = "$lease" ]
	# retention is the key's expiry
	[ "$(rcli PEXPIRETIME "idemkit:rec:$id")" = "$(( $(rcli HGET "idemkit:rec:$id" expiresAt) * 1000 ))" ]
}

@test "a claim held at the server (CLIENT PAUSE WRITE) for longer than its lease: its sentBootMs is read before it left (bounded from above), so the debit is LEASE_SHORT, nothing sent (issue 45)" {
	k=$(uid paused)
	t0=$(boot_ms)
	# (5 s: the claim is sent within them on a loaded machine.  The store's
	# timeout is 15 s, not its default 5: the server lifts a pause at its
	# next cron tick (up to 100 ms late at hz 10), so a claim sent within
	# that of the pause's start timed out first, 75: 1 in 4 here)
	rcli CLIENT PAUSE 5000 WRITE >/dev/null
	run --separate-stderr env IDEMKIT_STORE="$IDEMKIT_STORE?timeout=15s" \
		idemp-claim --lease 2s < <(ev "$k")
	echo "$stderr"
	[ "$status" -eq 0 ]
	answered=$(boot_ms)
	sent=$(jget "$output" claim.sentBootMs)
	echo "paused at $t0 for 5 s, sentBootMs $sent, answered by $answered"
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	[ "$answered" -ge $((t0 + 5000)) ]      # it did wait for the pause
	# sent before the pause ended (the script waited at the server)
	[ "${sent%.*}" -ge "$t0" ]
	[ "${sent%.*}" -lt $((t0 + 5000)) ]
	# (nothing listens there: a call would be 75, not 15)
	c=$output
	run -15 --separate-stderr charge-debit --url "http://127.0.0.1:$(free_port)/debits" \
		--timeout 500ms --lease-margin 100ms <<<"$c"
	[ "$(jget "$output" debit.outcome)" = LEASE_SHORT ]
	[[ "$(jget "$output" debit.error)" == *"nothing was sent"* ]]
}

@test "after SCRIPT FLUSH a long-running step loads its scripts again (NOSCRIPT) and goes on" {
	mkfifo "$BATS_TEST_TMPDIR/in"
	idemp-claim --stream < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" &
	pid=$!
	exec 4> "$BATS_TEST_TMPDIR/in"
	ev "$(uid ns1)" >&4
	for _ in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/out" ] && break; sleep 0.05; done
	rcli SCRIPT FLUSH >/dev/null
	ev "$(uid ns2)" >&4
	exec 4>&-
	wait "$pid"
	[ "$(grep -c ACQUIRED "$BATS_TEST_TMPDIR/out")" -eq 2 ]
}

@test "a server restarted between two envelopes of one idemp-done --stream: the closed connection is found before the second is sent, both finishes recorded (the charge never goes to the bank again)" {
	finish_across eval 'redis_stop; redis_restart'
	[ "$(jget "$first" done.outcome)" = OK ]
	[ "$(jget "$second" done.outcome)" = OK ]
	[ "$(jget "$(idemp-show --json "$(uid rs1)")" state)" = DONE ]
	[ "$(jget "$(idemp-show --json "$(uid rs2)")" state)" = DONE ]
	run ! grep -q -i "reset\|closed" "$BATS_TEST_TMPDIR/err"
}

@test "a finish whose answer a reset lost (the server ran it): sent again on a new connection and decided from the record, 0 and DONE; never 75 once the bank said yes" {
	k=$(uid lostans)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	[ "$(jget "$env" claim.outcome)" = ACQUIRED ]
	python3 "$IDEMKIT_SRC/tests/pgsilent.py" "$REDIS_PORT" "$BATS_TEST_TMPDIR/relay.port" "$k" reset-once 3>&- &
	relay=$!
	for _ in $(seq 100); do [ -s "$BATS_TEST_TMPDIR/relay.port" ] && break; sleep 0.05; done
	IDEMKIT_STORE=redis://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/relay.port") \
		run --separate-stderr idemp-done --state DONE <<<"$env"
	kill "$relay"; wait "$relay" 2>/dev/null || true
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.outcome)" = OK ]
	[[ $stderr == *"sending it again"*"Connection reset by peer"* ]]
	[ "$(jget "$(idemp-show --json "$k")" state)" = DONE ]
	# one finish in the record's history, not two
	[ "$(idemp-show --json "$k" | grep -o '"op":"finish"' | wc -l)" -eq 1 ]
}

@test "wait=1 with no replica: the write is done on the primary, the step is 75 and says WAIT" {
	id=$(uid wait)
	run --separate-stderr env IDEMKIT_STORE="redis://127.0.0.1:$REDIS_PORT?wait=1" idemp-claim < <(ev "$id")
	[ "$status" -eq 75 ]
	[[ "$stderr" == *"WAIT: 0 of 1 replicas"* ]]
	[ "$(rcli HGET "idemkit:rec:$id" state)" = IN_PROGRESS ]
	run --separate-stderr env IDEMKIT_STORE="redis://127.0.0.1:$REDIS_PORT?wait=0" idemp-claim < <(ev "$(uid wait0)")
	[ "$status" -eq 0 ]
}

@test "recovery lists come from the state indexes, never a SCAN; expired records leave the index" {
	a=$(uid ia) b=$(uid ib)
	ev "$a" | idemp-claim 2>/dev/null | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null
	# (retention 3 s, lease 2 s: the claim and the finish must come before
	# Redis forgets it, on a loaded machine too)
	ev "$b" | IDEMKIT_RETENTION=3s idemp-claim --lease 2s 2>/dev/null | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null
	rcli CONFIG RESETSTAT >/dev/null
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$status" -eq 0 ]
	[[ "$output" == *"\"chargeId\":\"$a\""* ]]
	run rcli INFO commandstats
	[[ "$output" != *cmdstat_scan* ]]
	[[ "$output" != *cmdstat_keys* ]]
	# b expires (retention 3s); the next listing drops it from the index
	for _ in $(seq 100); do [ "$(rcli EXISTS "idemkit:rec:$b")" = 0 ] && break; sleep 0.1; done
	[ "$(rcli EXISTS "idemkit:rec:$b")" = 0 ]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[[ "$output" != *"\"chargeId\":\"$b\""* ]]
	[ -z "$(rcli ZSCORE idemkit:idx:DEBITED_NOTIFICATION_FAILED "$b")" ]
	[ -n "$(rcli ZSCORE idemkit:idx:DEBITED_NOTIFICATION_FAILED "$a")" ]
}

@test "a list longer than one script page (200) comes back whole, each record once" {
	for i in $(seq 1 450); do ev "$(uid "pg$i")"; done | idemp-claim --stream --lease 1s >/dev/null 2>&1
	sleep 1.1
	run --separate-stderr idemp-list --expired
	[ "$status" -eq 0 ]
	n=$(grep -c "$(uid pg)" <<<"$output")
	u=$(grep -o "\"chargeId\":\"$(uid pg)[0-9]*\"" <<<"$output" | sort -u | wc -l)
	echo "listed $n unique $u"
	[ "$n" -eq 450 ]
	[ "$u" -eq 450 ]
}

@test "a wrong-typed record key is an error (70), never a claim" {
	id=$(uid wt)
	rcli SET "idemkit:rec:$id" junk >/dev/null
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 70 ]
	[[ "$stderr" == *WRONGTYPE* ]]
	[ "$(rcli GET "idemkit:rec:$id")" = junk ]
}

@test "a store that accepts but never answers is 75 after ?timeout, saying so" {
	port=$(free_port)
	python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64)
open(sys.argv[2], "w").close()
conns = []
while True:
    c, _ = s.accept(); conns.append(c)' "$port" "$BATS_TEST_TMPDIR/ready" 3>&- &
	pid=$!
	for _ in $(seq 100); do [ -e "$BATS_TEST_TMPDIR/ready" ] && break; sleep 0.05; done
	run --separate-stderr env IDEMKIT_STORE="redis://127.0.0.1:$port?timeout=200ms" idemp-claim < <(ev "$(uid slow)")
	kill "$pid"; wait "$pid" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[[ "$stderr" == *"timed out"* ]]
}

@test "idemp-stats after an upgrade: idemp-init puts the FAILED and DNF records written before the live sets into them" {
	rcli FLUSHALL >/dev/null
	# (one claim and one finish process for the 250: the same records)
	for i in $(seq 250); do ev "$(uid "f$i")"; done |
		idemp-claim --stream 2>/dev/null | idemp-done --stream --state FAILED >/dev/null 2>&1
	ev "$(uid n1)" | idemp-claim 2>/dev/null | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null 2>&1
	ev "$(uid d1)" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null 2>&1
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 250 ]
	# what a store written before the live sets looks like
	rcli DEL idemkit:live:FAILED idemkit:live:DEBITED_NOTIFICATION_FAILED >/dev/null
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 0 ]
	[ "$(jget "$output" dnfBacklog)" -eq 0 ]
	# a stale member (its record forgotten by another writer) is not counted
	rcli DEL "idemkit:rec:$(uid f7)" >/dev/null
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$output" states.FAILED)" -eq 249 ]
	[ "$(jget "$output" states.DEBITED_NOTIFICATION_FAILED)" -eq 1 ]
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	[ "$(jget "$output" states.DONE)" -eq 1 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 0 ]
	# the live set scores are the records' expiry (ms)
	exp=$(rcli HGET "idemkit:rec:$(uid f1)" expiresAt)
	[ "$(rcli ZSCORE idemkit:live:FAILED "$(uid f1)")" = "${exp}000" ]
}

@test "a retention shorter than the lease is refused (78) before anything is written; a worker clock behind the server's never expires a key before its lease ends (issue 24 item 15)" {
	id=$(uid ret)
	IDEMKIT_RETENTION=2s run --separate-stderr idemp-claim --lease 10s < <(ev "$id")
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"IDEMKIT_RETENTION (2s) is not longer than the lease (10s)"* ]]
	[ "$(rcli EXISTS "idemkit:rec:$id")" = 0 ]
	slow_or_skip idemp-claim
	# expiresAt comes from the worker's clock, 30 s behind the server's
	# here: 35 s of retention would end 5 s from now on the server, within
	# the 10 s lease.  The key lives until the lease's end at least.
	IDEMKIT_RETENTION=35s run --separate-stderr slow idemp-claim --lease 10s < <(ev "$id")
	[ "$status" -eq 0 ]
	ttl=$(rcli PTTL "idemkit:rec:$id")
	echo "pttl $ttl"
	[ "$ttl" -gt 9000 ]
	[ "$ttl" -le 10000 ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 11 ]
}
