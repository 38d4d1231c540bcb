#!/usr/bin/env bats
# The store suite: the claim/finish contract of DESIGN.md, driven through
# idemp-claim and idemp-done, backend-agnostic (IDEMKIT_TEST_BACKEND picks
# the store; see helper.bash).  Every case here must pass on every backend.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

# one server for the file (one cache emptied by each test on
# sqlite-cache): the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() { store_backend_setup_file; }
teardown_file() { store_backend_teardown_file; }
setup() { store_backend_setup; }
teardown() { bank_stop; }

@test "first claim acquires with attempt 1; a second is DUP_IN_PROGRESS with the holder's lease" {
	id=$(uid a)
	run --separate-stderr idemp-claim < <(ev "$id")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$output" claim.attempt)" = 1 ]
	[ "$(jget "$output" claim.chargeId)" = "$id" ]
	token=$(jget "$output" claim.token)
	[[ "$token" =~ ^[0-9a-f]{32}@[A-Za-z0-9._-]+:[0-9]+$ ]]   # random, then the holder
	lease=$(jget "$output" claim.leaseUntil)

	run --separate-stderr idemp-claim --lease 45s < <(ev "$id")
	[ "$status" -eq 11 ]
	[ "$(jget "$output" claim.outcome)" = DUP_IN_PROGRESS ]
	[ "$(jget "$output" claim.leaseUntil)" = "$lease" ]
	[ -z "$(jget "$output" claim.token)" ]
	# the holder's whole lease (the default 120 s, not the 45 s asked
	# here), from two times the one clock that runs the lease wrote
	[ "$(jget "$output" claim.holderLeaseMs)" = 120000 ]
}

@test "DONE -> 10, FAILED -> 12, DEBITED_NOTIFICATION_FAILED -> 10" {
	for pair in DONE:10 FAILED:12 DEBITED_NOTIFICATION_FAILED:10; do
		state=${pair%:*} want=${pair#*:}
		id=$(uid "$state")
		ev "$id" | idemp-claim 2>/dev/null | idemp-done --state "$state" >/dev/null
		run --separate-stderr idemp-claim < <(ev "$id")
		[ "$status" -eq "$want" ]
		[ "$(jget "$output" claim.state)" = "$state" ]
	done
}

@test "a finished record stays finished after its old lease ran out: DONE -> 10, FAILED -> 12, DNF -> 10, record unchanged" {
	pairs="DONE:10:DUP_DONE FAILED:12:DUP_FAILED DEBITED_NOTIFICATION_FAILED:10:DUP_DONE"
	# the three finished first, so one wait lets all three old leases run out
	for pair in $pairs; do
		IFS=: read -r state want outcome <<<"$pair"
		id=$(uid "late$state")
		ev "$id" | idemp-claim --lease 1s 2>/dev/null | idemp-done --state "$state" >/dev/null
		idemp-show --json "$id" > "$BATS_TEST_TMPDIR/before-$state"
		[ "$(jget "$(cat "$BATS_TEST_TMPDIR/before-$state")" state)" = "$state" ]
	done
	sleep 1.3
	for pair in $pairs; do
		IFS=: read -r state want outcome <<<"$pair"
		id=$(uid "late$state")
		before=$(cat "$BATS_TEST_TMPDIR/before-$state")
		run --separate-stderr idemp-claim --lease 1s < <(ev "$id")
		echo "$state: status $status: $output"
		[ "$status" -eq "$want" ]
		[ "$(jget "$output" claim.outcome)" = "$outcome" ]
		[ -z "$(jget "$output" claim.token)" ]
		after=$(idemp-show --json "$id")
		[ "$(jget "$after" state)" = "$state" ]
		[ "$(jget "$after" attempts)" = 1 ]
		[ "$(jget "$after" attempts)" = "$(jget "$before" attempts)" ]
		[ -n "$(jget "$after" owner)" ]
		[ "$(jget "$after" owner)" = "$(jget "$before" owner)" ]
	done
}

@test "derived state: declined -> FAILED, notify failed -> DNF, both OK -> DONE, with ref and error" {
	id=$(uid d1)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	run --separate-stderr idemp-done <<<"${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-1\"},\"notify\":{\"outcome\":\"OK\"}}"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.state)" = DONE ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = DONE ]
	[ "$(jget "$output" debitRef)" = TXN-1 ]

	id=$(uid d2)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	run --separate-stderr idemp-done <<<"${env%\}},\"debit\":{\"outcome\":\"DECLINED\",\"error\":\"HTTP 402: insufficient funds\"}}"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.state)" = FAILED ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = FAILED ]
	[ "$(jget "$output" lastError)" = "HTTP 402: insufficient funds" ]

	id=$(uid d3)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	run --separate-stderr idemp-done <<<"${env%\}},\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-3\"},\"notify\":{\"outcome\":\"NOTIFY_FAILED\",\"error\":\"HTTP 503\"}}"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.state)" = DEBITED_NOTIFICATION_FAILED ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = DEBITED_NOTIFICATION_FAILED ]
	[ "$(jget "$output" debitRef)" = TXN-3 ]
	[ "$(jget "$output" lastError)" = "HTTP 503" ]
}

