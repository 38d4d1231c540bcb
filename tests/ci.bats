#!/usr/bin/env bats
# CI's own machinery: make sanitize's choice of runs (tests/sancover.py and
# the committed tests/san-cover.txt), tests/run.sh's --list and
# IDEMKIT_TEST_ONLY, and tests/mutants/run.sh's workers; the fault
# campaign's checker (tests/chaos/checker.py) on histories made here,
# where the right verdict is known, which a campaign run cannot show in a
# few seconds.
bats_require_minimum_version 1.5.0
load helper

inner() {
	# (PATH without bats' own libexec, whose "bats" is not the front end)
	env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME" TMPDIR="$BATS_TEST_TMPDIR" "$@"
}

@test "tests/san-cover.txt is not stale: every run it leans on is still made, it has seen every C source" {
	cd "$IDEMKIT_SRC"
	make -s check-runs > "$BATS_TEST_TMPDIR/runs"
	grep -Fqx 'IDEMKIT_TEST_BACKEND=postgres tests/store.bats' "$BATS_TEST_TMPDIR/runs"
	grep -Fqx 'tests/ci.bats' "$BATS_TEST_TMPDIR/runs"
	run python3 tests/sancover.py check tests/san-cover.txt "$BATS_TEST_TMPDIR/runs"
	[ "$status" -eq 0 ]
	[[ "$output" != *stale* ]]
}

@test "a coverage list that misses a C source, or leans on a run gone, is stale and says which; a new run is named, not stale" {
	cd "$IDEMKIT_SRC"
	make -s check-runs > "$BATS_TEST_TMPDIR/runs"
	grep -v '^run [0-9]* [0-9]* tests/idemp-claim.bats$' tests/san-cover.txt |
		grep -v '^source lib/core/envelope.c$' > "$BATS_TEST_TMPDIR/old.txt"
	run python3 tests/sancover.py check "$BATS_TEST_TMPDIR/old.txt" "$BATS_TEST_TMPDIR/runs"
	[ "$status" -eq 1 ]
	[[ "$output" == *"unseen, sanitized in full: tests/idemp-claim.bats"* ]]
	[[ "$output" == *"stale: a C source it has not seen: lib/core/envelope.c"* ]]
	[[ "$output" == *"is stale: make san-cover renews it" ]]
	# a new run alone: named, not stale (select gives it in full)
	{ cat "$BATS_TEST_TMPDIR/runs"; echo 'tests/brand-new.bats'; } > "$BATS_TEST_TMPDIR/more"
	run python3 tests/sancover.py check tests/san-cover.txt "$BATS_TEST_TMPDIR/more"
	[ "$status" -eq 0 ]
	[ "$output" = "unseen, sanitized in full: tests/brand-new.bats" ]
	python3 tests/sancover.py select tests/san-cover.txt "$BATS_TEST_TMPDIR/more" | grep -Fqx tests/brand-new.bats
	# a run make check no longer has
	echo 'tests/gone.bats' > "$BATS_TEST_TMPDIR/one"
	run python3 tests/sancover.py check tests/san-cover.txt "$BATS_TEST_TMPDIR/one"
	[ "$status" -eq 1 ]
	[[ "$output" == *"unseen, sanitized in full: tests/gone.bats"* ]]
	[[ "$output" == *"stale: a run make check no longer has: tests/store.bats"* ]]
}

@test "sancover.py add: a run measured on a --coverage build joins the list with its lines in a source the list had not seen; the list is no longer stale" {
	# a tree of one old and one new source, built with --coverage as
	# make san-cover builds (objects under build/obj), each run's data apart
	# (GCOV_PREFIX, as run.sh's IDEMKIT_TEST_GCOV)
	root=$BATS_TEST_TMPDIR/root
	mkdir -p "$root/lib/a" "$root/lib/b" "$root/build/obj/lib/a" "$root/build/obj/lib/b"
	printf 'int old(int x)\n{\n\treturn x + 1;\n}\n' > "$root/lib/a/old.c"
	printf 'int old(int);\nint main(int c, char **v)\n{\n\t(void)v;\n\tif (c > 1)\n\t\treturn old(c) - c - 1;\n\treturn 0;\n}\n' > "$root/lib/b/new.c"
	(cd "$root" && gcc -O0 --coverage -c -o build/obj/lib/a/old.o lib/a/old.c &&
	    gcc -O0 --coverage -c -o build/obj/lib/b/new.o lib/b/new.c &&
	    gcc --coverage -o build/prog build/obj/lib/a/old.o build/obj/lib/b/new.o)
	GCOV_PREFIX=$BATS_TEST_TMPDIR/gc/0 "$root/build/prog" x
	echo 'tests/new.bats' > "$BATS_TEST_TMPDIR/gc/0/run"
	echo 7 > "$BATS_TEST_TMPDIR/gc/0/time"
	printf '# a list\nsource lib/a/old.c\nrun 0 3 tests/old.bats\nlines 2 0\n' > "$root/list"
	printf 'tests/old.bats\ntests/new.bats\n' > "$root/runs"
	cd "$root"
	run python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[ "$status" -eq 1 ]
	[[ "$output" == *"stale: a C source it has not seen: lib/b/new.c"* ]]
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" add "$BATS_TEST_TMPDIR/gc" list
	[[ "$output" =~ "1 runs added, "[1-9][0-9]*" lines in 1 new sources" ]]
	grep -qx 'source lib/b/new.c' list
	grep -qx 'run 1 7 tests/new.bats' list
	# its lines in new.c are its own; old.c's, which it ran too, are not added
	grep -Eqx 'lines [1-9][0-9]* 1' list
	grep -qx 'lines 2 0' list
	[ "$(grep -c '^lines' list)" -eq 2 ]
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[ -z "$output" ]
	# the cover takes both: each alone has lines
	[ "$(python3 "$IDEMKIT_SRC/tests/sancover.py" select list runs | sort | tr '\n' ' ')" = "tests/new.bats tests/old.bats " ]
	# a run the list has already keeps its unit: its lines in the sources
	# new to the list are added to it, no run added
	printf '# a list\nsource lib/a/old.c\nrun 0 3 tests/old.bats\nlines 2 0\n' > list
	echo tests/old.bats > "$BATS_TEST_TMPDIR/gc/0/run"
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" add "$BATS_TEST_TMPDIR/gc" list
	[[ "$output" =~ "0 runs added, "[1-9][0-9]*" lines in 1 new sources" ]]
	grep -qx 'source lib/b/new.c' list
	[ "$(grep -c '^run ' list)" -eq 1 ]
	grep -qx 'lines 2 0' list
	[ "$(grep -Ec '^lines [1-9][0-9]* 0$' list)" -eq 2 ]
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[[ "$output" != *stale* ]]
}

