#!/bin/sh
# tests/run.sh: runs bats suites, one run per argument ("[VAR=value ...]
# PATH"), keeps going after a failing run, and ends with one plain tally
# line, "N passed, N failed, N skipped", so a reader of the log need not
# count TAP lines.  Exits non-zero when any run failed.
set -u
# A test that hangs (a receive loop that never ends, a server that never
# answers) is a red test with its name, not a stuck run: bats ends it after
# BATS_TEST_TIMEOUT seconds (make faults sets a longer one).
: "${BATS_TEST_TIMEOUT:=300}"
export BATS_TEST_TIMEOUT
log=${TMPDIR:-/tmp}/idemkit-tests.$$
status=0
: > "$log"
for run in "$@"; do
	# Word splitting is the point: VAR=value words, then the path.
	# shellcheck disable=SC2086
	set -- $run
	vars=
	while [ $# -gt 1 ]; do vars="$vars $1"; shift; done
	echo "== bats $run"
	# shellcheck disable=SC2086
	{ env $vars bats --tap "$1"; echo $? > "$log.rc"; } | tee -a "$log"
	[ "$(cat "$log.rc")" -eq 0 ] || status=1
done
passed=$(grep -c '^ok ' "$log")
skipped=$(grep -c '^ok .* # skip' "$log")
failed=$(grep -c '^not ok ' "$log")
rm -f "$log" "$log.rc"
echo "$((passed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