@test "lease expiry: a reclaim gets attempt 2; the old token's idemp-done is 13 and changes nothing" {
	id=$(uid lease)
	old=$(ev "$id" | idemp-claim --lease 1s 2>/dev/null)
	[ "$(jget "$old" claim.attempt)" = 1 ]
	sleep 1.2
	run --separate-stderr idemp-claim --lease 60s < <(ev "$id")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 2 ]
	new_token=$(jget "$output" claim.token)
	[ "$new_token" != "$(jget "$old" claim.token)" ]
	before=$(idemp-show --json "$id")

	run --separate-stderr idemp-done --state DONE <<<"$old"
	[ "$status" -eq 13 ]
	[ "$(jget "$output" done.outcome)" = LEASE_LOST ]
	after=$(idemp-show --json "$id")
	[ "$(jget "$after" state)" = IN_PROGRESS ]
	[ "$(jget "$after" owner)" = "$new_token" ]
	[ "$(jget "$after" attempts)" = 2 ]
	[ "$(jget "$after" updatedAt)" = "$(jget "$before" updatedAt)" ]
}

@test "lease boundary through the port: a claim at exactly leaseUntil is refused, at leaseUntil + 1 it passes (C unit test; the server's clock on postgres and redis)" {
	run "$IDEMKIT_TEST_BIN/store_lease_edge" "$IDEMKIT_STORE" "$(uid edge)"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = PASSED ]
	if grep -q '^not ok' <<<"$output"; then false; fi
}

@test "same chargeId, different amount -> 14 on a live record and on an expired one" {
	id=$(uid mm)
	ev "$id" 2500 | idemp-claim --lease 1s >/dev/null 2>&1
	run --separate-stderr idemp-claim < <(ev "$id" 2600)
	[ "$status" -eq 14 ]
	[ "$(jget "$output" claim.outcome)" = PAYLOAD_MISMATCH ]
	sleep 1.2
	run --separate-stderr idemp-claim < <(ev "$id" 2600)
	[ "$status" -eq 14 ]
	# the original payload can still reclaim the expired lease
	run --separate-stderr idemp-claim < <(ev "$id" 2500)
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 2 ]
}

@test "mismatch beats duplicate on a finished record (different account)" {
	id=$(uid mmd)
	ev "$id" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	run --separate-stderr idemp-claim < <(ev "$id" 2500 ACC-OTHER)
	[ "$status" -eq 14 ]
}

@test "50 concurrent idemp-claim on one chargeId: exactly one 0, the rest 11 (5 rounds)" {
	for round in 1 2 3 4 5; do
		id=$(uid "race$round")
		dir=$BATS_TEST_TMPDIR/r$round
		mkdir -p "$dir"
		ev "$id" > "$dir/ev"
		pids=
		for i in $(seq 1 50); do
			( rc=0; idemp-claim < "$dir/ev" > "$dir/out$i" 2>/dev/null || rc=$?; echo $rc > "$dir/rc$i" ) &
			pids="$pids $!"
		done
		# shellcheck disable=SC2086
		wait $pids   # (not a bare wait: bats' own timeout watchdog is a child too)
		zeros=$(cat "$dir"/rc* | grep -cx 0 || true)
		elevens=$(cat "$dir"/rc* | grep -cx 11 || true)
		echo "round $round: zeros=$zeros elevens=$elevens $(cat "$dir"/rc* | sort | uniq -c | tr '\n' ' ')"
		[ "$zeros" -eq 1 ]
		[ "$elevens" -eq 49 ]
		run idemp-show --json "$id"
		[ "$(jget "$output" attempts)" = 1 ]
	done
}

