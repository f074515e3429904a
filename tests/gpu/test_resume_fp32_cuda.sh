#!/usr/bin/env bash
# test_resume_fp32_cuda.sh — an FP32 run trained on the CPU and resumed with --device cuda (issue 32):
# the resume must say that the CUDA engine continues in bf16 (tools/train_resume.c), run to the new
# step count from the checkpoint's step, and log finite losses there. GPU machine only (gpu-verify's
# tests phase). Usage: bash tests/gpu/test_resume_fp32_cuda.sh DEEPWELL
set -u
dw=${1:?usage: test_resume_fp32_cuda.sh DEEPWELL}
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$dw" train --model llama-tiny --data builtin --out "$t/run" --device cpu --steps 4 \
  --ckpt-every 2 --seed $RANDOM >"$t/cpu.log" 2>&1 || { cat "$t/cpu.log"; fail "the FP32 CPU run"; }
"$dw" train --resume "$t/run" --steps 8 --device cuda >"$t/cuda.log" 2>&1 || { cat "$t/cuda.log"; fail "the CUDA resume"; }
grep -q "was trained in fp32 on the cpu; the CUDA engine trains in bf16, so the run continues in bf16" "$t/cuda.log" ||
  { cat "$t/cuda.log"; fail "no bf16 note on the CUDA resume"; }
python3 - "$t/run/metrics.jsonl" <<'PY' || fail "metrics after the resume"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step"] for r in rows if "loss" in r]
assert steps[-1] == 8, f"last step {steps[-1]}, not 8"
assert all(s in steps for s in range(5, 9)), f"steps 5..8 not all logged: {steps}"
late = [r["loss"] for r in rows if "loss" in r and r["step"] > 4]
assert all(math.isfinite(x) for x in late), f"non-finite loss after the resume: {late}"
print(f"resumed on CUDA: steps 5..8, losses {', '.join(f'{x:.4f}' for x in late)}")
PY
echo "PASS test_resume_fp32_cuda"
