#!/usr/bin/env bats
# The contract around the commands: the exit-code table in lib/ and
# idemkit(7) agree; every command has a man page whose EXIT STATUS lists
# exactly the codes its --help lists, and a USAGE that matches.

load helper
bats_require_minimum_version 1.5.0

@test "idemkit(7) prints the table of lib/core/outcome.c, row for row" {
	run "$IDEMKIT_TEST_BIN/outcome_table"
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 17 ]
	for row in "${lines[@]}"; do
		grep -qxF -- "$row" "$IDEMKIT_SRC/man/idemkit.7" || { echo "missing in idemkit.7: $row"; return 1; }
	done
	[ "$(grep -c '^\.It [0-9]* Ta ' "$IDEMKIT_SRC/man/idemkit.7")" -eq 17 ]
}

@test "the codes never move (codes are API)" {
	run "$IDEMKIT_TEST_BIN/outcome_table"
	got=$(printf '%s\n' "${lines[@]}" | awk '{print $2 "=" $4}' | tr '\n' ' ')
	[ "$got" = "0=OK 1=EMPTY 10=DUP_DONE 11=DUP_IN_PROGRESS 12=DUP_FAILED 13=LEASE_LOST 14=PAYLOAD_MISMATCH 15=LEASE_SHORT 16=STALE_EVENT 17=RUN_FAILED 20=DECLINED 21=NOTIFY_FAILED 64=USAGE 65=DATAERR 70=SOFTWARE 75=TEMPFAIL 78=CONFIG " ]
}

