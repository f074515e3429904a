#!/usr/bin/env bash
# fresh-debian-check.sh — proves the README's two commands work on a fresh Debian machine: makes a
# minimal Debian 12 (bookworm) root with debootstrap (--variant=minbase: no compiler, no cmake, no
# python), puts a clean `git clone` of this repository at HEAD into it (committed files only, not
# the working tree), and runs, as root inside a chroot, `./scripts/run.sh` then `./scripts/test.sh`.
# Each command's output goes to a log beside the root; a summary prints each exit status and wall
# time. Exits non-zero if either command (or the setup) fails.
# Needs: root, a Debian/Ubuntu host (apt-get installs debootstrap if missing), network to the mirror,
# about 6 GB free. Takes on a 2-core machine about 2-3 min (debootstrap) + several minutes (run.sh:
# packages, build, training) + 10-20+ min (test.sh: packages incl. torch, two builds, all tests,
# fuzzing).
# Usage: scripts/fresh-debian-check.sh [DIR]   (DIR: where the root goes; default a new temp dir)
# Env: DW_DEBIAN_MIRROR (default http://deb.debian.org/debian), DW_DEBIAN_SUITE (default bookworm).
# The root is kept afterwards (delete it with `rm -rf DIR` once this script has exited: its mounts
# are gone by then).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${DW_DEBIAN_SUITE:-bookworm}
mirror=${DW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || { echo "fresh-debian-check: must run as root (debootstrap, chroot, mount)" >&2; exit 1; }
root=${1:-$(mktemp -d /tmp/dw-fresh-debian.XXXXXX)}
mkdir -p "$root"
root=$(cd "$root" && pwd)
logs=$root.logs
mkdir -p "$logs"
echo "fresh-debian-check: root $root, logs $logs"

if ! command -v debootstrap >/dev/null; then
  echo "== installing debootstrap on the host =="
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

elapsed() { echo $(($(date +%s) - $1)); }

if [ -x "$root/usr/bin/apt-get" ]; then
  echo "== $root already holds a Debian root: skipping debootstrap =="
else
  echo "== debootstrap --variant=minbase $suite $root $mirror (log $logs/debootstrap.log) =="
  t0=$(date +%s)
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$logs/debootstrap.log" 2>&1 ||
    { tail -n 30 "$logs/debootstrap.log"; echo "fresh-debian-check: debootstrap failed" >&2; exit 1; }
  echo "debootstrap ok in $(elapsed "$t0") s"
fi

# a clean clone of HEAD (what a user would get), not the working tree with its uncommitted edits
src=/root/deepwell
rm -rf "${root:?}$src"
git clone --quiet --no-hardlinks "$repo" "$root$src"
echo "cloned $(git -C "$root$src" rev-parse --short HEAD) into $root$src"

cp /etc/resolv.conf "$root/etc/resolv.conf" # apt-get inside needs name resolution
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" # packages must not start services
chmod +x "$root/usr/sbin/policy-rc.d"

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" ||
      echo "fresh-debian-check: could not unmount ${mounted[i]}" >&2
  done
}
trap cleanup EXIT
for m in /proc /sys /dev /dev/pts; do
  mkdir -p "$root$m"
  mount --bind "$m" "$root$m"
  mounted+=("$root$m")
done

# runs "$@" inside the chroot from the clone with a clean environment; logs to $logs/NAME.log
declare -A status seconds
run_inside() {
  local name=$1 t0 rc
  shift
  echo "== chroot: $* (log $logs/$name.log) =="
  t0=$(date +%s)
  set +e
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c 'cd "$0" && exec "$@"' "$src" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  set -e
  status[$name]=$rc
  seconds[$name]=$(elapsed "$t0")
  echo "$name: exit $rc in ${seconds[$name]} s; last lines:"
  tail -n 15 "$logs/$name.log" | sed 's/^/  | /'
}
run_inside run ./scripts/run.sh
run_inside test ./scripts/test.sh

echo "== summary (Debian $suite minbase root $root, clone at $(git -C "$root$src" rev-parse --short HEAD)) =="
fail=0
for name in run test; do
  printf '%-5s exit %-3s wall %5s s   log %s\n' "$name" "${status[$name]}" "${seconds[$name]}" "$logs/$name.log"
  [ "${status[$name]}" -eq 0 ] || fail=1
done
exit $fail
