#!/usr/bin/env bash
# run_counts.sh — the counting pass (src/precision/quant_counts.cu, with the quantisers' shared
# device definitions of quant_counts.cuh) on the host CUDA emulator (tests/common/cuda_emu), with
# ASan + UBSan: tests/gpu/test_quant_counts_cuda.c's comparison with the CPU's counts on the CPU
# reference's codes, every recipe (its GPU quantiser cases need a GPU: stubbed here, never called
# under DW_CUDA_EMU). The quantisers' own counting runs in run.sh (bulk kernels) and on a GPU.
# Needs a CPU build (default build/). Usage: run_counts.sh [CPU_BUILD_DIR]  (DW_TEST_SEED replays)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
emu=$root/tests/common/cuda_emu
out=$(mktemp -d "${TMPDIR:-/tmp}/dwqcemu.XXXXXX")
trap 'rm -rf "$out"' EXIT
inc="-I$emu -I$out/inc -I$root/src -I$root/include -I$root/tests/common"
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
mkdir -p "$out/inc/precision"
python3 "$emu/preprocess.py" "$root/src/precision/quant_counts.cuh" "$out/inc/precision/quant_counts.cuh"
python3 "$emu/preprocess.py" "$root/src/precision/quant_counts.cu" "$out/quant_counts.cpp"
g++ -std=c++17 -O1 -g $san -Wall -Wno-unknown-pragmas $inc -c "$out/quant_counts.cpp" -o "$out/qc.o"
g++ -std=c++17 -O1 -g $san -Wall $inc -c "$emu/emu.cpp" -o "$out/emu.o"
cat >"$out/stub.c" <<'C'
#include "kernels/cuda/quant.h"
/* the GPU quantiser: referenced by the test's GPU-only cases, never called on the emulator */
size_t dw_quantize_cuda_workspace_bytes(dw_recipe r, int64_t rows, int64_t cols) { (void)r, (void)rows, (void)cols; return 0; }
dw_status dw_quantize_cuda_set_tuning(dw_ctx *ctx, const dw_quant_tuning *t) { (void)ctx, (void)t; return DW_ERR_UNSUPPORTED; }
dw_status dw_quantize_cuda(dw_ctx *ctx, const dw_quant_opts *o, dw_quant_in in, const void *x, int64_t rows, int64_t cols,
                           const dw_quant_dev_out *out, const dw_quant_dev_out *out_t, void *ws, void *stream) {
    (void)ctx, (void)o, (void)in, (void)x, (void)rows, (void)cols, (void)out, (void)out_t, (void)ws, (void)stream;
    return DW_ERR_UNSUPPORTED;
}
C
gcc -std=c11 -O1 -g $san -D_GNU_SOURCE $inc -c "$out/stub.c" -o "$out/stub.o"
gcc -std=c11 -O1 -g $san -D_GNU_SOURCE $inc -c "$root/tests/common/testutil.c" -o "$out/testutil.o"
gcc -std=c11 -O1 -g $san -fopenmp -D_GNU_SOURCE -DDW_CUDA_EMU=1 -Wall $inc -c "$root/tests/gpu/test_quant_counts_cuda.c" \
    -o "$out/test.o"
g++ $san -fopenmp -o "$out/test" "$out/test.o" "$out/qc.o" "$out/stub.o" "$out/emu.o" "$out/testutil.o" \
    "$build/libdeepwell.a" -lcmocka -ljansson -lpcre2-8 -lutf8proc -lm
ASAN_OPTIONS=detect_stack_use_after_return=0 "$out/test"
