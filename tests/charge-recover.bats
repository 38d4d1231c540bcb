#!/usr/bin/env bats
# charge-recover: the three cron recovery jobs against bank-sim and the
# embedded queue.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=warn
}
teardown() { bank_stop; }

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 0 --lease 15s)
state() { jget "$(idemp-show --json "$1" 2>/dev/null)" state; }
qvisible() { sqs-stat "$@" | sed -n 's/.*"visible":\([0-9]*\).*/\1/p'; }

@test "usage: one mode is required; --help; nothing to do -> 1" {
	run charge-recover
	[ "$status" -eq 64 ]
	run charge-recover --renotify --redrive
	[ "$status" -eq 64 ]
	run charge-recover --help
	[ "$status" -eq 0 ]
	# no store yet: 78 naming where it looked, not "nothing to do"
	run --separate-stderr charge-recover --renotify
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"no store at "* ]]
	idemp-init >/dev/null
	run --separate-stderr charge-recover --renotify
	[ "$status" -eq 1 ]
	[[ "$stderr" == *'"found":0'* ]]
}

@test "--renotify: notification re-sent, record DONE, no second debit; a failing gateway leaves it (75)" {
	bank_start --notify-fail
	event CHG-RN | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>/dev/null
	[ "$(state CHG-RN)" = DEBITED_NOTIFICATION_FAILED ]
	sleep 0.1
	run --separate-stderr charge-recover --renotify --older-than 50ms --notify-retries 0
	[ "$status" -eq 75 ]
	[ "$(state CHG-RN)" = DEBITED_NOTIFICATION_FAILED ]
	bank_post /control '{"notifyFail":false}' >/dev/null
	run --separate-stderr charge-recover --renotify --older-than 50ms
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":1,"renotified":1'* ]]
	[ "$(state CHG-RN)" = DONE ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat attempts)" -eq 1 ]
}

@test "--redrive: a charge whose worker died after the debit is re-enqueued and finished once" {
	bank_start
	# the worker dies after the debit: claimed and debited, never recorded or acked
	# (a 3 s lease: the sanitizer build on a loaded machine took 650 ms
	# from the claim to charge-debit's lease check, past a 1 s lease's room
	# for a 500 ms call)
	event CHG-RD | idemp-claim --lease 3s 2>/dev/null | charge-debit --timeout 500ms --lease-margin 0 >/dev/null
	[ "$(bank_stat debits)" -eq 1 ]
	sleep 3.2
	run --separate-stderr charge-recover --redrive --older-than 1s
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":1,"requeued":1'* ]]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[ "$(state CHG-RD)" = DONE ]
	[ "$(jget "$(idemp-show --json CHG-RD)" attempts)" = 2 ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat replays)" -eq 1 ]
}

@test "--redrive: a pretty-printed stored event goes back as ONE message, not one per line" {
	bank_start
	pretty=$(event CHG-PR | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), indent=2))')
	[ "$(printf '%s\n' "$pretty" | wc -l)" -eq 8 ]
	# an envelope whose body (from a publisher that pretty-prints) spans lines
	python3 -c 'import json,sys; print(json.dumps({"v": 1, "body": sys.argv[1]}))' "$pretty" \
		| idemp-claim --lease 3s 2>/dev/null | charge-debit --timeout 500ms --lease-margin 0 >/dev/null
	[ "$(jget "$(idemp-show --json CHG-PR)" event)" = "$pretty" ]
	sleep 3.2
	run --separate-stderr charge-recover --redrive --older-than 1s
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":1,"requeued":1'* ]]
	[ "$(qvisible)" = 1 ]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"received":1,'* ]]
	[[ "$stderr" == *'"invalid":0,'* ]]
	[ "$(state CHG-PR)" = DONE ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(bank_stat replays)" -eq 1 ]
	[ "$(qvisible --queue "$IDEMKIT_DLQ")" = 0 ]
}

