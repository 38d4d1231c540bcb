#!/bin/sh
# tests/run.sh: runs bats suites, one run per argument ("[VAR=value ...]
# PATH", PATH a .bats file or a directory of them, each file its own run),
# keeps going after a failing run, and ends with each failure again (its
# run, its name, its diagnostics) and one plain tally line, "N passed, N
# failed, N skipped", so a reader of the log's tail need not search it.
# Exits non-zero when any run failed.
#
# The suites mostly wait (servers starting, leases and visibility running
# out), so runs go IDEMKIT_TEST_JOBS at a time (GNU parallel; default 6,
# three times the 2 cores this was measured on), one test at a time inside
# a file (IDEMKIT_TEST_FILE_JOBS, default 1).  bats --jobs N runs a file's
# tests N at a time, but through a semaphore of lock files it polls with a
# find, a wc and a sleep each second, and a flock'd bash per test: 0.28 s
# of CPU more per test than one at a time (measured here: 60 empty tests,
# 6.6 s against 23.2 s), on a suite whose wall is its CPU; the runs of other
# files fill the waits instead.  A file that says it cannot share
# (BATS_NO_PARALLELIZE_WITHIN_FILE) runs one at a time whatever N.  Every server a test starts is on a free port with its own
# directory, so two runs never meet.  Each run's output is buffered and
# printed whole when it ends; with IDEMKIT_TEST_JOBS=1 (or no GNU
# parallel) runs go one at a time, printed as they go.
#
# The longest runs start first: by the times the last run measured
# (IDEMKIT_TEST_TIMES, a file of "SECONDS RUN" lines, kept up to date),
# else in the order given, runs named one by one before the files of a
# directory (a file both named and in a directory runs once).
# Each run's CPU (user + system of the processes it waited for: a server
# it left running as a daemon is not counted) is printed with the tally,
# the 15 largest, and written to IDEMKIT_TEST_CPU when that names a file
# ("CPU WALL RUN" lines): the suite's cost is its CPU, on two cores.
# IDEMKIT_TEST_SKIP: files left out (words, as named).  IDEMKIT_TEST_ONLY:
# a file of runs, one a line as --list prints them: only those of the runs
# asked for run (make sanitize's selection).  IDEMKIT_BATS_OPTS: more bats
# options (e.g. --timing).  IDEMKIT_TEST_GCOV=DIR: each run's gcov data
# under DIR/N (GCOV_PREFIX; each test's under DIR/N/t/NAME, tests/helper.bash
# sets that), its run in DIR/N/run, its seconds in DIR/N/time and its
# output in DIR/N/out (make san-cover, on a --coverage build).  Each run
# has its own string in IDEMKIT_TEST_RUN (as --list prints it; tests/helper.bash
# looks its tests up by it in IDEMKIT_SAN_PLAIN_TESTS).
# IDEMKIT_TEST_PLAIN: a file of runs (as --list prints them) made with
# IDEMKIT_BIN=$IDEMKIT_PLAIN_BIN and IDEMKIT_TEST_BIN=$IDEMKIT_PLAIN_TEST_BIN
# (make test SANITIZE=1: the plain build for the runs the sanitizer pass
# does not need), in the same schedule as the others.
# run.sh --list RUN...: prints the runs, one a line, and runs none.
set -u
# A test that hangs (a receive loop that never ends, a server that never
# answers) is a red test with its name, not a stuck run: bats ends it after
# BATS_TEST_TIMEOUT seconds (make faults sets a longer one).  600, not 300:
# the suite's longest tests (200 charges through worker, relay and the
# example consumer on dynalite under the sanitizer; idemp-run --each's 200
# keys) passed 300 s at a load of 20 on two cores, slow, not hung; a hang
# is still ended, five minutes later.
: "${BATS_TEST_TIMEOUT:=600}"
export BATS_TEST_TIMEOUT

