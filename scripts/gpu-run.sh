#!/usr/bin/env bash
# gpu-run.sh — what one device call runs on the GPU machine, over a build made on the CPU
# machine (carried as build/ plus .deps/ with the cmocka runtime the GPU image lacks):
# the probe, every unit/GPU/CLI test binary, then any benchmarks named in $DW_BENCH.
# Logs go to $OUT (or out/); a summary table is printed last.
# Usage: scripts/gpu-run.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
deps=${DW_DEPS:-$PWD/.deps}
export LD_LIBRARY_PATH="$deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export DW_TEST_DATA="$PWD/tests/data" DW_SOURCE_DIR="$PWD"
summary=()
record() { summary+=("$(printf '%-40s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv >"$out/nvidia-smi.txt" 2>&1
"$build/deepwell" probe >"$out/probe.txt" 2>&1; record "deepwell probe" "rc=$?"
"$build/deepwell" probe --json >"$out/probe.json" 2>>"$out/probe.txt"; record "deepwell probe --json" "rc=$?"
cat "$out/probe.txt"

for t in "$build"/tests/test_* "$build"/tests/gpu_test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  timeout 900 "$t" >"$out/$name.log" 2>&1
  rc=$?
  record "$name" "rc=$rc $(grep -cE '^\[  FAILED  \]' "$out/$name.log" | sed 's/$/ failed-lines/')"
  [ $rc -ne 0 ] && tail -30 "$out/$name.log"
done
for t in tests/cli/test_*.sh; do
  name=$(basename "$t" .sh)
  bash "$t" "$build/deepwell" >"$out/cli_$name.log" 2>&1
  record "cli_$name" "rc=$?"
done
for b in ${DW_BENCH:-}; do
  "$build/deepwell" bench $b --json >"$out/bench_$b.json" 2>"$out/bench_$b.log"
  record "bench $b" "rc=$?"
  tail -40 "$out/bench_$b.log"
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
