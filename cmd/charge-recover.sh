#!/bin/sh
# charge-recover: the cron recovery jobs, each a pipeline of idemkit steps.
#
#   --renotify  DEBITED_NOTIFICATION_FAILED records: send the notification
#               again; on success the record becomes DONE.  Never re-debits.
#   --redrive   IN_PROGRESS records whose lease ended long ago (a worker died
#               and its message is gone): put the stored event back on the
#               queue; the normal flow reclaims it and debits with the same
#               idempotency key, which the bank answers as a replay if the
#               first debit went through.
#   --dlq       move the dead-letter queue back to the main queue after a
#               fix; a message is deleted from the DLQ only once it is sent.
#
# Each mode takes its own lock, so an overrunning cron run is never doubled.

# Step commands and their arguments are split into words on purpose.
# shellcheck disable=SC2086

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
PROG=charge-recover
USAGE="usage: charge-recover --renotify [--older-than DUR] [--notify-timeout SECS]
                      [--notify-retries N]
       charge-recover --redrive [--older-than DUR]
       charge-recover --dlq [--max N]
       (each mode also takes --metrics FILE)
"

usage() { printf '%s' "$USAGE" >&2; echo "Try '$PROG --help' for more information." >&2; exit 64; }
die() { echo "$PROG: $1" >&2; exit "${2:-64}"; }

help() {
	printf '%s' "$USAGE"
	cat <<'TXT'

Options:
  -n, --renotify           re-send notifications of DEBITED_NOTIFICATION_FAILED
                           records; each that succeeds becomes DONE
  -r, --redrive            re-enqueue the stored event of IN_PROGRESS records
                           whose lease ended more than --older-than ago
  -d, --dlq                move messages from the DLQ ($IDEMKIT_DLQ) back to the
                           queue ($IDEMKIT_QUEUE)
  -o, --older-than DUR     only records last updated more than DUR ago
                           (default 10m for --renotify, 1h for --redrive)
      --max N              at most N messages per DLQ receive batch (default 10)
      --notify-timeout S   per notification attempt (default 5)
      --notify-retries N   (default 3)
      --metrics FILE       at the end of the run, replace FILE (atomically) with
                           the run's Prometheus metrics (idemkit-metrics(1))
  -h, --help               this help
  -V, --version            print the version

Exit status:
    0  OK                something was recovered
    1  EMPTY             nothing to recover; or another run holds the lock
   64  USAGE             bad command line
   75  TEMPFAIL          some could not be recovered now (they stay for the next run)
   78  CONFIG            missing or invalid configuration

See charge-recover(1) and idemkit(7).
TXT
	exit 0
}

mode='' older='' max=10 notify_timeout=5 notify_retries=3 metrics=''
need() { [ $# -ge 2 ] || die "$1 needs a value"; }
setmode() { [ -z "$mode" ] || die "choose one of --renotify, --redrive, --dlq"; mode=$1; }
while [ $# -gt 0 ]; do
	case $1 in
	-n|--renotify) setmode renotify ;;
	-r|--redrive) setmode redrive ;;
	-d|--dlq) setmode dlq ;;
	-o|--older-than) need "$@"; older=$2; shift ;;
	--max) need "$@"; max=$2; shift ;;
	--notify-timeout) need "$@"; notify_timeout=$2; shift ;;
	--notify-retries) need "$@"; notify_retries=$2; shift ;;
	--metrics) need "$@"; metrics=$2; shift ;;
	-h|--help) help ;;
	-V|--version) echo "$PROG (idemkit) $VERSION"; exit 0 ;;
	*) echo "$PROG: unknown option '$1'" >&2; usage ;;
	esac
	shift
done
[ -n "$mode" ] || usage
isnum() { case $1 in ''|*[!0-9]*) return 1 ;; esac; }
for v in "$max" "$notify_timeout" "$notify_retries"; do
	isnum "$v" || die "want a whole number, got '$v'"
done

# The state directory and the DLQ as the C commands resolve them (the same
# DLQ sqs-ack fills: $IDEMKIT_DLQ, else the queue's own NAME-dlq).
resolved=$(sqs-stat --resolve) || exit $?
tab=$(printf '\t')
state='' dlq=''
while IFS=$tab read -r k v; do
	case $k in
	stateDir) state=$v ;;
	dlq) dlq=$v ;;
	esac
