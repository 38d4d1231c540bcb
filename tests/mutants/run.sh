#!/bin/sh
# tests/mutants/run.sh: applies each seeded defect (tests/mutants/*.patch,
# one realistic money bug each) to a scratch copy of the tree, builds it and
# runs the suites the patch names; a mutant the suites do not catch
# "survived", and so does the run: it fails.  A patch that no longer applies
# or no longer builds after a refactor fails loudly too, so it is updated
# with the code it guards.
#
# A patch starts with header lines, before the diff:
#   # defect: what the bug does, in a sentence
#   # run: [VAR=value ...] tests/FILE.bats [-f REGEX]   (one or more)
# each a bats run of that file against the mutated build, only the tests
# whose names match REGEX when -f is given (the test that guards the code:
# the whole of a long suite per mutant would not fit CI's time).
#
# Mutants go MUTANTS_JOBS at a time (default 2), each worker in its own
# scratch tree (a copy of the first, built once), each taking the next
# patch no worker has taken when it is free (a claim is a mkdir), so a
# worker that drew long mutants is not left running alone at the end, as
# a fixed share each was: a mutant's time is a rebuild of what the patch touches
# (CPU) and then its runs, which mostly wait on servers, leases and
# timeouts, so two at a time keep both cores of a CI machine busy.
#
# usage: tests/mutants/run.sh [NAME ...]    (default: every patch)
# env:   MUTANTS_DIR (scratch, default build/mutants), MAKE (default make),
#        MUTANTS_TEST_TIMEOUT (seconds a test may take, default 60: a mutant
#        that makes a loop never end is caught by the limit, quickly),
#        MUTANTS_JOBS (workers, default 2; 1: one at a time, as before)
set -u
# The scratch trees build the library shared (the Makefile's SHARED=1): a
# mutant of lib/ then relinks one object, not every program (0.7 CPU-s a
# mutant where the static archive took 4.5).  Exported, so a make that a
# suite runs in the tree builds the same way.
SHARED=1
export SHARED
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=${MUTANTS_DIR:-$src/build/mutants}
make=${MAKE:-make}
jobs=${MUTANTS_JOBS:-2}
case $jobs in ''|*[!0-9]*|0) echo "mutants: MUTANTS_JOBS must be a count" >&2; exit 64 ;; esac

