#!/bin/sh
# charge-worker: the driver.  Chains sqs-recv -> idemp-claim -> charge-debit
# -> charge-notify -> idemp-done -> sqs-ack, branching only on exit codes;
# what happens to each message is decided by sqs-ack, in C, from the
# envelope.  Every step command can be replaced through the environment
# (CHARGE_DEBIT_CMD=..., same exit-code contract).
#
# Rules: nothing is acked before its outcome is recorded (sqs-ack decides
# from the envelope, and leaves what is unfinished); SIGTERM/SIGINT finish
# the message in flight, receive no more, and exit 128+signal.

# Step commands and their arguments are split into words on purpose;
# counters are set through eval (n_KEY, t_KEY); traps call handlers.
# shellcheck disable=SC2086,SC2154,SC2317

set -u

VERSION=@VERSION@
PROG=charge-worker
USAGE="usage: charge-worker [-j N] [--drain | --once] [--stream] [--lease DUR]
                     [--wait SECS] [--debit-timeout SECS] [--notify-timeout SECS]
                     [--notify-retries N] [--window N] [--lock FILE] [--no-lock]
                     [--metrics FILE]
       charge-worker --trace < event|envelope
"

usage() { printf '%s' "$USAGE" >&2; echo "Try '$PROG --help' for more information." >&2; exit 64; }
die() { echo "$PROG: $*" >&2; exit "${2:-64}"; }

help() {
	printf '%s' "$USAGE"
	cat <<'TXT'

Options:
  -j, --jobs N             run N worker loops in parallel (default 1)
  -d, --drain              stop when a receive finds the queue empty (cron); the
                           exit status summarises the run
  -1, --once               process at most one message per loop, then stop
  -s, --stream             chain long-lived --stream processes with pipes
                           (one pipeline per job) instead of one process per step
  -l, --lease DUR          claim lease (default 120s); refused when shorter than
                           the debit and notify timeouts plus a 10s margin
  -w, --wait SECS          long-poll wait of each receive (default 5; 1 with --drain)
      --debit-timeout S    total timeout of one debit call (default 10)
      --notify-timeout S   total timeout of one notification call (default 5)
      --notify-retries N   notification retries before NOTIFY_FAILED (default 3)
      --window N           with --stream: at most N messages in flight per
                           pipeline (default 100)
      --lock FILE          the lock that keeps overlapping runs apart
                           (default $IDEMKIT_STATE_DIR/charge-worker.lock)
      --no-lock            do not take the lock
      --metrics FILE       at the end of the run, replace FILE (atomically) with
                           the run's Prometheus metrics (idemkit-metrics(1))
  -t, --trace              run one event or envelope from stdin through the steps
                           (no queue); each step's exit code, name and meaning on
                           stderr, the final envelope on stdout
  -h, --help               this help
  -V, --version            print the version

Environment: IDEMKIT_QUEUE, IDEMKIT_DLQ, IDEMKIT_STORE, IDEMKIT_BANK_URL,
IDEMKIT_NOTIFY_URL, IDEMKIT_STATE_DIR; step overrides SQS_RECV_CMD,
IDEMP_CLAIM_CMD, CHARGE_DEBIT_CMD, CHARGE_NOTIFY_CMD, IDEMP_DONE_CMD, SQS_ACK_CMD.

Exit status:
    0  OK                every message received was finished (or nothing to do with --once)
    1  EMPTY             nothing was received; or another run holds the lock
   64  USAGE             bad command line
   70  SOFTWARE          internal error
   75  TEMPFAIL          some messages were left for a retry (transient trouble)
   78  CONFIG            missing or invalid configuration

See charge-worker(1) and idemkit(7).
TXT
	exit 0
}

# --- options --------------------------------------------------------------

jobs=1 drain=0 once=0 stream=0 trace=0 lease=${IDEMKIT_LEASE:-120s} wait=
debit_timeout=10 notify_timeout=5 notify_retries=3 lock='' nolock=0 window=100 metrics=''

need() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
	case $1 in
	-j|--jobs) need "$@"; jobs=$2; shift ;;
	--jobs=*) jobs=${1#*=} ;;
	-d|--drain) drain=1 ;;
	-1|--once) once=1 ;;
	-s|--stream) stream=1 ;;
	-l|--lease) need "$@"; lease=$2; shift ;;
	--lease=*) lease=${1#*=} ;;
	-w|--wait) need "$@"; wait=$2; shift ;;
	--debit-timeout) need "$@"; debit_timeout=$2; shift ;;
	--notify-timeout) need "$@"; notify_timeout=$2; shift ;;
	--notify-retries) need "$@"; notify_retries=$2; shift ;;
	--window) need "$@"; window=$2; shift ;;
	--lock) need "$@"; lock=$2; shift ;;
	--no-lock) nolock=1 ;;
	--metrics) need "$@"; metrics=$2; shift ;;
	-t|--trace) trace=1 ;;
	-h|--help) help ;;
	-V|--version) echo "$PROG (idemkit) $VERSION"; exit 0 ;;
	*) usage ;;
	esac
	shift
