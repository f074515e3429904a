#!/usr/bin/env bash
# build.sh — configures and builds Deepwell into BUILD_DIR (default build/).
# CUDA is used when nvcc is found (also under /usr/local/cuda); otherwise a CPU-only build.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
grep -E "deepwell:" "$dir.configure.log" || true
cmake --build "$dir"
