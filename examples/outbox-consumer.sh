#!/bin/sh
# outbox-consumer.sh: a downstream consumer of idemkit's outbox events
# (idemkit(7) OUTBOX), applying each event exactly once as a recorded
# effect: the relay publishes at least once, so the same event can arrive
# twice (a relay that died before its checkpoint, a queue that redelivers);
# each one is applied under idemp-run with the key evt.EVENTID in the
# consumer's OWN idempotency store, so a copy is DUP_DONE and deleted
# without running COMMAND again.
#
# usage: outbox-consumer.sh [--follow] -- COMMAND [ARG...]
#   COMMAND gets the event (JSON, one line) on stdin; exit 0 applied, 75
#   try again later, anything else: released and retried on redelivery
#   (after the queue's redrive, the DLQ).  What it prints goes to this
#   script's standard error: its standard output is the ack stream.
#   Without --follow: until the queue has nothing visible, then exit.
# environment: OUTBOX_QUEUE (default $IDEMKIT_OUTBOX), CONSUMER_STORE
#   (default sqlite:$IDEMKIT_STATE_DIR/consumer.db); the idemkit commands
#   on PATH; jq.
set -eu

usage() {
	echo "usage: outbox-consumer.sh [--follow] -- COMMAND [ARG...]" >&2
	exit 64
}
follow=
[ "${1:-}" = --follow ] && { follow=1; shift; }
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || usage
queue=${OUTBOX_QUEUE:-${IDEMKIT_OUTBOX:-}}
[ -n "$queue" ] || { echo "outbox-consumer: set OUTBOX_QUEUE or IDEMKIT_OUTBOX" >&2; exit 78; }
store=${CONSUMER_STORE:-sqlite:${IDEMKIT_STATE_DIR:-.}/consumer.db}

# Each envelope gets what sqs-ack acts on.  sqs-ack reads a charge's
# steps; here the one step is idemp-run's claim of evt.ID, and once COMMAND
# succeeded that record is DONE whether this delivery or an earlier one
# applied it: a "claim" of DUP_DONE (delete).  TEMPFAIL leaves the message
# for a redelivery, DATAERR dead-letters it.  "apply" says what happened.
#
# One jq for the whole stream, not one per envelope (jq takes about 20 ms
# of CPU to start): for each envelope line it prints two lines, the
# eventId (empty unless the body is a version-1 event) and the body (its
# newlines made spaces, which keeps a JSON text the same document: a raw
# newline can only be whitespace between its tokens).  A line that is not
# JSON gets an empty eventId (DATAERR) like a body that is not an event.
# The envelope itself is passed on as it came, byte for byte, through a
# FIFO beside jq (tee): jq would write bytes that are not UTF-8 as U+FFFD,
# and a body that goes to the DLQ goes intact.
fields() {
	jq -R -r --unbuffered '(try fromjson catch null) as $e
		| ([$e | objects | .body | strings | fromjson? | objects | select(.v == 1) | .eventId | strings] | first // ""),
		  ([$e | objects | .body | strings] | first // "" | gsub("\n"; " "))'
}
apply() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/outbox-consumer.XXXXXX") || exit 75
	trap 'rm -rf "$tmp"' EXIT
	trap 'exit 143' TERM
	trap 'exit 130' INT
	mkfifo "$tmp/env" || exit 75
	# shellcheck disable=SC2094  # a FIFO: tee writes it, the loop reads it
	tee "$tmp/env" | fields | apply_each "$@" 3<"$tmp/env"
}
apply_each() {
	while IFS= read -r id && IFS= read -r body && IFS= read -r env <&3; do
		case $id in *[!0-9a-f]*) id= ;; esac   # an eventId is hex (idemkit(7))
		if [ -z "$id" ]; then
			outcome=DATAERR verdict=DATAERR
		else
			rc=0
			# (>&2: a line COMMAND prints is not an envelope for sqs-ack)
			printf '%s\n' "$body" | idemp-run --store "$store" --key "evt.$id" -- "$@" 3<&- >&2 || rc=$?
			case $rc in
			0) outcome=OK verdict=DUP_DONE ;;
			10) outcome=DUP_DONE verdict=DUP_DONE ;;
			*) outcome=TEMPFAIL verdict=TEMPFAIL ;;
			esac
		fi
		# the envelope is one JSON object on one line (sqs-recv): the two
		# results go before its closing brace
		printf '%s,"apply":{"outcome":"%s","eventId":"%s"},"claim":{"outcome":"%s"}}\n' \
			"${env%\}}" "$outcome" "$id" "$verdict"
	done
}

if [ -n "$follow" ]; then
	sqs-recv --queue "$queue" --follow --max 10 | apply "$@" | sqs-ack --stream --queue "$queue"
	exit
fi
# Bounded by the queue: each round receives and settles up to 10; an empty
# receive (exit 1) ends it.
while :; do
	rc=0
	out=$(sqs-recv --queue "$queue" --max 10) || rc=$?
	[ "$rc" -eq 1 ] && exit 0
	[ "$rc" -eq 0 ] || exit "$rc"
	printf '%s\n' "$out" | apply "$@" | sqs-ack --stream --queue "$queue" > /dev/null
done