done

isnum() { case $1 in ''|*[!0-9]*) return 1 ;; esac; }
if ! isnum "$jobs" || [ "$jobs" -lt 1 ] || [ "$jobs" -gt 256 ]; then
	die "--jobs: want 1 to 256, got '$jobs'"
fi
for v in "$debit_timeout" "$notify_timeout" "$notify_retries" "$window"; do
	isnum "$v" || die "timeouts and retries are whole numbers of seconds, got '$v'"
done
[ -z "$wait" ] || isnum "$wait" || die "--wait: want whole seconds, got '$wait'"
[ -n "$wait" ] || { [ "$drain" -eq 1 ] && wait=1 || wait=5; }

# The lease in seconds (the same forms the C commands take).
lease_s() {
	case $1 in
	*ms) n=${1%ms}; isnum "$n" && echo $((n / 1000)) ;;
	*s) n=${1%s}; isnum "$n" && echo "$n" ;;
	*m) n=${1%m}; isnum "$n" && echo $((n * 60)) ;;
	*h) n=${1%h}; isnum "$n" && echo $((n * 3600)) ;;
	*d) n=${1%d}; isnum "$n" && echo $((n * 86400)) ;;
	*) isnum "$1" && echo "$1" ;;
	esac
}
ls=$(lease_s "$lease") || die "--lease: not a duration: '$lease'"
[ -n "$ls" ] || die "--lease: not a duration: '$lease'"
# A lease must outlive the work done under it, or a second worker reclaims
# a charge whose debit is still in flight.
min=$((debit_timeout + notify_timeout * (notify_retries + 1) + 10))
[ "$ls" -ge "$min" ] || die "--lease ${lease} is shorter than the debit and notify timeouts plus a margin (${min}s): a slow bank would let a second worker in"

RECV=${SQS_RECV_CMD:-sqs-recv}
CLAIM=${IDEMP_CLAIM_CMD:-idemp-claim}
DEBIT=${CHARGE_DEBIT_CMD:-charge-debit}
NOTIFY=${CHARGE_NOTIFY_CMD:-charge-notify}
DONE=${IDEMP_DONE_CMD:-idemp-done}
ACK=${SQS_ACK_CMD:-sqs-ack}
claim_args="--lease $lease"
debit_args="--timeout $debit_timeout"
notify_args="--timeout $notify_timeout --retries $notify_retries"

# --- one message, one process per step ------------------------------------

explain() {  # CODE -> "NAME meaning"
	idemkit-code "$1" 2>/dev/null | awk -F '\t' '{print $2 " (" $4 ")"}'
}

# run_step NAME IN OUT CMD ARGS...: runs one step; its exit code in $rc.
run_step() {
	_name=$1 _in=$2 _out=$3
	shift 3
	rc=0
	"$@" < "$_in" > "$_out" || rc=$?
	[ "$first_rc" -ne 0 ] || first_rc=$rc
	if [ "$trace" -eq 1 ]; then
		printf '%-14s -> %3d %s\n' "$_name" "$rc" "$(explain "$rc")" >&2
	fi
}

# process IN: the steps for one envelope; sets the counters' deltas in
# $outcome (one word) and the final envelope in $work/final.
process() {
	in=$1
	first_rc=0
	run_step idemp-claim "$in" "$work/claimed" $CLAIM $claim_args
	c_rc=$rc
	cur=$work/claimed
	if [ "$c_rc" -eq 0 ]; then
		run_step charge-debit "$cur" "$work/debited" $DEBIT $debit_args
		d_rc=$rc
		cur=$work/debited
		case $d_rc in
		0)
			run_step charge-notify "$cur" "$work/notified" $NOTIFY $notify_args
			n_rc=$rc
			cur=$work/notified
			run_step idemp-done "$cur" "$work/done" $DONE
			cur=$work/done
			case $rc in
			0) [ "$n_rc" -eq 0 ] && outcome=debited || outcome=debited_notify_failed ;;
			13) outcome=lease_lost ;;
			*) outcome=left ;;
			esac ;;
		20)
			run_step idemp-done "$cur" "$work/done" $DONE
			cur=$work/done
			[ "$rc" -eq 0 ] && outcome=declined || outcome=left ;;
		*) outcome=left ;;
		esac
	else
		case $c_rc in
		10) outcome=dup_done ;;
		11) outcome=dup_in_progress ;;
		12) outcome=dup_failed ;;
		14) outcome=mismatch ;;
		65) outcome=invalid ;;
		78) outcome=config ;;
		*) outcome=left ;;
		esac
	fi
	final=$cur
}

