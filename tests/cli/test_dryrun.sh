#!/usr/bin/env bash
# test_dryrun.sh DEEPWELL — `deepwell dryrun --run`: a plan that cannot run here (multi-GPU, not
# runnable by the engine, or a machine without CUDA/GPU) says NOT RUN with the reason and exits 1,
# never a silent PASS; without --run the gpu-run check is SKIP; bad --steps → exit 2.
set -u
dw=$1
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
has() { # has FILE TEXT
  grep -q -- "$2" "$1" || { echo "FAIL: output lacks '$2'"; cat "$1"; fails=$((fails + 1)); }
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
gb=$(( (RANDOM % 4 + 1) * 8 ))

# multi-GPU plan: the planner's best on 8 GPUs (data parallel, which the runtime runs) is never
# executed by dryrun, which runs one GPU
"$dw" dryrun gpt2-124m --hw h200 --seq 1024 --global-batch 64 --run >"$tmp/o" 2>&1; check "8-GPU plan --run" 1 $?
has "$tmp/o" "NOT RUN  gpu-run: the plan uses 8 GPUs; --run executes one"
has "$tmp/o" "gpu-run NOT RUN"
grep -q "^PASS:" "$tmp/o" && { echo "FAIL: a NOT RUN dryrun printed PASS"; fails=$((fails + 1)); }

# one GPU with selective recompute: a plan the engine runs (its norms and MLP activations run
# again), whose compiled peak lies below the same plan's without recompute
peak() { sed -n 's/.*peak \([0-9.]*\) GiB per GPU.*/\1/p' "$1" | head -1; }
for rc in none selective; do
  echo '{"parallel": {"dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1}, "micro_batch": 8, "recompute": "'$rc'", "zero": 0}' >"$tmp/rc.json"
  "$dw" dryrun llama-1b --hw h200 --gpus 1 --seq 1024 --global-batch $gb --plan "$tmp/rc.json" >"$tmp/o_$rc" 2>&1
  check "recompute $rc plan" 0 $?
  has "$tmp/o_$rc" "PASS  constraints"
  has "$tmp/o_$rc" "rc=$rc"
done
if ! awk -v a="$(peak "$tmp/o_selective")" -v b="$(peak "$tmp/o_none")" 'BEGIN { exit !(a > 0 && a < b) }'; then
  echo "FAIL: selective recompute's peak $(peak "$tmp/o_selective") GiB is not below none's $(peak "$tmp/o_none")"
  fails=$((fails + 1))
fi
# ZeRO on one GPU: the engine does not run the plan as it is (on one GPU the planner plans for the
# engine, so the checker rejects such plans too)
echo '{"parallel": {"dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1}, "micro_batch": 8, "recompute": "none", "zero": 1}' >"$tmp/z.json"
"$dw" dryrun gpt2-124m --hw h200 --gpus 1 --seq 1024 --global-batch $gb --plan "$tmp/z.json" --run >"$tmp/o" 2>&1
check "ZeRO-1 plan --run" 1 $?
has "$tmp/o" "ZeRO-1"

# models the engine cannot build
"$dw" dryrun llama-8b --hw h200 --gpus 1 --seq 2048 --global-batch 1 --run >"$tmp/o" 2>&1; check "planning-only model --run" 1 $?
has "$tmp/o" "NOT RUN  gpu-run: the engine cannot build this model"
"$dw" dryrun gpt2-124m --hw h200 --gpus 1 --seq 1024 --global-batch 8 --moe experts=4,top_k=1 --run >"$tmp/o" 2>&1
rc=$?; [ $rc -ne 0 ] || { echo "FAIL: MoE --run exit 0"; fails=$((fails + 1)); }
grep -q "mixture-of-experts\|no configuration fits" "$tmp/o" || { echo "FAIL: MoE reason"; cat "$tmp/o"; fails=$((fails + 1)); }

# a runnable one-GPU plan: without --run SKIP and exit 0; with --run, on a machine without CUDA or
# a GPU, NOT RUN saying which (with a GPU it runs and prints measured numbers)
"$dw" dryrun gpt2-124m --hw h200 --gpus 1 --seq 1024 --global-batch $gb >"$tmp/o" 2>&1; check "one-GPU plan without --run" 0 $?
has "$tmp/o" "SKIP  gpu-run: not requested"
has "$tmp/o" "dp1 tp1 pp1 v1 cp1 ep1"
"$dw" dryrun gpt2-tiny --hw h200 --gpus 1 --seq 64 --global-batch 4 --run --steps 2 --warmup 2 >"$tmp/o" 2>&1; rc=$?
if grep -q "gpu-run memory" "$tmp/o"; then
  echo "note: this machine ran the plan on a GPU (exit $rc)"; has "$tmp/o" "measured"
else
  check "one-GPU plan --run without a GPU" 1 $rc
  grep -q "NOT RUN  gpu-run: this build has no CUDA\|NOT RUN  gpu-run: no usable CUDA device" "$tmp/o" ||
    { echo "FAIL: no reason for NOT RUN"; cat "$tmp/o"; fails=$((fails + 1)); }
fi

# bad input → 2
"$dw" dryrun gpt2-124m --hw h200 --gpus 1 --seq 1024 --global-batch 8 --run --steps 0 2>"$tmp/e"; check "--steps 0" 2 $?
has "$tmp/e" "--steps"
"$dw" dryrun gpt2-124m --hw h200 --gpus 9 --seq 1024 --global-batch 8 2>"$tmp/e"; check "--gpus 9 on an 8-GPU node" 2 $?
has "$tmp/e" "--gpus 9"
"$dw" dryrun --help | grep -q -- "--run"; check "dryrun --help names --run" 0 $?

echo "$fails failed"
[ $fails -eq 0 ]
