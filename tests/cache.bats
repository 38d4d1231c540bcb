#!/usr/bin/env bats
# The Redis fast path (IDEMKIT_CACHE) in front of a store of record: it
# answers only from terminal records written after the store's commit, it
# answers while the store is unavailable, and a cache that is down, slow or
# wrong-typed changes no outcome and fails no step.

bats_require_minimum_version 1.5.0
load helper
load redis_helper
load lock

# two redis-servers for the file, which some tests stop or fill: the tests
# run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	require_redis
	redis_start cache
	redis_start store
}
teardown_file() {
	redis_stop cache
	redis_stop store
}
setup() {
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db
	# (5 s, not the cache's 50 ms: on a busy machine a cache answer past
	# 50 ms is bypassed, by design, and a test that counts the store's round
	# trips would count that; the slow-cache test sets its own URL)
	export IDEMKIT_CACHE=redis://127.0.0.1:$REDIS_PORT_cache?timeout=5s
	export IDEMKIT_BUSY_TIMEOUT=200ms
}
# A test that failed before it stopped its proxy leaves it to us (a proxy
# left running outlived the whole suite once).
teardown() {
	[ -z "${PROXY_PID:-}" ] || { kill "$PROXY_PID" 2>/dev/null; wait "$PROXY_PID" 2>/dev/null; } || true
}

# finished ID STATE [AMOUNT]: claim and record STATE.
finished() {
	ev "$1" "${3:-2500}" | idemp-claim 2>/dev/null | idemp-done --state "$2" >/dev/null
}

@test "finish writes the terminal record to the cache with its fingerprint and the record's retention" {
	id=$(uid fin)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	# an acquired claim leaves a pending entry, never an answer
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = IN_PROGRESS ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 11 ]
	idemp-done --state DONE <<<"$env" >/dev/null
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = DONE ]
	fp=$(jget "$(idemp-show --json "$id")" fingerprint)
	[ "$(rcli cache HGET "idemkit:cache:$id" fingerprint)" = "$fp" ]
	want=$(( $(jget "$(idemp-show --json "$id")" expiresAt) * 1000 ))
	[ "$(rcli cache PEXPIRETIME "idemkit:cache:$id")" = "$want" ]
	# a late finish by the same token is LEASE_LOST and changes nothing
	run --separate-stderr idemp-done --state FAILED <<<"$env"
	[ "$status" -eq 13 ]
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = DONE ]
}

@test "duplicates of finished charges are answered while the SQLite store is write-locked" {
	d=$(uid d) f=$(uid f) n=$(uid n) p=$(uid p)
	finished "$d" DONE
	finished "$f" FAILED
	finished "$n" DEBITED_NOTIFICATION_FAILED
	ev "$p" | idemp-claim >/dev/null 2>&1
	hold_write_lock "$BATS_TEST_TMPDIR/store.db"
	run --separate-stderr idemp-claim < <(ev "$d")
	[ "$status" -eq 10 ]
	[ "$(jget "$output" claim.state)" = DONE ]
	run --separate-stderr idemp-claim < <(ev "$f")
	[ "$status" -eq 12 ]
	run --separate-stderr idemp-claim < <(ev "$n")
	[ "$status" -eq 10 ]
	[ "$(jget "$output" claim.state)" = DEBITED_NOTIFICATION_FAILED ]
	run --separate-stderr idemp-claim < <(ev "$d" 9999)
	[ "$status" -eq 14 ]
	# what the cache cannot answer still needs the store: a new charge,
	# and one in progress (never answered from a pending entry)
	run --separate-stderr idemp-claim < <(ev "$(uid new)")
	[ "$status" -eq 75 ]
	run --separate-stderr idemp-claim < <(ev "$p")
	[ "$status" -eq 75 ]
	# without the cache the finished one is not answered either
	IDEMKIT_CACHE= run --separate-stderr idemp-claim < <(ev "$d")
	[ "$status" -eq 75 ]
	kill "$LOCK_PID"
	wait "$LOCK_PID" 2>/dev/null || true
}

@test "a cached duplicate costs the store of record no round trip (Redis store: no EVALSHA)" {
	export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_store
	id=$(uid rt)
	finished "$id" DONE
	rcli store CONFIG RESETSTAT >/dev/null
	for i in 1 2 3; do
		run --separate-stderr idemp-claim < <(ev "$id")
		[ "$status" -eq 10 ]
	done
	if rcli store INFO commandstats | grep -q cmdstat_evalsha; then false; fi
	# and with no cache each duplicate is one claim script
	IDEMKIT_CACHE= run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 10 ]
	rcli store INFO commandstats | grep -q 'cmdstat_evalsha:calls=1,'
}

