#!/usr/bin/env bats
# sqs-recv on the embedded default queue (no configuration at all): every
# exit code it documents.  Backend semantics are in tests/queue.bats.

bats_require_minimum_version 1.5.0
load helper
load lock

@test "sqs-recv: 0 with the embedded default queue, file created 0600" {
	echo '{"chargeId":"CHG-1"}' | sqs-send >/dev/null
	run --separate-stderr sqs-recv
	[ "$status" -eq 0 ]
	[ "$(jget "$output" queue)" = "sqlite:$IDEMKIT_STATE_DIR/queue.db#charges" ]
	[ "$(jget "$output" body)" = '{"chargeId":"CHG-1"}' ]
	[ "$(stat -c %a "$IDEMKIT_STATE_DIR/queue.db")" = 600 ]
}

@test "sqs-recv: --max takes up to N, one envelope per line" {
	seq 1 5 | sqs-send >/dev/null
	run sqs-recv --max 3
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	run sqs-recv --max 10
	[ "${#lines[@]}" -eq 2 ]
}

@test "sqs-recv: --drain takes everything there is, then ends" {
	seq 1 23 | sqs-send >/dev/null
	run sqs-recv --max 10 --drain
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 23 ]
	run sqs-recv --drain
	[ "$status" -eq 1 ]
	run sqs-recv --drain --follow
	[ "$status" -eq 64 ]
}

@test "sqs-recv: 1 when nothing arrived, also after a short --wait" {
	run sqs-recv --wait 1
	[ "$status" -eq 1 ]
	[ -z "$output" ]
}

@test "sqs-recv: --wait returns as soon as a message arrives" {
	echo late | sqs-send --delay 1 >/dev/null
	start=$(date +%s%3N)
	run sqs-recv --wait 5
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = late ]
	[ $(( $(date +%s%3N) - start )) -lt 3000 ]
}

@test "sqs-recv: 64 on a bad command line" {
	run sqs-recv --max 11
	[ "$status" -eq 64 ]
	[[ "$output" == *"--max"* ]]
	run sqs-recv --wait 21
	[ "$status" -eq 64 ]
	run sqs-recv --visibility -1
	[ "$status" -eq 64 ]
	run sqs-recv extra
	[ "$status" -eq 64 ]
	[[ "$output" == "usage: sqs-recv"* ]]
}

@test "sqs-recv: 70 when stdout is closed, and the message is visible again at once" {
	echo precious | sqs-send >/dev/null
	run bash -c 'sqs-recv --visibility 300 >&-'
	[ "$status" -eq 70 ]
	[[ "$output" == *"returning 1 message(s) to the queue"* ]]
	run sqs-recv
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = precious ]
	[ "$(jget "$output" receiveCount)" = 2 ]
}

@test "sqs-recv: 75 when the queue is busy" {
	echo x | sqs-send >/dev/null
	hold_write_lock "$IDEMKIT_STATE_DIR/queue.db"
	IDEMKIT_BUSY_TIMEOUT=100ms run sqs-recv
	kill "$LOCK_PID" 2>/dev/null || true
	[ "$status" -eq 75 ]
	[[ "$output" == "sqs-recv: sqlite queue "*"locked"* ]]
}

@test "sqs-recv: 78 on a malformed queue URL or an unusable file" {
	run sqs-recv --queue 'sqlite:/tmp/q.db'
	[ "$status" -eq 78 ]
	[ "$output" = "sqs-recv: queue URL 'sqlite:/tmp/q.db': no #NAME after the path; expected sqlite:PATH#NAME, an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME) or amqp[s]://USER@HOST[:PORT][/VHOST]#QUEUE (RabbitMQ)" ]
	IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/nodir/q.db#main" run sqs-recv
	[ "$status" -eq 78 ]
	run sqs-recv --queue "sqlite:$BATS_TEST_TMPDIR/q.db#main?maxReceiveCount=3"
	[ "$status" -eq 78 ]
	[[ "$output" == *"maxReceiveCount needs dlq=NAME"* ]]
}

@test "sqs-recv: queue parameters are stored for later users of the queue" {
	q="sqlite:$BATS_TEST_TMPDIR/q.db#main"
	echo a | sqs-send --queue "$q?visibility=1" >/dev/null
	sqs-recv --queue "$q" >/dev/null       # the stored default: 1 s
	sleep 1.1
	run sqs-recv --queue "$q"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
}

@test "sqs-recv: retention drops messages older than it" {
	q="sqlite:$BATS_TEST_TMPDIR/q.db#main?retention=1s"
	echo old | sqs-send --queue "$q" >/dev/null
	sleep 1.1
	run sqs-recv --queue "$q"
	[ "$status" -eq 1 ]
}

@test "sqs-recv: SIGTERM during --follow: 143, no output lost" {
	sqs-recv --follow >"$BATS_TEST_TMPDIR/out" 3>&- &
	pid=$!
	sleep 0.3
	printf '%s\n' one two | sqs-send >/dev/null
	sleep 0.5
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 143 ]
	[ "$(wc -l <"$BATS_TEST_TMPDIR/out")" -eq 2 ]
}

