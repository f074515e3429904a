#!/usr/bin/env bash
# attn_run.sh — one device call for the attention kernels (bench/RESULTS.md "Attention kernels vs
# torch SDPA"): builds the library, the attention op test and bench/attn_bench.cu on the GPU machine,
# runs the test with the default tiles and with DW_ATTN_TILES=1,1,1 and 2,2,2, times every tile
# configuration (and the "before" kernels of $OLD, an older attn_mma.cu, when given) at the GPT-2
# and llama-1b shapes, then torch SDPA at the same shapes. PROFILE=1: ncu on the default kernels at
# the GPT-2 shape. STEP=1: `deepwell bench step` for both models, also with the tree in $BEFORE (an
# older checkout, built there) when given. A summary is printed last.
# Usage (on the GPU machine, from the staged dir, .deps carried): OLD=old.cu BEFORE=old STEP=1 bash bench/attn_run.sh
set -u
dest=${OUT:-out}  # gets summary.txt and logs.tgz (the device tool brings back only a few files)
out=$(mktemp -d)
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b=build-gpu
sum="$out/summary.txt"
: >"$sum"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$sum"
s=$(date +%s)
cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" >"$out/configure.log" 2>&1 &&
  ninja -C $b -j "$(nproc)" gpu_test_ops_cuda_attn deepwell >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; cp "$out/build.log" "${OUT:-out}/"; exit 1; }
old=""
[ -n "${OLD:-}" ] && old="-DAM_OLD=\"$PWD/$OLD\""
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc $old \
  bench/attn_bench.cu -o $b/attn_bench >"$out/bench_build.log" 2>&1 || { tail -30 "$out/bench_build.log"; exit 1; }
echo "build $(( $(date +%s) - s )) s" | tee -a "$sum"
for tiles in default 1,1,1 2,2,2; do
  s=$(date +%s); log="$out/test_attn_${tiles//,/_}.log"
  if [ $tiles = default ]; then timeout 120 $b/tests/gpu_test_ops_cuda_attn >"$log" 2>&1
  else DW_ATTN_TILES=$tiles timeout 120 $b/tests/gpu_test_ops_cuda_attn >"$log" 2>&1; fi
  rc=$?
  echo "TEST gpu_test_ops_cuda_attn tiles=$tiles rc=$rc ($(( $(date +%s) - s )) s)" | tee -a "$sum"
  [ $rc -ne 0 ] && grep -E "MISMATCH|NOT DET|FAIL|error" "$log" | head -8 | tee -a "$sum"
done
$b/attn_bench 16 1024 12 12 64 1 ${ITERS:-30} >"$out/bench_gpt2.txt" 2>&1
$b/attn_bench 8 2048 32 8 64 0 ${ITERS:-30} >"$out/bench_llama.txt" 2>&1
cat "$out/bench_gpt2.txt" "$out/bench_llama.txt" >>"$sum"
timeout 120 python3 bench/attn_anchor.py --b 16 --t 1024 --h 12 --d 64 >"$out/anchor_gpt2.json" 2>"$out/anchor_gpt2.err"
timeout 120 python3 bench/attn_anchor.py --b 8 --t 2048 --h 32 --hkv 8 --d 64 >"$out/anchor_llama.json" 2>"$out/anchor_llama.err"
cat "$out/anchor_gpt2.json" "$out/anchor_llama.json" >>"$sum"
if [ "${PROFILE:-0}" = 1 ]; then  # ncu, one launch of each default kernel at the GPT-2 shape
  secs="--section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
  timeout 200 ncu --clock-control none --kernel-name regex:am_ $secs --page raw $b/attn_bench 16 1024 12 12 64 1 1 profile >"$out/ncu_gpt2_raw.txt" 2>&1
  echo "NCU raw rc=$?" | tee -a "$sum"
  grep -E "am_.*kernel|issue_stalled_[a-z_]*_per_issue_active.ratio|pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active|smsp__inst_executed.sum " \
    "$out/ncu_gpt2_raw.txt" | sed 's/(.*//' | awk '$NF+0 >= 0.1 || /kernel/' >>"$sum"
fi
if [ "${STEP:-0}" = 1 ]; then
  if [ -n "${BEFORE:-}" ]; then
    s=$(date +%s)
    cmake -S "$BEFORE" -B "$BEFORE/$b" -G Ninja -DDW_CUDA=ON -DDW_TESTS=OFF -DCMAKE_PREFIX_PATH="$deps" >"$out/configure_before.log" 2>&1 &&
      ninja -C "$BEFORE/$b" -j "$(nproc)" deepwell >"$out/build_before.log" 2>&1
    echo "build before rc=$? $(( $(date +%s) - s )) s" | tee -a "$sum"
  fi
  for who in after before; do
    bin=$b/deepwell
    [ $who = before ] && { [ -n "${BEFORE:-}" ] || continue; bin=$BEFORE/$b/deepwell; }
    $bin bench step llama-1b --batch 8 --seq 2048 --steps 10 --profile >"$out/step_llama_$who.txt" 2>&1
    echo "STEP llama-1b ($who) rc=$?" >>"$sum"; head -3 "$out/step_llama_$who.txt" >>"$sum"
    grep -iE "^  att" "$out/step_llama_$who.txt" | head -2 >>"$sum"
    $bin bench step gpt2-124m --vocab 50304 --batch 16 --seq 1024 --steps 20 --profile >"$out/step_gpt2_$who.txt" 2>&1
    echo "STEP gpt2-124m ($who) rc=$?" >>"$sum"; head -3 "$out/step_gpt2_$who.txt" >>"$sum"
    grep -iE "^  att" "$out/step_gpt2_$who.txt" | head -2 >>"$sum"
  done
fi
mkdir -p "$dest" && cp "$sum" "$dest/summary.txt" && tar czf "$dest/logs.tgz" -C "$out" .
echo "==== summary"
cat "$sum"
