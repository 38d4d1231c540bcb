#!/usr/bin/env bats
# The outbox on the Redis store (issue 27; lib/store/redis/store_redis_outbox.c): what
# is this store's own.  The generic tests (the events and their format, a
# refused finish, kill -9 of the relay at each boundary, a worker killed
# between debit and finish, two relays racing, the downstream consumer)
# are tests/outbox.bats with IDEMKIT_TEST_BACKEND=redis.  Here, against a
# real redis-server per test (appendonly, appendfsync always): the event
# an entry of the stream idemkit:outbox XADDed by the finish's own script
# (one MULTI/EXEC with the transition in the append-only file), the same
# client round trips and AOF transactions per charge with or without it, a
# dead relay's pending entries taken over (XAUTOCLAIM), a store killed -9
# and restarted under a relay --follow, the lag gauge, the purge by MINID,
# the outbox through the Redis fast path (IDEMKIT_CACHE), a volatile
# server refused, and a failover to a replica.

bats_require_minimum_version 1.5.0
load helper
load queue_backend
load bank_helper
load outbox_helper
load redis_helper

setup_file() { queue_backend_setup_file; }
teardown_file() { queue_backend_teardown_file; }
setup() {
	require_redis
	queue_backend_setup
	unset IDEMKIT_QUEUE IDEMKIT_DLQ IDEMKIT_CACHE
	export IDEMKIT_OUTBOX=$QUEUE IDEMKIT_LOG=quiet
	redis_start
	export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
}
teardown() {
	for p in ${RELAYS:-}; do kill -KILL "$p" 2>/dev/null || true; done
	redis_stop
	redis_stop replica
	redis_stop vol
}