# one N RUN [stream]: the bats run RUN, its output in $dir/N.out (with
# stream: printed as it goes; else printed whole when it ends), its exit
# status in $dir/N.rc and its wall time in $dir/N.time.
one() {
	local_n=$1 local_run=$2 local_stream=${3:-}
	# Word splitting is the point: VAR=value words, then the path.
	# shellcheck disable=SC2086
	set -- $local_run
	local_vars=
	while [ $# -gt 1 ]; do local_vars="$local_vars $1"; shift; done
	local_start=$(date +%s)
	IDEMKIT_TEST_RUN=$local_run
	export IDEMKIT_TEST_RUN
	if [ -n "${IDEMKIT_TEST_GCOV:-}" ]; then
		mkdir -p "$IDEMKIT_TEST_GCOV/$local_n"
		echo "$local_run" > "$IDEMKIT_TEST_GCOV/$local_n/run"
		local_vars="$local_vars GCOV_PREFIX=$IDEMKIT_TEST_GCOV/$local_n GCOV_PREFIX_STRIP=0"
	fi
	{
		echo "== bats $local_run"
		# shellcheck disable=SC2086
		env $local_vars bats --tap ${IDEMKIT_BATS_OPTS:-} ${RUN_FILE_JOBS:-} "$1" 2>&1
		echo $? > "$dir/$local_n.rc"
	} | if [ -n "$local_stream" ]; then tee "$dir/$local_n.out"; else cat > "$dir/$local_n.out"; fi
	echo "$(( $(date +%s) - local_start )) $local_run" > "$dir/$local_n.time"
	# (times' second line: the CPU of the children waited for, "0m1.5s 0m0.25s")
	# (a builtin's output to a file: in a pipe it would run in a subshell,
	# whose children are none)
	times > "$dir/$local_n.times"
	awk -v w="$(cut -d' ' -f1 "$dir/$local_n.time")" -v r="$local_run" '
	    NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); c += a[1] * 60 + a[2] } }
	    END { printf "%.1f %s %s\n", c, w, r }' "$dir/$local_n.times" > "$dir/$local_n.cpu"
	if [ -n "${IDEMKIT_TEST_GCOV:-}" ]; then
		cut -d' ' -f1 "$dir/$local_n.time" > "$IDEMKIT_TEST_GCOV/$local_n/time"
		cp "$dir/$local_n.out" "$IDEMKIT_TEST_GCOV/$local_n/out"
	fi
	[ -n "$local_stream" ] || cat "$dir/$local_n.out"
}
# (how GNU parallel runs one: sh run.sh --one DIR N RUN)
if [ "${1:-}" = --one ]; then
	dir=$2
	one "$3" "$4"
	exit 0
fi

list=
[ "${1:-}" = --list ] && { list=y; shift; }
jobs=${IDEMKIT_TEST_JOBS:-6}
file_jobs=${IDEMKIT_TEST_FILE_JOBS:-1}
if ! command -v parallel >/dev/null 2>&1; then
	echo "run.sh: no GNU parallel (Debian: parallel): one test at a time" >&2
	jobs=1 file_jobs=1
fi
RUN_FILE_JOBS=
[ "$file_jobs" -gt 1 ] && RUN_FILE_JOBS="--jobs $file_jobs"
export RUN_FILE_JOBS

dir=$(mktemp -d "${TMPDIR:-/tmp}/idemkit-tests.XXXXXX") || exit 70
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM

# The runs, one a line: those named one by one first, in the order given
# (the caller names the slow ones: they start first), then the files of
# the directories not named already; none named in IDEMKIT_TEST_SKIP.
for run in "$@"; do
	[ -d "${run##* }" ] || echo "$run"