done <<EOF
$resolved
EOF
{ mkdir -p "$state" && chmod 700 "$state"; } || die "cannot create $state" 78
exec 9>>"$state/charge-recover-$mode.lock" || die "cannot open the lock in $state" 78
if ! flock -n 9; then
	echo "$PROG: another --$mode run is active; nothing to do" >&2
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/charge-recover.XXXXXX") || exit 70
trap 'rm -rf "$tmp"' EXIT

# The summary line is written at exit, when the status is known: with
# IDEMKIT_LOG=quiet (cron) only when the run did not succeed (a status other
# than 0 and 1), so a quiet job mails nothing on success.
# --metrics FILE: idemkit-metrics writes it from the summary line at exit,
# whatever the status; a file it cannot write is a warning only.
summary() {
	printf '%s\n' "$1" > "$tmp/summary"
}
# shellcheck disable=SC2317  # called from the EXIT trap
summary_at_exit() {
	[ -s "$tmp/summary" ] || return 0
	if [ "${IDEMKIT_LOG:-}" != quiet ] || [ "$1" -gt 1 ]; then cat "$tmp/summary" >&2; fi
}
# shellcheck disable=SC2317  # called from the EXIT trap
metrics_at_exit() {
	[ -s "$tmp/summary" ] && idemkit-metrics --file "$metrics" --job "recover-$mode" \
		--started "$started" --status "$1" < "$tmp/summary" \
		|| echo "$PROG: the metrics file $metrics was not written" >&2
}
if [ -n "$metrics" ]; then
	started=$(idemkit-metrics --clock) || die "idemkit-metrics not found" 78
	trap 'rc=$?; summary_at_exit "$rc"; metrics_at_exit "$rc"; rm -rf "$tmp"; exit "$rc"' EXIT
else
	trap 'rc=$?; summary_at_exit "$rc"; rm -rf "$tmp"; exit "$rc"' EXIT
fi

# --- progress on a terminal ----------------------------------------------------
# When stderr is a terminal: one line, rewritten at most four times a
# second, counting the lines of the step's output as they come (the reader
# reads only what was added since it last looked), and at the end a table
# before the summary line.  Off a terminal none of it.

tty=0
if [ -t 2 ] && p_t0=$(idemkit-metrics --clock 2>/dev/null); then tty=1; fi
# progress_line DONE FOUND OK LABEL: the line, drawn in place (the cursor
# left at its start, so what else is written covers it).
progress_line() {
	_ms=$(($(idemkit-metrics --clock) - p_t0))
	_r10=$(($1 * 10000 / (_ms > 0 ? _ms : 1)))
	printf '\r\033[K%s: %s %d of %d, %d %s, %d.%d/s\r' "$PROG" "$mode" "$1" "$2" "$3" "$4" \
		$((_r10 / 10)) $((_r10 % 10)) >&2
}
# progress_start FILE PATTERN FOUND LABEL: a reader of FILE in the
# background ($reader): its lines, and those matching PATTERN.
progress_start() {
	reader=
	[ "$tty" -eq 1 ] || return 0
	(
		trap '' INT HUP
		trap 'exit 0' TERM
		off=0 n=0 ok=0
		while :; do
			sleep 0.25 2>/dev/null || sleep 1
			kill -0 "$$" 2>/dev/null || exit 0   # the driver is gone
			size=$(wc -c < "$1" 2>/dev/null) || size=0
			if [ "$size" -gt "$off" ]; then
				# the complete lines added since: count, matches, bytes
				# shellcheck disable=SC2046  # three numbers, split on purpose
				set -- "$1" "$2" "$3" "$4" $(tail -c +$((off + 1)) "$1" | head -c $((size - off)) |
					LC_ALL=C awk -v m=$((size - off)) -v pat="$2" '
					{ b += length($0) + 1; n++; k = index($0, pat) > 0; ok += k }
					END { if (b > m) { n--; ok -= k; b -= length($0) + 1 }
						printf "%d %d %d", n, ok, b }')
				n=$((n + $5)) ok=$((ok + $6)) off=$((off + $7))
				set -- "$1" "$2" "$3" "$4"
			fi
			progress_line "$n" "$3" "$ok" "$4"
		done
	) &
	reader=$!
}
# progress_end DONE FOUND OK LABEL: the run's totals last, then the line
# gives way to the table.
progress_end() {
	[ "$tty" -eq 1 ] || return 0
	if [ -n "$reader" ]; then
		kill -TERM "$reader" 2>/dev/null
		wait "$reader"
	fi
	progress_line "$@"
	printf '\r\033[K' >&2
}
# table NAME COUNT MEANING...: the outcomes for a person, on a terminal.
table() {
	[ "$tty" -eq 1 ] || return 0
	_ms=$(($(idemkit-metrics --clock) - p_t0))
	printf '%s: --%s in %d.%ds\n  %-18s %7s  %s\n' "$PROG" "$mode" $((_ms / 1000)) \
		$((_ms % 1000 / 100)) outcome count meaning >&2
	while [ $# -ge 3 ]; do
		printf '  %-18s %7d  %s\n' "$1" "$2" "$3" >&2
		shift 3
	done
}

# list ARGS...: idemp-list into $tmp/list; exit 1 / the error when nothing.
list() {
	rc=0
	idemp-list "$@" > "$tmp/list" || rc=$?
	case $rc in
	0) ;;
	1) summary "{\"summary\":true,\"mode\":\"$mode\",\"found\":0}"; exit 1 ;;
	*) exit "$rc" ;;
	esac
}