# aof_blocks: the commands of the append-only file, one transaction (a
# script's MULTI ... EXEC, or a lone command) a line, as JSON lists.
aof_blocks() {
	python3 - "$REDIS_DIR_main"/appendonlydir/*.incr.aof <<'PY'
import json, sys
data = b"".join(open(f, "rb").read() for f in sys.argv[1:])
i, cmds = 0, []
while i < len(data):
    assert data[i:i+1] == b"*", data[i:i+20]
    j = data.index(b"\r\n", i); n = int(data[i+1:j]); i = j + 2; cmd = []
    for _ in range(n):
        j = data.index(b"\r\n", i); ln = int(data[i+1:j]); i = j + 2
        cmd.append(data[i:i+ln].decode()); i += ln + 2
    cmds.append(cmd)
block = None
for c in cmds:
    if c[0] == "MULTI": block = []
    elif c[0] == "EXEC": print(json.dumps(block)); block = None
    elif block is not None: block.append(c)
    elif c[0] != "SELECT": print(json.dumps([c]))
PY
}
# server_ms: the server's clock; server_past MS: it is past MS.
server_ms() { local t; t=$(rcli TIME) && set -- $t && echo $(( $1 * 1000 + 10#$2 / 1000 )); }
server_past() { [ "$(server_ms)" -ge "$1" ]; }
# wait_for CMD...: until CMD succeeds (200 tries, 0.1 s apart).
wait_for() {
	local _
	for _ in $(seq 200); do "$@" && return 0; sleep 0.1; done
	return 1
}
none_waiting() { [ "$(waiting)" = 0 ]; }

@test "redis: the event is XADDed by the finish's own script (one MULTI/EXEC with the transition); a refused finish and a claim add none" {
	k=$(uid a)
	env=$(ev "$k" | idemp-claim 2>/dev/null)
	run -13 idemp-done --state DONE <<<"${env/\"token\":\"/\"token\":\"0}"
	[ "$(rcli XLEN idemkit:outbox)" = 0 ]
	run -0 idemp-done --state DONE <<<"$env"
	[ "$(rcli XLEN idemkit:outbox)" = 1 ]
	# the entry: its id, then id, chargeId, type, body
	rcli XRANGE idemkit:outbox - + > "$BATS_TEST_TMPDIR/entry"
	[ "$(sed -n 2p "$BATS_TEST_TMPDIR/entry")" = id ]
	[[ "$(sed -n 3p "$BATS_TEST_TMPDIR/entry")" =~ ^[0-9a-f]{32}$ ]]
	[ "$(sed -n 5p "$BATS_TEST_TMPDIR/entry")" = "$k" ]
	[ "$(sed -n 7p "$BATS_TEST_TMPDIR/entry")" = charge.finished ]
	# In the append-only file the XADD is in the finish's own transaction,
	# with the state it announces; no XADD anywhere else.
	aof_blocks > "$BATS_TEST_TMPDIR/aof"
	python3 - "$BATS_TEST_TMPDIR/aof" "$k" <<'PY'
import json, sys
blocks = [json.loads(l) for l in open(sys.argv[1])]
with_xadd = [b for b in blocks if any(c[0] == "XADD" for c in b)]
assert len(with_xadd) == 1, with_xadd
b = with_xadd[0]
assert ["HSET", "idemkit:rec:" + sys.argv[2], "state", "DONE"] == b[0][:4], b[0]
x = [c for c in b if c[0] == "XADD"][0]
body = json.loads(x[x.index("body") + 1])
assert body["chargeId"] == sys.argv[2] and body["state"] == "DONE" and body["v"] == 1, body
PY
}

@test "redis: a re-notification adds its own event in its own script; one of a record not DNF adds none" {
	k=$(uid rn)
	finish "$k" DEBITED_NOTIFICATION_FAILED
	[ "$(rcli XLEN idemkit:outbox)" = 1 ]
	renotify_all
	[ "$(jget "$(idemp-show --json "$k")" state)" = DONE ]
	[ "$(rcli XLEN idemkit:outbox)" = 2 ]
	aof_blocks > "$BATS_TEST_TMPDIR/aof"
	python3 - "$BATS_TEST_TMPDIR/aof" <<'PY'
import json, sys
blocks = [json.loads(l) for l in open(sys.argv[1])]
rn = [b for b in blocks if any(c[0] == "XADD" and "charge.renotified" in c for c in b)]
assert len(rn) == 1 and rn[0][0][:4][2:] == ["state", "DONE"], rn
PY
}

@test "redis: the outbox costs no round trip and no AOF transaction per charge (MONITOR and the append-only file, without and with)" {
	N=30
	rcli MONITOR > "$BATS_TEST_TMPDIR/monitor" 2>/dev/null 3>&- &
	mon=$!
	RELAYS=$mon
	wait_for grep -q OK "$BATS_TEST_TMPDIR/monitor"
	aof_blocks > "$BATS_TEST_TMPDIR/aof0"
	for i in $(seq 1 "$N"); do ev "$(uid "off$i")"; done | IDEMKIT_OUTBOX= idemp-claim --stream 2>/dev/null \
		| IDEMKIT_OUTBOX= idemp-done --stream --state DONE >/dev/null 2>&1
	rcli ECHO idemkit-test-mark >/dev/null
	aof_blocks > "$BATS_TEST_TMPDIR/aof1"
	for i in $(seq 1 "$N"); do ev "$(uid "on$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	rcli ECHO idemkit-test-mark2 >/dev/null
	aof_blocks > "$BATS_TEST_TMPDIR/aof2"
	wait_for grep -q idemkit-test-mark2 "$BATS_TEST_TMPDIR/monitor"
	kill "$mon"
	[ "$(rcli XLEN idemkit:outbox)" = "$N" ]
	python3 - "$BATS_TEST_TMPDIR" "$N" <<'PY' >&3
import sys
d, n = sys.argv[1], int(sys.argv[2])
# the client's own commands (a script's inner ones are marked "lua")
mon = [l for l in open(d + "/monitor") if l.startswith(tuple("0123456789")) and "lua]" not in l]
mark = [i for i, l in enumerate(mon) if "idemkit-test-mark" in l]
off = [l for l in mon[:mark[0]] if '"MONITOR"' not in l]
on = mon[mark[0] + 1:mark[1]]
ev = lambda ls: sum('"EVALSHA"' in l for l in ls)
a = [sum(1 for _ in open(d + "/aof%d" % i)) for i in range(3)]
print("# outbox off: %d commands, %d EVALSHA, %d AOF transactions for %d charges"
      % (len(off), ev(off), a[1] - a[0], n))
print("# outbox on:  %d commands, %d EVALSHA, %d AOF transactions for %d charges"
      % (len(on), ev(on), a[2] - a[1], n))
# the same round trips and the same fsynced transactions (a script is
# one), once the scripts are loaded (the first run loads them)
assert ev(on) == ev(off) == 2 * n, (ev(on), ev(off))
assert a[2] - a[1] == a[1] - a[0] == 2 * n, a
PY
}

@test "redis: a dead relay's pending entries are taken over (XAUTOCLAIM) and its consumer dropped" {
	for i in $(seq 1 25); do ev "$(uid "k$i")"; done | idemp-claim --stream 2>/dev/null \
		| idemp-done --stream --state DONE >/dev/null 2>&1
	run -137 env IDEMKIT_TEST_RELAY_CRASH=after-publish idemp-outbox --lease 1s
	# its batch: delivered to its consumer, not acknowledged
	[ "$(rcli XPENDING idemkit:outbox relay | head -1)" = 10 ]
	[ "$(waiting)" = 25 ]
	rc=11
	for _ in $(seq 100); do
		rc=0; idemp-outbox --lease 1s > "$BATS_TEST_TMPDIR/second" 2>/dev/null || rc=$?
		[ "$rc" -ne 11 ] && break
		sleep 0.1
	done
	[ "$rc" -eq 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/second")" -eq 25 ]
	[ "$(rcli XPENDING idemkit:outbox relay | head -1)" = 0 ]
	[ "$(waiting)" = 0 ]
	# the dead relay's consumer is gone; the last one's stays (idle)
	[ "$(rcli XINFO CONSUMERS idemkit:outbox relay | grep -c '^name$')" -eq 1 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 35 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 25 ]
}

@test "redis: the store killed -9 and restarted under a relay --follow: it carries on, no event lost" {
	idemp-outbox --follow --lease 2s --poll 50ms > "$BATS_TEST_TMPDIR/relay" 2>/dev/null 3>&- &
	RELAYS=$!
	for i in $(seq 1 20); do finish "$(uid "a$i")" DONE; done
	wait_for none_waiting
	redis_kill9
	# while the store is down a finish cannot happen (75), so no event is
	# owed for it
	run -75 idemp-claim <<<"$(ev "$(uid down)")"
	redis_restart
	for i in $(seq 1 20); do finish "$(uid "b$i")" DONE; done
	[ "$(rcli XLEN idemkit:outbox)" -eq 40 ]
	wait_for none_waiting
	kill -0 "$RELAYS"
	kill -TERM "$RELAYS"
	rc=0; wait "$RELAYS" || rc=$?
	[ "$rc" -eq 143 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 40 ]
	python3 - "$BATS_TEST_TMPDIR/ev" <<'PY'
import json, sys
seen = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    assert seen.setdefault(e["attr"], e["body"]) == e["body"], e
PY
}

@test "redis: the lag gauge: events waiting and the oldest one's age on the server's clock; 0 once published" {
	run -0 idemp-outbox --stats
	[ "$output" = '{"waiting":0,"oldestWaitingMs":0,"published":0}' ]
	finish "$(uid g1)" DONE
	t0=$(server_ms)
	wait_for server_past $((t0 + 1200))
	finish "$(uid g2)" FAILED
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 2 ]
	[ "$(jget "$st" oldestWaitingMs)" -ge 1200 ]
	[ "$(jget "$st" oldestWaitingMs)" -lt 600000 ]
	# a relay that died after the queue took them: still waiting (pending)
	run -137 env IDEMKIT_TEST_RELAY_CRASH=after-publish idemp-outbox --lease 1s
	st=$(idemp-outbox --stats)
	[ "$(jget "$st" waiting)" = 2 ]
	[ "$(jget "$st" oldestWaitingMs)" -ge 1200 ]
	wait_for idemp-outbox --lease 1s
	[ "$(idemp-outbox --stats)" = '{"waiting":0,"oldestWaitingMs":0,"published":2}' ]
}

@test "redis: the purge trims published entries past the retention (MINID), not younger ones" {
	finish "$(uid p1)" DONE
	finish "$(uid p2)" DONE
	run -0 idemp-outbox
	[ "$(jget "$(idemp-outbox --stats)" published)" = 2 ]
	t0=$(server_ms)
	wait_for server_past $((t0 + 5200))
	finish "$(uid p3)" DONE
	# p3 waits, so the purge (when idle) comes after it is published, and
	# it is younger than the retention: it stays (a retention of 5 s: a
	# loaded sanitizer run took more than 1 s from p3's finish to the
	# purge, and trimmed p3 too)
	run -0 --separate-stderr idemp-outbox --retention 5s
	[ "${#lines[@]}" -eq 1 ]
	[ "$(idemp-outbox --stats)" = '{"waiting":0,"oldestWaitingMs":0,"published":1}' ]
	[ "$(rcli XLEN idemkit:outbox)" = 1 ]
	[ "$(rcli XRANGE idemkit:outbox - + | sed -n 5p)" = "$(uid p3)" ]
	# A relay that died after publishing p4: p4 waits (pending) and is
	# not trimmed; the next relay publishes it again, then purges.
	finish "$(uid p4)" DONE
	run -137 env IDEMKIT_TEST_RELAY_CRASH=after-publish idemp-outbox --lease 1s --retention 0
	[ "$(rcli XLEN idemkit:outbox)" = 2 ]
	wait_for idemp-outbox --lease 1s --retention 0
	[ "$(rcli XLEN idemkit:outbox)" = 0 ]
	[ "$(idemp-outbox --stats)" = '{"waiting":0,"oldestWaitingMs":0,"published":0}' ]
}

@test "redis: with IDEMKIT_CACHE the outbox is the store of record's, not the cache's; a store out of reach is 75, never a finish without its event" {
	# the fast path in front of the SQLite store (was refused, 78)
	export IDEMKIT_CACHE=redis://127.0.0.1:$REDIS_PORT/1
	export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/store.db
	finish "$(uid c1)" DONE
	finish "$(uid c2)" DEBITED_NOTIFICATION_FAILED
	[ "$(jget "$(idemp-outbox --stats)" waiting)" = 2 ]
	[ "$(sqlite3 "$BATS_TEST_TMPDIR/store.db" 'SELECT count(*) FROM outbox')" = 2 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 2 ]
	[ "$(redis-cli -p "$REDIS_PORT" -n 1 EXISTS idemkit:outbox)" = 0 ]
	# in front of a Redis store: the store's stream, not the cache's database
	export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
	finish "$(uid c3)" DONE
	[ "$(rcli XLEN idemkit:outbox)" = 1 ]
	[ "$(redis-cli -p "$REDIS_PORT" -n 1 EXISTS idemkit:outbox)" = 0 ]
	[ "$(redis-cli -p "$REDIS_PORT" -n 1 HGET "idemkit:cache:$(uid c3)" state)" = DONE ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 1 ]
	# the store out of reach: whether it keeps an outbox is not known, so
	# the step leaves the message for a retry (75), it does not claim
	run -75 --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:1 idemp-claim < <(ev "$(uid c4)")
	[ "$(jget "$output" claim.outcome)" = TEMPFAIL ]
	run -75 env IDEMKIT_STORE=redis://127.0.0.1:1 idemp-outbox
}

@test "redis: the relay refuses a volatile server (78) as every command does" {
	redis_start vol --appendfsync everysec
	run -78 --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_vol idemp-outbox
	[[ "$stderr" == *"appendfsync is everysec, not always"* ]]
	run -78 --separate-stderr env IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT_vol idemp-outbox --stats
	redis_stop vol
}

@test "redis: a failover to a replica (?wait=1): the events and the checkpoints were replicated, the relay on the promoted replica publishes only what waits" {
	redis_start replica --replicaof 127.0.0.1 "$REDIS_PORT"
	wait_for sh -c "redis-cli -p $REDIS_PORT_replica INFO replication | grep -q master_link_status:up"
	export IDEMKIT_STORE="redis://127.0.0.1:$REDIS_PORT?wait=1"
	for i in $(seq 1 10); do finish "$(uid "f$i")" DONE; done
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 10 ]
	for i in $(seq 11 15); do finish "$(uid "f$i")" DONE; done
	redis_kill9
	rcli replica REPLICAOF NO ONE >/dev/null
	export IDEMKIT_STORE="redis://127.0.0.1:$REDIS_PORT_replica"
	[ "$(waiting)" = 5 ]
	run -0 --separate-stderr idemp-outbox
	[ "${#lines[@]}" -eq 5 ]
	events > "$BATS_TEST_TMPDIR/ev"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/ev")" -eq 15 ]
	[ "$(ids "$BATS_TEST_TMPDIR/ev" | uniq | wc -l)" -eq 15 ]
}
