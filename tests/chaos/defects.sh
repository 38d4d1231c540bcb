#!/bin/sh
# tests/chaos/defects.sh: proves the campaign finds defects.  Each seeded
# defect (a realistic money bug: this round's fixes reverted one at a
# time, and mutants of tests/mutants/; the list and what each breaks in
# tests/chaos/defects/set) is applied to a scratch copy of the tree, as
# tests/mutants/run.sh does, built, and put under the campaign unchanged:
# its build/bin first on PATH, the full fault mix, the backend it lives
# in, seeds 1, 2, ... until the checker reports a violation.  Nothing tells
# the campaign where the defect is.  The campaign itself (tests/chaos/)
# runs from the scratch copy, so editing the tree meanwhile changes no run
# under way.  Prints, per defect, the shortest seed and the time to the
# verdict that found it, and the share found; exits 1 under
# CHAOS_DEFECTS_MIN percent (default 80).
#
# usage: tests/chaos/defects.sh [NAME[:BACKEND[:outbox]] ...]
#        (default: tests/chaos/defects/set; outbox: the run with --outbox)
# env:   CHAOS_DEFECT_SEEDS (seeds tried per defect, default 5),
#        CHAOS_DEFECT_FIRST (the first seed, default 1),
#        CHAOS_DEFECT_DURATION (seconds of faults per run, default 45),
#        CHAOS_DIR (scratch, default build/chaos), MAKE,
#        CHAOS_REUSE_TREE (set: keep CHAOS_DIR/tree as it is, unmutated, and
#        only bring its build up to date)
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=${CHAOS_DIR:-$src/build/chaos}
tree=$dir/tree
make=${MAKE:-make}
seeds=${CHAOS_DEFECT_SEEDS:-5}
duration=${CHAOS_DEFECT_DURATION:-45}
min=${CHAOS_DEFECTS_MIN:-80}

# NAME:BACKEND; by default tests/chaos/defects/set (what each one is).
if [ $# -eq 0 ]; then
	set -- $(sed 's/#.*//' "$src/tests/chaos/defects/set" |
		awk 'NF == 2 { print $1 ":" $2 } NF == 3 { print $1 ":" $2 ":" $3 }')
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "chaos defects: SKIP: needs root (network namespaces)" >&2
	exit 77
fi
if [ -z "${CHAOS_REUSE_TREE:-}" ] || [ ! -d "$tree" ]; then
	rm -rf "$tree"
	mkdir -p "$tree"
	(cd "$src" && git ls-files -co --exclude-standard | while IFS= read -r f; do
		[ -e "$f" ] && printf '%s\n' "$f"; done | tar cf - -T -) | (cd "$tree" && tar xf -)
	[ -d "$src/node_modules" ] && ln -s "$src/node_modules" "$tree/node_modules"
fi
echo "== chaos defects: building the scratch tree $tree"
"$make" -s -C "$tree" -j2 all >"$dir/build.log" 2>&1 || {
	tail -20 "$dir/build.log"; echo "chaos defects: the unmutated tree does not build" >&2; exit 2; }

found=0 total=0 table=$dir/defects.txt
: >"$table"
for spec in "$@"; do
	name=${spec%%:*} backend=${spec#*:} extra=
	[ "$backend" = "$spec" ] && backend=embedded
	case $backend in *:outbox) backend=${backend%:outbox} extra=--outbox ;; esac
	p=$src/tests/chaos/defects/$name.patch
	[ -f "$p" ] || p=$src/tests/mutants/$name.patch
	total=$((total + 1))
	if ! patch -d "$tree" -p1 -s -f <"$p" >"$dir/patch.log" 2>&1; then
		echo "BROKEN $name: the patch does not apply"; cat "$dir/patch.log"
		printf '%-32s %-9s %s\n' "$name" "$backend" "BROKEN (does not apply)" >>"$table"
		continue
	fi
	res="not found in $seeds seeds"
	if "$make" -s -C "$tree" -j2 all >"$dir/build.log" 2>&1; then
		s=${CHAOS_DEFECT_FIRST:-1}
		while [ "$s" -lt $(( ${CHAOS_DEFECT_FIRST:-1} + seeds )) ]; do
			out=$dir/run-$name-$s
			rm -rf "$out"
			t0=$(date +%s)
			python3 "$tree/tests/chaos/chaos.py" --backend "$backend" --seed "$s" \
				--duration "$duration" --bin "$tree/build/bin" --out "$out" $extra \
				>"$dir/$name-$s.log" 2>&1
			rc=$?
			t=$(( $(date +%s) - t0 ))
			inv=
			[ "$rc" -eq 1 ] && inv=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))
print(",".join(str(i["n"]) for i in v["invariants"] if not i["ok"]))' "$out/verdict.json")
			if [ "$rc" -eq 1 ]; then
				res="FOUND seed $s after ${t} s (invariants $inv)"
				found=$((found + 1))
				break
			elif [ "$rc" -ne 0 ]; then
				res="harness error (rc $rc) on seed $s: see $dir/$name-$s.log"
				break
			fi
			s=$((s + 1))
		done
	else
		res="BROKEN (does not build)"
	fi
	echo "$name ($backend): $res"
	printf '%-32s %-9s %s\n' "$name" "$backend${extra:+ (outbox)}" "$res" >>"$table"
	patch -d "$tree" -p1 -R -s -f <"$p" >/dev/null
done
echo "== chaos defects: $found of $total found"
cat "$table"
[ $((found * 100)) -ge $((min * total)) ]