count() { grep -c "$1" "$2" || true; }

case $mode in
renotify)
	list --state DEBITED_NOTIFICATION_FAILED --older-than "${older:-10m}" --format envelope
	rc=0
	found=$(wc -l < "$tmp/list")
	: > "$tmp/out"
	progress_start "$tmp/out" '"done":{"outcome":"OK"' "$found" renotified
	charge-notify --stream --timeout "$notify_timeout" --retries "$notify_retries" < "$tmp/list" \
		| idemp-done --stream --renotified > "$tmp/out" || rc=$?
	ok=$(count '"done":{"outcome":"OK"' "$tmp/out")
	progress_end "$(wc -l < "$tmp/out")" "$found" "$ok" renotified
	table found "$found" "DEBITED_NOTIFICATION_FAILED records listed" \
		renotified "$ok" "notification sent again; the record is DONE" \
		stillFailed $((found - ok)) "still DEBITED_NOTIFICATION_FAILED: the next run tries again"
	summary "{\"summary\":true,\"mode\":\"renotify\",\"found\":$found,\"renotified\":$ok,\"stillFailed\":$((found - ok))}"
	[ "$rc" -eq 0 ] || exit "$rc"
	[ "$ok" -eq "$found" ] || exit 75
	;;
redrive)
	list --expired --older-than "${older:-1h}" --format event
	rc=0
	found=$(wc -l < "$tmp/list")
	: > "$tmp/out"
	progress_start "$tmp/out" '"messageId"' "$found" requeued
	sqs-send < "$tmp/list" > "$tmp/out" || rc=$?
	sent=$(count '"messageId"' "$tmp/out")
	progress_end "$(wc -l < "$tmp/out")" "$found" "$sent" requeued
	table found "$found" "IN_PROGRESS records whose lease ended long ago" \
		requeued "$sent" "their stored event sent to the queue again"
	summary "{\"summary\":true,\"mode\":\"redrive\",\"found\":$found,\"requeued\":$sent}"
	[ "$rc" -eq 0 ] || exit "$rc"
	;;
dlq)
	rc=0
	sqs-recv --queue "$dlq" --max "$max" --drain > "$tmp/list" || rc=$?
	case $rc in
	0) ;;
	1) summary '{"summary":true,"mode":"dlq","found":0}'; exit 1 ;;
	*) exit "$rc" ;;
	esac
	rc=0
	found=$(wc -l < "$tmp/list")
	: > "$tmp/out"
	progress_start "$tmp/out" '"messageId"' "$found" requeued
	sqs-send --from-envelope < "$tmp/list" > "$tmp/out" || rc=$?
	sent=$(count '"messageId"' "$tmp/out")
	progress_end "$(wc -l < "$tmp/out")" "$found" "$sent" requeued
	table found "$found" "messages received from the DLQ" \
		requeued "$sent" "sent to the queue again, then deleted from the DLQ"
	summary "{\"summary\":true,\"mode\":\"dlq\",\"found\":$found,\"requeued\":$sent}"
	[ "$rc" -eq 0 ] || exit "$rc"
	;;
esac
exit 0
