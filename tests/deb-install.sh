#!/bin/sh
# tests/deb-install.sh DEB BANK_SIM: installs the package on a clean Debian
# 12 root and runs the demo there, as the idemkit user, with cron's PATH.
#
# The clean root is made once by `debootstrap --variant=minbase bookworm`
# into $IDEMKIT_DEB_ROOT (kept as a pristine copy) and copied for each run,
# so every run starts from a root that never saw the package.  apt-get in
# the copy fetches the package's dependencies from Debian's archive, as an
# operator's install does.  bank-sim (the test double, never packaged) and
# its library are put in /usr/local by this script, for the demo only.
# Needs root (chroot).  Exit 0 when every check holds.
set -eu

deb=$1 sim=$2
pristine=${IDEMKIT_DEB_ROOT:?set IDEMKIT_DEB_ROOT to a directory for the clean root}
work=$pristine.run
say() { echo "deb-install: $*"; }
fail() { echo "deb-install: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (chroot)"
if [ ! -x "$pristine/bin/sh" ]; then
	command -v debootstrap >/dev/null || fail "debootstrap not installed (apt-get install debootstrap)"
	say "debootstrap --variant=minbase bookworm $pristine"
	rm -rf "$pristine"; mkdir -p "$(dirname "$pristine")"
	debootstrap --variant=minbase bookworm "$pristine" > "$pristine.log" 2>&1 \
		|| { tail -20 "$pristine.log" >&2; fail "debootstrap"; }
fi
rm -rf "$work"
cp -a "$pristine" "$work"
# What apt downloads is kept beside the pristine root and put in each
# copy's archive directory: apt still resolves, checks (by the index's
# hashes: a file that does not match is fetched again) and installs every
# package, only the download is saved on the next run.
cache=$pristine.apt-archives
mkdir -p "$cache"
find "$cache" -maxdepth 1 -name '*.deb' -exec cp -t "$work/var/cache/apt/archives/" {} +
keep_debs() { find "$work/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec cp -u -t "$cache" {} +; }
trap 'umount "$work/proc" 2>/dev/null || true' EXIT
mount -t proc proc "$work/proc"
cp /etc/resolv.conf "$work/etc/resolv.conf"
inroot() { chroot "$work" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }

! inroot sh -c 'command -v charge-worker' >/dev/null || fail "the clean root already has charge-worker"
cp "$deb" "$work/tmp/idemkit.deb"
say "apt-get install ./idemkit.deb"
inroot apt-get update -qq
inroot apt-get install -y -qq --no-install-recommends /tmp/idemkit.deb > "$work.apt.log" 2>&1 \
	|| { tail -20 "$work.apt.log" >&2; fail "apt-get install"; }

# What the package put in place.
inroot getent passwd idemkit | grep -q '^idemkit:x:[0-9]*:[0-9]*:.*:/var/lib/idemkit:/usr/sbin/nologin$' \
	|| fail "no idemkit system user"
# shellcheck disable=SC2016 # dpkg-query's own ${field}, not the shell's
inroot dpkg-query -W -f='${Conffiles}\n' idemkit | grep -q '^ /etc/idemkit/idemkit.env ' \
	|| fail "/etc/idemkit/idemkit.env is not a conffile"
grep -qx 'ExecStart=/usr/bin/charge-worker -j 4' "$work/lib/systemd/system/idemkit-worker.service" \
	|| fail "the worker unit does not run /usr/bin/charge-worker"
grep -qx 'SuccessExitStatus=143' "$work/lib/systemd/system/idemkit-worker.service" \
	|| fail "the worker unit counts a stop as failed"
[ -f "$work/usr/share/man/man7/idemkit.7.gz" ] || fail "no idemkit(7)"
[ ! -e "$work/usr/share/man/man1/bank-sim.1.gz" ] || fail "bank-sim(1) installed"
[ "$(inroot stat -c %U:%a /var/lib/idemkit)" = idemkit:700 ] \
	|| fail "/var/lib/idemkit is not idemkit's, mode 700"
inroot charge-worker --version | grep -q '^charge-worker (idemkit) ' || fail "charge-worker --version"

# The demo, with the installed commands only (IDEMKIT_BIN=/usr/bin) and
# cron's PATH; bank-sim is the one command from outside the package.
say "the demo as the idemkit user"
inroot apt-get install -y -qq --no-install-recommends curl libmicrohttpd12 > "$work.apt2.log" 2>&1 \
	|| { tail -20 "$work.apt2.log" >&2; fail "apt-get install curl libmicrohttpd12"; }
keep_debs
install -m 755 "$sim" "$work/usr/local/bin/bank-sim"
install -m 755 "$(dirname "$0")/../examples/demo.sh" "$work/tmp/demo.sh"
ids=$(inroot id -u idemkit):$(inroot id -g idemkit)
chroot --userspec="$ids" "$work" env -i HOME=/var/lib/idemkit PATH=/usr/local/bin:/usr/bin:/bin \
	IDEMKIT_BIN=/usr/bin IDEMKIT_DEMO_DIR=/var/lib/idemkit/demo sh /tmp/demo.sh > "$work.demo.log" 2>&1 \
	|| { tail -20 "$work.demo.log" >&2; fail "the demo"; }
tail -1 "$work.demo.log"
grep -q '^demo: OK: every one of the 20 chargeIds was debited exactly once' "$work.demo.log" || fail "demo: no OK line"

# Removed, the conffile stays until purge; the commands go.
inroot apt-get remove -y -qq idemkit > /dev/null 2>&1 || fail "apt-get remove"
[ ! -e "$work/usr/bin/charge-worker" ] || fail "charge-worker left after remove"
[ -f "$work/etc/idemkit/idemkit.env" ] || fail "the env file went with remove (it is a conffile)"
# Purged, the state directory the demo filled stays, and the purge says why
# (debian/idemkit.postrm; an empty one goes).
inroot apt-get purge -y -qq idemkit > "$work.purge.log" 2>&1 || fail "apt-get purge"
[ -d "$work/var/lib/idemkit" ] || fail "purge deleted the state directory with its records"
grep -q '^idemkit: /var/lib/idemkit is kept: it holds the embedded store of record' "$work.purge.log" \
	|| fail "purge kept /var/lib/idemkit without saying why"
say "OK"