@test "the sanitizer's runs cover every line the whole suite covers, cheapest first, and runs it has not seen" {
	# A: 10 lines in 100 s; B: 8 of them in 2 s; C: the other 2 in 1 s.
	cat > "$BATS_TEST_TMPDIR/list" <<-'EOF'
	run 0 100 tests/a.bats
	run 1 2 tests/b.bats
	run 2 1 X=1 tests/c.bats
	lines 8 0,1
	lines 2 0,2
	EOF
	printf '%s\n' tests/a.bats tests/b.bats 'X=1 tests/c.bats' tests/new.bats > "$BATS_TEST_TMPDIR/runs"
	run python3 "$IDEMKIT_SRC/tests/sancover.py" select "$BATS_TEST_TMPDIR/list" "$BATS_TEST_TMPDIR/runs"
	[ "$status" -eq 0 ]
	[ "$output" = "$(printf '%s\n' tests/b.bats 'X=1 tests/c.bats' tests/new.bats)" ]
	# the committed list: what it selects covers every set of lines in it
	cd "$IDEMKIT_SRC"
	make -s check-runs > "$BATS_TEST_TMPDIR/runs"
	python3 tests/sancover.py select tests/san-cover.txt "$BATS_TEST_TMPDIR/runs" "$BATS_TEST_TMPDIR/plain" > "$BATS_TEST_TMPDIR/sel"
	[ -s "$BATS_TEST_TMPDIR/sel" ]
	# a unit is sanitized when its run is and (a test) it is not listed plain
	run awk -F '\t' 'FILENAME == ARGV[1] { sel[$0] = 1; next }
	    FILENAME == ARGV[2] { plain[$1 "\t" $2] = 1; next }
	    { split($0, w, " ") }
	    w[1] == "run" { r = $0; sub(/^run [0-9]+ [0-9]+ /, "", r); run[w[2]] = r; if (r in sel) chosen[w[2]] = 1; next }
	    w[1] == "test" { if ((run[w[3]] in sel) && !((run[w[3]] "\t" w[5]) in plain)) chosen[w[2]] = 1; next }
	    w[1] == "lines" { n = split(w[3], ids, ","); hit = 0
	        for (i = 1; i <= n; i++) if (ids[i] in chosen) hit = 1
	        if (!hit) missed += w[2]; total += w[2] }
	    END { print missed + 0, total + 0 }' "$BATS_TEST_TMPDIR/sel" "$BATS_TEST_TMPDIR/plain" tests/san-cover.txt
	[ "$status" -eq 0 ]
	[[ "$output" == "0 "* ]]
	[ "${output#0 }" -gt 1000 ]
}

@test "the cover by test: a sanitized run's tests the cover leaves out are listed plain, its file level and the tests it takes stay sanitized; a test the cover takes gone makes the list stale" {
	# run A: its file level (a server) has 1 line of its own; test a1, 50 s,
	# the same 8 lines as a2 in 1 s, and 2 of its own; a3 nothing of its own.
	# run B: 4 lines a test of its own alone has; run C: nothing at all.
	mkdir -p "$BATS_TEST_TMPDIR/tests"
	printf '@test "a one" { :; }\n@test "a two: x" { :; }\n@test "a_three" { :; }\n' > "$BATS_TEST_TMPDIR/tests/a.bats"
	printf '@test "b" { :; }\n' > "$BATS_TEST_TMPDIR/tests/b.bats"
	cat > "$BATS_TEST_TMPDIR/list" <<-'EOF'
	run 0 60 tests/a.bats
	test 1 0 50000 test_a_one
	test 2 0 1000 test_a_two-3a_x
	test 3 0 9000 test_a-2d5fthree
	run 4 5 X=1 tests/b.bats
	test 5 4 4000 test_b
	run 6 3 tests/c.bats
	lines 8 1,2
	lines 2 1
	lines 1 0
	lines 4 5
	lines 3 1,2,3,5
	EOF
	printf '%s\n' tests/a.bats 'X=1 tests/b.bats' tests/c.bats > "$BATS_TEST_TMPDIR/runs"
	cd "$BATS_TEST_TMPDIR"
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" select list runs plain
	[ "$output" = "$(printf '%s\n' tests/a.bats 'X=1 tests/b.bats')" ]
	[ "$(cat plain)" = "$(printf 'tests/a.bats\ttest_a-2d5fthree')" ]
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[ -z "$output" ]
	# a test the cover leaves out renamed: it is unseen (sanitized), nothing lost
	sed -i 's/a_three/a_four/' tests/a.bats
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[ -z "$output" ]
	# a test the cover takes renamed: the cover leaned on its old name
	sed -i 's/a two: x/a two: y/' tests/a.bats
	run -1 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[[ "$output" == *"stale: a test the cover takes is gone from tests/a.bats: test_a_two-3a_x"* ]]
	# its line renamed by hand: not stale
	sed -i "s/ test_a_two-3a_x\$/ $(python3 "$IDEMKIT_SRC/tests/sancover.py" encode 'a two: y')/" list
	run -0 python3 "$IDEMKIT_SRC/tests/sancover.py" check list runs
	[ -z "$output" ]
}