@test "finish twice: the second is LEASE_LOST (state no longer IN_PROGRESS)" {
	id=$(uid twice)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	idemp-done --state DONE <<<"$env" >/dev/null
	run --separate-stderr idemp-done --state FAILED <<<"$env"
	[ "$status" -eq 13 ]
	run idemp-show --json "$id"
	[ "$(jget "$output" state)" = DONE ]
}

@test "idemp-list filters by state, expiry and age" {
	a=$(uid la) b=$(uid lb) c=$(uid lc)
	ev "$a" | idemp-claim --lease 1s >/dev/null 2>&1
	ev "$b" | idemp-claim 2>/dev/null | idemp-done --state DEBITED_NOTIFICATION_FAILED >/dev/null
	ev "$c" | idemp-claim >/dev/null 2>&1
	sleep 1.2
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED
	[ "$status" -eq 0 ]
	[[ "$output" == *"\"chargeId\":\"$b\""* ]]
	[[ "$output" != *"\"chargeId\":\"$a\""* ]]
	run --separate-stderr idemp-list --expired
	[ "$status" -eq 0 ]
	[[ "$output" == *"\"chargeId\":\"$a\""* ]]
	[[ "$output" != *"\"chargeId\":\"$c\""* ]]
	run --separate-stderr idemp-list --state FAILED --older-than 1h
	[ "$status" -eq 1 ]
	[ -z "$output" ]
}

@test "idemp-forget deletes only FAILED records; the charge can then be claimed afresh" {
	f=$(uid forgetf) d=$(uid forgetd)
	ev "$f" | idemp-claim 2>/dev/null | idemp-done --state FAILED >/dev/null
	ev "$d" | idemp-claim 2>/dev/null | idemp-done --state DONE >/dev/null
	run --separate-stderr idemp-forget "$d"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"state is DONE; only FAILED records can be forgotten"* ]]
	[ "$(jget "$(idemp-show --json "$d")" state)" = DONE ]
	run --separate-stderr idemp-forget "$f"
	[ "$status" -eq 0 ]
	[ "$output" = "$f: forgotten (was FAILED)" ]
	[[ "$stderr" == *'"level":"audit"'* ]]
	run --separate-stderr idemp-claim < <(ev "$f")
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.attempt)" = 1 ]
	run --separate-stderr idemp-forget "$(uid nothing)"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"no record"* ]]
}

# The record's history (issue 17 item 3): the transitions in order, each
# with the store's clock; refused claims and stale finishes add nothing.
@test "history: claim, release, reclaim, a stale finish refused, finish -> four entries in order, on every store" {
	id=$(uid hist)
	env1=$(ev "$id" | idemp-claim --lease 60s 2>/dev/null)
	tok1=$(jget "$env1" claim.token)
	# charge-debit left it for lack of lease: idemp-done releases the claim
	left=$(jq -c '.debit = {"outcome": "LEASE_SHORT"}' <<<"$env1")
	run --separate-stderr idemp-done <<<"$left"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" done.released)" = True ]
	env2=$(ev "$id" | idemp-claim --lease 60s 2>/dev/null)
	tok2=$(jget "$env2" claim.token)
	[ "$(jget "$env2" claim.attempt)" = 2 ]
	# refused: a duplicate claim, and the first holder's finish
	run idemp-claim < <(ev "$id")
	[ "$status" -eq 11 ]
	run idemp-done --state DONE <<<"$env1"
	[ "$status" -eq 13 ]
	ok=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); e["debit"]={"outcome":"OK","ref":"BNK-H1"}; e["notify"]={"outcome":"OK"}; print(json.dumps(e))' "$env2")
	run --separate-stderr idemp-done <<<"$ok"
	[ "$status" -eq 0 ]
	show=$(idemp-show --json "$id")
	python3 - "$show" "$tok1" "$tok2" <<'PY'
import json, sys
r, t1, t2 = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
h = r["history"]
assert [e["op"] for e in h] == ["claim", "release", "claim", "finish"], h
assert [e.get("owner") for e in h] == [t1, t1, t2, t2], h
assert h[0]["attempt"] == 1 and h[2]["attempt"] == 2, h
assert all(e["leaseUntil"] > e["at"] for e in h if e["op"] == "claim"), h
ats = [e["at"] for e in h]
assert ats == sorted(ats) and all(a > 1.7e12 for a in ats), ats
assert h[3]["state"] == "DONE" and h[3]["debitRef"] == "BNK-H1" and h[3]["error"] is None, h
assert r["state"] == "DONE" and r["attempts"] == 2, r
PY
	# the human view shows the timeline
	run --separate-stderr idemp-show "$id"
	[ "$status" -eq 0 ]
	[[ "$output" == *claim*release*claim*finish* ]]
	[[ "$output" == *BNK-H1* ]]
}

