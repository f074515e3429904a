#!/usr/bin/env bash
# run.sh — builds the CUDA op kernels (src/kernels/cuda/ops_*.cu, decode_attn*.cu) and the GPU op tests
# (tests/gpu/test_ops_cuda*.c) for the host CUDA emulator in this folder, with ASan + UBSan, and
# runs the tests: a check of indexing, barriers, shuffles and shared-memory bounds on a machine
# without a GPU. Not a substitute for running on the GPU (libm instead of CUDA math, no timing,
# no concurrency). Needs a CPU build of the library (default build/: cmake -DDW_CUDA=OFF).
# Usage: tests/common/cuda_emu/run.sh [CPU_BUILD_DIR]   (DW_EMU_NOSAN=1: no sanitizers, faster;
# DW_EMU_TESTS='test_ops_cuda_attn*': only those tests (a path relative to tests/gpu, e.g.
# ../unit/test_decode_attn, runs a unit test's emulated part); DW_EMU_MMA=1: attn_mma.cu's tensor-core
# kernels too, their PTX primitives emulated by kernels/cuda/attn_mma_ptx.cuh here: slow)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
emu=$root/tests/common/cuda_emu
out=$(mktemp -d "${TMPDIR:-/tmp}/dwemu.XXXXXX")
trap 'rm -rf "$out"' EXIT
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
[ "${DW_EMU_NOSAN:-0}" = 1 ] && san="-O2"  # faster, without ASan/UBSan
inc="-I$emu -I$out/inc -I$root/src -I$root/include -I$root/tests/common"
mkdir -p "$out/inc/kernels/cuda"
for h in "$root"/src/kernels/cuda/*.cuh; do
  python3 "$emu/preprocess.py" "$h" "$out/inc/kernels/cuda/$(basename "$h")"
done
objs=()
for cu in "$root"/src/kernels/cuda/ops_*.cu "$root"/src/kernels/cuda/decode_attn*.cu; do
  name=$(basename "$cu" .cu)
  python3 "$emu/preprocess.py" "$cu" "$out/$name.cpp"
  g++ -std=c++17 -O1 -g $san -Wall -Wno-unused-function -Wno-unknown-pragmas $inc -c "$out/$name.cpp" -o "$out/$name.o"
  objs+=("$out/$name.o")
done
g++ -std=c++17 -O1 -g $san -Wall $inc -c "$emu/emu.cpp" -o "$out/emu.o"
# attn_mma.cu is inline PTX: a stub makes its tensor-core path ineligible (reference kernels run),
# or with DW_EMU_MMA=1 the kernels run on this folder's stand-ins for the PTX primitives
if [ "${DW_EMU_MMA:-0}" = 1 ]; then
  python3 "$emu/preprocess.py" "$root/src/kernels/cuda/attn_mma.cu" "$out/attn_mma.cpp"
  g++ -std=c++17 -O2 -fno-strict-aliasing -g $san -Wall -Wno-unused-function -Wno-unknown-pragmas $inc -c "$out/attn_mma.cpp" -o "$out/attn_mma.o"
  objs+=("$out/attn_mma.o")
else
  g++ -std=c++17 -O1 -g $san -Wall $inc -I"$root/src" -c "$emu/attn_stub.cpp" -o "$out/attn_stub.o"
  objs+=("$out/attn_stub.o")
fi
# moe_gemm_tc.cu likewise (mma.sync): the stand-in fails; the MoE test runs BF16 on the FMA tiles here
g++ -std=c++17 -O1 -g $san -Wall $inc -c "$emu/moe_gemm_stub.cpp" -o "$out/moe_gemm_stub.o"
objs+=("$out/moe_gemm_stub.o")
gcc -std=c11 -O1 -g $san -D_GNU_SOURCE $inc -c "$root/tests/common/testutil.c" -o "$out/testutil.o"
# a library built with MPI (CPU ranks) needs MPI at the link, as the build's own tests get it
mpi_link=()
if nm "$build/libdeepwell.a" 2>/dev/null | grep " U MPI_" >/dev/null; then  # not -q: pipefail and SIGPIPE
  read -r -a mpi_link <<<"$(mpicc --showme:link 2>/dev/null || pkg-config --libs ompi-c 2>/dev/null || echo -lmpi)"
fi
rc=0
for t in "$root"/tests/gpu/${DW_EMU_TESTS:-test_ops_cuda*}.c; do
  name=$(basename "$t" .c)
  gcc -std=c11 -O1 -g $san -fopenmp -D_GNU_SOURCE -DDW_CUDA_EMU=1 -Wall $inc -c "$t" -o "$out/$name.o"
  g++ $san -fopenmp -o "$out/$name" "$out/$name.o" "${objs[@]}" "$out/emu.o" "$out/testutil.o" \
      "$build/libdeepwell.a" "${mpi_link[@]}" -lcmocka -ljansson -lpcre2-8 -lutf8proc -lz -lm
  echo "== $name (emulated GPU)"
  ASAN_OPTIONS=detect_stack_use_after_return=0 "$out/$name" || rc=1
done
exit $rc