@test "tests/helper.bash inside a test: the plain build for a test listed plain, the given one for the others and for setup_file; each test's gcov data apart under make san-cover" {
	d=$BATS_TEST_TMPDIR/suite
	mkdir -p "$d" "$BATS_TEST_TMPDIR/san" "$BATS_TEST_TMPDIR/plain"
	# (printf: a line of this file that begins with @test would be bats's own)
	{
		printf 'load "%s/tests/helper"\n' "$IDEMKIT_SRC"
		printf 'setup_file() { echo "file $IDEMKIT_BIN $IDEMKIT_TEST_BIN" >> "%s/seen"; }\n' "$BATS_TEST_TMPDIR"
		for t in 1:'left out: plain' 2:taken; do
			printf '@test "%s" { echo "%s $IDEMKIT_BIN $IDEMKIT_TEST_BIN $(command -v idemp-claim) ${GCOV_PREFIX:-}" >> "%s/seen"; }\n' \
			    "${t#*:}" "${t%%:*}" "$BATS_TEST_TMPDIR"
		done
	} > "$d/x.bats"
	touch "$BATS_TEST_TMPDIR/san/idemp-claim" "$BATS_TEST_TMPDIR/plain/idemp-claim"
	chmod +x "$BATS_TEST_TMPDIR/san/idemp-claim" "$BATS_TEST_TMPDIR/plain/idemp-claim"
	printf 'X=1 %s\ttest_left_out-3a_plain\n' "$d/x.bats" > "$BATS_TEST_TMPDIR/plain-tests"
	s=$BATS_TEST_TMPDIR/san p=$BATS_TEST_TMPDIR/plain
	inner env IDEMKIT_SRC="$IDEMKIT_SRC" IDEMKIT_BIN="$s" IDEMKIT_TEST_BIN="$s/t" IDEMKIT_PLAIN_BIN="$p" \
	    IDEMKIT_PLAIN_TEST_BIN="$p/t" IDEMKIT_SAN_PLAIN_TESTS="$BATS_TEST_TMPDIR/plain-tests" \
	    IDEMKIT_TEST_RUN="X=1 $d/x.bats" bats "$d/x.bats"
	run sort "$BATS_TEST_TMPDIR/seen"
	[ "${lines[0]}" = "1 $p $p/t $p/idemp-claim " ]
	[ "${lines[1]}" = "2 $s $s/t $s/idemp-claim " ]
	[ "${lines[2]}" = "file $s $s/t" ]
	# another run of the same file: nothing listed, all on the given build
	rm "$BATS_TEST_TMPDIR/seen"
	inner env IDEMKIT_SRC="$IDEMKIT_SRC" IDEMKIT_BIN="$s" IDEMKIT_TEST_BIN="$s/t" IDEMKIT_PLAIN_BIN="$p" \
	    IDEMKIT_PLAIN_TEST_BIN="$p/t" IDEMKIT_SAN_PLAIN_TESTS="$BATS_TEST_TMPDIR/plain-tests" \
	    IDEMKIT_TEST_RUN="$d/x.bats" bats "$d/x.bats"
	[ "$(grep -c " $s $s/t" "$BATS_TEST_TMPDIR/seen")" -eq 3 ]
	# make san-cover's: each test's gcov data under the run's, its number beside
	rm "$BATS_TEST_TMPDIR/seen"
	g=$BATS_TEST_TMPDIR/gc/3
	inner env IDEMKIT_SRC="$IDEMKIT_SRC" IDEMKIT_BIN="$s" IDEMKIT_TEST_BIN="$s/t" IDEMKIT_TEST_GCOV="$BATS_TEST_TMPDIR/gc" GCOV_PREFIX="$g" \
	    bats "$d/x.bats"
	run sort "$BATS_TEST_TMPDIR/seen"
	[ "${lines[0]}" = "1 $s $s/t $s/idemp-claim $g/t/test_left_out-3a_plain" ]
	[ "${lines[1]}" = "2 $s $s/t $s/idemp-claim $g/t/test_taken" ]
	[ "$(cat "$g/t/test_taken/number")" = 2 ]
}