@test "history: a renotified record says so; the history keeps the last 20 transitions" {
	id=$(uid hren)
	env=$(ev "$id" | idemp-claim 2>/dev/null)
	dnf=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); e["debit"]={"outcome":"OK","ref":"BNK-H2"}; e["notify"]={"outcome":"NOTIFY_FAILED","error":"gateway 503"}; print(json.dumps(e))' "$env")
	idemp-done <<<"$dnf" >/dev/null
	# the re-drive's envelope, as charge-recover gets it, now notified
	rec=$(idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope | grep -F "\"$id\"")
	[ "$(jget "$rec" recovery.chargeId)" = "$id" ]
	run --separate-stderr idemp-done --renotified <<<"${rec%\}},\"notify\":{\"outcome\":\"OK\"}}"
	[ "$status" -eq 0 ]
	python3 - "$(idemp-show --json "$id")" <<'PY'
import json, sys
h = json.loads(sys.argv[1])["history"]
assert [e["op"] for e in h] == ["claim", "finish", "renotified"], h
assert h[1]["state"] == "DEBITED_NOTIFICATION_FAILED" and h[1]["error"] == "gateway 503", h
assert h[2]["state"] == "DONE", h
PY
	# 12 claims, each released: 24 transitions, the last 20 kept
	id=$(uid hmax)
	for i in $(seq 12); do
		e=$(ev "$id" | idemp-claim 2>/dev/null)
		[ "$(jget "$e" claim.attempt)" = "$i" ]
		jq -c '.debit = {"outcome": "LEASE_SHORT"}' <<<"$e" | idemp-done >/dev/null
	done
	python3 - "$(idemp-show --json "$id")" <<'PY'
import json, sys
h = json.loads(sys.argv[1])["history"]
assert len(h) == 20, len(h)
assert [e["op"] for e in h] == ["claim", "release"] * 10, h
assert h[0]["attempt"] == 3 and h[-2]["attempt"] == 12, h
PY
}

@test "note: a TEMPFAIL or CONFIG debit's reason is kept in the record, fenced by the owner token, lease and history untouched (issue 29 item 1)" {
	id=$(uid note)
	env1=$(ev "$id" | idemp-claim --lease 1s 2>/dev/null)
	before=$(idemp-show --json "$id")
	tf=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); e["debit"]={"outcome":"TEMPFAIL","error":"HTTP 503 from the bank \u00e9"}; print(json.dumps(e))' "$env1")
	run --separate-stderr idemp-done <<<"$tf"
	[ "$status" -eq 75 ]
	[ "$(jget "$output" debit.outcome)" = TEMPFAIL ]
	[ -z "$(jget "$output" done.outcome)" ]   # passed on untouched
	after=$(idemp-show --json "$id")
	python3 - "$before" "$after" <<'PY'
import json, sys
b, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["lastError"] == "TEMPFAIL from the bank: HTTP 503 from the bank \u00e9 (the lease decides the retry)", a
assert a["state"] == "IN_PROGRESS" and a["owner"] == b["owner"], a
for k in ("leaseUntil", "attempts", "history", "updatedAt"):
    assert a[k] == b[k], (k, b[k], a[k])
PY
	run --separate-stderr idemp-show "$id"
	[[ "$output" == *"last error   TEMPFAIL from the bank: HTTP 503"* ]]
	# CONFIG too
	cf=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); e["debit"]={"outcome":"CONFIG","error":"HTTP 401"}; print(json.dumps(e))' "$env1")
	run --separate-stderr idemp-done <<<"$cf"
	[ "$status" -eq 78 ]
	[ "$(jget "$(idemp-show --json "$id")" lastError)" = "CONFIG from the bank: HTTP 401 (the lease decides the retry)" ]
	# fenced: once another run holds the charge, the first run's note
	# changes nothing (the new claim cleared the reason)
	for _ in $(seq 1 200); do
		idemp-list --expired 2>/dev/null | grep -qF "\"$id\"" && break
		sleep 0.1
	done
	env2=$(ev "$id" | idemp-claim --lease 60s 2>/dev/null)
	[ "$(jget "$env2" claim.attempt)" = 2 ]
	[ "$(jget "$(idemp-show --json "$id")" lastError)" = "" ]
	run --separate-stderr idemp-done <<<"$tf"
	[ "$status" -eq 75 ]
	[ "$(jget "$(idemp-show --json "$id")" lastError)" = "" ]
	[ "$(jget "$(idemp-show --json "$id")" owner)" = "$(jget "$env2" claim.token)" ]
}

