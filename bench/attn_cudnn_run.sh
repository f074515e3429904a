#!/usr/bin/env bash
# attn_cudnn_run.sh — one device call for attention through cuDNN (bench/RESULTS.md "Attention
# through cuDNN"): builds the library and the attention tests on the GPU machine, reports the cuDNN
# there, runs tests/gpu/test_attn_cudnn.c (cuDNN vs the CPU reference, with cuDNN's error log on
# failure), the mma attention test and the GPU-vs-CPU training test with DW_ATTN=cudnn, times the
# ops entries with DW_ATTN=cudnn and mma at the GPT-2 (B16 T1024 H12 D64, packed qkv) and llama-1b
# (B8 T2048 H32 Hkv8 D64) shapes, torch SDPA at the same shapes (bench/attn_anchor.py), and with
# STEP=1 `deepwell bench step` for llama-1b and GPT-2 with each DW_ATTN. A summary is printed last.
# ALL=1: build everything, run every GPU test (with DW_ATTN=$ALL_ATTN when set) and the BF16-vs-CPU
# training test for seeds $SEEDS (default "1 2 3"; empty: none) with each DW_ATTN of $PATHS (default
# cudnn mma). BENCH=0: no timing of the ops. DIRECT=1: also the direct-dQ backward graph
# (DW_ATTN_CUDNN_DQ=direct: test and timing).
# CUDNN_INC=dir: cuDNN headers to build against when the machine has none (the library is dlopen'ed).
# Usage (on the GPU machine, from the staged dir, .deps carried): STEP=1 bash bench/attn_cudnn_run.sh
set -u
dest=${OUT:-out}
out=$(mktemp -d)
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b=build-gpu
mkdir -p "$dest"
sum="$dest/summary.txt"  # written as it goes: a call that runs out of time still brings it back
: >"$sum"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$sum"
{ echo "cudnn libs: $(ldconfig -p | grep -o 'libcudnn\.so\.[0-9]*[^ ]*' | sort -u | tr '\n' ' ')";
  ls /usr/local/cuda/lib64/libcudnn.so* /usr/lib/x86_64-linux-gnu/libcudnn.so* 2>/dev/null | tr '\n' ' '; echo;
  echo "cudnn headers: $(ls /usr/local/cuda/include/cudnn_graph.h /usr/include/cudnn_graph.h /usr/include/x86_64-linux-gnu/cudnn_graph*.h 2>/dev/null | tr '\n' ' ')"; } | tee -a "$sum"
inc=""
if ! ls /usr/local/cuda/include/cudnn_graph.h /usr/include/cudnn_graph.h >/dev/null 2>&1 && [ -n "${CUDNN_INC:-}" ]; then
  inc="-DDW_CUDNN_INCLUDE_DIR=$PWD/$CUDNN_INC"
  echo "building against the carried cuDNN headers $CUDNN_INC" | tee -a "$sum"
