#!/usr/bin/env bash
# gpu-deps.sh — prepares .deps/ (git-ignored) for device calls: the GPU machine's image has no
# Jansson, PCRE2, utf8proc or zlib headers and no cmocka, so the Debian packages are downloaded here and unpacked into
# .deps/root; scripts/gpu-verify.sh builds against them there. Carry ".deps" with the call.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
apt-get download libjansson4 libjansson-dev libcmocka0 libcmocka-dev libpcre2-8-0 libpcre2-dev zlib1g zlib1g-dev
# utf8proc's runtime package is libutf8proc3 from Debian 13 on, libutf8proc2 before: whichever apt knows
utf8proc=libutf8proc3
apt-cache show "$utf8proc" >/dev/null 2>&1 || utf8proc=libutf8proc2
apt-get download "$utf8proc" libutf8proc-dev
for d in ./*.deb; do dpkg -x "$d" root; done
echo "deepwell: .deps/root ready ($(du -sh root | cut -f1)); carry .deps in the device call"
