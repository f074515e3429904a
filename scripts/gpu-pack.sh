#!/usr/bin/env bash
# gpu-pack.sh [TARGET...] — builds Deepwell's CUDA binaries here (sm_90a, without MPI: the GPU
# machine has no Open MPI, and its ranks meet over TCP and NCCL) into build-pack/ and packs them,
# xz-compressed, into .gpu/pack.tar.xz (git-ignored) for a device call that carries ".gpu" and
# ".deps" and runs `scripts/gpu-verify.sh unpack ...` instead of `build`: the call skips its ~170 s
# build, a tenth of a session's device time (session 20's third call ran binaries built here,
# carried by hand). TARGETs are ninja targets (default: deepwell); test binaries land beside it as
# build-gpu/tests/NAME, the shared library (deepwell_shared) as build-gpu/libdeepwell.so, a standalone
# benchmark (NAME_bench) as build-gpu/NAME_bench. A first
# build here takes ~20 minutes on 2 cores; later ones rebuild what changed. The carried tree is limited to 64 MiB: the first binary is
# ~12 MB packed; the others add ~1 MB each, since they share most of their code and xz's 256 MiB
# window sees it again. Needs scripts/gpu-deps.sh's .deps (its libraries) on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(deepwell)
b=build-pack
if [ ! -f $b/build.ninja ]; then
  cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DDW_CUDA_ARCHS=90a -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$b.configure.log" 2>&1 ||
    { tail -20 "$b.configure.log"; exit 1; }
fi
ninja -C $b "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests"
for t in "${targets[@]}"; do
  case $t in
  deepwell) cp $b/deepwell "$stage/" ;;
  deepwell_shared) cp -P $b/libdeepwell.so* "$stage/" ;;
  *_bench) cp "$b/$t" "$stage/" ;; # standalone benchmarks (CMakeLists.txt), beside deepwell
  *) [ -x "$b/tests/$t" ] || { echo "gpu-pack: no test binary $b/tests/$t" >&2; exit 1; }; cp "$b/tests/$t" "$stage/tests/" ;;
  esac
done
# what they link beyond the CUDA toolkit, glibc and libgomp must be on the GPU machine or in .deps
for f in "$stage"/deepwell "$stage"/tests/*; do if [ -f "$f" ]; then ldd "$f"; fi; done |
  awk '$3 ~ /^\// {print $1}' | sort -u | { grep -v -E '^lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+|gomp|z|cublasLt)\.so' || true; } |
  while read -r l; do ls .deps/root/usr/lib/x86_64-linux-gnu/"$l" >/dev/null 2>&1 ||
    echo "gpu-pack: warning: $l is neither in .deps nor on the GPU machine's image (scripts/gpu-deps.sh)" >&2; done
mkdir -p .gpu
tar -C "$stage" -c . | xz -T2 --lzma2=preset=6,dict=256MiB >.gpu/pack.tar.xz
echo "deepwell: .gpu/pack.tar.xz ($(du -h .gpu/pack.tar.xz | cut -f1), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools include CMakeLists.txt || echo ' + uncommitted changes')): ${targets[*]}; carry .gpu and .deps, run scripts/gpu-verify.sh unpack ..."