@test "sqs-recv: --help lists the exit codes; --version" {
	run sqs-recv --help
	[ "$status" -eq 0 ]
	[[ "$output" == "usage: sqs-recv "* ]]
	[[ "$output" == *"  75  TEMPFAIL"* ]]
	run sqs-recv --version
	[ "$status" -eq 0 ]
	[[ "$output" == "sqs-recv (idemkit) "* ]]
}

@test "--window N --acked FILE: never more than N messages held ahead of the acks" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/w.db#charges"
	for i in $(seq 1 30); do echo "m$i"; done | sqs-send >/dev/null
	: > "$BATS_TEST_TMPDIR/acked"
	sqs-recv --max 10 --drain --window 5 --acked "$BATS_TEST_TMPDIR/acked" > "$BATS_TEST_TMPDIR/got" 2>/dev/null 3>&- &
	pid=$!
	sleep 0.5
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 10 ]   # one receive of 10 (the window is at least --max)
	head -3 "$BATS_TEST_TMPDIR/got" >> "$BATS_TEST_TMPDIR/acked"
	sleep 0.3
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 10 ]   # 7 held + 10 > 10: still waiting
	head -10 "$BATS_TEST_TMPDIR/got" | tail -7 >> "$BATS_TEST_TMPDIR/acked"
	sleep 0.3
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 20 ]
	# ack everything as it comes: the receiver takes the last 10, then its
	# next receive finds the queue empty and --drain ends
	for _ in $(seq 1 50); do
		cp "$BATS_TEST_TMPDIR/got" "$BATS_TEST_TMPDIR/acked"
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then kill "$pid"; false; fi
	wait "$pid"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 30 ]
	run sqs-recv --window 5
	[ "$status" -eq 64 ]
}

# acked FILE N: the first N envelopes of got, as sqs-ack writes them (deleted).
acked() {
	head -"$2" "$BATS_TEST_TMPDIR/got" | sed 's/}$/,"ack":{"action":"delete","verdict":"OK","outcome":"OK"}}/' > "$1.new"
	cat "$1.new" >> "$1"
}

# held REASON ACKED: waits (up to 30 s) for the receiver's debug line saying
# it holds for REASON with ACKED acks read, and prints how many it had
# handed out then (the file is counted after the line: the receiver hands
# out nothing more while it holds, so the count is what it had).
held() {
	local line="\"msg\":\"held\",\"step\":\"recv\",\"reason\":\"$1\","
	for _ in $(seq 300); do
		grep -q "$line.*\"acked\":$2}" "$BATS_TEST_TMPDIR/err" && break
		sleep 0.1
	done
	grep "$line" "$BATS_TEST_TMPDIR/err" | grep -q "\"acked\":$2}" || {
		echo "no 'held $1' line after $2 acks:" >&2; grep -v '"received"' "$BATS_TEST_TMPDIR/err" >&2; return 1; }
	wc -l < "$BATS_TEST_TMPDIR/got"
}

@test "--max-age DUR --acked FILE: nothing more while one in flight is older; then no more than the ack rate finishes in DUR" {
	# Each phase waits for the receiver's own "held" line (IDEMKIT_LOG=debug),
	# never a fixed sleep: a loaded machine only makes it slower.  With a
	# --max-age of 4 s one in flight is given up on after 9 s (twice the
	# age and a second), the margin a stalled machine has between phases.
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/w.db#charges"
	for i in $(seq 1 40); do echo "m$i"; done | sqs-send >/dev/null
	: > "$BATS_TEST_TMPDIR/acked"
	IDEMKIT_LOG=debug sqs-recv --max 10 --follow --wait 1 --window 100 --max-age 4s \
		--acked "$BATS_TEST_TMPDIR/acked" > "$BATS_TEST_TMPDIR/got" 2>"$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	# before any ack: one batch, however wide the window
	[ "$(held 'first batch' 0)" -eq 10 ]
	# the oldest in flight older than 4 s: nothing, whatever is acked
	[ "$(held max-age 0)" -eq 10 ]
	acked "$BATS_TEST_TMPDIR/acked" 2
	[ "$(held max-age 2)" -eq 10 ]
	# all acked (the first two again: counted once): a rate that finishes a few in 4 s lets more in, far fewer
	# than the window's 100, and holds again
	acked "$BATS_TEST_TMPDIR/acked" 10
	got=$(held 'ack rate' 10)
	kill "$pid"; wait "$pid" || true
	[ "$got" -gt 10 ]; [ "$got" -lt 40 ]
	run ! grep -q 'no longer waited for' "$BATS_TEST_TMPDIR/err"
	run sqs-recv --max-age 1s
	[ "$status" -eq 64 ]
	run sqs-recv --acked "$BATS_TEST_TMPDIR/acked" --max-age soon
	[ "$status" -eq 64 ]
}

