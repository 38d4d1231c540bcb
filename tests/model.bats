#!/usr/bin/env bats
# The protocol model (tests/model/idemkit.pml) checked with spin at the
# quick bounds: the protocol holds, every broken variant is caught, and a
# checker that would pass a model proving nothing fails.  `make model` runs
# the full bounds.

load helper

RUN=$IDEMKIT_SRC/tests/model/run.sh

setup() {
	if ! command -v spin >/dev/null 2>&1; then
		[ "${CI:-}" = true ] && { echo "spin is required under CI" >&2; return 1; }
		skip "spin not installed (apt-get install spin)"
	fi
}

@test "model: the protocol holds for 2 workers, bank with and without its key, and progress" {
	run sh "$RUN" quick 'n2-*'
	echo "$output"
	[ "$status" -eq 0 ]
	for c in n2-key n2-nokey n2-progress; do
		echo "$output" | grep -E "^$c +pass +(safety|progress) +states +[0-9]+ .* ok\$" ||
			{ echo "no clean run of $c"; return 1; }
	done
	echo "$output" | grep -q 'every run as expected'
}

@test "model: spin finds the bug in every broken variant, by the property meant to catch it" {
	run sh "$RUN" quick '*-P[0-9]*'
	echo "$output"
	[ "$status" -eq 0 ]
	while read -r c what; do
		echo "$output" | grep -E "^$c +pass .*violated: $what" ||
			{ echo "$c: not caught by $what"; return 1; }
	done <<'LIST'
nokey-P1 assertion violated \(ledger<=1\)
nokey-P4a assertion violated \(ledger==0\)
nofence-P5 assertion violated \(owner==tok\)
nofence-P4b assertion violated \(\(ledger==0\)\|\|
nofence-nokey-P2 assertion violated \(\(ledger==0\)\|\|\(dbl<=0\)\)
noleasecheck-nokey-P2 assertion violated \(\(ledger==0\)\|\|\(dbl<=0\)\)
ackearly-P3 assertion violated
ackearly-P6 acceptance cycle
keydelivery-P1 assertion violated \(ledger<=1\)
keydelivery-P4a assertion violated \(ledger==0\)
tempfailed-P4a assertion violated \(ledger==0\)
claimanystate-P3 assertion violated
claimanystate-P4b assertion violated
claimanystate-P6 acceptance cycle
claimnolease-P4b assertion violated
claimnolease-nokey-P2 assertion violated \(\(ledger==0\)\|\|\(dbl<=0\)\)
dupdoneleave-P6 acceptance cycle
LIST
	[ "$(echo "$output" | grep -c ' pass .*violated')" -eq 17 ]
}

@test "model: a variant spin cannot catch fails the run (a model that proves nothing)" {
	# The same model with every assertion switched off: the broken variant
	# now passes its search, which the runner must report as a failure.
	sed 's/-> assert(e)/-> skip/' "$IDEMKIT_SRC/tests/model/idemkit.pml" > "$BATS_TEST_TMPDIR/blind.pml"
	if cmp -s "$BATS_TEST_TMPDIR/blind.pml" "$IDEMKIT_SRC/tests/model/idemkit.pml"; then false; fi
	IDEMKIT_MODEL=$BATS_TEST_TMPDIR/blind.pml run sh "$RUN" quick 'ackearly-P3'
	echo "$output"
	[ "$status" -eq 1 ]
	echo "$output" | grep -E '^ackearly-P3 +FAIL .* ok$'
	echo "$output" | grep -q 'SOME RUNS NOT AS EXPECTED'
}

@test "model: a protocol run that finds a violation fails" {
	# The protocol with the ack moved before idemp-done by default.
	{ echo '#define BROKEN_ACKEARLY'; cat "$IDEMKIT_SRC/tests/model/idemkit.pml"; } > "$BATS_TEST_TMPDIR/early.pml"
	IDEMKIT_MODEL=$BATS_TEST_TMPDIR/early.pml run sh "$RUN" quick 'n2-key'
	echo "$output"
	[ "$status" -eq 1 ]
	echo "$output" | grep -E '^n2-key +FAIL .*violated: assertion violated'
}

@test "model: run.sh refuses an unknown set" {
	run sh "$RUN" nosuchset
	[ "$status" -eq 2 ]
	[ "$output" = "usage: run.sh [quick|full|matrix] [NAME-PATTERN]" ]
}

@test "model: a search cut short (memory bound) fails, it proves nothing" {
	IDEMKIT_MODEL_MEMLIM=8 run sh "$RUN" quick 'n2-key'
	echo "$output"
	[ "$status" -eq 1 ]
	echo "$output" | grep -E '^n2-key +FAIL .*FAIL \(search incomplete\)$'
}
