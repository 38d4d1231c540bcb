#!/usr/bin/env bats
# lib/'s layout (DESIGN.md "Layout"): a folder per port and per shared
# concern, depending one way.  The order and the rules are written once,
# in tests/layout.py; here they are held against the tree, its includes
# and its calls, and shown to fail where they should.
bats_require_minimum_version 1.5.0
load helper

layout() {
	python3 "$IDEMKIT_SRC/tests/layout.py" "$@"
}

# tree DIR FILE TEXT...: a fake tree under DIR, each FILE holding TEXT.
tree() {
	local dir=$1 f
	shift
	while [ $# -gt 0 ]; do
		f=$dir/$1
		mkdir -p "${f%/*}"
		printf '%b' "$2" > "$f"
		shift 2
	done
}

@test "layout: every #include of lib/, cmd/ and sim/ keeps the order of tests/layout.py" {
	run layout includes "$IDEMKIT_SRC"
	[ -z "$output" ] || { echo "$output"; return 1; }
	[ "$status" -eq 0 ]
}

@test "layout: no two files of lib/ call each other, and no folder calls one above it (nm over the library)" {
	run layout calls "$IDEMKIT_SRC" "$IDEMKIT_BIN/../lib/libidemkit.a"
	[ -z "$output" ] || { echo "$output"; return 1; }
	[ "$status" -eq 0 ]
}

@test "layout: the include check fails on each kind of violation, one line each, naming the rule" {
	d=$BATS_TEST_TMPDIR/tree
	tree "$d" \
		lib/core/util.h '' \
		lib/cli/cli.h '' \
		lib/store/store.h '#include "core/util.h"\n' \
		lib/store/store.c '#include "store/store.h"\n#include "cli/cli.h"\n' \
		lib/queue/queue.h '' \
		lib/store/sqlite/store_sqlite.h '' \
		lib/store/sqlite/store_sqlite.c '#include "store/sqlite/store_sqlite.h"\n#include "queue/queue.h"\n' \
		lib/store/pg/store_pg.c '#include "store/store.h"\n#include "store/sqlite/store_sqlite.h"\n' \
		lib/open/open_store.c '#include "store/sqlite/store_sqlite.h"\n' \
		lib/flow/acker.c '#include "store/sqlite/store_sqlite.h"\n' \
		lib/aws/aws.h '' \
		lib/bank/bankapi.c '#include "aws/aws.h"\n' \
		lib/conn/http.c '#include "banksim.h"\n#include "util.h"\n' \
		lib/amqp/amqp.c '#include "core/util.h"\n' \
		lib/queue/x/open_store.c '' \
		cmd/a.c '#include "cli/cli.h"\n#include "store/sqlite/store_sqlite.h"\n#include "aws/aws.h"\n' \
		sim/banksim.h '' \
		sim/bank-sim.c '#include "banksim.h"\n#include "core/util.h"\n'
	run layout includes "$d"
	[ "$status" -eq 1 ]
	printf '%s\n' "$output"
	[ "${#lines[@]}" -eq 11 ]
	[[ "$output" == *"lib/store/store.c includes lib/cli/cli.h: store may not use cli (order, lowest first: core < dl < conn < aws, bank < store, queue < store/*, queue/* < open < flow < cli)"* ]]
	[[ "$output" == *"lib/store/sqlite/store_sqlite.c includes lib/queue/queue.h: the adapter store/sqlite/ uses no port but store/"* ]]
	[[ "$output" == *"lib/store/pg/store_pg.c includes lib/store/sqlite/store_sqlite.h: only open/ names an adapter (store/sqlite/ is one)"* ]]
	[[ "$output" == *"lib/flow/acker.c includes lib/store/sqlite/store_sqlite.h: only open/ names an adapter"* ]]
	[[ "$output" == *"lib/bank/bankapi.c includes lib/aws/aws.h: bank may not use aws, on its own line"* ]]
	[[ "$output" == *'lib/conn/http.c includes "banksim.h": no such file under lib/'* ]]
	[[ "$output" == *'lib/conn/http.c includes "util.h": no such file under lib/ (a path from lib/, as "core/util.h")'* ]]
	[[ "$output" == *"lib/amqp/amqp.c: lib/amqp/ is on no line of the order in tests/layout.py"* ]]
	[[ "$output" == *"lib/open/open_store.c and lib/queue/x/open_store.c share the name open_store.c: the archive keeps one of them"* ]]
	[[ "$output" == *"cmd/a.c includes lib/store/sqlite/store_sqlite.h: a command talks to ports, not to store/sqlite/"* ]]
	[[ "$output" == *"cmd/a.c includes lib/aws/aws.h: a command talks to ports, not to aws/"* ]]
	# what may be: the factory names adapters, sim/ its own header
	[[ "$output" != *"lib/open/open_store.c includes"* ]]
	[[ "$output" != *"sim/bank-sim.c"* ]]
	[[ "$output" != *"lib/store/store.c includes lib/store/store.h"* ]]
}

@test "layout: the call check fails on two files that call each other, and on a call up the order" {
	command -v cc >/dev/null || skip "no C compiler"
	d=$BATS_TEST_TMPDIR/tree
	tree "$d" \
		lib/core/a.c 'int ik_b(void);\nint ik_a(void) { return ik_b(); }\n' \
		lib/core/b.c 'int ik_a(void);\nint ik_c(void);\nint ik_b(void) { return ik_a() + ik_c(); }\n' \
		lib/store/c.c 'int ik_c(void) { return 1; }\n' \
		lib/store/d.c 'int ik_c(void);\nint ik_d(void) { return ik_c(); }\n'
	for f in a b c d; do
		cc -c -o "$d/$f.o" "$(ls "$d"/lib/*/$f.c)"
	done
	ar rcs "$d/lib.a" "$d"/a.o "$d"/b.o "$d"/c.o "$d"/d.o
	run layout calls "$d" "$d/lib.a"
	[ "$status" -eq 1 ]
	printf '%s\n' "$output"
	[ "${#lines[@]}" -eq 2 ]
	[[ "${lines[0]}" == "lib/core/b.c calls lib/store/c.c (ik_c): core may not use store (order, lowest first: "* ]]
	[ "${lines[1]}" = "lib/core/a.c, lib/core/b.c call each other: lib/core/a.c -> lib/core/b.c (ik_b); lib/core/b.c -> lib/core/a.c (ik_a)" ]
}

@test "layout: the folder graph names each folder of lib/ with the folders it includes" {
	run layout graph "$IDEMKIT_SRC"
	[ "$status" -eq 0 ]
	printf '%s\n' "$output"
	[[ "$output" == *"open: conn core queue queue/amqp queue/sqlite queue/sqs store store/cache store/dynamodb store/postgres store/redis store/sqlite"* ]]
	[[ "$output" == *"queue/amqp: conn core queue"* ]]
	[[ "$output" == *"store/postgres: core dl store"* ]]
	[[ "$output" == *$'\n'"store: core"$'\n'* ]]
	[[ "$output" == *$'\n'"cli: core"$'\n'* ]]
}