@test "--dlq after a fix: a declined charge is forgotten, re-driven, then debited" {
	bank_start --decline ACC-POOR
	{ event CHG-DQ ACC-POOR; echo; } | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>/dev/null
	[ "$(state CHG-DQ)" = FAILED ]
	[ "$(qvisible --queue "$IDEMKIT_DLQ")" = 1 ]
	bank_post /control '{"decline":[]}' >/dev/null
	idemp-forget CHG-DQ >/dev/null 2>&1
	run --separate-stderr charge-recover --dlq
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":1,"requeued":1'* ]]
	[ "$(qvisible --queue "$IDEMKIT_DLQ")" = 0 ]
	charge-worker --drain "${fast[@]}" 2>/dev/null
	[ "$(state CHG-DQ)" = DONE ]
	[ "$(bank_stat debits)" -eq 1 ]
}

@test "a second run of the same job while one holds the lock exits 1" {
	exec 9>>"$IDEMKIT_STATE_DIR/charge-recover-redrive.lock" 2>/dev/null || { mkdir -p "$IDEMKIT_STATE_DIR"; exec 9>>"$IDEMKIT_STATE_DIR/charge-recover-redrive.lock"; }
	flock -n 9
	run --separate-stderr charge-recover --redrive
	exec 9>&-
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"another --redrive run is active"* ]]
}

@test "--dlq finds the DLQ sqs-ack fills, as the C commands resolve it (IDEMKIT_QUEUE=...#orders, no IDEMKIT_DLQ)" {
	bank_start
	unset IDEMKIT_DLQ
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#orders"
	echo '{"chargeId":"CHG-OQ","amount":1.5}' | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>/dev/null
	[ "$(qvisible --queue "sqlite:$BATS_TEST_TMPDIR/q.db#orders-dlq")" = 1 ]
	run --separate-stderr charge-recover --dlq
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"found":1,"requeued":1'* ]]
	[ "$(qvisible --queue "sqlite:$BATS_TEST_TMPDIR/q.db#orders-dlq")" = 0 ]
	[ "$(qvisible)" = 1 ]
}

@test "idemp-list --format envelope carries the debit as recorded: a declined charge's envelope is no notification (bank-sim), a DNF one is" {
	bank_start --decline ACC-POOR --notify-fail
	{ event CHG-EF ACC-POOR; echo; event CHG-EN ACC-RICH; echo; } | sqs-send >/dev/null
	charge-worker --drain "${fast[@]}" 2>/dev/null
	[ "$(state CHG-EF)" = FAILED ]
	[ "$(state CHG-EN)" = DEBITED_NOTIFICATION_FAILED ]
	bank_post /control '{"notifyFail":false}' >/dev/null
	n0=$(bank_stat notifications)
	# what the record says: FAILED is the bank's refusal, DNF the money moved
	run --separate-stderr idemp-list --state FAILED --format envelope
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.outcome)" = DECLINED ]
	[ "$(jget "$output" recovery.state)" = FAILED ]
	run --separate-stderr idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope
	[ "$(jget "$output" debit.outcome)" = OK ]
	[ "$(jget "$output" debit.ref)" = "$(jget "$(idemp-show --json CHG-EN)" debitRef)" ]
	# the operator's slip: the FAILED list through charge-notify tells nobody
	run --separate-stderr sh -c 'idemp-list --state FAILED --format envelope | charge-notify'
	[ "$status" -eq 20 ]
	[ "$(jget "$output" notify)" = "" ]
	[ "$(bank_stat notifications)" -eq "$n0" ]
	# nor does an envelope that says "debit OK" for a FAILED record (an older
	# idemp-list, a hand-made line): the record's state decides
	bad=$(idemp-list --state FAILED --format envelope | sed 's/"debit":{[^}]*}/"debit":{"outcome":"OK"}/')
	[ "$(jget "$bad" debit.outcome)" = OK ]
	run --separate-stderr charge-notify <<< "$bad"
	[ "$status" -eq 65 ]
	[ "$(jget "$output" notify.outcome)" = DATAERR ]
	[[ "$(jget "$output" notify.error)" == *"not DONE or DEBITED_NOTIFICATION_FAILED"* ]]
	[ "$(bank_stat notifications)" -eq "$n0" ]
	# the DNF one is notified and becomes DONE
	run --separate-stderr sh -c 'idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope |
		charge-notify --stream | idemp-done --stream --renotified'
	[ "$status" -eq 0 ]
	[ "$(jget "$output" notify.outcome)" = OK ]
	[ "$(state CHG-EN)" = DONE ]
	[ "$(state CHG-EF)" = FAILED ]
	[ "$(bank_stat notifications)" -eq $((n0 + 1)) ]
}