fi
s=$(date +%s)
targets="gpu_test_attn_cudnn gpu_test_ops_cuda_attn gpu_test_train_cuda deepwell"
[ "${ALL:-0}" = 1 ] && targets=""  # everything: every GPU test runs below
cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" $inc >"$out/configure.log" 2>&1 &&
  ninja -C $b -j "$(nproc)" $targets >"$out/build.log" 2>&1 ||
  { tail -30 "$out/configure.log" "$out/build.log"; cp "$out"/*.log "$dest/"; exit 1; }
grep -i cudnn "$out/configure.log" | tee -a "$sum"
echo "build $(( $(date +%s) - s )) s" | tee -a "$sum"

t=$b/tests/gpu_test_attn_cudnn
run_test() { # name env... -- cmd
  local name=$1; shift; local s=$(date +%s) log="$out/test_$name.log"
  env "$@" >"$log" 2>&1; local rc=$?
  echo "TEST $name rc=$rc ($(( $(date +%s) - s )) s)" | tee -a "$sum"
  grep -E "^cuDNN|worst|plans|bit-identical" "$log" | head -12 | tee -a "$sum"
  [ $rc -ne 0 ] && grep -E "MISMATCH|FAIL|error|unavailable|plan" "$log" | head -12 | tee -a "$sum"
  return 0
}
if [ "${ALL:-0}" != 1 ]; then
  run_test cudnn CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr timeout 150 $t
  run_test ops_attn_mma timeout 120 $b/tests/gpu_test_ops_cuda_attn
  run_test train_cudnn DW_ATTN=cudnn timeout 150 $b/tests/gpu_test_train_cuda
fi
[ "${DIRECT:-0}" = 1 ] && run_test cudnn_direct_dq DW_ATTN_CUDNN_DQ=direct timeout 150 $t

if [ "${ALL:-0}" = 1 ]; then  # every GPU test on the default path, then the BF16-vs-CPU training test over seeds
  for tt in $b/tests/gpu_test_*; do run_test "${ALL_ATTN:-default}_$(basename $tt)" ${ALL_ATTN:+DW_ATTN=$ALL_ATTN} timeout 100 $tt; done
  for seed in ${SEEDS-1 2 3}; do
    for path in ${PATHS:-cudnn mma}; do
      DW_TEST_SEED=$seed DW_ATTN=$path timeout 60 $b/tests/gpu_test_train_cuda >"$out/train_${path}_$seed.log" 2>&1
      echo "TRAIN seed=$seed DW_ATTN=$path rc=$? $(grep -o '(a) loss.*' "$out/train_${path}_$seed.log")" | tee -a "$sum"
    done
  done
fi
[ "${BENCH:-1}" = 1 ] && for shape in 16,1024,12,12,64,1 8,2048,32,8,64,0; do
  for path in cudnn mma; do
    DW_ATTN=$path DW_ATTN_BENCH=$shape,${ITERS:-20} timeout 60 $t 2>>"$out/bench.err" | grep BENCH | tee -a "$sum"
  done
  [ "${DIRECT:-0}" = 1 ] && DW_ATTN=cudnn DW_ATTN_CUDNN_DQ=direct DW_ATTN_BENCH=$shape,${ITERS:-20} timeout 60 $t 2>>"$out/bench.err" |
    grep BENCH | sed 's/path=cudnn/path=cudnn-direct-dq/' | tee -a "$sum"
done
if [ "${BENCH:-1}" = 1 ]; then
  timeout 100 python3 bench/attn_anchor.py --b 16 --t 1024 --h 12 --d 64 2>"$out/anchor_gpt2.err" | tee -a "$sum"
  timeout 100 python3 bench/attn_anchor.py --b 8 --t 2048 --h 32 --hkv 8 --d 64 2>"$out/anchor_llama.err" | tee -a "$sum"
fi

if [ "${STEP:-0}" = 1 ]; then
  for path in mma cudnn; do
    DW_ATTN=$path timeout 100 $b/deepwell bench step llama-1b --batch 8 --seq 2048 --steps 10 --profile >"$out/step_llama_$path.txt" 2>&1
    echo "STEP llama-1b DW_ATTN=$path rc=$?" >>"$sum"; head -3 "$out/step_llama_$path.txt" >>"$sum"
    grep -iE "^  att|cuDNN|warn" "$out/step_llama_$path.txt" | head -4 >>"$sum"
    DW_ATTN=$path timeout 100 $b/deepwell bench step gpt2-124m --vocab 50304 --batch 16 --seq 1024 --steps 20 --profile >"$out/step_gpt2_$path.txt" 2>&1
    echo "STEP gpt2-124m DW_ATTN=$path rc=$?" >>"$sum"; head -3 "$out/step_gpt2_$path.txt" >>"$sum"
    grep -iE "^  att|cuDNN|warn" "$out/step_gpt2_$path.txt" | head -4 >>"$sum"
  done
fi
tar czf "$dest/logs.tgz" -C "$out" .
echo "==== summary"
cat "$sum"