@test "a refused claim fills the cache from the store's record; forget and renotify keep it right" {
	id=$(uid fill)
	IDEMKIT_CACHE= finished "$id" FAILED
	[ -z "$(rcli cache HGET "idemkit:cache:$id" state)" ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 12 ]
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = FAILED ]
	run --separate-stderr idemp-forget "$id"
	[ "$status" -eq 0 ]
	[ -z "$(rcli cache HGET "idemkit:cache:$id" state)" ]   # a tombstone: its generation
	[ "$(rcli cache HGET "idemkit:cache:$id" gen)" = 1 ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 0 ]

	n=$(uid renotify)
	finished "$n" DEBITED_NOTIFICATION_FAILED
	[ "$(rcli cache HGET "idemkit:cache:$n" state)" = DEBITED_NOTIFICATION_FAILED ]
	rec=$(idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope | grep "$n")
	run --separate-stderr idemp-done --renotified <<<"${rec%\}},\"notify\":{\"outcome\":\"OK\"}}"
	[ "$status" -eq 0 ]
	[ "$(rcli cache HGET "idemkit:cache:$n" state)" = DONE ]
	run --separate-stderr idemp-claim < <(ev "$n")
	[ "$status" -eq 10 ]
	[ "$(jget "$output" claim.state)" = DONE ]
}

@test "stream mode with group commit: the cache is written after the commit, one entry per finish" {
	a=$(uid sa) b=$(uid sb) c=$(uid sc)
	{ ev "$a"; ev "$b"; ev "$c"; } | idemp-claim --stream 2>/dev/null | idemp-done --stream --state DONE >/dev/null
	for id in "$a" "$b" "$c"; do
		[ "$(rcli cache HGET "idemkit:cache:$id" state)" = DONE ]
	done
	run --separate-stderr idemp-claim --stream < <(ev "$a"; ev "$b")
	[ "$status" -eq 0 ]
	[ "$(grep -c DUP_DONE <<<"$output")" -eq 2 ]
}

@test "the cache emptied (restart, eviction), then a mismatching copy twice and the original once: 14, 14, 10" {
	id=$(uid mm)
	finished "$id" DONE 2500
	rcli cache DEL "idemkit:cache:$id" >/dev/null
	got=
	for amount in 9999 9999 2500; do
		rc=0
		idemp-claim < <(ev "$id" "$amount") >/dev/null 2>&1 || rc=$?
		got="$got $rc"
	done
	[ "$got" = " 14 14 10" ]
	# the entry the store's refusal filled holds the record's fingerprint
	[ "$(rcli cache HGET "idemkit:cache:$id" fingerprint)" = "$(jget "$(idemp-show --json "$id")" fingerprint)" ]
}

# slow_proxy PORT_FILE DIR [MODE]: a loopback TCP proxy in front of the
# cache (a stand-in for a slow network: no emulator delays single commands)
# that holds any request carrying the cache's MODE write (default
# terminal) for 1.5 s
# before it forwards it -- long after the writer's 50 ms timeout, as a
# congested link or a paused process would -- and touches DIR/held, then
# DIR/released once the server answered it.  Everything else passes at once.
slow_proxy() {
	python3 - "$REDIS_PORT_cache" "$1" "$2" "${3:-terminal}" <<'PY' 3>&- &
import os, socket, sys, threading, time
up, portfile, d, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
MARK = b"$%d\r\n%s\r\n" % (len(mode), mode.encode())
def pump(src, dst, hold):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            if hold and MARK in b:
                open(os.path.join(d, "held"), "w").close()
                time.sleep(1.5)
                dst.sendall(b)
                time.sleep(0.2)      # the server has run it
                open(os.path.join(d, "released"), "w").close()
                continue
            dst.sendall(b)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
def serve(c):
    u = socket.create_connection(("127.0.0.1", up))
    threading.Thread(target=pump, args=(c, u, True), daemon=True).start()
    threading.Thread(target=pump, args=(u, c, False), daemon=True).start()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0)); l.listen(64)
with open(portfile + ".tmp", "w") as f: f.write(str(l.getsockname()[1]))
os.rename(portfile + ".tmp", portfile)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
	PROXY_PID=$!
	for _ in $(seq 600); do [ -s "$1" ] && break; sleep 0.05; done
	[ -s "$1" ]
}

# proxied DIR: the cache's URL through the proxy slow_proxy started.  Its
# timeout is 500 ms, not 50: still a third of the hold, but room for the
# proxy's own start on a loaded machine, where the script's load through
# it timed out, the cache was bypassed and no write came to hold.
proxied() { echo "redis://127.0.0.1:$(cat "$1/port")?timeout=500ms"; }

