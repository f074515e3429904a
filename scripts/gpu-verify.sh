#!/usr/bin/env bash
# gpu-verify.sh — verification on the GPU machine, from source: builds there (Jansson and cmocka
# headers from .deps/, unpacked Debian packages, since that image has neither), then runs the
# phases asked for. Logs go to $OUT (or out/); a summary is printed last.
# Prepare .deps once with scripts/gpu-deps.sh and carry it.
# Usage: scripts/gpu-verify.sh build|unpack|base|tests|quick|attnwin|recipes|quant|gemm|step|ab|compare|dryrun|mainjob ...
#   e.g. `scripts/gpu-verify.sh build tests`. DW_CUDA_ARCHS (env, default 90a) narrows the build to
#   the GPU at hand; BUILD_TARGETS (env) narrows `build` to those ninja targets (a short call);
#   `unpack` replaces `build` with the binaries scripts/gpu-pack.sh built here (carry .gpu).
#   `base` builds the tree in .base/ (a git-ignored snapshot of an earlier commit,
#   `git archive COMMIT | tar -x -C .base`) into build-base/ and `ab` times it against build-gpu/
#   (bench/step_ab.sh): the "within 2% of before" check of a refactoring.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$PWD/build-gpu/lib:$deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b=build-gpu
summary=()
record() { summary+=("$(printf '%-44s %s' "$1" "$2")"); echo "== $1: $2"; }