if [ $# -eq 0 ]; then
	set -- $(cd "$src/tests/mutants" && ls ./*.patch | sed 's#^\./##; s#\.patch$##')
fi
[ $# -gt 0 ] || { echo "mutants: no patches in tests/mutants" >&2; exit 1; }

# The scratch copy: what git tracks, plus what it would (new files).
tree=$dir/tree
rm -rf "$dir"
mkdir -p "$tree"
(cd "$src" && git ls-files -co --exclude-standard | while IFS= read -r f; do
	[ -e "$f" ] && printf '%s\n' "$f"; done | tar cf - -T -) | (cd "$tree" && tar xf -)
[ -d "$src/node_modules" ] && ln -s "$src/node_modules" "$tree/node_modules"
echo "== mutants: building the scratch tree $tree"
if ! "$make" -s -C "$tree" -j2 check-build >"$dir/build.log" 2>&1; then
	tail -20 "$dir/build.log"
	echo "mutants: the unmutated tree does not build" >&2
	exit 1
fi

# worker K NAME...: of the mutants NAME, in turn, each one no other worker
# has claimed yet, in scratch tree K; each verdict line ends with the
# mutant's seconds; its tally ("killed survived broken names...") in
# $dir/tally.K at the end.
worker() {
	k=$1; shift
	tree=$dir/tree.$k log=$dir/log.$k
	killed=0 survived=0 broken=0 bad=
	for name in "$@"; do
		mkdir "$dir/claim/$(printf '%s' "$name" | tr / %)" 2>/dev/null || continue
		t0=$(date +%s)
		p=$src/tests/mutants/$name.patch
		if [ ! -f "$p" ]; then
			echo "BROKEN $name: no such patch"; broken=$((broken + 1)); bad="$bad $name"; continue
		fi
		defect=$(sed -n 's/^# defect: //p' "$p" | head -1)
		runs=$(sed -n 's/^# run: //p' "$p")
		if [ -z "$runs" ] || [ -z "$defect" ]; then
			echo "BROKEN $name: the patch names no '# defect:' or no '# run:'"
			broken=$((broken + 1)); bad="$bad $name"; continue
		fi
		if ! patch -d "$tree" -p1 --dry-run -s -f <"$p" >"$log" 2>&1; then
			echo "BROKEN $name: does not apply any more; update it with the code it guards:"
			sed 's/^/    /' "$log"
			broken=$((broken + 1)); bad="$bad $name"; continue
		fi
		patch -d "$tree" -p1 -s -f <"$p" >/dev/null
		if ! "$make" -s -C "$tree" -j2 check-build >"$log" 2>&1; then
			echo "BROKEN $name: does not build once applied:"
			tail -5 "$log" | sed 's/^/    /'
			broken=$((broken + 1)); bad="$bad $name"
		else
			# The "# run:" lines in turn, against the mutated build; the first
			# one that fails has caught the mutant (the rest need not run).
			caught='' norun='' nosetup=''
			while IFS= read -r r; do
				[ -n "$r" ] || continue
				filter=
				case $r in *" -f "*) filter=${r#* -f }; r=${r%% -f *} ;; esac
				# A setup_file that fails (a server that did not start on a
				# busy machine) proves nothing about the mutant: the run is
				# made once more, and a second such failure is BROKEN, never
				# a kill.
				for try in 1 2; do
					# shellcheck disable=SC2086
					if (cd "$tree" && set -- $r && vars= &&
					    while [ $# -gt 1 ]; do vars="$vars $1"; shift; done &&
					    env $vars IDEMKIT_BIN="$tree/build/bin" IDEMKIT_TEST_BIN="$tree/build/test" \
					    IDEMKIT_SRC="$tree" BATS_TEST_TIMEOUT="${MUTANTS_TEST_TIMEOUT:-60}" \
					    bats --tap ${filter:+-f "$filter"} "$1") >"$log" 2>&1 </dev/null; then
						break
					fi
					caught=$(grep -a -m1 '^not ok' "$log" || echo "(the run failed)")
					case $caught in *"setup_file failed"*) ;; *) break ;; esac
					[ "$try" = 2 ] && nosetup="$r${filter:+ -f $filter}"
					caught=
				done
				[ -z "$nosetup" ] || break
				if [ -n "$caught" ]; then
					caught="$r${filter:+ -f $filter}: $caught"
					break
				fi
				if ! grep -aq '^ok ' "$log"; then   # a filter that matches nothing proves nothing
					norun="$r${filter:+ -f $filter}"
					break
				fi
			done <<-RUNS
			$runs
			RUNS
			if [ -n "$nosetup" ]; then
				echo "BROKEN $name: '$nosetup' failed in its setup_file twice (proves nothing):"
				grep -a -A6 -m1 '^not ok' "$log" | sed 's/^/    /'
				broken=$((broken + 1)); bad="$bad $name"
			elif [ -n "$norun" ]; then
				echo "BROKEN $name: '$norun' ran no test"
				broken=$((broken + 1)); bad="$bad $name"
			elif [ -z "$caught" ]; then
				echo "SURVIVED $name ($(( $(date +%s) - t0 )) s): $defect"
				survived=$((survived + 1)); bad="$bad $name"
			else
				echo "killed $name ($(( $(date +%s) - t0 )) s) by $caught"
				killed=$((killed + 1))
			fi
		fi
		patch -d "$tree" -p1 -R -s -f <"$p" >/dev/null
	done
	echo "$killed $survived $broken$bad" > "$dir/tally.$k"
}

# Every worker is given every patch and claims the next one free.  Each
# one's lines are whole lines (one echo each), so they interleave but do
# not mix.
[ "$jobs" -le $# ] || jobs=$#
k=1
while [ "$k" -lt "$jobs" ]; do
	rm -rf "$dir/tree.$k"
	cp -a "$tree" "$dir/tree.$k"   # the built copy: times kept, no rebuild
	k=$((k + 1))
done
mv "$tree" "$dir/tree.0"
mkdir "$dir/claim"
pids='' k=0
while [ "$k" -lt "$jobs" ]; do
	worker "$k" "$@" &
	pids="$pids $!"
	k=$((k + 1))
done
trap 'kill $pids 2>/dev/null; exit 130' INT TERM
for pid in $pids; do wait "$pid"; done
killed=0 survived=0 broken=0 bad=
k=0
while [ "$k" -lt "$jobs" ]; do
	if [ -r "$dir/tally.$k" ]; then
		read -r a b c names < "$dir/tally.$k"
		killed=$((killed + a)) survived=$((survived + b)) broken=$((broken + c))
		[ -z "${names:-}" ] || bad="$bad $names"
	else
		echo "mutants: worker $k left no tally"; broken=$((broken + 1)); bad="$bad (worker $k)"
	fi
	k=$((k + 1))
done
[ -z "$bad" ] || echo "mutants not killed:$bad"
echo "$killed killed, $survived survived, $broken broken"
[ "$survived" -eq 0 ] && [ "$broken" -eq 0 ]
