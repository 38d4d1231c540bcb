#!/bin/sh
# tests/model/run.sh: model-checks tests/model/idemkit.pml with spin.
#
#   run.sh [quick|full|matrix] [NAME-PATTERN]
#
# Each configuration is spin -a, a pan compiled with its -D flags, and one
# exhaustive search.  A protocol configuration must end with "errors: 0"
# and a complete search (no "max search depth too small"); a broken variant
# must end with "errors: N", N >= 1 (spin found the violation), or the run
# fails: a model that proves nothing fails the test.  One line per run:
# name, verdict, states stored, transitions, depth, seconds.  quick is what
# make test runs (tests/model.bats); full is make model; matrix runs every
# broken variant against every property, one at a time, for the table in
# idemkit(7).  Exits non-zero when any run did not end as expected.
set -u
here=$(cd "$(dirname "$0")" && pwd)
model=${IDEMKIT_MODEL:-$here/idemkit.pml}   # another file: the tests check the checker
set_=${1:-full}
pat=${2:-}
# MB for one pan: the full N=3 runs need about 1.3 GB
MEMLIM=${IDEMKIT_MODEL_MEMLIM:-2048}
for t in spin ${CC:-cc}; do
	command -v "$t" >/dev/null 2>&1 || { echo "run.sh: $t not found (apt-get install spin gcc)" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/idemkit-model.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# Property masks (PROPS): bit 0 P1, 1 P2, 2 P3, 3 P4a, 4 P4b, 5 P5.  With
# the bank's key every property (63); without, all but P1 and P4a (54),
# which a bank without its key breaks (nokey-P1, nokey-P4a below).

# name | safety or progress | ok or violated | -D flags
configs() {
	case $1 in
	quick) cat <<'EOF'
n2-key|safety|ok|-DNW=2 -DCRASHES=1 -DSTOPS=1 -DTEMPS=1 -DDUPS=1 -DPROPS=63
n2-nokey|safety|ok|-DNW=2 -DCRASHES=1 -DSTOPS=1 -DTEMPS=1 -DDUPS=1 -DBANK_NOKEY -DPROPS=54
n2-progress|progress|ok|-DNW=2 -DCRASHES=1 -DSTOPS=1 -DTEMPS=1 -DDUPS=1 -DPROPS=0
EOF
	configs broken ;;
	full) cat <<'EOF'
n2-key|safety|ok|-DNW=2 -DCRASHES=2 -DSTOPS=1 -DTEMPS=2 -DDUPS=1 -DPROPS=63
n2-nokey|safety|ok|-DNW=2 -DCRASHES=2 -DSTOPS=1 -DTEMPS=2 -DDUPS=1 -DBANK_NOKEY -DPROPS=54
n3-key|safety|ok|-DNW=3 -DCRASHES=0 -DSTOPS=0 -DTEMPS=0 -DDUPS=1 -DPROPS=63
n3-nokey|safety|ok|-DNW=3 -DCRASHES=0 -DSTOPS=0 -DTEMPS=0 -DDUPS=1 -DBANK_NOKEY -DPROPS=54
n2-progress|progress|ok|-DNW=2 -DCRASHES=2 -DSTOPS=1 -DTEMPS=2 -DDUPS=1 -DPROPS=0
n2-nokey-progress|progress|ok|-DNW=2 -DCRASHES=2 -DSTOPS=1 -DTEMPS=2 -DDUPS=1 -DBANK_NOKEY -DPROPS=0
n3-progress|progress|ok|-DNW=3 -DCRASHES=1 -DSTOPS=1 -DTEMPS=1 -DDUPS=1 -DPROPS=0
EOF
	configs broken ;;
	# What spin must find.  nokey-P1 and nokey-P4a are not bugs of ours:
	# they are why the bank's own key is required (the crash window).
	broken) cat <<'EOF'
