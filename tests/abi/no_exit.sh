#!/usr/bin/env bash
# no_exit.sh OBJECT... — no object of the library calls exit, _exit, _Exit or quick_exit
# (include/deepwell.h: "The library never calls exit()"). nvcc compiles a host function's call to a
# __device__-only function into a silent exit(1) (src/kernels/cuda/ops_act.cu's argument check did
# that, and GPT-2's un-fused GELU ended the process with status 1 and no message), and gives every
# non-inline __device__ function with linkage a host stub that calls exit (unreachable, but it hides
# the real case: device-only helpers are static or __forceinline__). This finds either in the CUDA
# build's objects, which CI compiles but cannot run. Names the functions.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: no_exit.sh OBJECT..." >&2; exit 2; }
rc=0 n=$#
for o in "$@"; do [ -f "$o" ] || { echo "FAIL: $o: no such object"; rc=1; }; done
# one nm for all: "OBJECT: U SYMBOL" lines, the objects that leave exit & co. undefined
bad=$(nm -A -u "$@" 2>/dev/null | awk '$NF ~ /^(exit|_exit|_Exit|quick_exit)$/ {sub(/:$/, "", $1); print $1}' | sort -u)
for o in $bad; do
    echo "FAIL: $o calls exit; in:"
    objdump -dr --no-show-raw-insn -C "$o" |
        awk '/^[0-9a-f]+ <.*>:$/ {fn = $0} /R_X86_64_PLT32[ \t]+(exit|_exit|_Exit|quick_exit)([-+]|$)/ {print "  " fn}' | sort -u
    rc=1
done
[ "$n" -ge 50 ] || { echo "FAIL: only $n objects given (the test's object list is wrong)"; rc=1; }
[ $rc = 0 ] && echo "PASS: none of $n objects calls exit"
exit $rc