@test "run.sh --list prints the runs and runs none; IDEMKIT_TEST_ONLY runs only the runs it names" {
	d=$BATS_TEST_TMPDIR/suite
	mkdir -p "$d"
	for n in a b c; do
		printf '@test "%s" { echo ran > "%s/%s.ran"; }\n' "$n" "$d" "$n" > "$d/$n.bats"
	done
	run inner sh "$IDEMKIT_SRC/tests/run.sh" --list "$d/b.bats" "X=1 $d/c.bats" "$d"
	[ "$status" -eq 0 ]
	[ "$output" = "$(printf '%s\n' "$d/b.bats" "X=1 $d/c.bats" "$d/a.bats" "$d/c.bats")" ]
	[ ! -e "$d/a.ran" ]
	printf '%s\n' "$d/b.bats" "X=1 $d/c.bats" > "$BATS_TEST_TMPDIR/only"
	run inner IDEMKIT_TEST_ONLY="$BATS_TEST_TMPDIR/only" sh "$IDEMKIT_SRC/tests/run.sh" "$d/b.bats" "X=1 $d/c.bats" "$d"
	[ "$status" -eq 0 ]
	[[ "$output" == *"not run here (not in $BATS_TEST_TMPDIR/only): $d/a.bats $d/c.bats "* ]]
	[ "${lines[${#lines[@]}-1]}" = "2 passed, 0 failed, 0 skipped" ]
	[ ! -e "$d/a.ran" ]
	[ -e "$d/b.ran" ]
	[ -e "$d/c.ran" ]
	run inner IDEMKIT_TEST_ONLY="$BATS_TEST_TMPDIR/none" sh "$IDEMKIT_SRC/tests/run.sh" "$d"
	[ "$status" -eq 64 ]
	[[ "$output" == *"cannot read $BATS_TEST_TMPDIR/none"* ]]
}

