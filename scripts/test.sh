#!/usr/bin/env bash
# test.sh — installs what is missing, builds, and runs every CPU test: first the normal build
# (CUDA code compiled when nvcc exists, GPU tests not run), then once more under ASan + UBSan.
# GPU tests: on a machine with a GPU, `cmake --build build --target test-gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
jobs=$(nproc)

echo "== build (release, CUDA if available) =="
scripts/build.sh build
echo "== tests =="
(cd build && ctest -LE gpu --output-on-failure -j "$jobs")

echo "== build (AddressSanitizer + UndefinedBehaviorSanitizer, CPU only) =="
scripts/build.sh build-asan -DDW_SANITIZE=ON -DDW_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
echo "== tests under ASan + UBSan =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest -LE gpu --output-on-failure -j "$jobs")
