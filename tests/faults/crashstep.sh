#!/bin/sh
# crashstep.sh POINT CMD [ARGS...]: a step wrapper for charge-worker's
# *_CMD overrides that kill -9 the worker loop (its parent) at one step
# boundary, once per chargeId (a marker in $CRASH_DIR), then runs
# normally for every later delivery.  POINT:
#   after-claim   claim recorded, the worker dies before the debit
#   during-debit  the debit request is at the bank (it answers slowly);
#                 the worker and the debit call die mid-flight
#   after-debit   the bank debited; the worker dies before idemp-done
#   after-done    the record is DONE; the worker dies before the ack
set -u
point=$1
shift
in=$(mktemp) out=$(mktemp)
trap 'rm -f "$in" "$out"' EXIT
cat > "$in"
id=$(sed -n 's/.*\\"chargeId\\":\\"\([A-Za-z0-9._:-]*\)\\".*/\1/p' "$in" | head -1)
first() {  # true once per chargeId and point
	[ -n "$id" ] && mkdir "$CRASH_DIR/$point.$id" 2>/dev/null
}
die() {
	kill -9 "$PPID"
	exit 137
}
# run_as_is CMD...: the step itself in this process, on the input read
# above; the files are removed first (an exec skips the EXIT trap; the
# open input outlives its name).
run_as_is() {
	{ rm -f "$in" "$out"; exec "$@"; } < "$in"
}
case $point in
after-claim)
	rc=0; "$@" < "$in" > "$out" || rc=$?
	[ "$rc" -eq 0 ] && first && die
	cat "$out"; exit "$rc" ;;
during-debit)
	if grep -q '"claim":{"outcome":"ACQUIRED"' "$in" && first; then
		"$@" < "$in" > "$out" &
		sleep "${CRASH_INFLIGHT:-0.2}"
		kill -9 $! "$PPID"
		exit 137
	fi
	run_as_is "$@" ;;
after-debit)
	rc=0; "$@" < "$in" > "$out" || rc=$?
	[ "$rc" -eq 0 ] && first && die
	cat "$out"; exit "$rc" ;;
after-done)
	grep -q '"done":{"outcome":"OK"' "$in" && first && die
	run_as_is "$@" ;;
esac
echo "crashstep: unknown point $point" >&2
exit 64
