#!/usr/bin/env bats
# What an operator or a packager meets (issue 29 items 6-9): the drivers
# called by absolute path under cron's PATH, the installed layout, the help
# and man pages against behaviour, a bank's replay made visible.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() {
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges?visibility=30"
	export IDEMKIT_DLQ="sqlite:$BATS_TEST_TMPDIR/q.db#charges-dlq"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=quiet
}
teardown() { stubs_stop; bank_stop; }

fast=(--debit-timeout 2 --notify-timeout 1 --notify-retries 1 --lease 15s)

# cronpath CMD ARGS...: CMD by absolute path with cron's PATH, which holds
# no idemkit command (the built ones are not under /usr/bin or /bin).
cronpath() {
	local c=$1; shift
	PATH=/usr/bin:/bin "$IDEMKIT_BIN/$c" "$@"
}

@test "charge-worker and charge-recover by absolute path with PATH=/usr/bin:/bin find their sibling commands (item 6)" {
	if PATH=/usr/bin:/bin command -v idemkit-code; then false; fi
	bank_start
	for i in 1 2; do ev "CHG-CRON$i"; done | sqs-send >/dev/null
	# not quiet: a quiet run that succeeds writes no summary line
	IDEMKIT_LOG=warn run --separate-stderr cronpath charge-worker --drain "${fast[@]}"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"received":2,"debited":2'* ]]
	[ "$(jget "$(idemp-show --json CHG-CRON1)" state)" = DONE ]
	run --separate-stderr cronpath charge-recover --renotify
	[ "$status" -eq 1 ]
	[[ "$stderr" != *"not found"* ]]
	run --separate-stderr cronpath charge-recover --dlq
	[ "$status" -eq 1 ]
	[[ "$stderr" != *"not found"* ]]
	# through a symlink elsewhere: beside the file it points at
	mkdir -p "$BATS_TEST_TMPDIR/elsewhere"
	ln -s "$IDEMKIT_BIN/charge-worker" "$BATS_TEST_TMPDIR/elsewhere/charge-worker"
	IDEMKIT_LOG=warn run --separate-stderr env PATH=/usr/bin:/bin "$BATS_TEST_TMPDIR/elsewhere/charge-worker" --drain "${fast[@]}"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *'"received":0'* ]]
}

@test "the drivers name an unknown option; --drain with --once is refused; --once on an empty queue is 1 as --help says (item 9)" {
	for c in charge-worker charge-recover; do
		run --separate-stderr "$c" --bogus
		[ "$status" -eq 64 ]
		[[ "$stderr" == "$c: unknown option '--bogus'"* ]]
	done
	run --separate-stderr charge-worker --drain --once
	[ "$status" -eq 64 ]
	[ "$stderr" = "charge-worker: --drain and --once: choose one" ]
	bank_start
	run --separate-stderr charge-worker --once "${fast[@]}"
	[ "$status" -eq 1 ]
	run charge-worker --help
	[[ "$output" == *"1  EMPTY             nothing was received (with --once too)"* ]]
	[[ "$output" != *"nothing to do with --once"* ]]
	# a message given with its exit code: the code, not beside the message
	IDEMKIT_BANK_URL= run --separate-stderr charge-worker --drain "${fast[@]}"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *"charge-worker: charge-debit: configuration refused (above); nothing was received" ]]
}

