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
	[[ "$output" == *"SUCCESS: 5 rules found"* ]]
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
