#!/usr/bin/env bats
# RabbitMQ (AMQP 0-9-1) as the queue: what the queue suite cannot show
# (tests/queue.bats runs on it too, IDEMKIT_TEST_QUEUE_BACKEND=amqp).  How
# the promises are kept is idemkit(7) "RabbitMQ": a holder child keeps a
# receiver's deliveries on its connection; sqs-ack settles through it.
# One broker for the file (an Erlang start costs CPU seconds).

bats_require_minimum_version 1.5.0
load helper
load bank_helper
load rabbit_helper

BATS_NO_PARALLELIZE_WITHIN_FILE=true

# the broker has a TLS listener too (amqps://), its certificate from a
# throwaway CA
setup_file() {
	require_rabbit
	export RABBIT_TLS=$BATS_FILE_TMPDIR/tls
	rabbit_tls_certs "$RABBIT_TLS"
	rabbit_start
}
teardown_file() { rabbit_stop; }

setup() {
	require_rabbit
	name=t${BATS_TEST_NUMBER}x$$x$RANDOM
	export IDEMKIT_QUEUE IDEMKIT_DLQ
	IDEMKIT_QUEUE=$(rabbit_url "$name" "visibility=30")
	IDEMKIT_DLQ=$(rabbit_url "$name-dlq")
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=warn
}
teardown() {
	# a test that stopped the broker (SIGSTOP) and failed before it went on
	[ -z "${stopped:-}" ] || kill -CONT "$stopped" 2>/dev/null || true
	bank_stop
}

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 0 --lease 15s)
summary() { grep '"summary":true' <<<"$stderr"; }
FINISHED='{"claim":{"outcome":"ACQUIRED","chargeId":"CHG-1","token":"t","attempt":1,"leaseUntil":1},"debit":{"outcome":"OK","ref":"TXN-1"},"notify":{"outcome":"OK"},"done":{"outcome":"OK","state":"DONE"}}'
finished() { sed 's/}$/,'"${FINISHED:1}"'/'; }