# --- trace ------------------------------------------------------------------

if [ "$trace" -eq 1 ]; then
	work=$(mktemp -d "${TMPDIR:-/tmp}/charge-worker.XXXXXX") || exit 70
	trap 'rm -rf "$work"' EXIT
	cat > "$work/in"
	process "$work/in"
	cat "$final"
	echo "outcome: $outcome" >&2
	# The status of the step that decided the charge: the first that was not OK.
	exit "$first_rc"
fi

# --- the lock ----------------------------------------------------------------

state=${IDEMKIT_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/idemkit}
if [ "$nolock" -eq 0 ]; then
	[ -n "$lock" ] || { mkdir -p "$state" && chmod 700 "$state"; lock=$state/charge-worker.lock; }
	command -v flock >/dev/null || die "flock(1) not found (util-linux); use --no-lock" 78
	exec 9>>"$lock" || die "cannot open lock file $lock" 78
	if ! flock -n 9; then
		echo "$PROG: another run holds $lock; nothing to do" >&2
		exit 1
	fi
fi

# --- metrics (--metrics FILE) --------------------------------------------------
# idemkit-metrics writes the file from the summary line, at exit, whatever
# the status; a file it cannot write is a warning, not the run's outcome.

if [ -n "$metrics" ]; then
	started=$(idemkit-metrics --clock) || die "idemkit-metrics not found" 78
	summary_file=$(mktemp "${TMPDIR:-/tmp}/charge-worker.sum.XXXXXX") || exit 70
fi
summary_line() {
	if [ -n "$metrics" ]; then tee "$summary_file"; else cat; fi >&2
}
metrics_at_exit() {
	idemkit-metrics --file "$metrics" --job worker --started "$started" --status "$1" \
		< "$summary_file" || echo "$PROG: the metrics file $metrics was not written" >&2
	rm -f "$summary_file"
}

# --- the loops ---------------------------------------------------------------

stop=0
on_signal() { stop=$1; }
trap 'on_signal 15' TERM
trap 'on_signal 2' INT
trap 'on_signal 1' HUP

tmp=$(mktemp -d "${TMPDIR:-/tmp}/charge-worker.XXXXXX") || exit 70
COUNTERS="received debited debited_notify_failed declined dup_done dup_in_progress dup_failed mismatch invalid lease_lost left config ack_failed"

# loop ID: one worker; writes its counters to $tmp/ID.stats.
loop() {
	id=$1
	# A background subshell starts with default traps: set ours again, so a
	# stop lets the message in flight finish instead of killing the loop.
	trap 'stop=15' TERM
	trap 'stop=2' INT
	trap 'stop=1' HUP
	work=$tmp/w$id
	mkdir -p "$work"
	for k in $COUNTERS; do eval "n_$k=0"; done
	while [ "$stop" -eq 0 ]; do
		rc=0
		$RECV --max 1 --wait "$wait" > "$work/recv" || rc=$?
		if [ "$rc" -eq 1 ]; then
			[ "$drain" -eq 1 ] && break
			[ "$once" -eq 1 ] && break
			continue
		fi
		if [ "$rc" -ne 0 ]; then
			[ "$rc" -ge 128 ] && break
			echo "$PROG: receive failed ($rc $(explain "$rc")); backing off" >&2
			[ "$rc" -eq 78 ] && { n_config=$((n_config + 1)); break; }
			# A drain (cron) run ends here with 75, as the --stream
			# pipeline does: the next run is the retry.  Otherwise it
			# would wait out the outage with the lock held.
			{ [ "$drain" -eq 1 ] || [ "$once" -eq 1 ]; } && { n_left=$((n_left + 1)); break; }
			sleep 2
			continue
		fi
		n_received=$((n_received + 1))
		process "$work/recv"
		eval "n_$outcome=\$((n_$outcome + 1))"
		rc=0
		$ACK < "$final" > "$work/acked" || rc=$?
		[ "$rc" -eq 0 ] || n_ack_failed=$((n_ack_failed + 1))
		[ "$once" -eq 1 ] && break
		[ -t 2 ] && [ "$jobs" -eq 1 ] && printf '\r%s: received %d debited %d duplicates %d left %d ' \
			"$PROG" "$n_received" "$n_debited" "$((n_dup_done + n_dup_in_progress))" "$n_left" >&2
	done
	: > "$tmp/$id.stats"
	for k in $COUNTERS; do eval "echo \"$k \$n_$k\"" >> "$tmp/$id.stats"; done
}

