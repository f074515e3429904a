#!/usr/bin/env bash
# deps.sh — installs the Debian packages Deepwell needs to build and test, if any are missing.
# Usage: scripts/deps.sh [build|test]   (test adds the test-only packages)
set -euo pipefail
what=${1:-build}
pkgs=(build-essential cmake ninja-build libjansson-dev libpcre2-dev libutf8proc-dev zlib1g-dev python3 libopenmpi-dev openmpi-bin)
pkgs+=(python3-pip python3-numpy) # `pip install ./python` (the deepwell package) and its one dependency
if [ "$what" = test ]; then
  # libclang-rt-dev: the sanitizer and fuzzer runtimes clang links (not pulled in without recommends)
  pkgs+=(libcmocka-dev clang libclang-rt-dev python3-numpy python3-torch pkgconf)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deepwell: installing missing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