@test "run.sh names every failure again at the end, with its run and diagnostics, before the tally" {
	d=$BATS_TEST_TMPDIR/suite
	mkdir -p "$d"
	printf '@test "fine" { true; }\n@test "broken one" {\n\t[ 1 -eq 2 ]\n}\n' > "$d/a.bats"
	printf '@test "also fine" { true; }\n' > "$d/b.bats"
	run inner IDEMKIT_TEST_JOBS=2 sh "$IDEMKIT_SRC/tests/run.sh" "X=1 $d/a.bats" "$d/b.bats"
	[ "$status" -eq 1 ]
	n=${#lines[@]}
	[ "${lines[n-1]}" = "2 passed, 1 failed, 0 skipped" ]
	[ "${lines[n-4]}" = "FAILED X=1 $d/a.bats: not ok 2 broken one" ]
	[[ "${lines[n-3]}" == "    # (in test file "*"a.bats, line 3)" ]]
	[[ "${lines[n-2]}" == *'`[ 1 -eq 2 ]'"' failed" ]]
}

@test "tests/helper.bash's lighter trace: a failure names the line and command bats' own trace names ([ ], [[ ]], (( )), a pipeline, a function two deep, a helper file's function, a loop, setup); bats --trace and IDEMKIT_TEST_FULL_TRACE keep bats' trap" {
	d=$BATS_TEST_TMPDIR/tr
	mkdir -p "$d"
	cat > "$d/f.bats" <<-EOF
	load "$IDEMKIT_SRC/tests/helper"
	inner_fail() { local y=2; [ "\$y" -eq 3 ]; }
	outer_fail() { local z=1; inner_fail; echo no; }
	setup() { [ "\$BATS_TEST_DESCRIPTION" != "setup fails" ]; }
	EOF
	# (printf: a line of this file that begins with @test would be bats's own)
	printf '@test "%s" {\n\tx=1\n\t%s\n\techo after\n}\n' \
		single '[ "$x" -eq 2 ]' double '[[ $x == 2 ]]' arith '(( x == 2 ))' \
		pipeline 'echo x | grep -q y' nested 'outer_fail' \
		'helper file' 'jget "{\"a\":1}" a > /dev/null; PATH=/nowhere free_port' \
		loop 'for i in 1 2 3; do [ "$i" -lt 3 ]; done' subshell '( true; false; true )' \
		'setup fails' 'true' >> "$d/f.bats"
	printf '@test "the trap" {\n\ttrap -p DEBUG\n\tfalse\n}\n' >> "$d/f.bats"
	vars="IDEMKIT_SRC=$IDEMKIT_SRC IDEMKIT_BIN=$IDEMKIT_BIN IDEMKIT_TEST_BIN=$IDEMKIT_TEST_BIN"
	# shellcheck disable=SC2086
	run inner $vars bats --tap "$d/f.bats"
	light=$output
	# shellcheck disable=SC2086
	run inner $vars IDEMKIT_TEST_FULL_TRACE=1 bats --tap "$d/f.bats"
	full=$output
	# shellcheck disable=SC2086
	run inner $vars bats --trace --tap "$d/f.bats"
	traced=$output
	echo "$light"
	[ "$(grep -c '^not ok' <<<"$light")" -eq 10 ]
	# the lighter trap is the one in force, and only without --trace or FULL_TRACE
	grep -q "^# trap -- .*_ik_at=" <<<"$light"
	[ "$(grep -c "_ik_at=" <<<"$full")" -eq 0 ]
	[ "$(grep -c "_ik_at=" <<<"$traced")" -eq 0 ]
	grep -q "bats_debug_trap" <<<"$full"
	grep -Fqx '#   `[ "$x" -eq 2 ]'"' failed" <<<"$light"
	grep -Fqx '#   `[[ $x == 2 ]]'"' failed" <<<"$light"
	grep -Fqx '#   `(( x == 2 ))'"' failed" <<<"$light"
	grep -Fqx '#   `echo x | grep -q y'"' failed" <<<"$light"
	grep -Fqx '#   `outer_fail'"' failed" <<<"$light"
	grep -Eq "^# \(from function .inner_fail' in file .*f.bats, line 2,\$" <<<"$light"
	grep -Eq "^#  from function .outer_fail' in file .*f.bats, line 3,\$" <<<"$light"
	grep -Fqx '#   `for i in 1 2 3; do [ "$i" -lt 3 ]; done'"' failed" <<<"$light"
	grep -Eq "^# \(from function .free_port' in file .*tests/helper.bash, line [0-9]+,\$" <<<"$light"
	grep -Eq "^# \(from function .setup' in test file .*f.bats, line 4\)\$" <<<"$light"
	# what bats' own trap reports, line for line, but for the stack of its
	# own run (bats 1.8 names the frames of its version check inside it)
	diff <(grep '^#' <<<"$full" | grep -v 'trap --\|bats_warn_minimum\|test_functions.bash') \
		<(grep '^#' <<<"$light" | grep -v 'trap --')
}

@test "mutants: MUTANTS_JOBS must be a count" {
	run inner MUTANTS_JOBS=0 MUTANTS_DIR="$BATS_TEST_TMPDIR/m" sh "$IDEMKIT_SRC/tests/mutants/run.sh"
	[ "$status" -eq 64 ]
	[ "$output" = "mutants: MUTANTS_JOBS must be a count" ]
	run inner MUTANTS_JOBS=two MUTANTS_DIR="$BATS_TEST_TMPDIR/m" sh "$IDEMKIT_SRC/tests/mutants/run.sh"
	[ "$status" -eq 64 ]
	[ ! -e "$BATS_TEST_TMPDIR/m" ]
}

# clock LINES...: resolves one worker's log lines (logged times, in file
# order; "h" before one marks the harness's own line) under one clock
# fault on host w1, +20 s from 100000 to 110000 (true times), and prints
# the true time read for each line ("None": not judged).
clock() {
	python3 - "$@" <<'PY'
import sys
sys.path.insert(0, "tests/chaos")
import checker
sp = [(100000, 110000, {"kind": "clock", "host": "w1", "skew_s": 20.0})]
real = checker.real_clock(sp)
tss, fixed = [], set()
for i, a in enumerate(sys.argv[1:]):
    if a.startswith("h"):
        fixed.add(i)
        a = a[1:]
    tss.append(int(a))
print(" ".join(str(t) for t in real.resolve("w1", tss, fixed)))
PY
}

@test "a line logged under a clock fault is read in the log's order: skewed while the fault is on, true after it, though its time fits both" {
	cd "$IDEMKIT_SRC"
	# before the fault; under it (logged 20 s ahead); after the heal,
	# where 121000-128000 could also be read as logged under it
	run clock 95000 97000 h101000 122000 125000 128000 112000 114000 121000 128000 135000
	[ "$status" -eq 0 ]
	[ "$output" = "95000 97000 101000 102000 105000 108000 112000 114000 121000 128000 135000" ]
}

@test "a line whose readings both keep the order, or one at the clock change, is not judged (None), never guessed" {
	cd "$IDEMKIT_SRC"
	# nothing written after the heal: 125000 may be either reading
	run clock 95000 125000
	[ "$status" -eq 0 ]
	[ "$output" = "95000 None" ]
	# a line within 1.5 s of the change
	run clock 95000 120500 103000
	[ "$output" = "95000 None None" ]
}

@test "the checker's storage check (11): a log line naming a corrupt file, or an embedded file integrity_check faults, is a violation; a sound run is none" {
	cd "$IDEMKIT_SRC"
	r=$BATS_TEST_TMPDIR/run
	mkdir -p "$r/logs" "$r/shared"
	sqlite3 "$r/shared/queue.db" 'CREATE TABLE t (a PRIMARY KEY, b); INSERT INTO t VALUES (1, 2), (3, 4)'
	echo '{"msg":"ack failed","error":"sqlite queue q.db: delete: busy"}' > "$r/logs/worker-w1.log"
	storage() {
		python3 - "$r" <<'PY'
import sys
sys.path.insert(0, "tests/chaos")
import checker
out = []
checker.storage_checks(sys.argv[1], lambda i, cid, why: out.append("%d %s" % (i, why)))
print("\n".join(out) or "none")
PY
	}
	run storage
	[ "$status" -eq 0 ]
	[ "$output" = none ]
	echo '{"msg":"ack failed","error":"sqlite queue q.db: delete: database disk image is malformed"}' >> "$r/logs/worker-w1.log"
	run storage
	[[ $output == "11 1 line(s) in worker-w1.log name a corrupt file, the first: "*"malformed"* ]]
	[ "${#lines[@]}" -eq 1 ]
	rm "$r/logs/worker-w1.log"
	python3 - "$r/shared/queue.db" <<'PY'
import sys
# a page of the file overwritten: what a write into a deleted WAL leaves
with open(sys.argv[1], "r+b") as f:
    f.seek(4096 + 8)
    f.write(b"\xff" * 64)
PY
	run storage
	echo "$output"
	[[ $output == "11 queue.db: integrity_check says *** in database main ***"*"page 2"* ]]
}

@test "the checker's DLQ reason (3): idemkit's, or RabbitMQ's past the delivery limit (deathReason); a copy with neither has none" {
	cd "$IDEMKIT_SRC"
	run python3 - <<'PY'
import sys
sys.path.insert(0, "tests/chaos")
import checker
for m in ({"attributes": {"idemkit.reason": "INVALID_EVENT"}},
          {"attributes": {"deathReason": "delivery_limit", "deathQueue": "charges"}},
          {"attributes": {"deathQueue": "charges"}}, {"attributes": None}, {}):
    print(checker.dlq_reason(m))
PY
	[ "$status" -eq 0 ]
	[ "$output" = "$(printf 'INVALID_EVENT\ndelivery_limit\nNone\nNone\nNone')" ]
}

@test "the checker's timeline of a charge follows its message ids into the RabbitMQ holder's lines (which name no charge), the last ones kept when it is long" {
	cd "$IDEMKIT_SRC"
	run python3 - "$BATS_TEST_TMPDIR" <<'PY'
import json, os, sys
sys.path.insert(0, "tests/chaos")
import checker
run = sys.argv[1]
os.makedirs(os.path.join(run, "logs"))
h = lambda ts, msg, mid, **kw: dict({"ts": ts, "prog": "sqs-recv", "msg": msg,
                                     "step": "amqp-holder", "messageId": mid}, **kw)
lines = [h(1, "basic.deliver", "m1", tag=1, conn=1),
         {"ts": 2, "prog": "idemp-claim", "msg": "claim", "chargeId": "CHG-1", "messageId": "m1"},
         h(3, "visibility moved", "m1", tag=1, conn=1), h(4, "basic.deliver", "m2", tag=2),
         h(5, "returned", "m1", tag=1, conn=1, reason="visibility ended")]
lines += [h(10 + i, "returned", "m1", tag=9, conn=2, reason="r%d" % i) for i in range(100)]
with open(os.path.join(run, "logs", "worker-w1.0.log"), "w") as f:
    f.write("".join(json.dumps(e) + "\n" for e in lines))
tl = checker.timeline(run, "CHG-1")
print(len(tl), [x["ts"] for x in tl[:5]], tl[-1]["line"]["reason"])
PY
	echo "$output"
	[ "$status" -eq 0 ]
	# m2 (another message) is not in it; the first 20 and the last 60
	[ "$output" = "80 [1, 2, 3, 5, 10] r99" ]
}

@test "the suites' jget (tests/tools/jget.c) answers as Python's json does: 200 random documents and paths, those it hands to python3 included" {
	run python3 "$IDEMKIT_SRC/tests/tools/jget_check.py" "$IDEMKIT_TEST_BIN/jget" 43 200
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[${#lines[@]}-1]}" = "0 differ of 200" ]
}

# money DIR CASE: checks 7-9 (money_checks) on one charge's history made
# here, as in the soak's run embedded 1007; prints each violation as "N
# chargeId: why", or "none".  CHG-1's first claim (100000, a 16 s lease):
# its debit step gives up at 102000 (timed out); the bank answers a 201
# at 116300 to a request nobody waits for (stale: in 1007, one given up on
# before a partition, delivered when it healed, on a tree without
# SO_LINGER 0), the link writes it at 116400 to a socket no step reads;
# the second claim (116500): its request is cut (the bank restarting, the
# link's note has no status, 117050) and its step says TEMPFAIL (reset)
# at 117100; the third (133000) debits (a replay) and finishes.
#   stale: that history;
#   own:   no stale request, and the second claim's own request answered
#          201, the link writing it, while the step says TEMPFAIL (reset);
#   slow:  a slow bank (4 s) in force, the stale answer only 3 s after
#          the step gave up, as a request already past the worker.
money() {
	python3 - "$1" "$2" <<'PY'
import json, os, sys
sys.path.insert(0, "tests/chaos")
import checker
run, case = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(run, "logs"), exist_ok=True)
wl = {"lease_s": 16, "backend": "embedded", "charges": [{"chargeId": "CHG-1"}]}
claim = lambda at, n: {"op": "claim", "at": at, "attempt": n, "leaseUntil": at + 16000}
records = {"CHG-1": {"state": "DONE", "history": [
    claim(100000, 1), claim(116500, 2), claim(133000, 3),
    {"op": "finish", "at": 134000, "state": "DONE"}]}}
step = lambda ts, o, err=None: dict({"ts": ts, "prog": "charge-debit", "msg": "debit",
                                     "chargeId": "CHG-1", "outcome": o},
                                    **({"error": err} if err else {}))
lines = [step(102000, "TEMPFAIL", "bank: Operation timed out after 2000 milliseconds with 0 "
              "bytes received"),
         step(117100, "TEMPFAIL", "bank: Recv failure: Connection reset by peer"),
         step(133600, "OK")]
stale = 116300 if case != "slow" else 105000
reqs = [(stale, 201), (117000, 200), (133500, 200)]
notes = [{"conn": 1, "status": "201", "ts": stale + 100},
         {"conn": 2, "faults": ["upstream:IncompleteReadError"], "ts": 117050},
         {"conn": 3, "status": "200", "ts": 133550}]
nem = []
if case == "own":
    reqs = [(117000, 201), (133500, 200)]
    notes = [{"conn": 2, "status": "201", "faults": [], "ts": 117050}, notes[2]]
if case == "slow":
    nem = [{"t": 1, "kind": "bank-slow", "latency_ms": 4000, "d": 10, "action": a, "ts": ts}
           for a, ts in (("start", 99000), ("healed", 109000))]
for name, rows in (("nemesis.log", nem), ("logs/worker-w1.0.log", lines),
                   ("logs/bank-proxy.req.log",
                    [dict(n, req="POST /debits HTTP/1.1", key="CHG-1") for n in notes])):
    with open(os.path.join(run, name), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
out = []
checker.money_checks(run, wl, records, {"CHG-1": reqs},
                     lambda i, cid, why: out.append("%d %s: %s" % (i, cid, why)))
print("\n".join(out) or "none")
PY
}

@test "the checker's checks 7-9: a stale request's 201 is not the answer of the step whose own request was cut (run embedded 1007), but a request answered after its step gave up is a violation (9); a step's own 2xx it called TEMPFAIL still is (8, 7); a slow bank's late answer is not" {
	cd "$IDEMKIT_SRC"
	run money "$BATS_TEST_TMPDIR/stale" stale
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = "9 CHG-1: the bank answered a request (201) at 116300, 14300 ms after the debit step of the claim of 100000 gave up on it (TEMPFAIL: bank: Operation timed out after 2000 milliseconds with 0 bytes received) on w1.0, no step of that claim waiting" ]
	run money "$BATS_TEST_TMPDIR/own" own
	echo "$output"
	[ "${lines[0]}" = "8 CHG-1: the link delivered the bank's 201 (faults []) and the debit step said TEMPFAIL (bank: Recv failure: Connection reset by peer)" ]
	[[ ${lines[1]} == "7 CHG-1: the link delivered the bank's 201 and the debit step said TEMPFAIL on w1.0 at 117100, and the charge went to the bank again at 133500 with no crash window around it" ]]
	[ "${#lines[@]}" -eq 2 ]
	run money "$BATS_TEST_TMPDIR/slow" slow
	echo "$output"
	[ "$output" = none ]
}

@test "the campaign re-drives the DLQ once the backlog is drained with charges still open (run embedded 1006: a copy dead-lettered 21 s after the heal's re-drive), never while copies are queued or when every charge is settled" {
	cd "$IDEMKIT_SRC"
	run python3 - <<'PY'
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, "tests/chaos")
import chaos
for args in (("embedded", 1, 0, 0), ("embedded", 1, 3, 99), ("embedded", 0, 0, 99),
             ("embedded", None, 0, 99), ("dynamodb", 1, 5, 19), ("dynamodb", 1, 5, 20)):
    print(chaos.redrive_due(*args))
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = "$(printf '%s\n' True False False False False True)" ]
}