@test "a cache write that lands after idemp-forget cannot put FAILED back: the next claim is the store's (ACQUIRED), not DUP_FAILED" {
	id=$(uid late)
	d=$BATS_TEST_TMPDIR/proxy
	mkdir -p "$d"
	finished "$id" FAILED
	rcli cache DEL "idemkit:cache:$id" >/dev/null      # emptied: a restart, an eviction
	slow_proxy "$d/port" "$d"
	# a redelivery: the store refuses it with its FAILED record, and the
	# cache write of that record is held on the way
	IDEMKIT_CACHE=$(proxied "$d") run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 12 ]
	for _ in $(seq 600); do [ -e "$d/held" ] && break; sleep 0.05; done
	[ -e "$d/held" ]
	[ ! -e "$d/released" ]
	# meanwhile the operator forgets the declined charge after a fix
	run --separate-stderr idemp-forget "$id"
	[ "$status" -eq 0 ]
	for _ in $(seq 600); do [ -e "$d/released" ] && break; sleep 0.05; done
	[ -e "$d/released" ]                                # the late write reached the server
	kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true
	[ -z "$(rcli cache HGET "idemkit:cache:$id" state)" ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
}

@test "a late finish cannot overwrite the entry of a newer claim made after idemp-forget: the cache follows the store" {
	id=$(uid oldfin)
	d=$BATS_TEST_TMPDIR/proxy
	mkdir -p "$d"
	old=$(ev "$id" | idemp-claim 2>/dev/null)
	slow_proxy "$d/port" "$d" finish
	# declined: recorded FAILED in the store; its cache write is held
	IDEMKIT_CACHE=$(proxied "$d") run --separate-stderr idemp-done --state FAILED <<<"$old"
	[ "$status" -eq 0 ]
	for _ in $(seq 600); do [ -e "$d/held" ] && break; sleep 0.05; done
	[ -e "$d/held" ]
	# forgotten after a fix, and claimed again by the redelivery
	idemp-forget "$id" >/dev/null 2>&1
	new=$(ev "$id" | idemp-claim 2>/dev/null)
	[ "$(jget "$new" claim.outcome)" = ACQUIRED ]
	for _ in $(seq 600); do [ -e "$d/released" ] && break; sleep 0.05; done
	[ -e "$d/released" ]                                # the old finish reached the server
	kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = IN_PROGRESS ]
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 11 ]                              # the store's answer, not DUP_FAILED
	idemp-done --state DONE <<<"$new" >/dev/null
	[ "$(rcli cache HGET "idemkit:cache:$id" state)" = DONE ]
}

@test "idemp-stats and the metrics' gauges work with IDEMKIT_CACHE set: the store's counts, not 78" {
	finished "$(uid st1)" DONE
	finished "$(uid st2)" FAILED
	ev "$(uid st3)" | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	with=$output
	IDEMKIT_CACHE= run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$with" states.DONE)$(jget "$with" states.FAILED)$(jget "$with" states.IN_PROGRESS)" = \
	  "$(jget "$output" states.DONE)$(jget "$output" states.FAILED)$(jget "$output" states.IN_PROGRESS)" ]
	[ "$(jget "$with" states.FAILED)" = 1 ]
	# the metrics file's store gauges, as charge-worker --metrics writes them
	started=$(idemkit-metrics --clock)
	echo '{"summary":true,"received":0}' | idemkit-metrics --file "$BATS_TEST_TMPDIR/m.prom" \
		--job worker --started "$started" --status 0
	grep -qx 'idemkit_store_stats_up{idemkit_job="worker"} 1' "$BATS_TEST_TMPDIR/m.prom"
	grep -qx 'idemkit_records{idemkit_job="worker",state="FAILED"} 1' "$BATS_TEST_TMPDIR/m.prom"
}

# outcomes: one scripted run of every claim outcome and finish; prints
# "step exit" lines to compare a run with a cache against one without.
outcomes() {
	local p=$1 env
	run_one() { local rc=0; "$@" >/dev/null 2>>"$BATS_TEST_TMPDIR/err" || rc=$?; echo "$rc"; }
	ev "$p-1" | idemp-claim 2>/dev/null > "$BATS_TEST_TMPDIR/e1"
	echo "acquired $(jget "$(cat "$BATS_TEST_TMPDIR/e1")" claim.outcome)"
	echo "dup-in-progress $(run_one idemp-claim < <(ev "$p-1"))"
	echo "done $(run_one idemp-done --state DONE < "$BATS_TEST_TMPDIR/e1")"
	echo "dup-done $(run_one idemp-claim < <(ev "$p-1"))"
	echo "lease-lost $(run_one idemp-done --state DONE < "$BATS_TEST_TMPDIR/e1")"
	echo "mismatch $(run_one idemp-claim < <(ev "$p-1" 7777))"
	env=$(ev "$p-2" | idemp-claim 2>/dev/null)
	echo "failed $(run_one idemp-done --state FAILED <<<"$env")"
	echo "dup-failed $(run_one idemp-claim < <(ev "$p-2"))"
	echo "forget $(run_one idemp-forget "$p-2")"
	echo "reclaim $(run_one idemp-claim < <(ev "$p-2"))"
	env=$(ev "$p-3" | idemp-claim 2>/dev/null)
	echo "dnf $(run_one idemp-done --state DEBITED_NOTIFICATION_FAILED <<<"$env")"
	echo "dup-dnf $(run_one idemp-claim < <(ev "$p-3"))"
	echo "list $(run_one idemp-list --state DEBITED_NOTIFICATION_FAILED)"
}