# loop_stream ID: one pipeline of long-lived processes.
loop_stream() {
	id=$1
	# At most $window messages in flight per pipeline: the receiver counts
	# what sqs-ack has written, so a slow bank slows the receiving instead
	# of letting claimed messages wait in the pipes past their leases.
	: > "$tmp/$id.out"
	recv_args="--max 10 --wait $wait --window $window --acked $tmp/$id.out"
	[ "$drain" -eq 1 ] && recv_args="$recv_args --drain" || recv_args="$recv_args --follow"
	# A stop goes to the receiver only: it stops receiving, and the rest of
	# the pipeline finishes what is in flight and ends at end of input.
	trap 'stop=15; kill -TERM "$(cat "$tmp/$id.recv" 2>/dev/null)" 2>/dev/null' TERM
	trap 'stop=2; kill -TERM "$(cat "$tmp/$id.recv" 2>/dev/null)" 2>/dev/null' INT
	sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$tmp/$id.recv" $RECV $recv_args \
		| $CLAIM --stream $claim_args | $DEBIT --stream $debit_args \
		| $NOTIFY --stream $notify_args | $DONE --stream | $ACK --stream > "$tmp/$id.out" &
	pipe=$!
	while ! wait "$pipe"; do kill -0 "$pipe" 2>/dev/null || break; done
	# Count outcomes from the envelopes sqs-ack wrote (keys come out of
	# cJSON in the order the steps added them).
	awk -v keys="$COUNTERS" '
	function outcome(step,   m) {
		if (match($0, "\"" step "\":\\{\"outcome\":\"[A-Z_]+\"")) {
			m = substr($0, RSTART, RLENGTH); sub(/.*"outcome":"/, "", m); sub(/"$/, "", m); return m
		}
		return ""
	}
	BEGIN { n = split(keys, k, " "); for (i = 1; i <= n; i++) c[k[i]] = 0
		d["DUP_DONE"] = "dup_done"; d["DUP_IN_PROGRESS"] = "dup_in_progress"; d["DUP_FAILED"] = "dup_failed"
		d["PAYLOAD_MISMATCH"] = "mismatch"; d["DATAERR"] = "invalid"; d["CONFIG"] = "config" }
	{
		c["received"]++
		a = outcome("ack"); if (a != "" && a != "OK") c["ack_failed"]++
		cl = outcome("claim"); dn = outcome("done")
		if (cl != "ACQUIRED") c[(cl in d) ? d[cl] : "left"]++
		else if (dn == "LEASE_LOST") c["lease_lost"]++
		else if (dn != "OK") c["left"]++
		else if (outcome("debit") == "DECLINED") c["declined"]++
		else if (outcome("notify") == "OK") c["debited"]++
		else c["debited_notify_failed"]++
	}
	END { for (i = 1; i <= n; i++) print k[i], c[k[i]] }' "$tmp/$id.out" > "$tmp/$id.stats"
}

pids=
i=1
while [ "$i" -le "$jobs" ]; do
	if [ "$stream" -eq 1 ]; then loop_stream "$i" & else loop "$i" & fi
	pids="$pids $!"
	i=$((i + 1))
done
# Forward a stop to the loops: each finishes its message in flight.
trap 'stop=15; kill -TERM $pids 2>/dev/null' TERM
trap 'stop=2; kill -TERM $pids 2>/dev/null' INT
for p in $pids; do
	while ! wait "$p"; do kill -0 "$p" 2>/dev/null || break; done
done
[ -t 2 ] && [ "$jobs" -eq 1 ] && printf '\n' >&2

# --- the summary ---------------------------------------------------------------

for k in $COUNTERS; do eval "t_$k=0"; done
for f in "$tmp"/*.stats; do
	[ -f "$f" ] || continue
	while read -r k v; do eval "t_$k=\$((t_$k + v))"; done < "$f"
done
rm -rf "$tmp"
dlq=$((t_dup_failed + t_mismatch + t_invalid + t_declined))
left=$((t_left + t_lease_lost + t_dup_in_progress + t_ack_failed))
printf '{"summary":true,"received":%d,"debited":%d,"debitedNotificationFailed":%d,"declined":%d,"dupDone":%d,"dupInProgress":%d,"dupFailed":%d,"payloadMismatch":%d,"invalid":%d,"leaseLost":%d,"toDlq":%d,"leftForRetry":%d,"ackFailed":%d,"config":%d}\n' \
	"$t_received" "$t_debited" "$t_debited_notify_failed" "$t_declined" "$t_dup_done" \
	"$t_dup_in_progress" "$t_dup_failed" "$t_mismatch" "$t_invalid" "$t_lease_lost" \
	"$dlq" "$left" "$t_ack_failed" "$t_config" | summary_line
[ -z "$metrics" ] || trap 'metrics_at_exit $?' EXIT

[ "$stop" -ne 0 ] && exit $((128 + stop))
[ "$t_config" -gt 0 ] && exit 78
[ "$t_left" -gt 0 ] || [ "$t_ack_failed" -gt 0 ] || [ "$t_lease_lost" -gt 0 ] && exit 75
[ "$t_received" -eq 0 ] && exit 1
exit 0