# foreign DIR: a run of another consumer (chaos.py --worker) made by hand,
# judged; prints each violation as "N chargeId: why", then the verdict.
# The history: CHG-1 debited once and notified once (sound); CHG-2
# debited twice under two keys and notified under both; CHG-3 never
# debited, not in the DLQ, a copy left in the queue; CHG-4 declined, in
# the DLQ; CHG-5 debited, never notified; a poison message deleted.  Each
# notification's body carries an ISO-8859-1 byte, as after bank-legacy.
foreign() {
	python3 - "$1" "$2" <<'PY'
import json, os, sqlite3, sys
sys.path.insert(0, "tests/chaos")
import checker
run, sound = sys.argv[1], sys.argv[2] == "sound"
for d in ("bank", "logs"):
    os.makedirs(os.path.join(run, d), exist_ok=True)
ch = lambda cid, acct="ACC-0001": {"chargeId": cid, "accountId": acct, "amount": 100,
                                   "declined": acct.startswith("ACC-DECL"), "copies": 2,
                                   "mismatch": None, "body": json.dumps({"chargeId": cid})}
poison = "POISON {not json"
json.dump({"seed": 9, "backend": "dynamodb", "duration": 40, "lease_s": 16,
           "declined": ["ACC-DECL-1"], "worker": "python3 consumer.py",
           "charges": [ch("CHG-1"), ch("CHG-2"), ch("CHG-3"), ch("CHG-4", "ACC-DECL-1"),
                       ch("CHG-5")], "poison": [poison]},
          open(os.path.join(run, "workload.json"), "w"))
db = sqlite3.connect(os.path.join(run, "bank", "ledger.db"))
db.executescript("CREATE TABLE debits (seq INTEGER PRIMARY KEY, key, ref, charge_id, amount,"
                 " replays, created_at); CREATE TABLE notifications (key, count, body);")
debits = [("k1", "CHG-1"), ("k2", "CHG-2"), ("k5", "CHG-5")]
notes = [("n1", "CHG-1"), ("n2", "CHG-2")]
if not sound:
    debits += [("k2b", "CHG-2")]
    notes += [("n2b", "CHG-2")]
else:
    debits += [("k3", "CHG-3")]
    notes += [("n3", "CHG-3"), ("n5", "CHG-5")]
for i, (k, c) in enumerate(debits):
    db.execute("INSERT INTO debits VALUES (?, ?, ?, ?, 100, 0, ?)", (i + 1, k, "TXN-%d" % i, c,
                                                                    1000 + i))
for k, c in notes:
    # CHG-1's as bank-legacy leaves it: the reference's ISO-8859-1 byte
    body = json.dumps({"chargeId": c, "debitRef": "TXN-0/M\xfcnchen"}, ensure_ascii=False)
    db.execute("INSERT INTO notifications VALUES (?, 1, CAST(? AS TEXT))",
               (k, body.encode("latin-1")))
db.commit()
dlq = [{"body": json.dumps({"chargeId": "CHG-4"})}] + ([{"body": poison}] if sound else [])
left = [] if sound else [{"body": json.dumps({"chargeId": "CHG-3"})}]
for name, ms in (("dlq", dlq), ("queue", left), ("records", [])):
    with open(os.path.join(run, name + ".ndjson"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in ms)
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    v = checker.check(run, [], {"drained_s": 3.0, "drain_bound_s": 77})
for inv in v["invariants"]:
    for x in inv["violations"]:
        print("%d %s: %s" % (inv["n"], x["chargeId"], x["why"]))
print("judged", " ".join(str(i["n"]) for i in v["invariants"]), "VALID" if v["ok"] else "INVALID")
PY
}

@test "the campaign judges another consumer (--worker) by the bank, the gateway and the queues alone: a double debit, a charge lost, a copy left, a notification twice or never, a poison message deleted" {
	cd "$IDEMKIT_SRC"
	run foreign "$BATS_TEST_TMPDIR/bad" broken
	echo "$output"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "1 CHG-2: 2 distinct debits at the bank (TXN-1, TXN-3), under keys ['k2', 'k2b']" ]]
	[ "${lines[1]}" = "3 CHG-3: never debited, and not in the DLQ" ]
	[ "${lines[2]}" = "3 CHG-3: 1 copies still in the queue" ]
	[ "${lines[3]}" = "3 POISON {not json: a malformed message is not in the DLQ" ]
	[ "${lines[4]}" = "4 CHG-2: debited, and notified under 2 keys" ]
	[ "${lines[5]}" = "4 CHG-5: debited, and never notified" ]
	[ "${lines[6]}" = "judged 1 3 4 5 6 INVALID" ]
	[ "${#lines[@]}" -eq 7 ]
	# the same consumer's sound history: nothing to say
	run foreign "$BATS_TEST_TMPDIR/good" sound
	echo "$output"
	[ "$output" = "judged 1 3 4 5 6 VALID" ]
}