for phase in "$@"; do
  case $phase in
  build)
    s=$(date +%s)
    cmake -S . -B $b -G Ninja -DDW_CUDA=ON -DDW_CUDA_ARCHS="${DW_CUDA_ARCHS:-90a}" -DCMAKE_PREFIX_PATH="$deps" \
      >"$out/configure.log" 2>&1 && ninja -C $b -j "$(nproc)" ${BUILD_TARGETS:-} >"$out/build.log" 2>&1
    rc=$?
    record "build ($(( $(date +%s) - s )) s)" "rc=$rc"
    [ $rc -ne 0 ] && { tail -n 40 "$out/configure.log" "$out/build.log"; exit 1; }
    ;;
  unpack)  # instead of build: the binaries scripts/gpu-pack.sh built on the CPU machine (carry .gpu)
    mkdir -p $b && tar -xJf .gpu/pack.tar.xz -C $b
    record "unpack .gpu/pack.tar.xz" "rc=$? ($(cd $b && find . -type f | tr '\n' ' '))"
    ;;
  base)
    s=$(date +%s)
    cmake -S .base -B build-base -G Ninja -DDW_CUDA=ON -DDW_CUDA_ARCHS="${DW_CUDA_ARCHS:-90a}" -DDW_TESTS=OFF \
      -DCMAKE_PREFIX_PATH="$deps" >"$out/configure-base.log" 2>&1 && ninja -C build-base -j "$(nproc)" deepwell \
      >"$out/build-base.log" 2>&1
    rc=$?
    record "build .base ($(( $(date +%s) - s )) s)" "rc=$rc"
    [ $rc -ne 0 ] && tail -n 20 "$out/configure-base.log" "$out/build-base.log"
    ;;
  ab)
    s=$(date +%s)
    bash bench/step_ab.sh build-base/deepwell "$b/deepwell" "${AB_ROUNDS:-2}" | tee "$out/step_ab.txt"
    record "bench/step_ab.sh base vs this tree ($(( $(date +%s) - s )) s)" "rc=$?"
    ;;
  tests)
    "$b/deepwell" probe | tee "$out/probe.txt"
    for t in "$b"/tests/gpu_test_* "$b"/tests/test_core "$b"/tests/test_probe; do  # CPU tests run in CI
      [ -x "$t" ] || continue
      n=$(basename "$t"); s=$(date +%s)
      timeout 480 "$t" >"$out/$n.log" 2>&1; rc=$? # engine_cuda takes ~275 s alone on an H100
      record "$n ($(( $(date +%s) - s )) s)" "rc=$rc"
      [ $rc -ne 0 ] && grep -E "FAIL|ERROR|MISMATCH|mismatch|error" "$out/$n.log" | head -12
    done
    bash tests/cli/test_probe.sh "$b/deepwell" >"$out/cli_probe.log" 2>&1; record cli_test_probe "rc=$?"
    DEEPWELL_LIB=$b/libdeepwell.so timeout 300 python3 tests/gpu/test_python_cuda.py >"$out/python_cuda.log" 2>&1
    record "tests/gpu/test_python_cuda.py" "rc=$?"
    bash tests/gpu/test_resume_fp32_cuda.sh "$b/deepwell" >"$out/resume_fp32_cuda.log" 2>&1
    record "tests/gpu/test_resume_fp32_cuda.sh" "rc=$?"
    # the guardrails' training test on the CUDA engine (the planted NVFP4 outlier falls back at the
    # same step, the resumed run continues bit for bit), with the host check and the device check
    for q in 0 1; do
      DW_TEST_DEVICE=cuda DW_QCHECK_DEVICE=$q timeout 300 "$b/tests/test_guard_train" >"$out/guard_train_cuda_q$q.log" 2>&1
      record "test_guard_train on CUDA (DW_QCHECK_DEVICE=$q)" "rc=$?"
    done
    ;;
  quant)
    "$b/deepwell" bench quant >"$out/bench_quant.txt" 2>&1; record "bench quant" "rc=$?"; cat "$out/bench_quant.txt"
    ;;
  gemm)
    "$b/deepwell" bench gemm --json >"$out/bench_gemm.json" 2>"$out/bench_gemm.log"; record "bench gemm" "rc=$?"
    "$b/deepwell" bench gemm 2>&1 | tail -30
    timeout 200 python3 bench/gemm_anchor.py >"$out/gemm_anchor.json" 2>"$out/gemm_anchor.err"; record "gemm anchor (PyTorch)" "rc=$?"
    head -c 3000 "$out/gemm_anchor.json"; echo
    ;;
  step)
    mkdir -p "$out/gpt2"
    args="gpt2-124m --vocab 50304 --batch 16 --seq 1024"
    "$b/deepwell" bench step $args --profile --config-out "$out/gpt2/config.json" >"$out/step.txt" 2>&1
    record "bench step gpt2-124m B16 T1024" "rc=$?"; cat "$out/step.txt" | head -40
    timeout 240 python3 bench/train_anchor.py --config "$out/gpt2/config.json" --batch 16 --seq 1024 \
      --modes eager,compile --steps 20 --warmup 5 2>"$out/anchor.err" | tee "$out/anchor.json"
    record "train anchor (PyTorch eager, compile)" "rc=$?"
    ;;
  compare)  # issue 30's table: the shared anchors (compile, max-autotune, torchao fp8; ANCHORS) vs Deepwell bf16, fp8_block
    s=$(date +%s)
    OUT="$out" bash bench/train_compare.sh "$b" ${COMPARE_MODELS:-gpt2 llama} | tee "$out/compare.md"
    record "bench/train_compare.sh ($(( $(date +%s) - s )) s)" "rc=$?"
    ;;
  dryrun)  # deepwell dryrun --run: predicted vs measured on this GPU (GEMM rates measured first)
    "$b/deepwell" bench gemm --json --shapes gpt2,vocab --recipes bf16,fp8_block >"$out/rates.json" 2>"$out/rates.err"
    record "bench gemm --shapes gpt2,vocab" "rc=$?"
    for job in "gpt2-124m --seq 1024 --global-batch 16" "llama-1b --seq 2048 --global-batch 8"; do
      n=$(echo "$job" | cut -d' ' -f1)
      timeout 120 "$b/deepwell" dryrun $job --hw h200 --gpus 1 --gemm-rates "$out/rates.json" --run \
        >"$out/dryrun_$n.txt" 2>&1
      record "dryrun --run $n" "rc=$? $(grep -E '^(PASS|FAIL|NOT RUN) +gpu-run' "$out/dryrun_$n.txt" | tr '\n' ' ')"
      grep -iE "memory|step" "$out/dryrun_$n.txt" | grep -iE "measured|predicted" | head -4
    done
    ;;
  quick)  # the GEMM, engine and training GPU tests only
    for n in gpu_test_gemm_gpu gpu_test_engine_cuda gpu_test_train_cuda; do
      s=$(date +%s); timeout 300 "$b/tests/$n" >"$out/$n.log" 2>&1; rc=$?
      record "$n ($(( $(date +%s) - s )) s)" "rc=$rc"
      [ $rc -ne 0 ] && grep -E "FAIL|ERROR|error" "$out/$n.log" | head -12
    done
    ;;
  attnwin)  # issue 26: windowed / capped attention on cuDNN and mma vs the CPU, then both timed (ATTNWIN_SHAPE)
    n=gpu_test_attn_cudnn_window; s=$(date +%s); shape=${ATTNWIN_SHAPE:-2,4096,32,8,128,20}  # B,T,H,Hkv,D,iters[,W...]
    timeout 300 "$b/tests/$n" >"$out/$n.log" 2>&1; rc=$?
    record "$n ($(( $(date +%s) - s )) s)" "rc=$rc"
    grep -E "^cuDNN|ran on|declined|worst" "$out/$n.log"; [ $rc -ne 0 ] && grep -E "FAIL|MISMATCH|error" "$out/$n.log" | head -12
    DW_ATTN_WINDOW_BENCH=$shape timeout 300 "$b/tests/$n" >"$out/attnwin_bench.txt" 2>&1
    record "window attention mma vs cuDNN ($shape)" "rc=$?"; grep -E "BENCH|bench" "$out/attnwin_bench.txt"
    ;;
  recipes)  # deepwell train --device cuda under every recipe: llama-tiny 40 steps, gpt2-124m 10 steps
    for r in bf16 fp8_tensor fp8_row fp8_block fp8_block2d mxfp8 mxfp8_e5m2 mxfp4 nvfp4; do
      rm -rf "/tmp/dw-rec-$r"
      timeout 60 "$b/deepwell" train --model llama-tiny --data builtin --device cuda --precision $r \
        --out "/tmp/dw-rec-$r" --steps 40 --batch 8 --seq 64 --lr 3e-3 --warmup 5 --log-every 40 \
        >"$out/recipe_$r.log" 2>&1
      record "train llama-tiny --precision $r" "rc=$? $(grep -o 'step 40/40 | loss [0-9.]*' "$out/recipe_$r.log" | tail -1)"
      rm -rf "/tmp/dw-rec-$r"
      timeout 90 "$b/deepwell" train --model gpt2-124m --data builtin --device cuda --precision $r \
        --out "/tmp/dw-rec-$r" --steps 10 --batch 4 --seq 256 --lr 1e-3 --warmup 2 --log-every 10 \
        >"$out/recipe_gpt2_$r.log" 2>&1
      record "train gpt2-124m --precision $r" "rc=$? $(grep -o 'step 10/10 | loss [0-9.]*' "$out/recipe_gpt2_$r.log" | tail -1)"
    done
    ;;
  mainjob)
    s=$(date +%s)
    DW_BUILD_DIR=$b DW_RUN_DIR=/tmp/dw-mainjob timeout 240 bash scripts/run.sh >"$out/mainjob.log" 2>&1
    record "main job (scripts/run.sh, $(( $(date +%s) - s )) s)" "rc=$?"
    grep -E "^== |step (1|80|160)/|device" "$out/mainjob.log" | head -20; tail -4 "$out/mainjob.log"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
