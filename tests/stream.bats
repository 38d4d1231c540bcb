#!/usr/bin/env bats
# --stream and its group commit (step.h): the same outcomes as one-shot on
# the same input, one winner per chargeId under concurrent streams, a lone
# envelope out at once (no waiting for EOF), and a group that cannot
# commit redone line by line.

bats_require_minimum_version 1.5.0
load helper
load lock

setup() { export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db; pid=; }
teardown() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; }

# The mixed input: new, duplicate in flight, invalid JSON, invalid event,
# payload mismatch, an envelope already claimed upstream, a bare envelope.
mixed() {
	ev CHG-S1
	ev CHG-S2
	ev CHG-S3
	ev CHG-S4
	ev CHG-S1
	echo 'not json'
	echo '{"chargeId":"CHG-S5","accountId":"ACC-1","amount":12.5,"currency":"INR","chargeType":"FEE"}'
	ev CHG-S2 9999
	echo '{"v":1,"messageId":"m-up","body":"{}","claim":{"outcome":"DUP_DONE","chargeId":"CHG-UP"}}'
	printf '{"v":1,"messageId":"m-6","receiveCount":1,"body":%s}\n' \
		"$(ev CHG-S6 | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')"
	ev CHG-S3
}

# The bank's and the notifier's answers, by chargeId: S3 is declined, S4's
# notification fails, the rest go through.  Not-acquired envelopes pass.
bank() {
	python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    c = e.get("claim", {})
    if c.get("outcome") == "ACQUIRED":
        k = c["chargeId"]
        e["debit"] = {"outcome": "DECLINED", "error": "no funds"} if k == "CHG-S3" else {"outcome": "OK", "ref": "TXN-" + k}
        if k != "CHG-S3":
            e["notify"] = {"outcome": "NOTIFY_FAILED", "error": "HTTP 503"} if k == "CHG-S4" else {"outcome": "OK"}
    print(json.dumps(e), flush=True)'
}

# One line per envelope: what each step decided (no tokens or times).
outcomes() {
	python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    c, d = e.get("claim", {}), e.get("done", {})
    print(e.get("messageId", "-"), c.get("outcome"), c.get("chargeId"), c.get("state"),
          c.get("attempts"), d.get("outcome"), d.get("state"))'
}

records() {
	idemp-list | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["chargeId"], r["state"], r["attempts"], r.get("debitRef"), r.get("lastError"))' | sort
}

# each STEP ARGS... < IN: the step one-shot, one process per line.
each() {
	while IFS= read -r line; do
		printf '%s\n' "$line" | "$@" 2>/dev/null || true
	done
}

@test "stream and one-shot give the same outcomes on the same input, line by line" {
	t=$BATS_TEST_TMPDIR
	mixed > "$t/in"
	# one-shot: one process per envelope, step after step
	export IDEMKIT_STORE=sqlite:$t/one.db
	each idemp-claim < "$t/in" | bank > "$t/one.claimed"
	each idemp-done < "$t/one.claimed" > "$t/one.done"
	each idemp-claim < "$t/in" > "$t/one.again"     # the redelivery
	records > "$t/one.records"
	# stream: the whole input at once, so the claims form groups (a copy
	# of a charge claimed in this stream is held for its original, which
	# is finished only later here: passed on once its time is up, 1 s
	# before a 2 s lease ends, so it leaves last)
	export IDEMKIT_STORE=sqlite:$t/stream.db
	idemp-claim --stream --lease 2s < "$t/in" 2>/dev/null | bank > "$t/stream.claimed"
	idemp-done --stream < "$t/stream.claimed" > "$t/stream.done" 2>/dev/null
	idemp-claim --stream < "$t/in" > "$t/stream.again" 2>/dev/null
	records > "$t/stream.records"

	[ "$(wc -l < "$t/stream.done")" -eq 11 ]
	for f in claimed done again; do
		outcomes < "$t/one.$f" > "$t/one.$f.o"
		outcomes < "$t/stream.$f" > "$t/stream.$f.o"
		diff <(sort "$t/one.$f.o") <(sort "$t/stream.$f.o")
	done

	diff "$t/one.records" "$t/stream.records"
	# and they are the expected outcomes, not merely equal ones
	run cut -d' ' -f2,3,6,7 "$t/stream.done.o"
	[ "${lines[0]}" = "ACQUIRED CHG-S1 OK DONE" ]
	[ "${lines[1]}" = "ACQUIRED CHG-S2 OK DONE" ]
	[ "${lines[2]}" = "ACQUIRED CHG-S3 OK FAILED" ]
	[ "${lines[3]}" = "ACQUIRED CHG-S4 OK DEBITED_NOTIFICATION_FAILED" ]
	[ "${lines[4]}" = "DATAERR None None None" ]
	[ "${lines[5]}" = "DATAERR None None None" ]
	[ "${lines[6]}" = "PAYLOAD_MISMATCH CHG-S2 None None" ]
	[ "${lines[7]}" = "DUP_DONE CHG-UP None None" ]
	[ "${lines[8]}" = "ACQUIRED CHG-S6 OK DONE" ]
	[ "${lines[9]}" = "DUP_IN_PROGRESS CHG-S1 None None" ]
	[ "${lines[10]}" = "DUP_IN_PROGRESS CHG-S3 None None" ]
	run cut -d' ' -f2,3 "$t/stream.again.o"
	[ "${lines[0]}" = "DUP_DONE CHG-S1" ]
	[ "${lines[2]}" = "DUP_FAILED CHG-S3" ]
	[ "${lines[3]}" = "DUP_DONE CHG-S4" ]
	[ "${lines[7]}" = "PAYLOAD_MISMATCH CHG-S2" ]
	run cat "$t/stream.records"
	[ "${lines[0]}" = "CHG-S1 DONE 1 TXN-CHG-S1 None" ]
	[ "${lines[2]}" = "CHG-S3 FAILED 1 None no funds" ]
	[ "${lines[3]}" = "CHG-S4 DEBITED_NOTIFICATION_FAILED 1 TXN-CHG-S4 HTTP 503" ]
}

