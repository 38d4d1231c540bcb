#!/usr/bin/env bats
# A request the worker gave up on never reaches the bank later (invariant
# 7, soak run embedded seed 1004): charge-debit --stream sends a debit on
# its kept-alive connection while the path to the bank drops everything,
# times out (TEMPFAIL) and closes that connection.  With a plain close the
# kernel keeps retransmitting the unacknowledged request (FIN-WAIT-1) and
# delivers it when the path comes back, after the retry; idemkit closes
# with SO_LINGER {1, 0} (lib/conn/http.c), so nothing is left to send.
# Two network namespaces joined by a veth pair, nothing else: needs root,
# ip and nft (skipped without them, as the chaos campaign exits 77).

load faults

NET=10.214.0
WAIT_S=20   # after the send: TCP's backoff from a 200 ms RTO retransmits
            # at about 0.2, 0.6, 1.4, 3.0, 6.2 and 12.6 s; the path heals
            # at about 1.5 s, so a left request arrives by 3 or 6 s

setup() {
	[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, nftables)"
	command -v ip >/dev/null && command -v nft >/dev/null || skip "needs ip and nft"
	NB=ikl$$b NW=ikl$$w
	ip netns add "$NB" || skip "cannot make a network namespace"
	ip netns add "$NW"
	ip -n "$NW" link add vw type veth peer name vb netns "$NB"
	ip -n "$NB" addr add "$NET.1/30" dev vb
	ip -n "$NW" addr add "$NET.2/30" dev vw
	local n
	for n in "$NB" "$NW"; do
		ip -n "$n" link set lo up
		ip -n "$n" link set "v${n: -1}" up
	done
	D=$BATS_TEST_TMPDIR
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj /CN=bank -addext "subjectAltName=IP:$NET.1" \
		-keyout "$D/key.pem" -out "$D/cert.pem" 2>/dev/null
	ip netns exec "$NB" env IDEMKIT_LOG=info bank-sim --listen "$NET.1" --port 0 \
		--port-file "$D/port" --db "$D/ledger.db" \
		--tls-cert "$D/cert.pem" --tls-key "$D/key.pem" >"$D/bank.out" 2>"$D/bank.log" 3>&- &
	BANK_PID=$!
	for _ in $(seq 200); do grep -q '^listening ' "$D/bank.out" 2>/dev/null && break; sleep 0.05; done
	grep -q '^listening ' "$D/bank.out"
	export IDEMKIT_BANK_URL=https://$NET.1:$(cat "$D/port")/debits IDEMKIT_BANK_CACERT=$D/cert.pem
}

teardown() {
	[ -n "${NB:-}" ] || return 0
	local p
	for p in ${DEBIT_PID:-} ${BANK_PID:-}; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	ip netns del "$NW" 2>/dev/null
	ip netns del "$NB" 2>/dev/null
	true
}

# partition on|off: the worker's namespace drops everything to and from the bank.
partition() {
	if [ "$1" = on ]; then
		ip netns exec "$NW" nft -f - <<-EOF
			table inet cut {
				chain out { type filter hook output priority 0; ip daddr $NET.1 drop; }
				chain in { type filter hook input priority 0; ip saddr $NET.1 drop; }
			}
		EOF
	else
		ip netns exec "$NW" nft delete table inet cut
	fi
}

# lines N: wait (at most 10 s) until charge-debit wrote N envelopes.
lines() {
	for _ in $(seq 200); do [ "$(wc -l < "$D/out")" -ge "$1" ] && return 0; sleep 0.05; done
	return 1
}

# requests KEY: how many requests with Idempotency-Key KEY bank-sim logged.
requests() { grep -c "\"key\":\"$1\"" "$D/bank.log" || true; }

@test "a debit abandoned during a partition never reaches the bank after it heals" {
	mkfifo "$D/in"
	ip netns exec "$NW" charge-debit --stream --timeout 1s <"$D/in" >"$D/out" 2>"$D/err" 3>&- &
	DEBIT_PID=$!
	exec 5>"$D/in"
	envelope CHG-L0 >&5          # opens the kept-alive connection
	lines 1
	envelope CHG-L1 >&5
	lines 2
	[ "$(jget "$(sed -n 1p "$D/out")" debit.outcome)" = OK ]
	[ "$(jget "$(sed -n 2p "$D/out")" debit.outcome)" = OK ]
	# still kept alive and reused: one connection for both debits
	[ "$(ip netns exec "$NW" ss -tanH dst "$NET.1" | wc -l)" -eq 1 ]
	partition on
	sent=$(date +%s%3N)
	envelope CHG-L2 >&5          # same connection: the request is never acknowledged
	lines 3
	[ "$(jget "$(sed -n 3p "$D/out")" debit.outcome)" = TEMPFAIL ]
	# What the worker's kernel still holds for the bank: nothing.  A plain
	# close leaves the request in a FIN-WAIT-1 socket's send queue.
	held=$(ip netns exec "$NW" ss -tanH dst "$NET.1" | awk '$3 > 0')
	echo "sockets with unacknowledged bytes for the bank: ${held:-none}"
	exec 5>&-
	wait "$DEBIT_PID"
	DEBIT_PID=
	partition off
	healed=$(date +%s%3N)
	# The retry the worker makes after a TEMPFAIL: the first request never
	# arrived, so this one is the debit, not a replay.
	run --separate-stderr ip netns exec "$NW" charge-debit --timeout 5s <<<"$(envelope CHG-L2)"
	while [ "$(requests CHG-L2)" -le 1 ] && [ $(( $(date +%s%3N) - sent )) -lt $((WAIT_S * 1000)) ]; do
		sleep 0.2
	done
	n=$(requests CHG-L2)
	report "linger: path healed $((healed - sent)) ms after the send; requests for the abandoned key at the bank after $(( $(date +%s%3N) - sent )) ms: $n (1 = the retry only)"
	[ -z "$held" ]
	[ "$n" -eq 1 ]
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.ref)" = TXN-00000003 ]
	[ -z "$(jget "$output" debit.replayed)" ]
}