@test "--settle DUR: a receive that brings nothing waits for a copy left that is due back within DUR, not for one due later" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/s.db#charges"
	echo m1 | sqs-send >/dev/null
	sqs-recv --visibility 2 > "$BATS_TEST_TMPDIR/got"
	# sqs-ack left it, visible again in 2 s
	sed 's/}$/,"ack":{"action":"leave-backoff","verdict":"TEMPFAIL","outcome":"OK","visibility":2}}/' \
		"$BATS_TEST_TMPDIR/got" > "$BATS_TEST_TMPDIR/acked"
	run --separate-stderr sqs-recv --wait 0 --acked "$BATS_TEST_TMPDIR/acked" --settle 1s
	[ "$status" -eq 1 ]        # due in 2 s, later than 1 s: not waited for
	run --separate-stderr sqs-recv --wait 1 --acked "$BATS_TEST_TMPDIR/acked" --settle 30s
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = m1 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
	# once sqs-ack settled it (deleted), there is nothing to wait for
	sed 's/}$/,"ack":{"action":"delete","verdict":"OK","outcome":"OK"}}/' <<<"$output" >> "$BATS_TEST_TMPDIR/acked"
	run --separate-stderr sqs-recv --wait 0 --acked "$BATS_TEST_TMPDIR/acked" --settle 30s
	[ "$status" -eq 1 ]
	run sqs-recv --settle 1s
	[ "$status" -eq 64 ]
}

@test "--settle (the drain's wait): a copy left with a backoff longer than the receive's grace (--wait + 2 s) is waited for, and received when it is due" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/g.db#charges"
	echo m1 | sqs-send >/dev/null
	sqs-recv --visibility 6 > "$BATS_TEST_TMPDIR/got"
	# sqs-ack left it, visible again in 6 s: past --wait 1 + 2 s of grace,
	# within --settle 30s (a slip of seconds for milliseconds makes it due
	# "a moment ago", and the drain gives up on it after the grace)
	sed 's/}$/,"ack":{"action":"leave-backoff","verdict":"TEMPFAIL","outcome":"OK","visibility":6}}/' \
		"$BATS_TEST_TMPDIR/got" > "$BATS_TEST_TMPDIR/acked"
	run --separate-stderr sqs-recv --wait 1 --acked "$BATS_TEST_TMPDIR/acked" --settle 30s
	[ "$status" -eq 0 ]
	[ "$(jget "$output" body)" = m1 ]
	[ "$(jget "$output" receiveCount)" = 2 ]
}

@test "--drain --settle: the messages in flight are waited for by their acks; a copy an ack left is received again when due; the drain ends with the last ack" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/d.db#charges"
	printf 'm1\nm2\nm3\n' | sqs-send >/dev/null
	: > "$BATS_TEST_TMPDIR/acked"
	# --wait 0, as charge-worker drains the embedded queue
	sqs-recv --drain --max 10 --wait 0 --acked "$BATS_TEST_TMPDIR/acked" --settle 30s \
		> "$BATS_TEST_TMPDIR/got" 2> "$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	for _ in $(seq 1 100); do [ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -ge 3 ] && break; sleep 0.1; done
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 3 ]
	sleep 1
	kill -0 "$pid"             # three in flight: not the end
	# sqs-ack deletes m1 and m2 and leaves m3, visible again in 1 s
	sed -n '1,2s/}$/,"claim":{"outcome":"DUP_DONE"}}/p' "$BATS_TEST_TMPDIR/got" |
		sqs-ack --stream >> "$BATS_TEST_TMPDIR/acked"
	sed -n '3s/}$/,"claim":{"outcome":"TEMPFAIL"}}/p' "$BATS_TEST_TMPDIR/got" |
		sqs-ack --backoff-base 1 --backoff-cap 1 >> "$BATS_TEST_TMPDIR/acked"
	[ "$(jget "$(sed -n 3p "$BATS_TEST_TMPDIR/acked")" ack.visibility)" = 1 ]
	for _ in $(seq 1 100); do [ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -ge 4 ] && break; sleep 0.1; done
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 4 ]
	last=$(sed -n 4p "$BATS_TEST_TMPDIR/got")
	[ "$(jget "$last" body)" = m3 ]
	[ "$(jget "$last" receiveCount)" = 2 ]
	sleep 0.5
	kill -0 "$pid"             # m3 in flight again
	sed 's/}$/,"claim":{"outcome":"DUP_DONE"}}/' <<<"$last" | sqs-ack >> "$BATS_TEST_TMPDIR/acked"
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	run kill -0 "$pid"
	[ "$status" -ne 0 ]
	wait "$pid"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 4 ]
	run sqs-recv
	[ "$status" -eq 1 ]        # all three deleted
}

@test "--max-age: a message in flight for twice DUR (a step lost it) no longer stops the receiving" {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/l.db#charges"
	for i in $(seq 1 20); do echo "m$i"; done | sqs-send >/dev/null
	: > "$BATS_TEST_TMPDIR/acked"
	sqs-recv --max 10 --follow --wait 1 --max-age 1s --acked "$BATS_TEST_TMPDIR/acked" \
		> "$BATS_TEST_TMPDIR/got" 2> "$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	for _ in $(seq 1 100); do [ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -ge 20 ] && break; sleep 0.1; done
	kill "$pid"; wait "$pid" || true
	[ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -eq 20 ]
	grep -q "in flight for twice --max-age; no longer waited for" "$BATS_TEST_TMPDIR/err"
}
