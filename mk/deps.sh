#!/bin/sh
# mk/deps.sh: installs what a make target needs on Debian, when it is
# missing, so `make demo` and `make test` each work on a fresh machine.
#
# usage: mk/deps.sh [--print] ENTRY ...
#   ENTRY is a Debian package name ("libpq-dev"), or CMD:PACKAGE
#   ("node:nodejs"): the package is wanted only when the command CMD is
#   not already on PATH (Node.js or Java may come from elsewhere).
#
# Nothing missing: silent, exit 0.  Missing, as root: one apt-get update and
# one apt-get install of exactly the missing packages.  Missing, not root:
# the exact apt-get line on stderr and exit 1 (we never call sudo).
# --print: only print the missing packages, one line, and exit 0.
set -u

print=
if [ "${1:-}" = --print ]; then print=1; shift; fi

missing=
for entry in "$@"; do
	case $entry in
	*:*)
		cmd=${entry%%:*} pkg=${entry#*:}
		command -v "$cmd" >/dev/null 2>&1 && continue
		;;
	*)
		pkg=$entry
		;;
	esac
	st=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) || st=
	case $st in
	*" installed") ;;
	*) case " $missing " in *" $pkg "*) ;; *) missing="$missing $pkg" ;; esac ;;
	esac
done
missing=${missing# }

if [ -n "$print" ]; then
	printf '%s\n' "$missing"
	exit 0
fi
[ -z "$missing" ] && exit 0

line="apt-get install -y --no-install-recommends $missing"
if [ "$(id -u)" -ne 0 ]; then
	echo "missing Debian packages; install them with:" >&2
	echo "  sudo apt-get update && sudo $line" >&2
	exit 1
fi
command -v apt-get >/dev/null 2>&1 || {
	echo "missing packages ($missing) and no apt-get here: install them by hand" >&2
	exit 1
}
echo "installing: $missing" >&2
export DEBIAN_FRONTEND=noninteractive
# Another apt-get (a target beside this one, an unattended upgrade) holds
# apt's lock for a while: wait for it, up to ten minutes, not fail at once.
lock='-o DPkg::Lock::Timeout=600'
# shellcheck disable=SC2086
apt-get $lock update -qq >&2 || exit 1
# shellcheck disable=SC2086
apt-get $lock install -y -qq --no-install-recommends $missing >&2 || exit 1