done > "$dir/named"
for run in "$@"; do
	path=${run##* } vars=${run% "$path"}
	[ "$vars" = "$run" ] && vars=
	[ -d "$path" ] || continue
	for f in "${path%/}"/*.bats; do
		[ -e "$f" ] || continue
		grep -Fqx -- "${vars:+$vars }$f" "$dir/named" || echo "${vars:+$vars }$f"
	done
done | cat "$dir/named" - > "$dir/all"
for run in ${IDEMKIT_TEST_SKIP:-}; do echo "$run"; done > "$dir/skip"
grep -Fvx -f "$dir/skip" "$dir/all" > "$dir/runs"
if [ -n "${IDEMKIT_TEST_ONLY:-}" ]; then
	[ -r "$IDEMKIT_TEST_ONLY" ] || { echo "run.sh: cannot read $IDEMKIT_TEST_ONLY" >&2; exit 64; }
	grep -Fvx -f "$IDEMKIT_TEST_ONLY" "$dir/runs" > "$dir/left"
	grep -Fx -f "$IDEMKIT_TEST_ONLY" "$dir/runs" > "$dir/only"
	mv "$dir/only" "$dir/runs"
	[ -s "$dir/left" ] && echo "not run here (not in $IDEMKIT_TEST_ONLY): $(tr '\n' ' ' < "$dir/left")"
fi
[ -n "$list" ] && { cat "$dir/runs"; exit 0; }
if [ -n "${IDEMKIT_TEST_PLAIN:-}" ]; then
	# these runs on the plain build (make test SANITIZE=1: the runs the
	# sanitizer's set cover leaves out), the rest on the one given
	[ -r "$IDEMKIT_TEST_PLAIN" ] || { echo "run.sh: cannot read $IDEMKIT_TEST_PLAIN" >&2; exit 64; }
	: "${IDEMKIT_PLAIN_BIN:?IDEMKIT_TEST_PLAIN needs IDEMKIT_PLAIN_BIN}" "${IDEMKIT_PLAIN_TEST_BIN:?IDEMKIT_TEST_PLAIN needs IDEMKIT_PLAIN_TEST_BIN}"
	awk -v pre="IDEMKIT_BIN=$IDEMKIT_PLAIN_BIN IDEMKIT_TEST_BIN=$IDEMKIT_PLAIN_TEST_BIN " \
	    'NR == FNR { plain[$0] = 1; next } { print (($0 in plain) ? pre : "") $0 }' \
	    "$IDEMKIT_TEST_PLAIN" "$dir/runs" > "$dir/runs.p" && mv "$dir/runs.p" "$dir/runs"
fi
[ -s "$dir/skip" ] && echo "not run here (IDEMKIT_TEST_SKIP): $(tr '\n' ' ' < "$dir/skip")"
if [ -s "${IDEMKIT_TEST_TIMES:-}" ]; then
	# the slowest first by the last measure; runs it has not seen first of
	# all (a new suite may be slow), in the order given
	awk 'NR == FNR { t = $1; sub(/^[0-9]+ /, ""); s[$0] = t; next }
	    { print (($0 in s) ? s[$0] : 999999) "\t" FNR "\t" $0 }' \
	    "$IDEMKIT_TEST_TIMES" "$dir/runs" | sort -t "$(printf '\t')" -k1,1nr -k2,2n |
	    cut -f3- > "$dir/order"
	mv "$dir/order" "$dir/runs"
fi

if [ "$jobs" -le 1 ]; then
	n=0
	while IFS= read -r run; do
		n=$((n + 1))
		(one "$n" "$run" stream)   # (a subshell: its times are this run's alone)
	done < "$dir/runs"
else
	# (parallel's default --group: a run's lines come out together)
	awk '{ print NR "\t" $0 }' "$dir/runs" |
		parallel --will-cite --jobs "$jobs" --colsep '\t' \
			sh "$0" --one "$dir" '{1}' '{2}'
fi

status=0
n=$(wc -l < "$dir/runs")
i=0
while [ "$i" -lt "$n" ]; do
	i=$((i + 1))
	[ "$(cat "$dir/$i.rc" 2>/dev/null)" = 0 ] || status=1
done
if [ -n "${IDEMKIT_TEST_TIMES:-}" ]; then
	# this run's times, and the last ones of the runs it did not make
	# (make faults and make check share the file)
	cat "$dir"/*.time > "$dir/times" 2>/dev/null
	{ cat "$dir/times"; [ -f "$IDEMKIT_TEST_TIMES" ] &&
		awk 'NR == FNR { sub(/^[0-9]+ /, ""); seen[$0] = 1; next }
		    { r = $0; sub(/^[0-9]+ /, "", r) } !(r in seen)' "$dir/times" "$IDEMKIT_TEST_TIMES"
	} | sort -nr > "$dir/times.all" && mv "$dir/times.all" "$IDEMKIT_TEST_TIMES"
fi
cat "$dir"/*.cpu 2>/dev/null | sort -nr > "$dir/cpu"
if [ -s "$dir/cpu" ]; then
	awk '{ c += $1 } END { printf "CPU: %.0f s in %d runs (user + system, the processes each run waited for); the most:\n", c, NR }' "$dir/cpu"
	head -15 "$dir/cpu" | awk '{ c = $1; w = $2; $1 = $2 = ""; sub(/^ +/, ""); printf "  %7.1f s CPU %5d s wall  %s\n", c, w, $0 }'
	[ -z "${IDEMKIT_TEST_CPU:-}" ] || cp "$dir/cpu" "$IDEMKIT_TEST_CPU"
fi
# Every failure again at the end, with its run and its diagnostics (the
# "# " lines after it), so the tail of a long log names them all.
for out in "$dir"/*.out; do
	[ -e "$out" ] || continue
	awk 'NR == 1 { run = $0; sub(/^== bats /, "", run); next }
	    /^not ok / { print "FAILED " run ": " $0; on = 1; next }
	    on && /^# / { print "    " $0; next }
	    { on = 0 }' "$out"
done
passed=$(cat "$dir"/*.out 2>/dev/null | grep -c '^ok ')
skipped=$(cat "$dir"/*.out 2>/dev/null | grep -c '^ok .* # skip')
failed=$(cat "$dir"/*.out 2>/dev/null | grep -c '^not ok ')
echo "$((passed - skipped)) passed, $failed failed, $skipped skipped"
exit $status
