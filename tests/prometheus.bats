#!/usr/bin/env bats
# examples/prometheus/: the alerting rules are valid and fire on the series
# they are for (promtool's own unit tests, alerts_test.yml), and a metrics
# file charge-worker writes passes promtool's exposition-format lint.

bats_require_minimum_version 1.5.0
load helper
load bank_helper

setup() {
	command -v promtool >/dev/null || {
		[ "${CI:-}" != true ] || { echo "promtool (Debian: prometheus) is required under CI"; return 1; }
		skip "promtool not installed"
	}
	export IDEMKIT_QUEUE="sqlite:$BATS_TEST_TMPDIR/q.db#charges"
	export IDEMKIT_STORE="sqlite:$BATS_TEST_TMPDIR/store.db"
	export IDEMKIT_LOG=quiet
}
teardown() { bank_stop; }

@test "alerts.yml: promtool check rules, and its unit tests pass" {
	cd "$IDEMKIT_SRC/examples/prometheus"
	run promtool check rules alerts.yml
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"SUCCESS: 7 rules found"* ]]
	run promtool test rules alerts_test.yml
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *SUCCESS* ]]
}

@test "a metrics file from charge-worker passes promtool check metrics" {
	bank_start
	event CHG-P1 | sqs-send >/dev/null
	run --separate-stderr charge-worker --drain --debit-timeout 2 --notify-timeout 1 \
		--notify-retries 0 --lease 15s --metrics "$BATS_TEST_TMPDIR/w.prom"
	[ "$status" -eq 0 ]
	run promtool check metrics < "$BATS_TEST_TMPDIR/w.prom"
	echo "$output"
	[ "$status" -eq 0 ]
	[ -z "$output" ]
}

@test "every alert has a runbook_url into idemkit-runbook(7), whose section of that name exists; the page is installed (issue 29 item 3)" {
	names=$(sed -n 's/^ *- alert: //p' "$IDEMKIT_SRC/examples/prometheus/alerts.yml")
	[ "$(printf '%s\n' "$names" | wc -l)" -eq 7 ]
	[ "$(grep -c '^ *runbook_url: ' "$IDEMKIT_SRC/examples/prometheus/alerts.yml")" -eq 7 ]
	for n in $names; do
		grep -q "^ *runbook_url: \"man:idemkit-runbook(7)#$n\"\$" "$IDEMKIT_SRC/examples/prometheus/alerts.yml"
		grep -qx "\.Ss $n" "$IDEMKIT_SRC/man/idemkit-runbook.7"
	done
	dest=$BATS_TEST_TMPDIR/root
	make -s -C "$IDEMKIT_SRC" install DESTDIR="$dest" PREFIX=/usr >/dev/null
	[ -f "$dest/usr/share/man/man7/idemkit-runbook.7" ]
	if command -v mandoc >/dev/null; then
		[[ "$(mandoc -Thtml "$dest/usr/share/man/man7/idemkit-runbook.7")" == *IdemkitStuckCharges* ]]
	fi
}