@test "group commit: concurrent streams on one store, exactly one winner per chargeId" {
	for i in $(seq 1 300); do ev "CHG-W$i"; done > "$BATS_TEST_TMPDIR/ids"
	pids=
	for p in 1 2 3 4; do
		# a line-buffered writer, so the groups come in all sizes
		shuf "$BATS_TEST_TMPDIR/ids" | awk '{ print; fflush() }' \
			| idemp-claim --stream > "$BATS_TEST_TMPDIR/w$p.out" 2>/dev/null 3>&- &
		pids="$pids $!"
	done
	for p in $pids; do wait "$p"; done
	cat "$BATS_TEST_TMPDIR"/w*.out > "$BATS_TEST_TMPDIR/all"
	[ "$(wc -l < "$BATS_TEST_TMPDIR/all")" -eq 1200 ]
	run python3 -c '
import json, sys, collections
won, other = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    c = json.loads(line)["claim"]
    if c["outcome"] == "ACQUIRED": won[c["chargeId"]] += 1
    else: other[c["outcome"]] += 1
print(len(won), max(won.values()), dict(other))' "$BATS_TEST_TMPDIR/all"
	echo "$output"
	grep -v '"outcome":"\(ACQUIRED\|DUP_IN_PROGRESS\)"' "$BATS_TEST_TMPDIR/all" | head -3
	[ "$output" = "300 1 {'DUP_IN_PROGRESS': 900}" ]
	run records
	[ "${#lines[@]}" -eq 300 ]
	for l in "${lines[@]}"; do [[ "$l" == *" IN_PROGRESS 1 None None" ]]; done
}

@test "a lone envelope comes out at once, before EOF; a line split across writes too" {
	mkfifo "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out"
	idemp-claim --stream < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	exec 6< "$BATS_TEST_TMPDIR/out"
	ev CHG-L1 >&5
	IFS= read -r -t 5 -u 6 answer
	[ "$(jget "$answer" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$answer" claim.chargeId)" = CHG-L1 ]
	line=$(ev CHG-L2)
	printf '%s' "${line:0:20}" >&5
	sleep 0.2
	printf '%s\n' "${line:20}" >&5
	IFS= read -r -t 5 -u 6 answer
	[ "$(jget "$answer" claim.chargeId)" = CHG-L2 ]
	kill -0 "$pid"          # still waiting for more
	exec 5>&-
	IFS= read -r -t 5 -u 6 answer || true
	[ -z "$answer" ]
	exec 6<&-
	wait "$pid"
}

@test "idemp-done --stream: a lone envelope is recorded and out at once" {
	mkfifo "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out"
	env=$(ev CHG-L3 | idemp-claim 2>/dev/null)
	idemp-done --stream --state DONE < "$BATS_TEST_TMPDIR/in" > "$BATS_TEST_TMPDIR/out" 2>/dev/null 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	exec 6< "$BATS_TEST_TMPDIR/out"
	printf '%s\n' "$env" >&5
	IFS= read -r -t 5 -u 6 answer
	[ "$(jget "$answer" done.outcome)" = OK ]
	run idemp-show --json CHG-L3
	[ "$(jget "$output" state)" = DONE ]
	exec 5>&- 6<&-
	wait "$pid"
}

@test "a group that cannot commit is redone line by line: each TEMPFAIL, nothing recorded" {
	mkfifo "$BATS_TEST_TMPDIR/in" "$BATS_TEST_TMPDIR/out"
	IDEMKIT_BUSY_TIMEOUT=100ms idemp-claim --stream < "$BATS_TEST_TMPDIR/in" \
		> "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err" 3>&- &
	pid=$!
	exec 5> "$BATS_TEST_TMPDIR/in"
	exec 6< "$BATS_TEST_TMPDIR/out"
	ev CHG-G0 >&5            # the store is open from here on
	IFS= read -r -t 5 -u 6 answer
	[ "$(jget "$answer" claim.outcome)" = ACQUIRED ]
	group=$(ev CHG-G1; ev CHG-G2; ev CHG-G3)
	hold_write_lock "$BATS_TEST_TMPDIR/s.db"
	printf '%s\n' "$group" >&5     # one write: the three form one group
	for i in 1 2 3; do
		IFS= read -r -t 5 -u 6 answer
		[ "$(jget "$answer" claim.outcome)" = TEMPFAIL ]
		[ "$(jget "$answer" claim.chargeId)" = "CHG-G$i" ]
	done
	kill "$LOCK_PID" 2>/dev/null || true
	wait "$LOCK_PID" 2>/dev/null || true
	grep -q "group commit failed; redoing each alone" "$BATS_TEST_TMPDIR/err"
	run idemp-show CHG-G1
	[ "$status" -eq 1 ]
	# once the store is free again, the same lines go through
	printf '%s\n' "$group" >&5
	for i in 1 2 3; do
		IFS= read -r -t 5 -u 6 answer
		[ "$(jget "$answer" claim.outcome)" = ACQUIRED ]
	done
	exec 5>&- 6<&-
	wait "$pid"
}

@test "envelopes and log lines are the bytes cJSON prints, integers without its %g round trip (C unit test)" {
	run "$IDEMKIT_TEST_BIN/json_print"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = ok ]
}