nokey-P1|safety|violated|-DNW=2 -DBANK_NOKEY -DPROPS=1
nokey-P4a|safety|violated|-DNW=2 -DBANK_NOKEY -DPROPS=8
nofence-P5|safety|violated|-DNW=2 -DBROKEN_NOFENCE -DPROPS=32
nofence-P4b|safety|violated|-DNW=2 -DBROKEN_NOFENCE -DPROPS=16
nofence-nokey-P2|safety|violated|-DNW=2 -DBROKEN_NOFENCE -DBANK_NOKEY -DPROPS=2
noleasecheck-nokey-P2|safety|violated|-DNW=2 -DBROKEN_NOLEASECHECK -DBANK_NOKEY -DPROPS=2
ackearly-P3|safety|violated|-DNW=2 -DBROKEN_ACKEARLY -DPROPS=4
ackearly-P6|progress|violated|-DNW=2 -DBROKEN_ACKEARLY -DPROPS=0
keydelivery-P1|safety|violated|-DNW=2 -DBROKEN_KEYDELIVERY -DPROPS=1
keydelivery-P4a|safety|violated|-DNW=2 -DBROKEN_KEYDELIVERY -DPROPS=8
tempfailed-P4a|safety|violated|-DNW=2 -DBROKEN_TEMPFAILED -DPROPS=8
claimanystate-P3|safety|violated|-DNW=2 -DBROKEN_CLAIMANYSTATE -DPROPS=4
claimanystate-P4b|safety|violated|-DNW=2 -DBROKEN_CLAIMANYSTATE -DPROPS=16
claimanystate-P6|progress|violated|-DNW=2 -DBROKEN_CLAIMANYSTATE -DPROPS=0
claimnolease-P4b|safety|violated|-DNW=2 -DBROKEN_CLAIMNOLEASE -DPROPS=16
claimnolease-nokey-P2|safety|violated|-DNW=2 -DBROKEN_CLAIMNOLEASE -DBANK_NOKEY -DPROPS=2
dupdoneleave-P6|progress|violated|-DNW=2 -DBROKEN_DUPDONELEAVE -DPROPS=0
EOF
		;;
	matrix)
		for v in NOFENCE NOLEASECHECK ACKEARLY KEYDELIVERY TEMPFAILED CLAIMANYSTATE CLAIMNOLEASE DUPDONELEAVE; do
			for bank in key nokey; do
				b=; [ $bank = nokey ] && b=-DBANK_NOKEY
				# a key per delivery means nothing without a key
				[ $v:$bank = KEYDELIVERY:nokey ] && continue
				n=1
				for p in P1 P2 P3 P4a P4b P5; do
					echo "$v-$bank-$p|safety|any|-DNW=2 -DBROKEN_$v $b -DPROPS=$n"
					n=$((n * 2))
				done
				echo "$v-$bank-P6|progress|any|-DNW=2 -DBROKEN_$v $b -DPROPS=0"
			done
		done ;;
	esac
}

# run NAME MODE EXPECT FLAGS: one spin -a, cc, pan; prints one line.
run() {
	name=$1 mode=$2 expect=$3 flags=$4
	d=$work/$name
	mkdir -p "$d"
	start=$(date +%s)
	if [ "$mode" = progress ]; then
		sflags="-DPROGRESS $flags"
		cflags="-DNFAIR=4 -DNOREDUCE"     # weak fairness; POR off with it
		pflags="-a -f -N p6"
	else
		sflags=$flags
		cflags="-DSAFETY -DNOCLAIM"
		pflags=""
	fi
	# shellcheck disable=SC2086
	if ! (cd "$d" && spin -a $sflags "$model" > spin.out 2>&1) ||
	   grep -q 'Error' "$d/spin.out"; then
		echo "$name: spin -a failed"; cat "$d/spin.out"; return 1
	fi
	opt=-O2; [ "$expect" = violated ] && opt=-O0   # found at once: compile fast
	# shellcheck disable=SC2086
	if ! (cd "$d" && ${CC:-cc} $opt -w -DCOLLAPSE -DMEMLIM=$MEMLIM $cflags $flags -o pan pan.c) \
	    > "$d/cc.out" 2>&1; then
		echo "$name: cc pan.c failed"; cat "$d/cc.out"; return 1
	fi
	# shellcheck disable=SC2086
	(cd "$d" && ./pan -m3000000 $pflags > pan.out 2>&1)
	secs=$(($(date +%s) - start))
	out=$d/pan.out
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | tail -1)
	stored=$(awk '/states, stored/ {print $1; exit}' "$out")
	trans=$(awk '/transitions \(= / {print $1; exit}' "$out")
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' "$out")
	what=$(grep -m1 -o 'assertion violated.*\|acceptance cycle' "$out")
	verdict=
	if [ -z "$errors" ]; then
		verdict="FAIL (pan did not finish)"
	elif [ "$errors" -gt 0 ]; then
		verdict="violated: $what"   # pan stops at the first: "not completed"
	elif grep -q 'max search depth too small\|Search not completed\|reached -DMEMLIM\|out of memory' "$out"; then
		verdict="FAIL (search incomplete)"
	else
		verdict=ok
	fi
	case $expect:$verdict in
	ok:ok|violated:violated*|any:*) mark=pass ;;
	*) mark=FAIL ;;
	esac
	printf '%-28s %-4s %-9s states %10s  transitions %10s  depth %8s  %4ss  %s\n' \
	    "$name" "$mark" "$mode" "${stored:-?}" "${trans:-?}" "${depth:-?}" "$secs" "$verdict"
	[ "$mark" = pass ] || { tail -20 "$out"; return 1; }
	rm -rf "$d"
}

status=0
total=$(date +%s)
configs "$set_" > "$work/list"
[ -s "$work/list" ] || { echo "usage: run.sh [quick|full|matrix] [NAME-PATTERN]" >&2; exit 2; }
while IFS='|' read -r name mode expect flags; do
	# shellcheck disable=SC2254  # a glob on purpose
	[ -n "$pat" ] && case $name in $pat) ;; *) continue ;; esac
	run "$name" "$mode" "$expect" "$flags" < /dev/null || status=1
done < "$work/list"
echo "model $set_: $(($(date +%s) - total))s, $([ $status -eq 0 ] && echo 'every run as expected' || echo 'SOME RUNS NOT AS EXPECTED')"
exit $status