# holder_pid RECEIPT: the pid of the holder a receipt names (its socket).
holder_pid() {
	local id=${1#amqp1.}
	id=${id%%.*}
	ss -xlp | sed -n "s/.*@idemkit-amqp-$id .*pid=\([0-9]*\).*/\1/p" | head -1
}

# unacked NAME: the broker's count of queue NAME's deliveries not acked
# (rabbitmqctl: about 1 s of CPU, so once per test): 0 once every settled
# delivery's ack reached the broker.
unacked() {
	rabbit_ctl list_queues -q name messages_unacknowledged | awk -v q="$1" '$1 == q { print $2 }'
}

# until_recv ARGS...: sqs-recv ARGS until it brings a message (at most 20 s).
until_recv() {
	local i
	for i in $(seq 1 100); do
		sqs-recv "$@" && return 0
		sleep 0.2
	done
	return 1
}

@test "amqp: charge-worker --stream -j 2 --drain: duplicates and a poison; every charge debited once, the poison in the DLQ with its reason" {
	bank_start
	for i in $(seq 1 20); do event "CHG-A$i"; echo; done > "$BATS_TEST_TMPDIR/evs"
	cat "$BATS_TEST_TMPDIR/evs" <(head -5 "$BATS_TEST_TMPDIR/evs") <(echo poison) | sqs-send >/dev/null
	run --separate-stderr charge-worker --stream -j 2 --drain "${fast[@]}"
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 20 ]
	[ "$(jget "$(summary)" leftForRetry)" -eq 0 ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	dead=$(sqs-recv --queue "$IDEMKIT_DLQ")
	[ "$(jget "$dead" body)" = poison ]
	[ -n "$(jget "$dead" attributes)" ]
	# settled means acked on the broker, not only answered by the holder
	# (unacked ones would come back when their visibility ends)
	[ "$(unacked "$name")" = 0 ]
}

@test "amqp: the holder killed (kill -9): what it held is delivered again at once, and its receipt is LEASE_LOST (13)" {
	echo '{"chargeId":"CHG-K1"}' | sqs-send >/dev/null
	first=$(sqs-recv --visibility 600)
	run sqs-recv
	[ "$status" -eq 1 ]                 # held
	pid=$(holder_pid "$(jget "$first" receipt)")
	[ -n "$pid" ]
	kill -9 "$pid"
	second=$(until_recv --visibility 30)
	[ "$(jget "$second" messageId)" = "$(jget "$first" messageId)" ]
	[ "$(jget "$second" receiveCount)" = 2 ]
	run --separate-stderr sqs-ack <<<"$(finished <<<"$first")"
	[ "$status" -eq 13 ]
	[ "$(jget "${lines[0]}" ack.outcome)" = LEASE_LOST ]
	run sqs-ack <<<"$(finished <<<"$second")"
	[ "$status" -eq 0 ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
}

@test "amqp: the receiver killed (kill -9) mid-run: its deliveries stay held until their visibility ends, then come back; nothing acked" {
	echo '{"chargeId":"CHG-R1"}' | sqs-send >/dev/null
	sqs-recv --follow --wait 1 --visibility 4 >"$BATS_TEST_TMPDIR/out" 3>&- &
	pid=$!
	for _ in $(seq 1 200); do [ -s "$BATS_TEST_TMPDIR/out" ] && break; sleep 0.05; done
	[ -s "$BATS_TEST_TMPDIR/out" ]
	kill -9 "$pid"
	wait "$pid" || true
	got=$(date +%s%3N)
	run sqs-recv
	[ "$status" -eq 1 ]                 # still held by the holder
	again=$(until_recv --visibility 30)
	[ $(( $(date +%s%3N) - got )) -ge 2000 ]
	[ "$(jget "$again" body)" = '{"chargeId":"CHG-R1"}' ]
	[ "$(jget "$again" receiveCount)" = 2 ]
}

@test "amqp: past its delivery limit a message goes to the DLQ with the broker's reason; charge-recover --dlq re-drives it and it is debited once" {
	bank_start
	export IDEMKIT_QUEUE
	IDEMKIT_QUEUE=$(rabbit_url "$name" "maxReceiveCount=2&dlq=$name-dlq")
	event CHG-L1 | sqs-send >/dev/null
	[ "$(jget "$(sqs-recv --visibility 0)" receiveCount)" = 1 ]
	[ "$(jget "$(until_recv --visibility 0)" receiveCount)" = 2 ]
	dead=$(until_recv --queue "$IDEMKIT_DLQ" --visibility 0)
	[ "$(jget "$dead" attributes.deathReason)" = delivery_limit ]
	[ "$(jget "$dead" attributes.deathQueue)" = "$name" ]
	# the queue dead-letters at least once (the default, at most once,
	# loses a message to a broker that dies in that hop)
	run -0 rabbit_ctl list_queues -q name arguments
	line=$(grep "^$name[[:space:]]" <<<"$output")
	[[ "$line" == *x-dead-letter-strategy*at-least-once* ]]
	[[ "$line" == *x-overflow*reject-publish* ]]
	run sqs-recv
	[ "$status" -eq 1 ]
	run --separate-stderr charge-recover --dlq
	echo "$stderr"
	[ "$status" -eq 0 ]
	run --separate-stderr charge-worker --drain "${fast[@]}"
	echo "$stderr" | tail -2
	[ "$status" -eq 0 ]
	[ "$(bank_stat debits)" -eq 1 ]
	[ "$(idemp-show --json CHG-L1 | sed -n 's/.*"state":"\([A-Z_]*\)".*/\1/p')" = DONE ]
}

@test "amqp: a TEMPFAIL leaves the message held for the backoff (change-visibility), not requeued in a loop" {
	echo '{"chargeId":"CHG-T1"}' | sqs-send >/dev/null
	env=$(sqs-recv --visibility 30)
	run --separate-stderr sqs-ack <<<"$(sed 's/}$/,"claim":{"outcome":"TEMPFAIL"}}/' <<<"$env")"
	[ "$status" -eq 0 ]
	echo "$output"
	[ "$(jget "$output" ack.action)" = leave-backoff ]
	vis=$(jget "$output" ack.visibility)
	at=$(jget "$output" ack.at)
	[ "$vis" -ge 2 ]
	# held: not received again before its backoff ended (a loaded machine
	# may look only after it ended: then the copy is due, and that look
	# must come after the backoff, not before)
	start=$(date +%s%3N)
	run sqs-recv
	if [ "$status" -eq 0 ]; then
		[ $(( start - at )) -ge $(( vis * 1000 - 1000 )) ]
		again=$output
	else
		[ "$status" -eq 1 ]
		again=$(until_recv --visibility 30)
		[ $(( $(date +%s%3N) - at )) -ge $(( vis * 1000 - 1000 )) ]
	fi
	[ "$(jget "$again" receiveCount)" = 2 ]
}

@test "amqp: publisher confirms: the broker restarted, sends while it is down are 75 and lose nothing confirmed; held deliveries come back" {
	seq 1 20 | sqs-send >/dev/null
	held=$(sqs-recv --max 5 --visibility 600 | wc -l)
	[ "$held" -eq 5 ]
	_rabbit_down
	run sqs-send <<<"down"
	[ "$status" -eq 75 ]
	[[ "$output" == *"amqp 127.0.0.1:$RABBIT_PORT"* ]]
	_rabbit_launch
	# quorum queues elect their leader after the start: wait for it
	for _ in $(seq 1 100); do [ "$(jget "$(sqs-stat 2>/dev/null)" visible)" = 20 ] && break; sleep 0.2; done
	[ "$(jget "$(sqs-stat)" visible)" = 20 ]
	run sqs-send <<<"up"
	[ "$status" -eq 0 ]
	[ "$(jget "$(sqs-stat)" visible)" = 21 ]
}

@test "amqp: a disk alarm blocks publishers: the send is 75 (no confirm), and once the alarm clears a send is confirmed" {
	export IDEMKIT_AMQP_TIMEOUT=2s
	rabbit_ctl set_disk_free_limit 100000GB >/dev/null
	run sqs-send <<<"blocked"
	rabbit_ctl set_disk_free_limit 50MB >/dev/null
	[ "$status" -eq 75 ]
	[[ "$output" == *"no publisher confirm"* ]]
	for _ in $(seq 1 50); do
		echo ok | sqs-send >/dev/null 2>&1 && break
		sleep 0.2
	done
	run sqs-send <<<"ok2"
	[ "$status" -eq 0 ]
	# the blocked one may have reached the queue after all (its confirm
	# never came): a copy the chargeId absorbs, never a loss of ok and ok2
	bodies=$(sqs-recv --max 10 --visibility 30 --drain | sed -n 's/.*"body":"\([a-z0-9]*\)".*/\1/p' | sort | tr '\n' ' ')
	[[ "$bodies" == *"ok2 "* ]]
}

@test "amqp: --delay goes through a quorum queue that dead-letters at least once into the queue, and the message arrives after it" {
	echo later | sqs-send --delay 2 >/dev/null
	run -0 rabbit_ctl list_queues -q name type arguments
	line=$(grep "^$name.delayq.2[[:space:]]" <<<"$output")
	[[ "$line" == *quorum* ]]
	[[ "$line" == *x-dead-letter-strategy*at-least-once* ]]
	[[ "$line" == *x-overflow*reject-publish* ]]
	[[ "$line" == *x-dead-letter-routing-key*"$name"* ]]
	out=$(until_recv)
	[ "$(jget "$out" body)" = later ]
}

@test "amqp: every connection cut mid-run (rabbitmqctl close_all_connections): nothing lost, every charge debited once" {
	# the bank stopped (SIGSTOP: the worker's requests wait in its listen
	# queue) until the cut is done, so the cut comes while the worker holds
	# deliveries whose debits are under way however long rabbitmqctl takes
	# to start (a 4 s latency was not enough at load 10: the worker, 30
	# debits in flight at once, had settled all before the cut)
	bank_start
	N=30
	for i in $(seq 1 "$N"); do event "CHG-C$i"; echo; done | sqs-send >/dev/null
	slow=(--debit-timeout 120 --notify-timeout 60 --notify-retries 0 --lease 300s)
	kill -STOP "$BANK_PID"; stopped=$BANK_PID
	charge-worker --stream -j 2 --drain "${slow[@]}" >/dev/null 2>"$BATS_TEST_TMPDIR/w1" 3>&- &
	w=$!
	# once the worker holds some
	for _ in $(seq 1 300); do [ "$(jget "$(sqs-stat)" visible)" -lt "$N" ] && break; sleep 0.1; done
	[ "$(jget "$(sqs-stat)" visible)" -lt "$N" ]
	rabbit_ctl close_all_connections "test cut" >/dev/null
	kill -CONT "$BANK_PID"; stopped=
	rc=0; wait "$w" || rc=$?
	echo "first run: $rc"; tail -5 "$BATS_TEST_TMPDIR/w1"
	# it came mid-batch: settles refused (the deliveries went back to the
	# broker with the connection), counted, the run 75
	[ "$rc" -eq 75 ]
	[ "$(jget "$(grep '"summary":true' "$BATS_TEST_TMPDIR/w1")" ackFailed)" -gt 0 ]
	# what was held when the connections went is delivered again: a
	# second run settles it (DUP_DONE for what the first one finished)
	run --separate-stderr charge-worker --stream -j 2 --drain "${slow[@]}"
	echo "$stderr" | tail -3
	[ "$status" -eq 0 ] || [ "$status" -eq 1 ]
	[ "$(bank_stat debits)" -eq "$N" ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	[ "$(idemp-list --state DONE | wc -l)" -eq "$N" ]
	[ "$(unacked "$name")" = 0 ]
}

@test "amqps: a send, receive and ack over TLS, the broker's certificate checked against IDEMKIT_AMQP_CACERT; another CA, another host name or no CA is 78, a failed handshake 75" {
	local tls="amqps://guest@localhost:$RABBIT_TLS_PORT"
	export IDEMKIT_QUEUE="$tls#$name?visibility=30" IDEMKIT_DLQ="$tls#$name-dlq"
	export IDEMKIT_AMQP_CACERT=$RABBIT_TLS/ca.pem
	# the TLS listener starts beside the plain one
	for _ in $(seq 1 100); do (exec 2>/dev/null; echo > "/dev/tcp/127.0.0.1/$RABBIT_TLS_PORT") && break; sleep 0.1; done
	run sqs-send <<<'{"chargeId":"CHG-T1"}'
	[ "$status" -eq 0 ]
	got=$(sqs-recv)
	[ "$(jget "$got" body)" = '{"chargeId":"CHG-T1"}' ]
	run sqs-ack <<<"$(finished <<<"$got")"
	[ "$status" -eq 0 ]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	# it was the TLS port: the plain listener's queue is the same one
	IDEMKIT_QUEUE=$(rabbit_url "$name") run sqs-stat
	[ "$output" = '{"visible":0,"inflight":0,"delayed":0}' ]
	# a CA that did not sign the broker's certificate (same name, other key)
	IDEMKIT_AMQP_CACERT=$RABBIT_TLS/other-ca.pem run sqs-send <<<'{"chargeId":"CHG-T2"}'
	[ "$status" -eq 78 ]
	[[ "$output" == *"amqp localhost:$RABBIT_TLS_PORT"*"not signed by the CA in IDEMKIT_AMQP_CACERT"* ]]
	[[ "$output" != *guest* ]]
	IDEMKIT_AMQP_CACERT=$RABBIT_TLS/other-ca.pem run sqs-recv
	[ "$status" -eq 78 ]
	# the certificate names localhost, not 127.0.0.1
	IDEMKIT_QUEUE="amqps://guest@127.0.0.1:$RABBIT_TLS_PORT#$name" run sqs-send <<<'{"chargeId":"CHG-T3"}'
	[ "$status" -eq 78 ]
	[[ "$output" == *"does not name the URL's host"* ]]
	IDEMKIT_AMQP_CACERT= run sqs-send <<<'{"chargeId":"CHG-T4"}'
	[ "$status" -eq 78 ]
	[[ "$output" == *"needs IDEMKIT_AMQP_CACERT"* ]]
	# amqps:// on the plain listener: a handshake that fails is for later
	# (75, as a broker restarting mid-handshake is), not a certificate to fix
	IDEMKIT_QUEUE="amqps://guest@localhost:$RABBIT_PORT#$name" run sqs-send <<<'{"chargeId":"CHG-T5"}'
	[ "$status" -eq 75 ]
	[[ "$output" == *"TLS handshake failed"* ]]
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
}

@test "amqp: a receive takes only what it asked for: one-shot receivers one after the other each get a message never delivered before (maxReceiveCount=2, nothing dead-lettered)" {
	# a consumer whose prefetch went past the receive's --max would take
	# more than it hands out and return the rest as its receiver ends; on
	# a quorum queue each return counts toward the delivery limit, so
	# messages nobody worked on would reach the DLQ after two such runs
	export IDEMKIT_QUEUE
	IDEMKIT_QUEUE=$(rabbit_url "$name" "maxReceiveCount=2&dlq=$name-dlq")
	seq 1 6 | sqs-send >/dev/null
	for _ in $(seq 1 6); do
		out=$(sqs-recv --max 1 --wait 2 --visibility 600)
		[ "$(jget "$out" receiveCount)" = 1 ]
		jget "$out" body >> "$BATS_TEST_TMPDIR/bodies"
	done
	[ "$(sort -u "$BATS_TEST_TMPDIR/bodies" | wc -l)" -eq 6 ]
	run sqs-recv --queue "$IDEMKIT_DLQ"
	[ "$status" -eq 1 ]
}

# alive PID: PID runs (a zombie not yet reaped does not).
alive() {
	[ -e "/proc/$1/stat" ] && [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

@test "amqp: a draining receiver whose connection was cut and whose reader is gone ends, and its holder too (it does not wait out --settle)" {
	seq 1 3 | sqs-send >/dev/null
	: > "$BATS_TEST_TMPDIR/acked"
	mkfifo "$BATS_TEST_TMPDIR/fifo"
	IDEMKIT_LOG=debug sqs-recv --drain --max 10 --wait 1 --visibility 30 --acked "$BATS_TEST_TMPDIR/acked" \
		--settle 120s >"$BATS_TEST_TMPDIR/fifo" 2>"$BATS_TEST_TMPDIR/err" 3>&- &
	r=$!
	cat "$BATS_TEST_TMPDIR/fifo" >"$BATS_TEST_TMPDIR/out" 3>&- &
	c=$!
	for _ in $(seq 1 200); do [ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -ge 3 ] && break; sleep 0.05; done
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 3 ]
	holder=$(holder_pid "$(jget "$(head -1 "$BATS_TEST_TMPDIR/out")" receipt)")
	[ -n "$holder" ]
	# the pipeline died (its reader gone; nothing will ack the three) and
	# the connection was cut
	kill "$c"
	wait "$c" || true
	rabbit_ctl close_all_connections "test cut" >/dev/null
	# The cut is this test's premise, so it is checked: the broker lists
	# no connection.  (A loaded run saw the holder live on past the bound
	# below and end soon after: as a holder whose connection was never cut
	# does, when its deliveries' visibility ends; its log was not kept.)
	for _ in 1 2 3; do
		conns=$(rabbit_ctl list_connections -q pid state)
		[ -z "$conns" ] && break
		echo "still connected after the cut: $conns"
		rabbit_ctl close_all_connections "test cut again" >/dev/null
	done
	for _ in $(seq 1 150); do
		{ alive "$r" || alive "$holder"; } || break
		sleep 0.1
	done
	if alive "$r" || alive "$holder"; then
		ps -o pid,stat,time,args -p "$r,$holder" || true
		cat "$BATS_TEST_TMPDIR/err"
		false
	fi
	wait "$r" || true
	# what they held went back to the queue with the connection
	for _ in $(seq 1 100); do [ "$(jget "$(sqs-stat)" visible)" = 3 ] && break; sleep 0.1; done
	[ "$(jget "$(sqs-stat)" visible)" = 3 ]
}

@test "amqp: heartbeats (IDEMKIT_AMQP_HEARTBEAT=1s): a broker gone silent (SIGSTOP, a half-open connection) is seen by an idle holder, which lets go of what it held; a bad value is 78" {
	IDEMKIT_AMQP_HEARTBEAT=1.5s run sqs-recv
	[ "$status" -eq 78 ]
	[[ "$output" == *IDEMKIT_AMQP_HEARTBEAT* ]]
	export IDEMKIT_AMQP_HEARTBEAT=1s
	echo '{"chargeId":"CHG-H1"}' | sqs-send >/dev/null
	first=$(sqs-recv --visibility 600)
	holder=$(holder_pid "$(jget "$first" receipt)")
	[ -n "$holder" ]
	# idle, holding one: still there after more than two heartbeats (it
	# answers the broker's)
	sleep 3
	alive "$holder"
	# the broker falls silent without closing anything: only the missing
	# heartbeats tell; the holder drops the connection and ends (its
	# receiver is gone, it holds nothing any more)
	beam=$(_rabbit_beam)
	[ -n "$beam" ]
	stopped=$beam
	kill -STOP "$beam"
	for _ in $(seq 1 100); do alive "$holder" || break; sleep 0.1; done
	kill -CONT "$beam"
	stopped=
	if alive "$holder"; then false; fi
	# the broker, back, delivers it again; the old receipt is LEASE_LOST
	second=$(until_recv --visibility 30)
	[ "$(jget "$second" messageId)" = "$(jget "$first" messageId)" ]
	[ "$(jget "$second" receiveCount)" = 2 ]
	run sqs-ack <<<"$(finished <<<"$first")"
	[ "$status" -eq 13 ]
}

@test "amqp: IDEMKIT_LOG=debug: the holder logs each delivery, return (and why), visibility move and ack by message id, into a file, never a receipt key or the password; a pipe is not kept open" {
	log=$BATS_TEST_TMPDIR/holder.log
	echo '{"chargeId":"CHG-D1"}' | sqs-send >/dev/null
	first=$(IDEMKIT_LOG=debug sqs-recv --visibility 1 2>>"$log")
	id=$(jget "$first" messageId)
	# returned when its visibility ends (1 s), by the holder that outlives
	# the receiver
	for _ in $(seq 1 100); do grep -q '"msg":"returned".*"reason":"visibility ended"' "$log" && break; sleep 0.1; done
	second=$(IDEMKIT_LOG=debug sqs-recv --wait 10 --visibility 30 2>>"$log")
	[ "$(jget "$second" messageId)" = "$id" ]
	run sqs-ack <<<"$(sed 's/}$/,"claim":{"outcome":"TEMPFAIL"}}/' <<<"$second")"
	[ "$status" -eq 0 ]
	run sqs-ack <<<"$(finished <<<"$second")"
	[ "$status" -eq 0 ]
	for _ in $(seq 1 100); do grep -q '"msg":"acked"' "$log" && break; sleep 0.1; done
	cat "$log"
	h='"step":"amqp-holder","holder":[0-9]*,"holderId":"[0-9a-f]\{8\}","conn":1'
	grep -q "\"msg\":\"basic.get-ok\",$h,\"messageId\":\"$id\",\"tag\":1,\"redelivered\":0,\"deliveryCount\":0,\"to\":\"receive\"" "$log"
	grep -q "\"msg\":\"returned\",$h,\"messageId\":\"$id\",\"tag\":1,\"reason\":\"visibility ended\"" "$log"
	grep -q "\"msg\":\"basic.deliver\",$h,\"messageId\":\"$id\",\"tag\":1,\"redelivered\":1,\"deliveryCount\":1,\"consumer\":\"ik.1\",\"to\":\"receive\"" "$log"
	grep -q "\"msg\":\"basic.consume\",$h,\"consumer\":\"ik.1\",\"prefetch\":1}" "$log"
	grep -q "\"msg\":\"visibility moved\",$h,\"messageId\":\"$id\",\"tag\":1,\"seconds\":[0-9]" "$log"
	grep -q "\"msg\":\"acked\",$h,\"messageId\":\"$id\",\"tag\":1}" "$log"
	grep -q "\"msg\":\"connected\",$h}" "$log"
	# a receipt's key settles the delivery: never logged; nor the password
	r1=$(jget "$first" receipt) r2=$(jget "$second" receipt)
	run ! grep -q "${r1##*.}" "$log"
	run ! grep -q "${r2##*.}" "$log"
	run ! grep -q "$IDEMKIT_AMQP_PASSWORD" "$log"
	# to a pipe the holder keeps no stderr: the reader ends with the
	# receiver, not when the holder lets the delivery go (30 s)
	echo '{"chargeId":"CHG-D2"}' | sqs-send >/dev/null
	start=$(date +%s%3N)
	run -0 timeout 20 sh -c 'IDEMKIT_LOG=debug sqs-recv --visibility 30 2>&1 | cat'
	[ $(( $(date +%s%3N) - start )) -lt 15000 ]
	[[ "$output" == *CHG-D2* ]]
}
