#!/usr/bin/env bash
# run.sh — runs the bulk-copy quantisation kernels (src/kernels/cuda/quant_bulk.cu) on the host
# CUDA emulator (tests/common/cuda_emu, copied and given a yielding scheduler so that the producer
# and consumer warps can wait on each other) against the CPU reference, with ASan + UBSan. Checks
# tile/lane indexing, ring and barrier logic without a GPU; the PTX itself and the speed need
# tests/gpu/test_quant.c and `deepwell bench quant` on a GPU. Needs a CPU build (default build/).
# Usage: tests/gpu/test_quant_emu/run.sh [CPU_BUILD_DIR]    (DW_TEST_SEED=<seed> replays a run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/dwqemu.XXXXXX")
trap 'rm -rf "$out"' EXIT
cp -r "$root/tests/common/cuda_emu" "$out/emu"
python3 - "$out/emu/emu.cpp" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
# a thread may yield (stay runnable); while any thread can run, a partial warp exchange just waits
old = '''            if (at_warp != 32 || lanes != 32) divergence("warp shuffle without all 32 lanes");'''
new = '''            if (at_warp != 32 || lanes != 32) {
                if (running) continue;
                divergence("warp shuffle without all 32 lanes");
            }'''
pre = '''        int done = 0, at_block = 0, released = 0;'''
pre_new = '''        int done = 0, at_block = 0, released = 0, running = 0;
        for (int i = 0; i < n; i++) running += g_threads[(size_t)i].state == RUN;'''
post = '''        if (released) continue;'''
for a, b in [(old, new), (pre, pre_new), (post, post + '\n        if (running) continue;'),
             ('void __syncthreads(void) { wait_here(AT_BLOCK); }',
              'void __syncthreads(void) { wait_here(AT_BLOCK); }\nvoid dw_emu_yield(void) { wait_here(RUN); }')]:
    if a not in s:
        sys.exit('emu.cpp changed: run.sh cannot patch it (%s)' % a.strip()[:40])
    s = s.replace(a, b)
open(p, 'w').write(s)
PY
python3 "$here/transform.py" "$root/src/kernels/cuda" "$out"
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
inc="-I$out/inc -I$out/emu -I$root/src -I$root/include -I$root/tests/common"
cxx="g++ -std=c++17 -O1 -g $san -w -include $here/shim.h $inc"
$cxx -c "$out/quant_bulk.cpp" -o "$out/quant_bulk.o"
$cxx -c "$here/harness.cpp" -o "$out/harness.o"
$cxx -c "$out/emu/emu.cpp" -o "$out/emu.o"
gcc -std=c11 -O1 -g $san -D_GNU_SOURCE $inc -c "$root/tests/common/testutil.c" -o "$out/testutil.o"
g++ $san -fopenmp -o "$out/harness" "$out/harness.o" "$out/quant_bulk.o" "$out/emu.o" "$out/testutil.o" \
    "$build/libdeepwell.a" -ljansson -lpcre2-8 -lutf8proc -lz -lm $(mpicc --showme:link 2>/dev/null || true)
ASAN_OPTIONS=detect_stack_use_after_return=0 timeout 900 "$out/harness"  # a ring bug can hang