@test "liveness as a number: from each fault's heal to the last charge outstanding then settled, per kind (p50, p99, max); none outstanding is 0; a charge never settled counts nowhere" {
	cd "$IDEMKIT_SRC"
	run python3 - <<'PY'
import sys
sys.path.insert(0, "tests/chaos")
import checker
heals = [("kill-worker", 1000), ("partition", 5000), ("partition", 9000), ("heal-all", 9500)]
sent = {"a": 0, "b": 900, "c": 4000, "d": 8000, "lost": 100}
settled = {"a": 500, "b": 3000, "c": 7000, "d": 8500}
for k, x in checker.recovery(heals, sent, settled).items():
    print(k, x["n"], x["p50"], x["p99"], x["max"])
print(checker.summary([float(i) for i in range(1, 101)]))
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "heal-all 1 0.0 0.0 0.0" ]
	[ "${lines[1]}" = "kill-worker 1 2.0 2.0 2.0" ]
	[ "${lines[2]}" = "partition 2 0.0 2.0 2.0" ]
	[ "${lines[3]}" = "{'n': 100, 'p50': 50.0, 'p99': 99.0, 'max': 100.0}" ]
}

@test "no test asserts with [ A ] && [ B ], or a bare ! CMD, before its last line: bats's errexit ignores a failing A there, and any ! CMD, so the assertion could never fail" {
	# (15 such lines were found and split into two commands, 2026-12-05;
	# four bare ! lines, 2026-12-06)
	run python3 - "$IDEMKIT_SRC" <<-'PY'
	import glob, re, sys
	pat = re.compile(r"^\s*(\[\[? .*\]\]? && \[\[? |! )")
	bad = []
	for f in sorted(glob.glob(sys.argv[1] + "/tests/**/*.bats", recursive=True)):
	    lines = open(f).read().split("\n")
	    intest = False
	    for i, l in enumerate(lines):
	        if l.startswith("@test "): intest = True
	        elif l.startswith("}"): intest = False
	        if not intest or not pat.match(l) or "||" in l or "return" in l or "echo" in l:
	            continue
	        j = i + 1
	        while j < len(lines) and not lines[j].strip(): j += 1
	        if j < len(lines) and not lines[j].startswith("}"):
	            bad.append("%s:%d: %s" % (f[len(sys.argv[1]) + 1:], i + 1, l.strip()))
	print("\n".join(bad))
	sys.exit(1 if bad else 0)
	PY
	echo "$output"
	[ "$status" -eq 0 ]
	# the check itself finds one
	mkdir -p "$BATS_TEST_TMPDIR/t/tests"
	printf '@test "x" {\n\t[ 1 = 2 ] && [ 2 = 2 ]\n\ttrue\n\t! true\n\ttrue\n}\n' > "$BATS_TEST_TMPDIR/t/tests/x.bats"
	sed -n '/^\trun python3 - "\$IDEMKIT_SRC" <<-.PY.$/,/^\tPY$/p' "$BATS_TEST_FILENAME" | sed '1d;$d; s/^\t//' > "$BATS_TEST_TMPDIR/check.py"
	run python3 "$BATS_TEST_TMPDIR/check.py" "$BATS_TEST_TMPDIR/t"
	[ "$status" -eq 1 ]
	[ "$output" = "$(printf 'tests/x.bats:2: [ 1 = 2 ] && [ 2 = 2 ]\ntests/x.bats:4: ! true')" ]
}


@test "every seeded mutant still applies to the tree (a refactor that moves the code it mutates fails here, in make test, not at the end of CI's mutants step)" {
	cd "$IDEMKIT_SRC"
	bad=
	for p in tests/mutants/*.patch; do
		patch -p1 --dry-run -s -f < "$p" > /dev/null 2>&1 || bad="$bad ${p##*/}"
	done
	echo "no longer apply:$bad"
	[ -z "$bad" ]
}