@test "history: a debit the bank answered as a replay (a crash window) says so in the finish entry and idemp-show; the run's summary counts it, on every store (issue 29 item 8)" {
	bank_start
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	# bank-sim marks a replay as Stripe does; said here, as an operator would.
	export IDEMKIT_BANK_REPLAY_HEADER='Idempotent-Replayed: true'
	id=$(uid repl)
	# The crash window: the debit reached the bank, the worker died before
	# idemp-done (its envelope is dropped here), the 5 s lease runs out
	# (four and a half seconds of it before the 500 ms call: a loaded
	# machine or a sanitizer build starts charge-debit slowly; a local
	# clean-clone sanitizer pass on DynamoDB spent 1.65 s of a 2 s one
	# before its lease check: LEASE_SHORT).
	ev "$id" | idemp-claim --lease 5s 2>/dev/null | charge-debit --timeout 500ms --lease-margin 0 >/dev/null
	[ "$(bank_stat debits)" -eq 1 ]
	for _ in $(seq 1 200); do
		idemp-list --expired 2>/dev/null | grep -qF "\"$id\"" && break
		sleep 0.1
	done
	idemp-list --expired | grep -qF "\"$id\""
	# The redelivery: debited again with the same key, answered as a replay.
	ev "$id" | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain --debit-timeout 2 --notify-timeout 1 --notify-retries 1 --lease 15s
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"debited":1,'*'"bankReplays":1,'* ]]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat replays)" -eq 1 ]
	python3 - "$(idemp-show --json "$id")" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
h = r["history"]
assert [e["op"] for e in h] == ["claim", "claim", "finish"], h
assert h[2]["state"] == "DONE" and h[2]["bankReplayed"] is True, h
assert all("bankReplayed" not in e for e in h[:2]), h
assert r["state"] == "DONE" and r["attempts"] == 2 and r["debitRef"], r
PY
	run --separate-stderr idemp-show "$id"
	[ "$status" -eq 0 ]
	[[ "$output" == *" finish "*"DONE, bank ref TXN-"*" (replayed by the bank), error -"* ]]
	# a first-time debit's finish says nothing of a replay
	id2=$(uid norepl)
	ev "$id2" | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain --debit-timeout 2 --notify-timeout 1 --notify-retries 1 --lease 15s
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"bankReplays":0,'* ]]
	python3 - "$(idemp-show --json "$id2")" <<'PY'
import json, sys
h = json.loads(sys.argv[1])["history"]
assert [e["op"] for e in h] == ["claim", "finish"] and "bankReplayed" not in h[1], h
PY
	[[ "$(idemp-show "$id2")" != *replayed* ]]
}

@test "one decision, one clock: a worker whose wall clock is 30 s slow never debits after its 5 s lease was taken over (issue 24 item 4)" {
	slow_or_skip charge-debit
	bank_start
	id=$(uid clock)
	# Where the store's clock runs the lease (postgres, redis) the whole
	# worker is slow; where the workers' clocks run it (sqlite, dynamodb:
	# idemkit(7) asks for NTP there) its clock steps back after the claim.
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	postgres|redis) claim_clock=slow ;;
	*) claim_clock= ;;
	esac
	a=$(ev "$id" | $claim_clock idemp-claim --lease 5s 2>/dev/null)
	[ "$(jget "$a" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$a" claim.leaseMs)" = 5000 ]
	# Another worker takes the charge over once the lease ended on the
	# clock that runs it, and debits it.
	for _ in $(seq 150); do
		b=$(ev "$id" | idemp-claim --lease 60s 2>/dev/null) && break
		sleep 0.1
	done
	[ "$(jget "$b" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$b" claim.attempt)" = 2 ]
	run --separate-stderr charge-debit --timeout 1s --lease-margin 1s <<<"$b"
	[ "$status" -eq 0 ]
	# The first, late: its lease is over on every clock but its own wall
	# clock, where leaseUntil is still about 25 s away.  Nothing is sent.
	run --separate-stderr slow charge-debit --timeout 1s --lease-margin 1s <<<"$a"
	echo "$output"
	[ "$status" -eq 15 ]
	[ "$(jget "$output" debit.outcome)" = LEASE_SHORT ]
	[[ "$(jget "$output" debit.error)" =~ ^"the claim's lease ended "[0-9]+"ms ago" ]]
	[ "$(bank_stat attempts)" -eq 1 ]
	[ "$(ledger_debits)" -eq 1 ]
}

