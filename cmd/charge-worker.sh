#!/bin/sh
# charge-worker: the driver.  Chains sqs-recv -> idemp-claim -> charge-debit
# -> charge-notify -> idemp-done -> sqs-ack, branching only on exit codes;
# what happens to each message is decided by sqs-ack, in C, from the
# envelope.  Every step command can be replaced through the environment
# (CHARGE_DEBIT_CMD=..., same exit-code contract).
#
# Rules: nothing is acked before its outcome is recorded (sqs-ack decides
# from the envelope, and leaves what is unfinished); SIGTERM/SIGINT finish
# the message in flight, receive no more, and exit 128+signal.  Every
# message received is accounted for: what sqs-recv handed out and no
# sqs-ack wrote (a step died, a pipe broke) is counted "stranded", keeps
# the run from 0 and 1, and the step that died is named.

# Step commands and their arguments are split into words on purpose;
# counters are set through eval (n_KEY, t_KEY); traps call handlers.
# shellcheck disable=SC2086,SC2154,SC2317

set -u
# The sibling commands are the ones installed beside this script, found
# first whatever PATH the caller has (cron's /usr/bin:/bin, a unit's, a call
# by absolute path): a step of another idemkit on PATH, or none, would not
# do.  Through a symlink, beside the file it points at.
case $0 in
*/*) _self=$(readlink -f -- "$0" 2>/dev/null) || _self=$0
     PATH=$(cd -- "${_self%/*}" && pwd -P):$PATH; export PATH ;;
esac

VERSION=@VERSION@
PROG=charge-worker
USAGE="usage: charge-worker [-j N] [--drain | --once] [--stream] [--lease DUR]
                     [--wait SECS] [--debit-timeout SECS] [--notify-timeout SECS]
                     [--notify-retries N] [--window N] [--inflight N]
                     [--lock FILE] [--no-lock]
                     [--metrics FILE [--metrics-every SECS]]
       charge-worker --trace < event|envelope
"

usage() { printf '%s' "$USAGE" >&2; echo "Try '$PROG --help' for more information." >&2; exit 64; }
die() { echo "$PROG: $1" >&2; exit "${2:-64}"; }

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
                           for each receive (up to 10 messages; one at a time
                           with --once or a step replaced through the environment)
  -l, --lease DUR          claim lease (default 120s); refused when shorter than
                           the debit and notify timeouts plus a 10s margin
  -w, --wait SECS          long-poll wait of each receive (default 5; with
                           --drain 1 on SQS, 0 on the embedded queue)
      --debit-timeout S    total timeout of one debit call (default 10)
      --notify-timeout S   total timeout of one notification call (default 5)
      --notify-retries N   notification retries before NOTIFY_FAILED (default 3)
      --window N           with --stream: at most N messages in flight per
                           pipeline (default 512)
      --inflight N         with --stream: bank and gateway requests each of
                           charge-debit and charge-notify keeps in flight, set
                           as their IDEMKIT_BANK_INFLIGHT and
                           IDEMKIT_NOTIFY_INFLIGHT (default: those variables,
                           else 64; charge-worker(1) says why)
      --lock FILE          the lock that keeps overlapping runs apart
                           (default $IDEMKIT_STATE_DIR/charge-worker.lock)
      --no-lock            do not take the lock
      --metrics FILE       on every exit (a refusal to start and a held lock
                           too), replace FILE (atomically) with the run's
                           Prometheus metrics (idemkit-metrics(1)); a run
                           without --drain or --once rewrites it periodically
      --metrics-every S    that period, in seconds (default 60)
  -t, --trace              run one event or envelope from stdin through the steps
                           (no queue); each step's exit code, name and meaning on
                           stderr, the final envelope on stdout
  -h, --help               this help
  -V, --version            print the version

Environment: IDEMKIT_QUEUE, IDEMKIT_DLQ, IDEMKIT_STORE, IDEMKIT_BANK_URL,
IDEMKIT_NOTIFY_URL, IDEMKIT_STATE_DIR, IDEMKIT_LOG (quiet: no summary line
when the run succeeds, status 0 or 1); step overrides SQS_RECV_CMD,
IDEMP_CLAIM_CMD, CHARGE_DEBIT_CMD, CHARGE_NOTIFY_CMD, IDEMP_DONE_CMD, SQS_ACK_CMD.

Exit status:
    0  OK                every message received was settled
    1  EMPTY             nothing was received (with --once too); or another run
                         holds the lock
   64  USAGE             bad command line
   70  SOFTWARE          internal error; or a step that exited 70 left messages
                         unsettled
   75  TEMPFAIL          some messages were left for a retry (transient trouble,
                         or a step died holding them)
   78  CONFIG            missing or invalid configuration

See charge-worker(1) and idemkit(7).
TXT
	exit 0
}

# --- options --------------------------------------------------------------

jobs=1 drain=0 once=0 stream=0 trace=0 lease=${IDEMKIT_LEASE:-120s} wait=
debit_timeout=10 notify_timeout=5 notify_retries=3 lock='' nolock=0 window=512 inflight='' metrics='' metrics_every=60

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
	--inflight) need "$@"; inflight=$2; shift ;;
	--lock) need "$@"; lock=$2; shift ;;
	--no-lock) nolock=1 ;;
	--metrics) need "$@"; metrics=$2; shift ;;
	--metrics-every) need "$@"; metrics_every=$2; shift ;;
	-t|--trace) trace=1 ;;
	-h|--help) help ;;
	-V|--version) echo "$PROG (idemkit) $VERSION"; exit 0 ;;
	*) echo "$PROG: unknown option '$1'" >&2; usage ;;
	esac
	shift
done

# Both stop the loop, on different conditions: one of them, not a guess.
[ "$drain" -eq 0 ] || [ "$once" -eq 0 ] || die "--drain and --once: choose one"
isnum() { case $1 in ''|*[!0-9]*) return 1 ;; esac; }
if ! isnum "$jobs" || [ "$jobs" -lt 1 ] || [ "$jobs" -gt 256 ]; then
	die "--jobs: want 1 to 256, got '$jobs'"
fi
if [ -n "$inflight" ]; then
	if ! isnum "$inflight" || [ "$inflight" -lt 1 ] || [ "$inflight" -gt 1024 ]; then
		die "--inflight: want 1 to 1024, got '$inflight'"
	fi
	# Through the environment, not as an option: a step replaced by
	# CHARGE_DEBIT_CMD that knows no --inflight still runs.
	IDEMKIT_BANK_INFLIGHT=$inflight IDEMKIT_NOTIFY_INFLIGHT=$inflight
	export IDEMKIT_BANK_INFLIGHT IDEMKIT_NOTIFY_INFLIGHT
fi
for v in "$debit_timeout" "$notify_timeout" "$notify_retries" "$window"; do
	isnum "$v" || die "timeouts and retries are whole numbers of seconds, got '$v'"
done
[ -z "$wait" ] || isnum "$wait" || die "--wait: want whole seconds, got '$wait'"
[ -n "$wait" ] || [ "$drain" -eq 1 ] || wait=5

# --- metrics (--metrics FILE) --------------------------------------------------
# idemkit-metrics writes the file at every exit from here on, whatever the
# status -- a refusal to start (78) and a held lock (1) too, so
# idemkit_run_exit_status never keeps an older run's 0 -- from the summary
# line, or zeros when the run ended before it; a file it cannot write is a
# warning, not the run's outcome.  A run that does not end by itself (no
# --drain, no --once) also rewrites it every --metrics-every seconds
# (metrics_ticker, below), counting what was settled since the last write.

if ! isnum "$metrics_every" || [ "$metrics_every" -lt 1 ]; then
	die "--metrics-every: want whole seconds, at least 1, got '$metrics_every'"
fi
ZERO_SUMMARY='{"summary":true,"received":0}'
if [ -n "$metrics" ]; then
	started=$(idemkit-metrics --clock) || die "idemkit-metrics not found" 78
	summary_file=$(mktemp "${TMPDIR:-/tmp}/charge-worker.sum.XXXXXX") || exit 70
	printf '%s\n' "$ZERO_SUMMARY" > "$summary_file"
	trap 'metrics_at_exit $?' EXIT
fi
# quiet (IDEMKIT_LOG=quiet, the cron setting): the summary line is written
# only when the run did not succeed (status other than 0 and 1), so a
# quiet cron job mails nothing on success and speaks on failure.
quiet=0
[ "${IDEMKIT_LOG:-}" != quiet ] || quiet=1
summary_line() {  # STATUS < the summary line
	if [ -n "$metrics" ]; then tee "$summary_file"; else cat; fi |
		if [ "$quiet" -eq 1 ] && [ "$1" -le 1 ]; then cat > /dev/null; else cat >&2; fi
}
metrics_at_exit() {
	idemkit-metrics --file "$metrics" --job worker --started "$started" --status "$1" \
		< "$summary_file" || echo "$PROG: the metrics file $metrics was not written" >&2
	rm -f "$summary_file"
}

# The claims name this run as their holder (ik_store_token: host and pid),
# not the step process that made them, so idemp-show can say whether the
# run that holds a charge is still alive.
IDEMKIT_RUN_PID=$$
export IDEMKIT_RUN_PID

# The lease in milliseconds, parsed as every C command parses a duration.
lease_ms=$(idemkit-code --duration "$lease" 2>/dev/null) || die "--lease: not a duration: '$lease'"

# Any step replaced through the environment: the one-shot loop takes one
# message at a time (loop).
replaced=${SQS_RECV_CMD:-}${IDEMP_CLAIM_CMD:-}${CHARGE_DEBIT_CMD:-}${CHARGE_NOTIFY_CMD:-}${IDEMP_DONE_CMD:-}${SQS_ACK_CMD:-}
RECV=${SQS_RECV_CMD:-sqs-recv}
CLAIM=${IDEMP_CLAIM_CMD:-idemp-claim}
DEBIT=${CHARGE_DEBIT_CMD:-charge-debit}
NOTIFY=${CHARGE_NOTIFY_CMD:-charge-notify}
DONE=${IDEMP_DONE_CMD:-idemp-done}
ACK=${SQS_ACK_CMD:-sqs-ack}
# What the steps get, and what the lease must outlive: one debit call, every
# notification attempt, and a margin for the store writes and the
# notification backoff (at most 0.2 + 0.4 + 0.8 s with the defaults).
# Shorter, and a second worker could reclaim a charge whose debit is still
# in flight.
margin=10
claim_args="--lease $lease"
debit_args="--timeout ${debit_timeout}s"
notify_args="--timeout ${notify_timeout}s --retries $notify_retries"
min=$((debit_timeout + notify_timeout * (notify_retries + 1) + margin))
[ "$lease_ms" -ge $((min * 1000)) ] || die "--lease ${lease} is shorter than the debit and notify timeouts plus a margin (minimum ${min}s = ${debit_timeout}s + ${notify_timeout}s x $((notify_retries + 1)) attempts + ${margin}s): a slow bank would let a second worker in"
# How long a message may wait in the pipes before its debit: the lease's
# slack beyond that work.  The receiver takes nothing more while the oldest
# message it handed out and sqs-ack has not finished is older, so an
# envelope reaches charge-debit with at least the work's time left on its
# lease (and charge-debit's own lease check seldom has to leave it).
max_age_ms=$((lease_ms - min * 1000))
# How long a drain waits for the copies it left (DUP_IN_PROGRESS,
# LEASE_SHORT, TEMPFAIL) to come back: one lease, the cap of sqs-ack's
# backoff for a duplicate in progress, so a duplicate of a charge finished
# in this run is settled in this run.
settle_ms=$lease_ms

# --- one message, one process per step ------------------------------------

explain() {  # CODE -> "NAME meaning"
	idemkit-code "$1" 2>/dev/null | awk -F '\t' '{print $2 " (" $4 ")"}'
}

# run_step NAME IN OUT CMD ARGS...: runs one step; its exit code in $rc.
# The first step that died (a signal) or wrote nothing is noted in
# $work/st as "NAME STATUS", for ended (the exit code of a step that ran is
# the outcome, already in its envelope).
run_step() {
	_name=$1 _in=$2 _out=$3
	shift 3
	rc=0
	"$@" < "$_in" > "$_out" || rc=$?
	[ "$first_rc" -ne 0 ] || first_rc=$rc
	if { [ "$rc" -ge 128 ] || [ ! -s "$_out" ]; } && [ ! -s "$work/st" ]; then
		echo "$_name $rc" > "$work/st"
	fi
	if [ "$trace" -eq 1 ]; then
		printf '%-14s -> %3d %s\n' "$_name" "$rc" "$(explain "$rc")" >&2
	fi
}

# process IN: the steps for one envelope; the envelope for sqs-ack in
# $final.  Once charge-debit wrote its envelope, idemp-done always sees it:
# after a good debit the record must end DEBITED_NOTIFICATION_FAILED or
# DONE whatever the notification did, so a notify step that crashed or
# wrote nothing hands the debited envelope on instead of its own.
process() {
	in=$1
	first_rc=0 debit_rc=-1
	: > "$work/st"
	run_step idemp-claim "$in" "$work/claimed" $CLAIM $claim_args
	final=$work/claimed
	if [ "$rc" -ne 0 ]; then
		# (a store that refuses the claim as CONFIG counts as the bank's
		# refusal does, below)
		[ "$rc" -ne 78 ] || debit_rc=78
		return 0
	fi
	run_step charge-debit "$final" "$work/debited" $DEBIT $debit_args
	debit_rc=$rc
	# A debit step that wrote nothing: what the bank did is unknown; the
	# claim's lease holds the charge and sqs-ack leaves the message.
	[ -s "$work/debited" ] || return 0
	final=$work/debited
	if [ "$rc" -eq 0 ]; then
		run_step charge-notify "$final" "$work/notified" $NOTIFY $notify_args
		[ "$rc" -ge 128 ] || [ ! -s "$work/notified" ] || final=$work/notified
	fi
	run_step idemp-done "$final" "$work/done" $DONE
	[ ! -s "$work/done" ] || final=$work/done
}

# --- the messages of one receive, one process per step ---------------------

# batch: the envelopes of one receive ($work/recv, up to 10) through one
# process per step, each with --stream over them all and chained by pipes
# as a --stream pipeline is, ending with the batch: the bank and gateway
# calls go out together, and a copy next to its original is held in
# idemp-claim until the original's finish is recorded (DUP_DONE).  The
# steps ignore the stop signals (nostop) and finish the batch; the loop
# stops after it.  sqs-ack's lines go to $work/acked, its status in $arc;
# what charge-debit wrote and sqs-ack never saw (a later step died) goes
# through idemp-done and sqs-ack again, as after a pipeline; what none
# wrote is stranded (ended).
batch() {
	arc=0
	: > "$work/st"
	stepst "$work/st" idemp-claim $CLAIM --stream $claim_args < "$work/recv" \
		| stepst "$work/st" charge-debit $DEBIT --stream $debit_args \
		| nostop tee -p "$work/debited" | stepst "$work/st" charge-notify $NOTIFY --stream $notify_args \
		| stepst "$work/st" idemp-done $DONE --stream \
		| stepst "$work/st" sqs-ack $ACK --stream > "$work/acked" || arc=$?
	unacked "$work/debited" "$work/acked" > "$work/left"
	if [ -s "$work/left" ]; then
		echo "$clr$PROG: $(wc -l < "$work/left") envelope(s) past charge-debit did not reach sqs-ack (a step ended early); recording them now" >&2
		nostop $DONE --stream < "$work/left" | nostop $ACK --stream >> "$work/acked" || arc=$?
	fi
	ended "$work/st" "$work/recv" "$work/acked"
}

# --- trace ------------------------------------------------------------------

if [ "$trace" -eq 1 ]; then
	work=$(mktemp -d "${TMPDIR:-/tmp}/charge-worker.XXXXXX") || exit 70
	trap 'rm -rf "$work"' EXIT
	cat > "$work/in"
	process "$work/in"
	cat "$final"
	# The status of the step that decided the charge: the first that was not OK.
	exit "$first_rc"
fi

# --- before anything is received ----------------------------------------------

# preflight CMD ARGS...: ask a command whether its configuration holds (no
# network for the steps' --check).  78 ends the run here, before a message
# is received and its claim taken; the command said why on stderr.
preflight() {
	_rc=0
	_err=$("$@" 2>&1 < /dev/null > /dev/null) || _rc=$?
	[ -z "$_err" ] || printf '%s\n' "$_err" >&2
	case $_rc in
	0|1) ;;
	78) die "$1: configuration refused (above); nothing was received" 78 ;;
	64) echo "$PROG: $1 does not know $2; its configuration is not checked before the run" >&2 ;;
	*) echo "$PROG: $* answered $_rc $(explain "$_rc"); going on" >&2 ;;
	esac
}
# the lease, a retention longer than it, and the store (opened as the
# claim opens it: idemp-show would not create the embedded one)
preflight $CLAIM --check-store $claim_args
preflight $DEBIT --check $debit_args
preflight $NOTIFY --check $notify_args
# The queue, the DLQ sqs-ack fills and the state directory, as C resolves them.
rc=0
resolved=$(sqs-stat --resolve) || rc=$?
[ "$rc" -eq 0 ] || die "sqs-stat: configuration refused (above); nothing was received" "$rc"
tab=$(printf '\t')
queue=
while IFS=$tab read -r k v; do
	case $k in stateDir) state=$v ;; queue) queue=$v ;; esac
done <<EOF2
$resolved
EOF2
# A drain's receive that finds the embedded queue empty is exact at once;
# SQS's short poll samples some of its servers, so there it long-polls.
if [ -z "$wait" ]; then
	case $queue in sqlite:*) wait=0 ;; *) wait=1 ;; esac
fi

# --- the lock ----------------------------------------------------------------

if [ "$nolock" -eq 0 ]; then
	[ -n "$lock" ] || { mkdir -p "$state" && chmod 700 "$state"; lock=$state/charge-worker.lock; }
	command -v flock >/dev/null || die "flock(1) not found (util-linux); use --no-lock" 78
	exec 9>>"$lock" || die "cannot open lock file $lock" 78
	if ! flock -n 9; then
		echo "$PROG: another run holds $lock; nothing to do" >&2
		exit 1
	fi
fi

# --- progress on a terminal ------------------------------------------------------
# When stderr is a terminal: one line, rewritten at most four times a second
# by a reader that sums the counts each loop's sqs-ack keeps in
# $tmp/ID.progress (sqs-ack --progress, through $IDEMKIT_PROGRESS, which a
# replaced step ignores), and at the end a table of the outcomes before the
# summary line.  The cursor is left at the start of the line, so what else
# is written to stderr covers it; our own messages clear it first ($clr).
# Off a terminal none of it, and sqs-ack keeps no counts.

unset IDEMKIT_PROGRESS
tty=0 clr=''
if [ -t 2 ] && p_t0=$(idemkit-metrics --clock 2>/dev/null); then
	tty=1 clr=$(printf '\033[K')
fi
# progress_line RECEIVED DEBITED DUPS LEFT DLQ: the line, drawn in place.
progress_line() {
	_ms=$(($(idemkit-metrics --clock) - p_t0))
	_r10=$(($1 * 10000 / (_ms > 0 ? _ms : 1)))
	_dlq=''
	[ "${5:-0}" -eq 0 ] || _dlq=", $5 to the DLQ"
	printf '\r\033[K%s: %d received, %d debited, %d duplicates, %d left%s, %d.%d/s\r' \
		"$PROG" "$1" "$2" "$3" "$4" "$_dlq" $((_r10 / 10)) $((_r10 % 10)) >&2
}
# progress_reader: the line from the loops' counts, every 250 ms (1 s
# where sleep takes whole seconds only).  A terminal's ^C is the
# driver's to handle; TERM ends the reader.
progress_reader() {
	trap '' INT HUP
	trap 'exit 0' TERM
	dlq_names=$(idemkit-code | awk -F '\t' '$3 == "dlq" { printf "%s ", $2 }')
	while :; do
		sleep 0.25 2>/dev/null || sleep 1
		kill -0 "$$" 2>/dev/null || exit 0   # the driver is gone
		# shellcheck disable=SC2046  # five numbers, split on purpose
		progress_line $(awk -F '\t' -v dlq=" $dlq_names" '
			{ n[$1] += $2 }
			index(dlq, " " $1 " ") { d += $2 }
			END { printf "%d %d %d %d %d", n["RECEIVED"], n["OK"],
				n["DUP_DONE"] + n["DUP_IN_PROGRESS"] + n["DUP_FAILED"], n["LEFT"], d }' \
			"$tmp"/*.progress 2>/dev/null)
	done
}
# outcomes_table: the run's outcomes for a person, from the v_NAME counts
# and the meanings in the one table, then what is counted outside it.
outcomes_table() {
	_ms=$(($(idemkit-metrics --clock) - p_t0))
	_r10=$((received * 10000 / (_ms > 0 ? _ms : 1)))
	printf '%s: %d received in %d.%ds (%d.%d/s)\n' "$PROG" "$received" \
		$((_ms / 1000)) $((_ms % 1000 / 100)) $((_r10 / 10)) $((_r10 % 10))
	printf '  %-18s %7s  %s\n' outcome count meaning
	idemkit-code | while IFS=$tab read -r _code _name _act _meaning; do
		eval "_n=\${v_$_name:-0}"
		[ "$_n" -eq 0 ] || printf '  %-18s %7d  %s\n' "$_name" "$_n" "$_meaning"
	done
	[ "$dlq" -eq 0 ] || printf '  %-18s %7d  %s\n' "to the DLQ" "$dlq" "sent to the dead-letter queue, then deleted"
	[ "$left" -eq 0 ] || printf '  %-18s %7d  %s\n' "left for retry" "$left" "not settled in this run: received again later"
	[ "$ack_failed" -eq 0 ] || printf '  %-18s %7d  %s\n' "ack failed" "$ack_failed" "recorded, but the queue refused the ack: comes back"
	[ "$stranded" -eq 0 ] || printf '  %-18s %7d  %s\n' "stranded" "$stranded" "a step died holding them: no sqs-ack saw them; come back"
	[ "$config" -eq 0 ] || printf '  %-18s %7d  %s\n' "config" "$config" "missing or invalid configuration met during the run"
}

# --- the summary's numbers ------------------------------------------------------

# totals: the summary's numbers from the v_NAME counts of a tally and the
# loops' t_KEY counters.
totals() {
	config=$((v_CONFIG + t_config))
	ack_failed=$v_ACK_FAILED
	# Received, then lost with a step that died: no sqs-ack wrote them.
	stranded=${v_STRANDED:-0}
	# Left for a retry: messages none of whose receives in this run ended in
	# a delete (a copy left, or stranded, then received again and settled,
	# is settled).
	left=$((v_UNSETTLED + t_recv_failed))
	dlq=$((v_DUP_FAILED + v_PAYLOAD_MISMATCH + v_DATAERR + v_DECLINED + v_STALE_EVENT))
	received=$v_RECEIVED
}
summary_json() {
	printf '{"summary":true,"received":%d,"debited":%d,"debitedNotificationFailed":%d,"declined":%d,"dupDone":%d,"dupInProgress":%d,"dupFailed":%d,"payloadMismatch":%d,"invalid":%d,"staleEvent":%d,"leaseLost":%d,"toDlq":%d,"leftForRetry":%d,"ackFailed":%d,"stranded":%d,"bankReplays":%d,"config":%d}\n' \
		"$received" "$v_OK" "$v_NOTIFY_FAILED" "$v_DECLINED" "$v_DUP_DONE" \
		"$v_DUP_IN_PROGRESS" "$v_DUP_FAILED" "$v_PAYLOAD_MISMATCH" "$v_DATAERR" "$v_STALE_EVENT" "$v_LEASE_LOST" \
		"$dlq" "$left" "$ack_failed" "$stranded" "${v_BANK_REPLAYED:-0}" "$config"
}
# tally_delta OLD NEW: NEW's counts less OLD's (both idemkit-code --tally).
tally_delta() {
	awk -F '\t' -v OFS='\t' 'FILENAME == ARGV[1] { o[$1] = $2; next } { print $1, $2 - o[$1] }' "$1" "$2"
}

# metrics_ticker: while a run that does not end by itself lasts, every
# --metrics-every seconds, the metrics file from what the loops' sqs-ack
# wrote since the last write (whole lines only: a loop may be writing),
# with status 0: the run is alive and settling.  The loops' own failures
# (a receive refused) are counted when the run ends.
metrics_ticker() {
	# A stop waits for a write under way (the final write counts from
	# tally.ticked: a write made and not yet marked would count twice),
	# and ends the sleep at once (a waited background sleep).
	trap '' INT HUP
	tick_stop=0 tick_sleep=
	trap 'tick_stop=1; [ -z "$tick_sleep" ] || kill "$tick_sleep" 2>/dev/null' TERM
	for k in $COUNTERS; do eval "t_$k=0"; done
	idemkit-code --tally < /dev/null > "$tmp/tally.ticked"
	while [ "$tick_stop" -eq 0 ]; do
		sleep "$metrics_every" & tick_sleep=$!
		wait "$tick_sleep"
		tick_sleep=
		[ "$tick_stop" -eq 0 ] || break
		kill -0 "$$" 2>/dev/null || break   # the driver is gone
		for f in "$tmp"/*.out "$tmp"/*.stranded; do
			[ -f "$f" ] && head -n "$(wc -l < "$f")" "$f"
		done | idemkit-code --tally > "$tmp/tally.now" || continue
		tally_delta "$tmp/tally.ticked" "$tmp/tally.now" > "$tmp/tally.delta"
		while IFS=$tab read -r k v; do eval "v_$k=\$v"; done < "$tmp/tally.delta"
		totals
		summary_json | idemkit-metrics --file "$metrics" --job worker --started "$started" \
			--status 0 || echo "$clr$PROG: the metrics file $metrics was not written" >&2
		mv "$tmp/tally.now" "$tmp/tally.ticked"
	done
}

# --- the loops ---------------------------------------------------------------

stop=0
on_signal() { stop=$1; }
trap 'on_signal 15' TERM
trap 'on_signal 2' INT
trap 'on_signal 1' HUP

tmp=$(mktemp -d "${TMPDIR:-/tmp}/charge-worker.XXXXXX") || exit 70
# What is counted outside sqs-ack's output: receive failures, refusals of
# the configuration, a dead sqs-recv, and steps that exited 70 holding
# messages (ended).
COUNTERS="config recv_failed died software"

# Every loop appends what sqs-ack wrote to $tmp/ID.out and what it received
# that no sqs-ack wrote to $tmp/ID.stranded: the one source of the run's
# outcomes (idemkit-code --tally counts them by verdict).

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
	: > "$tmp/$id.out"
	# The messages of each receive go through the steps together (batch),
	# up to 10; one at a time with --once, and when a step is replaced: a
	# replaced step keeps the one-envelope contract, its exit code the
	# outcome (process).
	max=10
	[ "$once" -eq 0 ] && [ -z "$replaced" ] || max=1
	[ "$tty" -eq 0 ] || export IDEMKIT_PROGRESS="$tmp/$id.progress"
	for k in $COUNTERS; do eval "n_$k=0"; done
	config_run=0
	while [ "$stop" -eq 0 ]; do
		rc=0
		$RECV --max "$max" --wait "$wait" > "$work/recv" || rc=$?
		if [ "$rc" -eq 1 ] && [ "$drain" -eq 1 ]; then
			# Empty now; a drain waits for the copies it left that
			# are due back within one lease (sqs-recv reads them
			# from what sqs-ack wrote).
			rc=0
			$RECV --max "$max" --wait "$wait" --acked "$tmp/$id.out" --settle "${settle_ms}ms" \
				> "$work/recv" || rc=$?
		fi
		if [ "$rc" -eq 1 ]; then
			[ "$drain" -eq 1 ] && break
			[ "$once" -eq 1 ] && break
			continue
		fi
		if [ "$rc" -ge 128 ]; then
			# A stop, or sqs-recv died: what it wrote out goes no
			# further (stranded); one that died may have held more.
			echo "sqs-recv $rc" > "$work/st"
			if [ "$stop" -ne 0 ]; then : > "$work/st"; fi
			: > "$work/acked"
			ended "$work/st" "$work/recv" "$work/acked"
			break
		fi
		if [ "$rc" -ne 0 ]; then
			echo "$clr$PROG: receive failed ($rc $(explain "$rc")); backing off" >&2
			[ "$rc" -eq 78 ] && { n_config=$((n_config + 1)); break; }
			# A drain (cron) run ends here with 75, as the --stream
			# pipeline does: the next run is the retry.  Otherwise it
			# would wait out the outage with the lock held.
			{ [ "$drain" -eq 1 ] || [ "$once" -eq 1 ]; } && { n_recv_failed=$((n_recv_failed + 1)); break; }
			sleep 2
			continue
		fi
		if [ "$max" -gt 1 ]; then
			batch
			cat "$work/acked" >> "$tmp/$id.out"
			# 78: sqs-ack halted, the bank (or the store, at the
			# claim) refused IK_ACKER_CONFIG_RUN charges in a row as
			# CONFIG, or the queue's configuration is refused.
			# Across batches, as the one-at-a-time loop counts below:
			# a batch with a debit answered starts the count again.
			[ "$arc" -ne 78 ] || break
			idemkit-code --tally < "$work/acked" > "$work/tally"
			b_OK=0 b_NOTIFY_FAILED=0 b_DECLINED=0 b_CONFIG=0 b_ACK_FAILED=0
			while IFS=$tab read -r k v; do
				case $k in OK|NOTIFY_FAILED|DECLINED|CONFIG|ACK_FAILED) eval "b_$k=\$v" ;; esac
			done < "$work/tally"
			# The queue refused acks: as below, one at a time.
			if [ "$b_ACK_FAILED" -gt 0 ]; then
				echo "$clr$PROG: ack failed for $b_ACK_FAILED message(s); left" >&2
				{ [ "$drain" -eq 1 ] || [ "$once" -eq 1 ]; } && break
				sleep 2
			fi
			if [ $((b_OK + b_NOTIFY_FAILED + b_DECLINED)) -gt 0 ]; then
				config_run=0
			else
				config_run=$((config_run + b_CONFIG))
				[ "$config_run" -lt 3 ] || break
			fi
			continue
		fi
		process "$work/recv"
		# One envelope line from sqs-ack into the loop's output; none (a
		# step died with nothing written, so nothing is acked; or sqs-ack
		# died): the message is stranded (ended).
		arc=0
		: > "$work/acked"
		if [ -s "$final" ]; then
			$ACK < "$final" > "$work/acked" || arc=$?
			[ -s "$work/acked" ] || [ -s "$work/st" ] || echo "sqs-ack $arc" > "$work/st"
		fi
		if [ -s "$work/acked" ]; then
			cat "$work/acked" >> "$tmp/$id.out"
		fi
		if [ ! -s "$work/acked" ] || [ -s "$work/st" ]; then
			ended "$work/st" "$work/recv" "$work/acked"
		fi
		# The queue refused the ack (busy, unreachable, misconfigured):
		# the message was left and comes back.  A drain or --once run
		# ends here with 75 as on a failed receive (the next run is the
		# retry, a redelivery is DUP_DONE); otherwise wait and go on.
		case $arc in
		75|78)
			echo "$clr$PROG: ack failed ($arc $(explain "$arc")); the message was left" >&2
			{ [ "$drain" -eq 1 ] || [ "$once" -eq 1 ]; } && break
			sleep 2 ;;
		esac
		[ "$once" -eq 1 ] && break
		# The bank (or the store, at the claim) refused 3 charges in a
		# row as CONFIG, none answered between (IK_ACKER_CONFIG_RUN, as
		# sqs-ack --stream halts): its configuration refuses every
		# charge; stop here (78) rather than walk the queue.  One such charge among good ones goes on.
		case $debit_rc in
		78) config_run=$((config_run + 1)); [ "$config_run" -lt 3 ] || break ;;
		0|20) config_run=0 ;;
		esac
	done
	: > "$tmp/$id.stats"
	for k in $COUNTERS; do eval "echo \"$k \$n_$k\"" >> "$tmp/$id.stats"; done
}

# unacked DEBITED ACKED: the envelopes of DEBITED whose receipt is in no
# line of ACKED (receipts are opaque; found wherever the key sits).
unacked() {
	awk 'function receipt() { return match($0, /"receipt":"[^"]*"/) ? substr($0, RSTART, RLENGTH) : "" }
	FILENAME == ARGV[1] { seen[receipt()] = 1; next }
	!(receipt() in seen)' "$2" "$1"
}

# nostop CMD ARGS...: CMD with the stop signals ignored, which the steps
# keep (a signal ignored on entry stays ignored, as the shell does for
# background jobs).  A signal to the whole process group -- systemd's
# KillMode=control-group, supervisord's stopasgroup, kill -TERM -PGID --
# then stops the receiver alone, as a stop of the driver does, and every
# step after it finishes what was received and ends at end of input:
# stopped with the receiver, a step would leave the answers in flight
# behind it nowhere to go.
nostop() { trap '' TERM INT HUP; exec "$@"; }

# stepst FILE NAME CMD ARGS...: CMD as nostop runs it, its status then
# appended to FILE as "NAME STATUS" (NAME: the step's name in the flow,
# whatever command runs it).  A shell waits for it, so which step of a
# pipeline died is known, not guessed from what is missing.
stepst() {
	_f=$1 _n=$2
	shift 2
	trap '' TERM INT HUP
	_rc=0
	"$@" || _rc=$?
	echo "$_n $_rc" >> "$_f"
	exit "$_rc"
}

# flow_at NAME: the step's place in the flow, in $_p.
flow_at() {
	case $1 in
	sqs-recv) _p=1 ;; idemp-claim) _p=2 ;; charge-debit) _p=3 ;;
	charge-notify) _p=4 ;; idemp-done) _p=5 ;; *) _p=6 ;;
	esac
}

# ended ST RECEIVED ACKED: after a pipeline (or one message) ended.  The
# envelopes of RECEIVED whose receipt is in no line of ACKED reached no
# sqs-ack: they are added to $tmp/ID.stranded, which the run's tally counts
# (STRANDED: received, and left for a retry unless another copy was
# settled).  ST holds the steps' statuses; the step that ended the
# pipeline is the last in the flow that did not end as it should (the
# steps before it then fail to write, those after it see the end of their
# input).  It is named on stderr with what it left unsettled, and noted
# for the run's status: a dead sqs-recv keeps it from 0 and 1 (what it held
# and had not handed out cannot be counted), and one that exited 70
# leaving messages unsettled makes it 70.
ended() {
	unacked "$2" "$3" > "$work/stranded"
	_n=0
	if [ -s "$work/stranded" ]; then
		_n=$(wc -l < "$work/stranded")
		cat "$work/stranded" >> "$tmp/$id.stranded"
	fi
	_dead='' _code=0 _at=0
	while read -r _s _c; do
		case $_s:$_c in
		*:0|sqs-recv:1|sqs-recv:129|sqs-recv:130|sqs-recv:143) continue ;;
		sqs-recv:75|sqs-recv:78)
			echo "$clr$PROG: receive failed ($_c $(explain "$_c"))" >&2
			if [ "$_c" -eq 75 ]; then n_recv_failed=$((n_recv_failed + 1))
			else n_config=$((n_config + 1)); fi
			continue ;;
		esac
		flow_at "$_s"
		[ "$_p" -le "$_at" ] || _dead=$_s _code=$_c _at=$_p
	done < "$1"
	if [ -z "$_dead" ]; then
		[ "$_n" -eq 0 ] || echo "$clr$PROG: $_n message(s) received reached no sqs-ack; left on the queue, received again after their visibility timeout" >&2
		return 0
	fi
	if [ "$_code" -ge 128 ]; then _how="was killed by signal $((_code - 128))"
	else _how="exited $_code $(explain "$_code")"; fi
	if [ "$_dead" = sqs-recv ]; then
		echo "$clr$PROG: sqs-recv $_how: $_n message(s) it handed out reached no sqs-ack, and what it held is not known; left on the queue, received again after their visibility timeout" >&2
		n_died=$((n_died + 1))
	elif [ "$_n" -gt 0 ]; then
		echo "$clr$PROG: $_dead $_how holding $_n message(s) received and not settled (they reached no sqs-ack); left on the queue, received again after their visibility timeout" >&2
	else
		echo "$clr$PROG: $_dead $_how; none of what it held was stranded (it reached sqs-ack another way)" >&2
	fi
	if [ "$_n" -gt 0 ] || [ "$_dead" = sqs-recv ]; then
		[ "$_code" -ne 70 ] || n_software=$((n_software + 1))
		[ "$_code" -ne 78 ] || [ "$_dead" = sqs-ack ] || n_config=$((n_config + 1))
	fi
}

# loop_stream ID: one pipeline of long-lived processes.
loop_stream() {
	id=$1
	work=$tmp/w$id
	mkdir -p "$work"
	for k in $COUNTERS; do eval "n_$k=0"; done
	# At most $window messages in flight per pipeline: the receiver counts
	# what sqs-ack has written, so a slow bank slows the receiving instead
	# of letting claimed messages wait in the pipes past their leases.
	# What it hands out is also kept (--tee, written once it is out), to
	# be compared with what sqs-ack wrote when the pipeline has ended.
	: > "$tmp/$id.out"
	: > "$tmp/$id.recvd"
	: > "$work/st"
	[ "$tty" -eq 0 ] || export IDEMKIT_PROGRESS="$tmp/$id.progress"
	recv_args="--max 10 --wait $wait --window $window --max-age ${max_age_ms}ms --acked $tmp/$id.out --tee $tmp/$id.recvd"
	if [ "$drain" -eq 1 ]; then
		recv_args="$recv_args --drain --settle ${settle_ms}ms"
	else
		recv_args="$recv_args --follow"
	fi
	# A stop goes to the receiver only: it stops receiving, and the rest of
	# the pipeline finishes what is in flight and ends at end of input.
	trap 'stop=15; kill -TERM "$(cat "$tmp/$id.recv" 2>/dev/null)" 2>/dev/null' TERM
	trap 'stop=2; kill -TERM "$(cat "$tmp/$id.recv" 2>/dev/null)" 2>/dev/null' INT
	trap 'stop=1; kill -TERM "$(cat "$tmp/$id.recv" 2>/dev/null)" 2>/dev/null' HUP
	# What charge-debit writes is also kept (tee -p goes on into the file
	# when the pipe after it breaks).  When sqs-ack ends, the receiver is
	# stopped, so a pipeline whose later step died winds down instead of
	# receiving and debiting for nobody.  The subshell outlives a signal
	# to the group (a trap, not ignored: the receiver must still take its
	# stop), so the wait below ends when the last step has.  Each step's
	# status goes to $work/st (stepst; the receiver's and sqs-ack's by the
	# shells around them, which outlive a stop as the steps do).
	st=$work/st
	(
		trap : TERM HUP
		{ trap : TERM INT HUP; r=0
		  sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$tmp/$id.recv" $RECV $recv_args || r=$?
		  echo "sqs-recv $r" >> "$st"; } \
			| stepst "$st" idemp-claim $CLAIM --stream $claim_args \
			| stepst "$st" charge-debit $DEBIT --stream $debit_args \
			| nostop tee -p "$tmp/$id.debited" \
			| stepst "$st" charge-notify $NOTIFY --stream $notify_args \
			| stepst "$st" idemp-done $DONE --stream \
			| { trap '' TERM INT HUP; a=0; $ACK --stream > "$tmp/$id.out" || a=$?
			    echo "sqs-ack $a" >> "$st"
			    kill -TERM "$(cat "$tmp/$id.recv")" 2>/dev/null; }
	) &
	pipe=$!
	while ! wait "$pipe"; do kill -0 "$pipe" 2>/dev/null || break; done
	# Money that moved is recorded even when a step after the debit died:
	# what the debit step wrote and sqs-ack never saw goes through
	# idemp-done and sqs-ack now.
	unacked "$tmp/$id.debited" "$tmp/$id.out" > "$tmp/$id.left"
	if [ -s "$tmp/$id.left" ]; then
		echo "$clr$PROG: $(wc -l < "$tmp/$id.left") envelope(s) past charge-debit did not reach sqs-ack (a step ended early); recording them now" >&2
		nostop $DONE --stream < "$tmp/$id.left" | nostop $ACK --stream >> "$tmp/$id.out"
	fi
	ended "$st" "$tmp/$id.recvd" "$tmp/$id.out"
	: > "$tmp/$id.stats"
	for k in $COUNTERS; do eval "echo \"$k \$n_$k\"" >> "$tmp/$id.stats"; done
}

pids=
reader=
if [ "$tty" -eq 1 ]; then progress_reader & reader=$!; fi
ticker=
if [ -n "$metrics" ] && [ "$drain" -eq 0 ] && [ "$once" -eq 0 ]; then
	metrics_ticker & ticker=$!
fi
i=1
while [ "$i" -le "$jobs" ]; do
	if [ "$stream" -eq 1 ]; then loop_stream "$i" & else loop "$i" & fi
	pids="$pids $!"
	i=$((i + 1))
done
# Forward a stop to the loops: each finishes its message in flight.
trap 'stop=15; kill -TERM $pids 2>/dev/null' TERM
trap 'stop=2; kill -TERM $pids 2>/dev/null' INT
trap 'stop=1; kill -TERM $pids 2>/dev/null' HUP
# A stop that came while the loops were being started was only noted
# (on_signal): forward it now, or a loop started before it would run on
# and this wait with it (a stop just after the start hung until SIGKILL).
[ "$stop" -eq 0 ] || kill -TERM $pids 2>/dev/null
# And once more a second later, to the loops not yet waited for: a loop
# that caught the stop between its fork and setting its own traps has lost
# it (the shell drops a signal its subshell caught with the parent's trap
# just reset), and would run on with this wait (1 stop in 40 just after
# the start, under load).  A loop that had it takes it again, harmlessly;
# an exited loop's pid stays ours until it is waited for.
resent=0
stop_again() {  # PIDS
	{ [ "$stop" -eq 0 ] || [ "$resent" -eq 1 ]; } && return 0
	resent=1
	sleep 1
	kill -TERM $1 2>/dev/null
}
rest=$pids
for p in $pids; do
	stop_again "$rest"
	while ! wait "$p"; do
		kill -0 "$p" 2>/dev/null || break
		stop_again "$rest"
	done
	rest=${rest#*" $p"}
done
for p in $reader $ticker; do
	kill -TERM "$p" 2>/dev/null
	wait "$p"
done

# --- the summary ---------------------------------------------------------------

for k in $COUNTERS; do eval "t_$k=0"; done
for f in "$tmp"/*.stats; do
	[ -f "$f" ] || continue
	while read -r k v; do eval "t_$k=\$((t_$k + v))"; done < "$f"
done
# The outcomes, by the verdict sqs-ack acted on (v_NAME for each code).
cat "$tmp"/*.out "$tmp"/*.stranded 2>/dev/null | idemkit-code --tally > "$tmp/tally" || exit 70
while IFS=$tab read -r k v; do eval "v_$k=\$v"; done < "$tmp/tally"
totals
if [ "$tty" -eq 1 ]; then
	# The last line shows the run's totals, then gives way to the table.
	progress_line "$received" "$v_OK" $((v_DUP_DONE + v_DUP_IN_PROGRESS + v_DUP_FAILED)) "$left" "$dlq"
	printf '\r\033[K' >&2
	outcomes_table >&2
fi
status=0
if [ "$stop" -ne 0 ]; then status=$((128 + stop))
elif [ "$config" -gt 0 ]; then status=78
# 0 only when every message received was settled (a dead sqs-recv may have
# held more than it handed out); 70 when a step that exited 70 held some.
elif [ "$left" -gt 0 ] || [ "$ack_failed" -gt 0 ] || [ "$t_died" -gt 0 ]; then
	status=75
	[ "$t_software" -eq 0 ] || status=70
elif [ "$received" -eq 0 ]; then status=1
fi
summary_json | summary_line "$status"
if [ -n "$metrics" ] && [ -s "$tmp/tally.ticked" ]; then
	# The periodic writes counted part of this run already: the file gets
	# the rest (the summary line above keeps the run's totals).
	tally_delta "$tmp/tally.ticked" "$tmp/tally" > "$tmp/tally.rest"
	while IFS=$tab read -r k v; do eval "v_$k=\$v"; done < "$tmp/tally.rest"
	totals
	summary_json > "$summary_file"
fi
rm -rf "$tmp"
exit "$status"
