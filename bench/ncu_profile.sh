#!/usr/bin/env bash
# ncu_profile.sh — on the GPU machine: Nsight Compute profiles of the kernels behind issues 3 and 4,
# to see what limits each (tensor pipe, shared memory, L2, DRAM, issue): Deepwell's FP8 block GEMM
# variants, cuBLASLt's block-scaled and tensorwise FP8 paths at 8192^3 (same process as bench gemm),
# and the transposing quantiser. Clocks are left alone (--clock-control none).
# Builds into build-gpu first unless NOBUILD=1. Usage: [KERNELS="..."] bash bench/ncu_profile.sh [gemm] [quant]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
b=build-gpu
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [ "${NOBUILD:-0}" != 1 ]; then
  s=$(date +%s)
  cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" >"$out/configure.log" 2>&1 &&
    ninja -C $b -j "$(nproc)" deepwell >"$out/build.log" 2>&1 || { tail -40 "$out/configure.log" "$out/build.log"; exit 1; }
  echo "build $(( $(date +%s) - s )) s"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
metrics="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_bytes.sum,dram__bytes.sum,sm__cycles_elapsed.avg.per_second"
ncu_run() { # NAME KERNEL_REGEX SKIP COUNT CMD...
  local name=$1 re=$2 skip=$3 count=$4; shift 4
  echo "=== $name: $*" >>"$out/ncu_$group.txt"
  timeout 180 ncu --clock-control none -k "regex:$re" --launch-skip "$skip" --launch-count "$count" $sections $metrics "$@" \
    >>"$out/ncu_$group.txt" 2>&1
  echo "== ncu $name rc=$?"
}
for group in ${*:-gemm quant}; do
    case $group in
    gemm)
      : >"$out/ncu_gemm.txt"
      bq="$b/deepwell bench gemm --shapes square --iters 1"
      for k in ${KERNELS:-deepwell_fp8block_sm90_3wg deepwell_fp8block_sm90}; do
        ncu_run "$k" fp8block_kernel 3 1 $bq --recipes fp8_block --backend "$k"
      done
      # any kernel: cuBLASLt's block path also runs Deepwell's scale-layout kernels (3 per call)
      ncu_run cublaslt_fp8_block . 9 3 $bq --recipes fp8_block --backend cublaslt_fp8_sm90
      ncu_run cublaslt_fp8_tensor . 6 2 $bq --recipes fp8_tensor --backend cublaslt_fp8_sm90
      ncu_run cublaslt_bf16 . 3 1 $bq --recipes bf16
      grep -E "^=== |^  [a-z_]+.*(kernel|Kernel)|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|gmma_cycles_active|wavefronts_mem_shared|lts__t_bytes|Executed Ipc A|Issue Slots Busy|No Eligible|Registers Per|Grid Size|Block Size|Dynamic Shared|SM Frequency|Cluster" \
        "$out/ncu_gemm.txt" | cut -c1-150
      ;;
    quant)
      : >"$out/ncu_quant.txt"
      bq="$b/deepwell bench quant --iters 1 --batch 1"
      # bench quant: 5 warm-up calls + 1 timed per variant; mxfp8 + T, then fp8_block + T
      ncu_run quant_mxfp8_T quant_bulk_kernel 5 1 $bq
      ncu_run quant_fp8_block_T quant_bulk_kernel 11 1 $bq
      grep -E "^=== |^  [a-z_]+.*(kernel|Kernel)|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Registers Per|Achieved Active Warps|Theoretical Occupancy|Stall" \
        "$out/ncu_quant.txt" | cut -c1-150
      ;;
    *) echo "unknown group $group (gemm, quant)"; exit 2 ;;
    esac
done