@test "cache down (port closed): every outcome is the same as without a cache, logged once per process" {
	IDEMKIT_CACHE= outcomes "$(uid plain)" > "$BATS_TEST_TMPDIR/plain"
	closed=$(free_port)
	IDEMKIT_CACHE=redis://127.0.0.1:$closed outcomes "$(uid down)" > "$BATS_TEST_TMPDIR/down"
	cat "$BATS_TEST_TMPDIR/plain" "$BATS_TEST_TMPDIR/down"
	diff "$BATS_TEST_TMPDIR/plain" "$BATS_TEST_TMPDIR/down"
	grep -q '"msg":"cache unavailable' "$BATS_TEST_TMPDIR/err"
	# a stream of many charges logs it once
	: > "$BATS_TEST_TMPDIR/err2"
	for i in 1 2 3 4 5; do ev "$(uid "st$i")"; done |
		IDEMKIT_CACHE=redis://127.0.0.1:$closed idemp-claim --stream 2>"$BATS_TEST_TMPDIR/err2" > "$BATS_TEST_TMPDIR/out2"
	[ "$(grep -c ACQUIRED "$BATS_TEST_TMPDIR/out2")" -eq 5 ]
	[ "$(grep -c 'cache unavailable' "$BATS_TEST_TMPDIR/err2")" -eq 1 ]
}

@test "wrong-typed cache keys: every outcome is the same as without a cache" {
	IDEMKIT_CACHE= outcomes "$(uid plain)" > "$BATS_TEST_TMPDIR/plain"
	p=$(uid wt)
	rcli cache SET "idemkit:cache:$p-1" junk >/dev/null
	rcli cache LPUSH "idemkit:cache:$p-2" junk >/dev/null
	rcli cache HSET "idemkit:cache:$p-3" state DONE >/dev/null   # no fingerprint
	outcomes "$p" > "$BATS_TEST_TMPDIR/wt"
	diff "$BATS_TEST_TMPDIR/plain" "$BATS_TEST_TMPDIR/wt"
	grep -q 'WRONGTYPE' "$BATS_TEST_TMPDIR/err"
}

@test "a cache that never answers (slow): bypassed after its timeout, same outcomes" {
	port=$(free_port)
	python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64)
open(sys.argv[2], "w").close()
conns = []
while True:
    c, _ = s.accept(); conns.append(c)' "$port" "$BATS_TEST_TMPDIR/ready" 3>&- &
	pid=$!
	for _ in $(seq 100); do [ -e "$BATS_TEST_TMPDIR/ready" ] && break; sleep 0.05; done
	IDEMKIT_CACHE= outcomes "$(uid plain)" > "$BATS_TEST_TMPDIR/plain"
	IDEMKIT_CACHE=redis://127.0.0.1:$port outcomes "$(uid slow)" > "$BATS_TEST_TMPDIR/slow"
	kill "$pid"; wait "$pid" 2>/dev/null || true
	diff "$BATS_TEST_TMPDIR/plain" "$BATS_TEST_TMPDIR/slow"
	grep -q 'timed out' "$BATS_TEST_TMPDIR/err"
}

@test "IDEMKIT_CACHE misconfigured is 78: rediss://, another scheme, a store-only option" {
	for url in rediss://127.0.0.1:1 memcached://x 'redis://127.0.0.1:1?durability=unsafe' 'redis://h:99999'; do
		run --separate-stderr env IDEMKIT_CACHE="$url" idemp-claim < <(ev "$(uid cfg)")
		echo "$url -> $status $stderr"
		[ "$status" -eq 78 ]
		[[ "$stderr" == *IDEMKIT_CACHE* ]]
	done
	run --separate-stderr env IDEMKIT_CACHE=rediss://127.0.0.1:1 idemp-claim < <(ev "$(uid cfg)")
	[[ "$stderr" == *"hiredis 0.14 has no TLS"*"idemkit(7)"* ]]
}
