#!/usr/bin/env bats
# The set-up the README's two commands do by themselves (mk/deps.sh), and
# the warning flags a build gets in a checkout and in a packager's tree.
load helper

@test "deps: nothing missing is silent; --print names exactly the missing packages" {
	run sh "$IDEMKIT_SRC/mk/deps.sh" dpkg sh:idemkit-no-such-package
	[ "$status" -eq 0 ]
	[ -z "$output" ]
	run sh "$IDEMKIT_SRC/mk/deps.sh" --print dpkg idemkit-no-such-package sh:idemkit-other \
		idemkit-no-such-package idemkit-no-such-command:idemkit-third
	[ "$status" -eq 0 ]
	[ "$output" = "idemkit-no-such-package idemkit-third" ]
}

@test "deps: not root, something missing: the exact apt-get line and exit 1, nothing installed" {
	command -v runuser >/dev/null || skip "runuser not installed"
	[ "$(id -u)" -eq 0 ] || skip "needs root to become another user"
	run runuser -u nobody -- sh "$IDEMKIT_SRC/mk/deps.sh" dpkg idemkit-no-such-package
	[ "$status" -eq 1 ]
	[[ "$output" == *"sudo apt-get install -y --no-install-recommends idemkit-no-such-package"* ]]
	[[ "$output" != *"installing"* ]]
}

@test "make demo and make test parse without any library (they install first)" {
	cd "$IDEMKIT_SRC"
	# (-n still runs the sub-make, which then meets the missing libraries:
	# what matters is that the install step came first.)
	# (as from a shell: not as a sub-make of the make that runs the tests)
	mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL PKG_CONFIG_PATH=/nonexistent \
		PKG_CONFIG_LIBDIR=/nonexistent make --no-print-directory "$@"; }
	run mk -n test
	[[ "${lines[0]}" == "sh mk/deps.sh "*" bats "* ]]
	run mk -n demo
	[[ "${lines[0]}" == "sh mk/deps.sh "*" libsqlite3-dev "* ]]
	run mk -n all
	[ "$status" -ne 0 ]
	[[ "$output" == *"missing libraries; install them with: apt-get install"* ]]
}

@test "-Werror in a checkout, not in a packager's tree without .git" {
	cd "$IDEMKIT_SRC"
	run env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -n -B build/obj/lib/core/err.o O=build
	[ "$status" -eq 0 ]
	[[ "$output" == *" -Werror "* ]]
	tree=$BATS_TEST_TMPDIR/tarball
	mkdir -p "$tree"
	cp -r Makefile lib cmd mk "$tree/"
	run env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -n -B -C "$tree" build/obj/lib/core/err.o O=build
	[ "$status" -eq 0 ]
	[[ "$output" == *" -Wall -Wextra "* ]]
	[[ "$output" != *"-Werror"* ]]
}