@test "make install: units name the installed charge-worker and env file, verify clean; examples, rules and env file under share/doc and /etc (item 6)" {
	p=$BATS_TEST_TMPDIR/p
	run make -s -C "$IDEMKIT_SRC" install PREFIX="$p" SYSCONFDIR="$p/etc"
	[ "$status" -eq 0 ]
	u=$p/lib/systemd/system
	[ "$(grep '^ExecStart=' "$u/idemkit-worker.service")" = "ExecStart=$p/bin/charge-worker -j 4" ]
	[ "$(grep '^ExecStart=' "$u/idemkit-drain.service")" = "ExecStart=$p/bin/charge-worker -j 4 --drain" ]
	[ "$(grep '^EnvironmentFile=' "$u/idemkit-worker.service")" = "EnvironmentFile=$p/etc/idemkit/idemkit.env" ]
	# the outbox relay's unit beside the worker's (installed, not enabled),
	# and every unit names its man pages (systemctl help UNIT)
	[ "$(grep '^ExecStart=' "$u/idemkit-outbox.service")" = "ExecStart=$p/bin/idemp-outbox --follow" ]
	for f in "$u"/*; do
		grep -Eq '^Documentation=man:[a-z-]+\([178]\)' "$f" || { echo "$f: no Documentation="; return 1; }
	done
	[ "$(ls "$u" | wc -l)" -eq 6 ]
	# a job once per period across hosts (idemp-run@JOB): its ExecStart as
	# systemd hands it to sh ($$, %% and %i undone) runs the command once
	# for the day; the next start is DUP_DONE (10, a success to the unit)
	grep -q '^SuccessExitStatus=10 11$' "$u/idemp-run@.service"
	printf '#!/bin/sh\necho "$1" >> "%s"\n' "$BATS_TEST_TMPDIR/ran" > "$BATS_TEST_TMPDIR/job.sh"
	chmod +x "$BATS_TEST_TMPDIR/job.sh"
	line=$(sed -n 's/^ExecStart=//p' "$u/idemp-run@.service" | sed -e 's/\$\$/$/g' -e 's/%%/%/g' -e 's/%i/fees/g')
	for want in 0 10; do
		IDEMKIT_RUN_COMMAND="$BATS_TEST_TMPDIR/job.sh posted" run --separate-stderr eval "$line"
		[ "$status" -eq "$want" ] || { echo "$line: $status, not $want: $stderr"; return 1; }
	done
	[ "$(cat "$BATS_TEST_TMPDIR/ran")" = posted ]
	idemp-show "fees-$(date -u +%Y-%m-%d)" | grep -q '^  state        DONE$'
	run ! grep -rn /usr/local/bin "$u" "$p/share/doc/idemkit"
	[ -f "$u/idemkit-drain.timer" ]
	for f in crontab idemkit.env idemp-run-fees.service prometheus/alerts.yml prometheus/alerts_test.yml \
		prometheus/idemkit-drain.service.d/metrics.conf; do
		[ -f "$p/share/doc/idemkit/examples/$f" ] || { echo "missing $f"; return 1; }
	done
	[ ! -e "$p/share/doc/idemkit/examples/demo.sh" ]
	[ "$(head -1 "$p/etc/idemkit/idemkit.env")" = "# $p/etc/idemkit/idemkit.env: the worker's environment (systemd EnvironmentFile," ]
	grep -q '^IDEMKIT_BANK_URL=' "$p/etc/idemkit/idemkit.env"
	if command -v systemd-analyze >/dev/null; then
		# (verify runs man for each Documentation=: the pages just installed)
		MANPATH=$p/share/man run systemd-analyze verify "$u/idemkit-worker.service" "$u/idemkit-drain.service" "$u/idemkit-drain.timer" \
			"$u/idemkit-outbox.service"
		[ "$status" -eq 0 ]
		[ -z "$output" ]
		# the templates, as an instance
		mkdir -p "$BATS_TEST_TMPDIR/inst"
		cp "$u/idemp-run@.service" "$BATS_TEST_TMPDIR/inst/idemp-run@fees.service"
		cp "$u/idemp-run@.timer" "$BATS_TEST_TMPDIR/inst/idemp-run@fees.timer"
		MANPATH=$p/share/man run systemd-analyze verify "$BATS_TEST_TMPDIR/inst/idemp-run@fees.service" \
			"$BATS_TEST_TMPDIR/inst/idemp-run@fees.timer"
		[ "$status" -eq 0 ]
		[ -z "$output" ]
	fi
	# the operator's env file survives a reinstall and an uninstall
	echo '# mine' >> "$p/etc/idemkit/idemkit.env"
	make -s -C "$IDEMKIT_SRC" install PREFIX="$p" SYSCONFDIR="$p/etc"
	make -s -C "$IDEMKIT_SRC" uninstall PREFIX="$p" SYSCONFDIR="$p/etc"
	grep -q '^# mine$' "$p/etc/idemkit/idemkit.env"
	[ ! -e "$u/idemkit-worker.service" ] && [ ! -e "$p/bin/charge-worker" ] && [ ! -e "$p/share/doc/idemkit" ]
}

# lock_held: some process holds charge-worker's lock (seen in /proc/locks:
# a probe that took the lock itself could make the worker find it held).
lock_held() {
	[ -f "$IDEMKIT_STATE_DIR/charge-worker.lock" ] &&
		grep -q ":$(stat -c %i "$IDEMKIT_STATE_DIR/charge-worker.lock") " /proc/locks
}

@test "a stop of the long-running worker exits 143, which its unit counts as success (item 6); also a stop just after its start, ten times over" {
	bank_start
	# the stop as soon as it holds the lock: a stop that came while its
	# loops were being started once hung it until SIGKILL (1 in 30 here)
	for _ in $(seq 10); do
		# (the last run's receiver may hold the lock a moment longer)
		for i in $(seq 150); do
			lock_held || break
			sleep 0.1
		done
		charge-worker "${fast[@]}" --wait 1 2>"$BATS_TEST_TMPDIR/err" 3>&- &
		pid=$!
		# started: it holds the lock (seen in /proc/locks: a probe that
		# took the lock itself could make the worker find it held)
		for i in $(seq 400); do
			lock_held && break
			sleep 0.01
		done
		kill -TERM "$pid" || { rc=0; wait "$pid" || rc=$?; echo "exited $rc before the stop: $(cat "$BATS_TEST_TMPDIR/err")" >&2; return 1; }
		for i in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then
			echo "still running 15 s after the stop" >&2
			pkill -KILL -P "$pid"; kill -KILL "$pid"
			return 1
		fi
		rc=0; wait "$pid" || rc=$?
		[ "$rc" -eq 143 ]
	done
	for unit in idemkit-worker idemkit-drain; do
		grep -Eq "^SuccessExitStatus=(.* )?$rc( |$)" "$IDEMKIT_SRC/examples/$unit.service"
	done
}

@test "man pages on a terminal: no \"BSD General Commands Manual\", the footer names idemkit, braces balanced; installed pages point at no bank-sim(1) (item 9)" {
	command -v man >/dev/null && command -v script >/dev/null || skip "man or script not installed"
	for page in "$IDEMKIT_SRC"/man/*.[1-8]; do
		# man(1) on a pseudo-terminal, as an operator reads it (groff, not mandoc)
		out=$(MANPAGER=cat MANWIDTH=80 script -qec "man -l '$page'" /dev/null | col -bx)
		name=$(basename "$page"); name=${name%.*}; name=$(echo "$name" | tr a-z A-Z)
		head=$(printf '%s\n' "$out" | grep -m1 "^$name(")
		[[ "$head" == *"Manual"* ]] || { echo "$page: no header: $head"; return 1; }
		[[ "$head" != *BSD* ]] || { echo "$page: $head"; return 1; }
		printf '%s\n' "$out" | tail -3 | grep -q '^idemkit ' || { echo "$page: footer"; return 1; }
	done
	out=$(MANPAGER=cat MANWIDTH=200 man -l "$IDEMKIT_SRC/man/idemkit-metrics.1" 2>/dev/null | col -bx)
	[[ "$out" == *"idemkit_records{state}, idemkit_stuck_records,"* ]]
	while IFS= read -r l; do
		o=${l//[^\{]/} c=${l//[^\}]/}
		[ "${#o}" -eq "${#c}" ] || { echo "unbalanced: $l"; return 1; }
	done <<<"$out"
	for page in "$IDEMKIT_SRC"/man/*.[1-8]; do
		[ "$(basename "$page")" != bank-sim.1 ] || continue
		if grep -n '^\.Xr bank-sim' "$page"; then echo "$page points at bank-sim(1)"; return 1; fi
	done
}

@test "the embedded queue refuses a message SQS would (over 256 KiB with its attributes): 65, named; the others of the batch sent (item 9)" {
	big=$(head -c 300000 /dev/zero | tr '\0' x)
	edge=$(head -c 262144 /dev/zero | tr '\0' y)
	run --separate-stderr sqs-send <<<"$(printf '%s\n%s\n{"small":1}\n' "$big" "$edge")"
	[ "$status" -eq 65 ]
	[ "$stderr" = "sqs-send: line 1 not sent: message of 300000 bytes (body and attributes): the largest a queue takes is 262144 (256 KiB, SQS's limit)" ]
	[ "${#lines[@]}" -eq 2 ]
	# the attributes count, as on SQS: name, type ("String") and value
	run --separate-stderr sqs-send --attr k=v <<<"$edge"
	[ "$status" -eq 65 ]
	[[ "$stderr" == *"message of 262152 bytes"* ]]
	[[ "$(sqs-stat)" == *'"visible":2,'* ]]
}

@test "every --store help lists the store forms of lib/open/open_store.c's table, the same as its refusal does (item 9)" {
	run --separate-stderr idemp-show --store foo:x CHG-1
	[ "$status" -eq 78 ]
	forms=${stderr#*(want }; forms=${forms%)}
	[ "$forms" = "sqlite:PATH, dynamodb:TABLE, postgres://..., redis://HOST:PORT or rediss://HOST:PORT" ]
	n=0
	for b in "$IDEMKIT_BIN"/*; do
		help=$("$b" --help 2>/dev/null) || continue
		[[ "$help" == *"--store URL"* ]] || continue
		[[ "$help" != *"@STORES@"* ]]
		# the list as help wraps it, joined again
		got=$(printf '%s\n' "$help" | awk '/-S, --store URL/ { on = 1; next } on && /^  +[a-z]/ { sub(/^ +/, ""); printf "%s%s", sep, $0; sep = " " } on && /^  +-/ { exit }')
		[[ "$got" == *"$forms"* ]] || { echo "$(basename "$b"): $got"; return 1; }
		n=$((n + 1))
	done
	[ "$n" -ge 9 ]
}

@test "idemp-show --json: expiresAt stays epoch seconds (API), expiresAtMs gives the same instant in ms like every other time (item 9)" {
	ev CHG-EXP | idemp-claim >/dev/null
	j=$(idemp-show --json CHG-EXP)
	python3 - "$j" <<'PY'
import json, sys, time
r = json.loads(sys.argv[1])
now = time.time()
assert r["expiresAtMs"] == r["expiresAt"] * 1000, r
assert abs(r["expiresAt"] - (now + 30 * 86400)) < 120, r          # seconds
for k in ("createdAt", "updatedAt", "leaseUntil", "expiresAtMs"):  # milliseconds
    assert r[k] > now * 1000 - 120000, (k, r[k])
PY
	grep -q 'expiresAtMs' "$IDEMKIT_SRC/man/idemp-show.1"
}

@test "charge-debit and charge-notify --dry-run: method, URL, headers with secrets masked, the body; nothing sent (item 7)" {
	bank_start
	key=$BATS_TEST_TMPDIR/hmac.key
	printf 'k3y-material-xyz' > "$key"; chmod 600 "$key"
	ev=$(ev CHG-DRY 2500)
	run --separate-stderr env IDEMKIT_BANK_TOKEN=s3cr3t-t0ken IDEMKIT_BANK_HMAC_KEY_FILE="$key" \
		charge-debit --dry-run --request '{ref: $key, amt: $amountMajor}' <<<"$ev"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "POST $IDEMKIT_BANK_URL" ]
	[ "${lines[1]}" = "Content-Type: application/json" ]
	[ "${lines[3]}" = "Idempotency-Key: CHG-DRY" ]
	[ "${lines[4]}" = "Authorization: Bearer ***" ]
	[[ "${lines[5]}" =~ ^X-Idemkit-Timestamp:\ [0-9]+$ ]]
	[ "${lines[6]}" = "X-Idemkit-Signature: v2=***" ]
	[ "${lines[7]}" = '{"ref":"CHG-DRY","amt":"25.00"}' ]
	[[ "$output" != *s3cr3t* && "$output" != *k3y-material* ]]
	# the notification: its own key, the debit's ref from the envelope
	env=$(printf '{"v":1,"body":%s,"debit":{"code":0,"name":"OK","ref":"TXN-9"}}' \
		"$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$ev")")
	run --separate-stderr charge-notify --dry-run --request '{k: $key, r: $ref}' <<<"$env"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "POST $IDEMKIT_NOTIFY_URL" ]
	[ "${lines[3]}" = "Idempotency-Key: CHG-DRY:notify" ]
	[ "${lines[4]}" = '{"k":"CHG-DRY:notify","r":"TXN-9"}' ]
	# nothing reached the bank
	[ "$(bank_stat attempts)" = 0 ]
	[ -z "$(bank_get /ledger)" ]
	# the reasons, as the real run gives them
	run --separate-stderr charge-debit --dry-run --request '.foo |' <<<"$ev"
	[ "$status" -eq 78 ]
	[[ "$stderr" == "charge-debit: --request: not a jq program: syntax error"* ]]
	run --separate-stderr charge-debit --dry-run < /dev/null
	[ "$status" -eq 65 ]
	IDEMKIT_BANK_URL= run --separate-stderr charge-debit --dry-run <<<"$ev"
	[ "$status" -eq 78 ]
	[ "$stderr" = "charge-debit: no URL: set IDEMKIT_BANK_URL or --url" ]
}

@test "a bank's replay, by its own configurable header, is in the debit result, the run's summary (bankReplays) and the metrics (item 8)" {
	# A bank whose replay header is its own (tests/bankstub.py replay=):
	# bank-sim sends the Stripe-style default, so it cannot show the option.
	stub_start replay bankstub.py 'replay=X-Replay-Of: original'
	export IDEMKIT_BANK_URL=http://127.0.0.1:$STUB_PORT/debits
	export IDEMKIT_NOTIFY_URL=http://127.0.0.1:$STUB_PORT/notifications
	env1=$(ev CHG-REPL1 | idemp-claim)
	run --separate-stderr charge-debit <<<"$env1"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.replayed)" = "" ]
	# the same key again: the default header does not know this bank's
	run --separate-stderr charge-debit <<<"$env1"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.replayed)" = "" ]
	IDEMKIT_BANK_REPLAY_HEADER='X-Replay-Of: original' run --separate-stderr charge-debit <<<"$env1"
	[ "$status" -eq 0 ]
	[ "$(jget "$output" debit.replayed)" = True ]
	[ "$(jget "$output" debit.ref)" = TXN-CHG-REPL1 ]
	run --separate-stderr charge-debit --replay-header 'x-replay-of:ORIGINAL' <<<"$env1"
	[ "$(jget "$output" debit.replayed)" = True ]
	# refused before any call when it is not NAME: VALUE
	IDEMKIT_BANK_REPLAY_HEADER='X-Replay-Of' run --separate-stderr charge-debit --check
	[ "$status" -eq 78 ]
	[[ "$stderr" == *'replay header "X-Replay-Of": want NAME: VALUE'* ]]

	# A run that meets a replay: the first debit of CHG-REPL2 reached the
	# bank and its answer was lost (a crash window); the worker's debit is
	# answered as a replay, counted in the summary and the metrics.
	curl -fsS -o /dev/null -H 'Idempotency-Key: CHG-REPL2' --data-binary '{}' "$IDEMKIT_BANK_URL"
	ev CHG-REPL2 | sqs-send >/dev/null
	export IDEMKIT_BANK_REPLAY_HEADER='X-Replay-Of: original'
	IDEMKIT_LOG=warn run --separate-stderr charge-worker --drain "${fast[@]}" --metrics "$BATS_TEST_TMPDIR/m.prom"
	[ "$status" -eq 0 ]
	[[ "$stderr" == *'"debited":1,'*'"bankReplays":1,'* ]]
	grep -qx 'idemkit_worker_bank_replays_total{idemkit_job="worker"} 1' "$BATS_TEST_TMPDIR/m.prom"
	[ "$(jget "$(idemp-show --json CHG-REPL2)" state)" = DONE ]
}

@test "the closing note: a charge stuck behind a bank outage (503) shows its holder (host, pid, exited), the 503 as its last error, and no dead-worker diagnosis (issue 29 items 1, 4)" {
	bank_start
	bank_post /control '{"errorRate":1,"errorStatus":503}' >/dev/null
	ev CHG-OUTAGE | sqs-send >/dev/null
	IDEMKIT_LOG=warn run --separate-stderr charge-worker --once --debit-timeout 2 \
		--notify-timeout 1 --notify-retries 1 --lease 60s
	[ "$status" -eq 75 ]
	[[ "$stderr" == *'"received":1,"debited":0,'*'"leftForRetry":1,'* ]]
	[ "$(bank_stat debits)" -eq 0 ]
	owner=$(jget "$(idemp-show --json CHG-OUTAGE)" owner)
	pid=${owner##*:}
	host=$(hostname | cut -c1-63 | tr -c 'A-Za-z0-9._\n-' _)
	[[ "$owner" == *"@$host:$pid" ]]
	run --separate-stderr idemp-show CHG-OUTAGE
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"state        IN_PROGRESS"* ]]
	[[ "$output" == *"debited      unknown: the last run left it after the bank's answer (last error)"* ]]
	[[ "$output" == *"lease        held by $host pid $pid (token ${owner:0:8}), "*"s left"* ]]
	[[ "$output" == *"holder       exited: no process with that pid on this host"* ]]
	[[ "$output" == *"last error   TEMPFAIL from the bank: "*"503"*"(the lease decides the retry)"* ]]
	[[ "$output" != *died* ]]
	[[ "$output" != *dead* ]]
	# the message is left for the retry (in flight, its backoff), none dead-lettered
	[[ "$(sqs-stat)" == *'"visible":0,"inflight":1,'* ]]
	[[ "$(sqs-stat --queue "$IDEMKIT_DLQ")" == *'"visible":0,"inflight":0,'* ]]
}

@test "the shipped idemkit.env is quiet on success: a cron run that sources it and drains the queue writes nothing (issue 45 item 8)" {
	bank_start
	ev CHG-ENV1 | sqs-send >/dev/null
	unset IDEMKIT_LOG
	# the file as shipped, then this test's state, bank and no token file
	run --separate-stderr env -u IDEMKIT_LOG sh -c 'set -a; . "$1"; IDEMKIT_STATE_DIR=$2 IDEMKIT_BANK_URL=$3 IDEMKIT_NOTIFY_URL=$4; unset IDEMKIT_BANK_TOKEN_FILE; shift 4; exec charge-worker --drain "$@"' \
		sh "$IDEMKIT_SRC/examples/idemkit.env" "$IDEMKIT_STATE_DIR" "$IDEMKIT_BANK_URL" "$IDEMKIT_NOTIFY_URL" "${fast[@]}"
	[ "$status" -eq 0 ]
	[ -z "$stderr" ]
	[ -z "$output" ]
	[ "$(jget "$(idemp-show --json CHG-ENV1)" state)" = DONE ]
}

@test "the package's purge removes an empty /var/lib/idemkit and keeps one with records, saying why (issue 45 item 8)" {
	root=$BATS_TEST_TMPDIR/root
	mkdir -p "$root/var/lib/idemkit"
	DPKG_ROOT=$root run -0 --separate-stderr sh "$IDEMKIT_SRC/debian/idemkit.postrm" remove
	[ -d "$root/var/lib/idemkit" ]
	[ -z "$stderr" ]
	DPKG_ROOT=$root run -0 --separate-stderr sh "$IDEMKIT_SRC/debian/idemkit.postrm" purge
	[ ! -e "$root/var/lib/idemkit" ]
	[ -z "$stderr" ]
	mkdir -p "$root/var/lib/idemkit" && : > "$root/var/lib/idemkit/idempotency.db"
	DPKG_ROOT=$root run -0 --separate-stderr sh "$IDEMKIT_SRC/debian/idemkit.postrm" purge
	[ -f "$root/var/lib/idemkit/idempotency.db" ]
	[ "$stderr" = "idemkit: $root/var/lib/idemkit is kept: it holds the embedded store of record (which charges were debited) and the queue; remove it by hand once no one needs them" ]
}