# (idemp-claim --stream on a fifo: helper.bash's stream_start; the group
# path on SQLite and Redis, claims in flight on PostgreSQL and DynamoDB)
@test "--stream: a copy next to its original in the same pipeline waits there for the original's finish (DUP_DONE, not left on the queue); another process's claim is DUP_IN_PROGRESS at once; the envelopes after the copy go on meanwhile" {
	id=$(uid hold)
	ev "$id-other" | idemp-claim >/dev/null 2>&1
	stream_start
	{ ev "$id-1"; ev "$id-1"; ev "$id-2"; ev "$id-other"; } >&5
	stream_lines 3
	orig=$(grep -e "\"$id-1\"" "$STREAM_OUT")
	# the original finished first, the checks after: the copy is held at
	# most 5 s, which a loaded sanitized run can spend on the checks
	run --separate-stderr idemp-done --state DONE <<<"$orig"
	[ "$status" -eq 0 ]
	[ "$(jget "$orig" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$(grep -e "\"$id-2\"" "$STREAM_OUT")" claim.outcome)" = ACQUIRED ]
	[ "$(jget "$(grep -e "\"$id-other\"" "$STREAM_OUT")" claim.outcome)" = DUP_IN_PROGRESS ]
	# nothing of the hold leaves the process
	run ! grep -q hold-ms "$STREAM_OUT"
	stream_lines 4
	copy=$(sed -n 4p "$STREAM_OUT")
	[ "$(jget "$copy" claim.chargeId)" = "$id-1" ]
	[ "$(jget "$copy" claim.outcome)" = DUP_DONE ]
	run ! grep -q hold-ms "$STREAM_OUT"
	exec 5>&-
	wait "$CLAIM_PID"
	run idemp-show --json "$id-1"
	[ "$(jget "$output" attempts)" = 1 ]
	[ "$(jget "$output" owner)" = "$(jget "$orig" claim.token)" ]
}

# idemp-claim --check-store is what charge-worker asks before it receives:
# it must use the store as a claim would (connect, authenticate, read the
# table), not only parse its URL -- PostgreSQL and DynamoDB connect on
# first use, so an open alone said 0 for a store no claim could use.
@test "--check-store uses the store as a claim would: one no claim can use is 78 and why, and charge-worker --drain stops there with the message still queued" {
	run -0 --separate-stderr idemp-claim --check-store
	case ${IDEMKIT_TEST_BACKEND:-sqlite} in
	sqlite|sqlite-cache)
		printf 'these bytes are not a SQLite database, whatever the name says; not at all\n' \
			> "$BATS_TEST_TMPDIR/bad.db"
		export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/bad.db why='not a database' ;;
	postgres)
		# TLS asked for, from a server that has none (the tests' has none)
		export IDEMKIT_STORE=$IDEMKIT_STORE\&sslmode=verify-full why='SSL' ;;
	dynamodb|dynamodb-local)
		export IDEMKIT_STORE=dynamodb:absent-$$ why="absent-$$" ;;
	redis)
		export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT/99 why='database 99' ;;
	esac
	run -78 --separate-stderr idemp-claim --check-store
	[[ "$stderr" == *"$why"* ]]
	if [ "${IDEMKIT_TEST_BACKEND:-}" = postgres ]; then   # connected, no table
		IDEMKIT_STORE=$PG_URL?table=absent_$$ run -78 --separate-stderr idemp-claim --check-store
		[[ "$stderr" == *"absent_$$"* ]]
	fi
	ev "$(uid chk)" | sqs-send >/dev/null
	run -78 --separate-stderr charge-worker --drain
	[[ "$stderr" == *"$why"* ]]
	[[ "$stderr" == *"nothing was received"* ]]
	run -0 sqs-stat
	[[ "$output" == *'"visible":1,"inflight":0'* ]]
}