@test "every command: a man page, --help and EXIT STATUS list the same codes, --version works" {
	for bin in "$IDEMKIT_BIN"/*; do
		name=$(basename "$bin")
		page=$IDEMKIT_SRC/man/$name.1
		[ -f "$page" ] || { echo "$name: no man page"; return 1; }
		help=$("$bin" --help) || { echo "$name --help failed"; return 1; }
		"$bin" --version | grep -q "idemkit" || { echo "$name --version"; return 1; }
		hcodes=$(printf '%s\n' "$help" | sed -n '/^Exit status:/,/^$/p' | awk '/^ +[0-9]+ /{print $1}' | sort -n | tr '\n' ' ')
		mcodes=$(sed -n '/^\.Sh EXIT STATUS/,/^\.Sh /p' "$page" | awk '/^\.It [0-9]+$/{print $2}' | sort -n | tr '\n' ' ')
		[ -n "$hcodes" ] || { echo "$name: no codes in --help"; return 1; }
		[ "$hcodes" = "$mcodes" ] || { echo "$name: --help [$hcodes] vs man [$mcodes]"; return 1; }
		first=$(printf '%s\n' "$help" | head -1)
		[[ "$first" == "usage: $name"* ]] || { echo "$name: usage line: $first"; return 1; }
	done
}

# The pipeline's table (outcome.c, idemkit(7)) says what a code means for
# a charge on its way (0: "claim ACQUIRED, debited, ..."); a command's
# --help says what it means for that command (idemp-show's 0: every
# chargeId has a record), its name from the one table.
@test "every --help says what each code means for that command, not the pipeline table's meaning" {
	run "$IDEMKIT_TEST_BIN/outcome_table"
	generic=$(printf '%s\n' "${lines[@]}" | sed -n 's/^\.It \(0\|1\|75\|78\) Ta [A-Z_]* Ta \(.*\); [^;]*$/\2/p')
	[ "$(wc -l <<<"$generic")" -eq 4 ]
	for bin in "$IDEMKIT_BIN"/*; do
		exits=$("$bin" --help | sed -n '/^Exit status:/,/^$/p')
		while IFS= read -r m; do
			if grep -qF -- "$m" <<<"$exits"; then
				echo "$(basename "$bin") --help: the pipeline's meaning: $m"
				return 1
			fi
		done <<<"$generic"
	done
	run -0 idemp-show --help
	[[ "$output" == *$'\n    0  OK                every chargeId has a record\n    1  EMPTY             at least one chargeId has no record\n'* ]]
	# a meaning on two lines goes on under its own column
	run -0 idemp-claim --help
	[[ "$output" == *$'   14  PAYLOAD_MISMATCH  same chargeId, another account, amount,\n                         currency or chargeType\n'* ]]
}

@test "man pages are clean mdoc" {
	command -v mandoc >/dev/null || skip "mandoc not installed"
	for page in "$IDEMKIT_SRC"/man/*.[1-8]; do
		out=$(mandoc -Tlint -W warning "$page" 2>&1) || true
		[ -z "$out" ] || { echo "$out"; return 1; }
	done
}

@test "the shell commands and examples are shellcheck-clean POSIX sh" {
	if ! command -v shellcheck >/dev/null; then
		[ "${CI:-}" != true ] || { echo "shellcheck is required under CI"; return 1; }
		skip "shellcheck not installed"
	fi
	shellcheck -s sh "$IDEMKIT_SRC"/cmd/*.sh "$IDEMKIT_SRC"/examples/*.sh
}

@test "make install puts every command and man page under DESTDIR/PREFIX" {
	dest=$BATS_TEST_TMPDIR/root
	run make -s -C "$IDEMKIT_SRC" install DESTDIR="$dest" PREFIX=/opt/idemkit
	[ "$status" -eq 0 ]
	for bin in "$IDEMKIT_BIN"/*; do
		# bank-sim is the test double: built beside the commands, never installed.
		[ "$(basename "$bin")" != bank-sim ] || continue
		[ -x "$dest/opt/idemkit/bin/$(basename "$bin")" ] || { echo "missing $(basename "$bin")"; return 1; }
	done
	[ -f "$dest/opt/idemkit/share/man/man7/idemkit.7" ]
	[ -f "$dest/opt/idemkit/share/man/man1/charge-worker.1" ]
	grep -q '^VERSION=[0-9]' "$dest/opt/idemkit/bin/charge-worker"
}

# without "SONAME..." CMD...: CMD where none of those libraries can be
# loaded: a private mount namespace with /dev/null bound over each.
without() {
	local so p paths=''
	for so in $1; do
		p=$(ldconfig -p | awk -v so="$so" '$1 == so { print $NF; exit }')
		[ -n "$p" ] || { echo "$so is not installed" >&2; return 99; }
		paths="$paths $p"
	done
	shift
	IK_HIDE=$paths unshare -m sh -c \
		'for p in $IK_HIDE; do mount --bind /dev/null "$p" || exit 99; done; exec "$@"' sh "$@"
}

@test "libcurl, libpq and hiredis are loaded on first use: no command links them; the embedded default runs without them" {
	local b
	for b in "$IDEMKIT_BIN"/*; do
		head -c 4 "$b" | grep -q ELF || continue
		if readelf -d "$b" | grep -E 'NEEDED.*\[(libcurl|libpq|libhiredis)'; then
			echo "$b links a library that lib/dl/dl.h loads on first use" >&2
			return 1
		fi
	done
	unshare -m true 2>/dev/null || skip "needs unshare -m (root)"
	ev "$(uid)" > "$BATS_TEST_TMPDIR/ev"
	run without "libcurl.so.4 libpq.so.5 libhiredis.so.0.14" idemp-claim < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 0 ]
	[[ $output == *'"outcome":"ACQUIRED"'* ]]
}

@test "a missing libpq, hiredis or libcurl is CONFIG (78) naming the library and its Debian package" {
	unshare -m true 2>/dev/null || skip "needs unshare -m (root)"
	ev "$(uid)" > "$BATS_TEST_TMPDIR/ev"
	run --separate-stderr without libpq.so.5 idemp-claim --store postgres://127.0.0.1:1/x < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 78 ]
	[[ $stderr == *"idemp-claim: postgres: cannot load libpq: "*"(install the Debian package libpq5)"* ]]
	run --separate-stderr without libhiredis.so.0.14 idemp-claim --store redis://127.0.0.1:1 < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 78 ]
	[[ $stderr == *"cannot load hiredis: "*"(install the Debian package libhiredis0.14)"* ]]
	IDEMKIT_CACHE=redis://127.0.0.1:1 run --separate-stderr without libhiredis.so.0.14 idemp-claim < "$BATS_TEST_TMPDIR/ev"
	[ "$status" -eq 78 ]
	[[ $stderr == *"IDEMKIT_CACHE: cannot load hiredis: "*"libhiredis0.14)"* ]]
	# nothing was claimed on the way: the embedded store still has the charge free
	idemp-claim < "$BATS_TEST_TMPDIR/ev" > "$BATS_TEST_TMPDIR/claimed"
	IDEMKIT_BANK_URL=http://127.0.0.1:1/debits run --separate-stderr without libcurl.so.4 \
		charge-debit < "$BATS_TEST_TMPDIR/claimed"
	[ "$status" -eq 78 ]
	[[ $stderr == *"cannot load libcurl: "*"(install the Debian package libcurl4)"* ]]
}
