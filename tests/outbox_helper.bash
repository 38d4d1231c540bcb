# tests/outbox_helper.bash: what the outbox suites share (tests/outbox.bats,
# tests/outbox-STORE.bats; `load outbox_helper` after helper and
# queue_backend): finish a charge, read the events queue, the lag gauge.

# finish ID STATE [AMOUNT] [REASON]: claim, the results a worker's steps
# would have written (the bank's reference, the reason), and idemp-done
# (run under $SLOW when set: e.g. faketime for a finish on a slow clock).
finish() {
	local extra
	case $2 in
	DONE) extra='{"debit":{"outcome":"OK","ref":"TXN-T1"},"notify":{"outcome":"OK"}}' ;;
	FAILED) extra="{\"debit\":{\"outcome\":\"DECLINED\",\"error\":\"${4:-}\"}}" ;;
	*) extra="{\"debit\":{\"outcome\":\"OK\",\"ref\":\"TXN-T3\"},\"notify\":{\"outcome\":\"NOTIFY_FAILED\",\"error\":\"${4:-}\"}}" ;;
	esac
	ev "$1" "${3:-2500}" | idemp-claim 2>/dev/null | envset "$extra" |
		${SLOW:-} idemp-done --state "$2" >/dev/null 2>&1
}
# renotified ID: ID finished DEBITED_NOTIFICATION_FAILED, then notified
# again (renotify_all): two events.
renotified() {
	finish "$1" DEBITED_NOTIFICATION_FAILED
	renotify_all
}
# renotify_all: every DEBITED_NOTIFICATION_FAILED record notified again
# (the re-notify path: idemp-done --renotified).
renotify_all() {
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope 2>/dev/null \
		| jq -c '.notify = {"outcome": "OK"}' | idemp-done --renotified >/dev/null 2>&1
}
# events: every message now on the events queue, one JSON line each:
# {"attr": eventId attribute, "body": the event}; received with a long
# visibility so each copy is read once.
# (every batch received first, then one python3 for all: a start per
# batch of ten was most of what reading 300 events cost)
# On SQS an empty short poll is asked again with a long poll (1 s) before
# the reading ends: a short poll may come back empty while messages wait
# (SQS samples some of its servers; the emulator's 40 ms poll on a loaded
# machine), and a read that stopped there would look like lost events.
# (The embedded queue's empty read is exact.)
events() {
	local rc=0 all=$BATS_TEST_TMPDIR/events.recv wait=0
	: > "$all"
	while :; do
		rc=0
		sqs-recv --queue "$IDEMKIT_OUTBOX" --max 10 --visibility 600 --wait "$wait" >> "$all" || rc=$?
		if [ "$rc" -eq 1 ]; then
			case $IDEMKIT_OUTBOX in sqlite:*) break ;; esac
			[ "$wait" -eq 0 ] || break
			wait=1
			continue
		fi
		wait=0
		[ "$rc" -eq 0 ] || return "$rc"
	done
	python3 -c 'import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    print(json.dumps({"attr": e["attributes"]["eventId"], "body": json.loads(e["body"])}))' "$all"
}
waiting() { jget "$(idemp-outbox --stats)" waiting; }
# ids FILE: the eventIds in an events() file, sorted, duplicates kept.
ids() { jq -r '.attr' "$1" | LC_ALL=C sort; }
