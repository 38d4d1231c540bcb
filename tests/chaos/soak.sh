#!/bin/sh
# tests/chaos/soak.sh: the campaign run long, one backend, run after run
# (a fresh seed each) until the runs judged there add up to SOAK_CHARGES
# charges; each run's row (its seed, length, charges, faults landed,
# replays absorbed, throughput, drain, verdict) appended to SOAK_TABLE as
# it ends, so a soak stopped at any point has lost only the run under way.
# A VALID run's directory is removed, its verdict.json kept beside it
# (SOAK_DIR/BACKEND-SEED.verdict.json: the recovery per fault kind); an
# INVALID one's is kept and named in its row: its
# seed replays the schedule (chaos.py --seed), its directory re-judges
# (checker.py).  Runs whose harness failed (exit 2) count no charges; five
# in a row stop the soak.
#
# usage: tests/chaos/soak.sh BACKEND
# env:   SOAK_CHARGES (stop at this many charges judged on BACKEND, the
#        table's earlier rows included; default 200000), SOAK_DURATION
#        (seconds of faults per run, default 600), SOAK_RATE (charges
#        offered a second, default 4), SOAK_TABLE (default docs/soak.md),
#        SOAK_DIR (run directories, default build/soak), SOAK_SEED (the
#        first seed; default: after the table's last on BACKEND, else
#        1001), CHAOS_ARGS (more chaos.py arguments, e.g. --worker CMD)
# exit:  0 every run VALID; 1 a run INVALID (the soak goes on to the end);
#        2 the harness failed five times in a row; 64 usage; 77 no root.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -eq 1 ] || { echo "usage: tests/chaos/soak.sh BACKEND" >&2; exit 64; }
b=$1
want=${SOAK_CHARGES:-200000}
duration=${SOAK_DURATION:-600}
rate=${SOAK_RATE:-4}
table=${SOAK_TABLE:-$src/docs/soak.md}
dir=${SOAK_DIR:-$src/build/soak}
mkdir -p "$dir" || exit 2

if [ ! -s "$table" ]; then
	cat > "$table" <<'EOF'
# The campaign run long (`make soak`, tests/chaos/soak.sh)

One row per run, appended as it ends: the full fault mix, a fresh seed
each (`chaos.py --backend B --seed N --duration D --rate R` replays its
schedule). Charges: charges judged (each sent 1-5 times; copies: every
copy sent, poison included). Settled a second: charges settled over the
time from the first send to the last settlement. Recovery: the slowest
fault kind's p99 from its heal to what was outstanding then settled
(docs/RELIABILITY.md, "Liveness as a number").

| finished (UTC) | backend | seed | faults for | rate offered | charges | copies | faults landed | replays absorbed | settled a second | drained after heal | recovery p99 (worst kind) | verdict |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
EOF
fi

# charges judged on b so far, and its last seed
done_n() {
	awk -F'|' -v b=" $b " '$3 == b && $14 !~ /harness/ { gsub(/ /, "", $7); n += $7 } END { print n + 0 }' "$table"
}
last_seed() {
	awk -F'|' -v b=" $b " '$3 == b { gsub(/ /, "", $4); s = $4 } END { print s + 0 }' "$table"
}
seed=${SOAK_SEED:-$(($(last_seed) + 1))}
[ "$seed" -gt 1 ] || seed=1001

rc=0 fails=0
while [ "$(done_n)" -lt "$want" ]; do
	out=$dir/$b-$seed
	rm -rf "$out"
	# shellcheck disable=SC2086
	python3 "$src/tests/chaos/chaos.py" --backend "$b" --seed "$seed" --duration "$duration" \
		--rate "$rate" --bin "$src/build/bin" --out "$out" ${CHAOS_ARGS:-} > "$dir/$b-$seed.out" 2>&1
	r=$?
	[ $r -eq 77 ] && { cat "$dir/$b-$seed.out" >&2; exit 77; }
	python3 - "$out" "$b" "$seed" "$duration" "$rate" "$r" >> "$table" <<'PY'
import json, sys, time
run, b, seed, dur, rate, r = sys.argv[1:]
when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
try:
    v = json.load(open(run + "/verdict.json"))
except (OSError, ValueError):
    print("| %s | %s | %s | %s s | %s/s | — | — | — | — | — | — | — | harness failed (exit %s): %s.out |"
          % (when, b, seed, dur, rate, r, run))
    sys.exit(0)
d = v["facts"].get("drained_s")
rec = [(x["p99"], k) for k, x in v.get("recovery_s", {}).items() if x.get("n")]
worst = "%.1f s (%s)" % max(rec) if rec else "—"
bad = [str(i["n"]) for i in v["invariants"] if not i["ok"]]
print("| %s | %s | %s | %s s | %s/s | %d | %d | %d | %d | %s | %s | %s | %s |"
      % (when, b, seed, dur, rate, v["charges"], v["copies_sent"], sum(v["faults_landed"].values()),
         v["replays_absorbed"], v.get("settled_per_s") or "—",
         "%.1f s" % d if d is not None else "not within %d s" % v["facts"]["drain_bound_s"],
         worst, "VALID" if v["ok"] else "INVALID (%s): %s" % (", ".join(bad), run)))
PY
	case $r in
	0) cp "$out/verdict.json" "$dir/$b-$seed.verdict.json"
	   rm -rf "$out" "$dir/$b-$seed.out"; fails=0 ;;
	1) rc=1; fails=0 ;;
	*) fails=$((fails + 1))
	   [ $fails -lt 5 ] || { echo "soak: the harness failed five times in a row" >&2; exit 2; } ;;
	esac
	echo "soak: $b seed $seed exit $r; $(done_n) of $want charges judged on $b"
	seed=$((seed + 1))
done
exit $rc
