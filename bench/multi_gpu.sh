#!/usr/bin/env bash
# multi_gpu.sh DEEPWELL N PHASE... — issue 29's measurement run on one node of N GPUs, writing logs
# and JSON under $OUT (or out/mgpu). Phases:
#   topo     nvidia-smi's GPU list and link matrix, NCCL's version
#   correct  a small Llama and a small Mixtral-style MoE, 20 steps on the GPU: one process with
#            --batch 8 against `deepwell launch -n K` with --batch 8/K (K = 2 and N), ZeRO 0, 1,
#            2 and 3 (CORRECT_ZERO narrows the stages); prints the largest relative loss
#            difference per run and fails above 3e-2 (BF16 GEMMs summing 8 sequences in one
#            kernel or K partial sums apart, carried by AdamW over 20 steps); MoE runs: 3e-3
#            over steps 1-10, 1e-1 over all, 3e-2 at the last (compare(): BF16 routing near-ties)
#   resume   the small Llama, 160 steps on N ranks checkpointing every 20; one rank is SIGKILLed
#            after step 100 (launch stops the rest); resumed on N/2 ranks from the last checkpoint
#            to the end, its losses against the same N-rank run uninterrupted (3e-2: the steps
#            after the resume sum the batch in N/2 parts instead of N)
#   scale    llama-1b B8 T2048 and moe-e64 B4 T2048 per GPU at 1, 2, ..., N GPUs: tokens/s
#            (median of the logged steps after the 10th), JSON lines in scale.jsonl; SCALE_MODELS
#            (env) narrows the list ("llama-1b:8 moe-e64:4", MODEL:BATCH), SCALE_GPUS the counts;
#            max_gpu_mem_mib: nvidia-smi's largest memory.used of any GPU during the run (context
#            and allocator included); rc 0 in a line: all 30 steps were logged (the end-of-run checkpoint is cut short by a kill);
#            comm_s / exposed_comm_s: medians over those steps of the slowest rank's gradient
#            communication and the part of it the step waited for; SCALE_FLAGS (env) adds train
#            flags (e.g. "--no-overlap", "--zero 1", "--ep 4") and SCALE_TAG names such a variant
#            (an environment A/B too: the row's "tag", shown by the planner phase)
#   ep       the small MoE on N ranks with expert parallelism (--ep 2, and --ep N when it divides
#            the 4 experts) against --ep 1 on the same N ranks: the largest relative loss
#            difference (3e-2), on NCCL's all-to-all
#   planner  the planner's predicted step and memory per rank beside every scale run so far
#            (bench/plan_vs_measured.py over scale.jsonl; HW env: the preset, default h100-sxm)
#   anchors  PyTorch in the same call: DDP under torch.compile (ANCHORS/anchor_train.py) at 1 and
#            N GPUs, FSDP2 per-block compile (bench/anchor_fsdp2.py) at N GPUs, and a plain NCCL
#            all-reduce loop (bench/nccl_busbw.py) — JSON lines in anchors.jsonl
# ANCHORS (env) is the folder of the shared anchor scripts (default .anchors).
set -uo pipefail
dw=$(realpath "$1"); n=$2; shift 2
out=${OUT:-out}/mgpu
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
anchors=${ANCHORS:-.anchors}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} # never NVLink multicast on a shared host
fail=0
dev=${DEVICE:-cuda} # DEVICE=cpu: the correct and resume phases on CPU ranks (a dry run of this script)
say() { echo "== $*" | tee -a "$out/summary.txt"; }

small_models() {
  mkdir -p "$out/llama" "$out/moe"
  cat >"$out/llama/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 688,
 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
 "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
  cat >"$out/moe/config.json" <<'JSON'
{"model_type": "mixtral", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 4,
 "num_experts_per_tok": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "router_aux_loss_coef": 0.01, "tie_word_embeddings": false}
JSON
}

# train_run NAME RANKS BATCH MODEL [extra flags] — 20 steps of builtin data at T=256 on the GPU(s)
train_run() {
  local name=$1 k=$2 b=$3 model=$4; shift 4
  local cmd=(train --model "$model" --data builtin --seq 256 --steps 20 --warmup 4 --lr 2e-3 --batch "$b"
             --global-batch 8 --eval-every 0 --device "$dev" --seed 11 --out "$out/runs/$name" "$@")
  rm -rf "$out/runs/$name"
  if [ "$k" = 1 ]; then timeout 120 "$dw" "${cmd[@]}" >"$out/$name.log" 2>&1
  else timeout 120 "$dw" launch -n "$k" -- "${cmd[@]}" >"$out/$name.log" 2>&1; fi
}

# compare REF RUN [RUN...] — the largest relative loss difference of each run against REF
compare() {
  python3 - "$out/runs" "$@" <<'PY'
import json, sys
root, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
load = lambda r: {j["step"]: j["loss"] for j in map(json.loads, open(f"{root}/{r}/metrics.jsonl"))}
a, bad = load(ref), 0
for r in runs:
    b = load(r)
    steps = sorted(set(a) & set(b))
    rel = {s: abs(a[s] - b[s]) / abs(a[s]) for s in steps}
    d, last = max(rel.values()), rel[steps[-1]]
    ok = len(steps) >= min(len(a), 20)
    if "moe" in r:
        # BF16 routers: once weights differ in their last bits, a near-tied token picks another
        # expert and that step's loss moves by a few percent (session 17: EP 2 vs 1 equal to 8e-4
        # over steps 1-11, 5.9e-2 at step 14, 2e-3 at the last). A wrong dispatch or reduction
        # shows from the first steps: those are held to 3e-3, the rest to 1e-1, the last to 3e-2.
        early = max(rel[s] for s in steps[:10])
        ok = ok and early <= 3e-3 and d <= 1e-1 and last <= 3e-2
        tag = f"steps 1-10 {early:.2e}, "
    else:
        ok, tag = ok and d <= 3e-2, ""
    bad += not ok
    print(f"{r:>14} vs {ref}: {len(steps)} steps, {tag}max rel loss diff {d:.2e}, last {b[steps[-1]]:.4f} vs {a[steps[-1]]:.4f} {'ok' if ok else 'FAIL'}")
sys.exit(1 if bad else 0)
PY
}

for phase in "$@"; do
  case $phase in
  topo)
    nvidia-smi -L | tee "$out/topo.txt"
    nvidia-smi topo -m | tee -a "$out/topo.txt"
    python3 -c 'import torch; print("nccl", torch.cuda.nccl.version())' | tee -a "$out/topo.txt"
    ;;
  correct)
    small_models
    for m in llama moe; do
      train_run "$m-1" 1 8 "$out/$m" || { say "$m one GPU failed"; tail -5 "$out/$m-1.log"; fail=1; continue; }
      runs=()
      for k in 2 "$n"; do
        [ "$k" -le "$n" ] || continue
        for z in ${CORRECT_ZERO:-0 1 2 3}; do
          [ "$k" = 2 ] && [ "$k" != "$n" ] && [ "$z" != 0 ] && continue # ZeRO stages at N only
          name="$m-dp$k-z$z"
          [[ " ${runs[*]} " == *" $name "* ]] && continue
          if train_run "$name" "$k" $((8 / k)) "$out/$m" --zero "$z"; then runs+=("$name")
          else say "$name failed"; tail -5 "$out/$name.log"; fail=1; fi
        done
      done
      cat "$out/$m-dp$n"-z*.log 2>/dev/null | grep -h "communicator\|NCCL" | head -4
      compare "$m-1" "${runs[@]}" | tee -a "$out/summary.txt" || fail=1
    done
    ;;
  resume)
    small_models
    h=$((n / 2)); [ "$h" -ge 1 ] || h=1
    rflags=(--model "$out/llama" --data builtin --seq 256 --steps 160 --warmup 4 --lr 2e-3 --global-batch 8
            --eval-every 0 --device "$dev" --seed 11 --ckpt-every 20 --keep 0)
    rm -rf "$out/runs/resume-ref" "$out/runs/resume"
    timeout 300 "$dw" launch -n "$n" -- train "${rflags[@]}" --batch $((8 / n)) --out "$out/runs/resume-ref" \
      >"$out/resume-ref.log" 2>&1 || { say "resume reference run failed"; fail=1; }
    "$dw" launch -n "$n" -- train "${rflags[@]}" --batch $((8 / n)) --out "$out/runs/resume" >"$out/resume-kill.log" 2>&1 &
    lp=$!
    until grep -q '^step 1[0-9][0-9]/' "$out/resume-kill.log" 2>/dev/null || ! kill -0 $lp 2>/dev/null; do sleep 0.05; done
    victim=$(pgrep -f -n "deepwell train .*runs/resume") && kill -9 "$victim"
    wait $lp; rc=$?
    say "killed rank pid ${victim:-none} after step 100 of 160 on $n ranks: launch exit $rc; $(grep -o '^step [0-9]*/' "$out/resume-kill.log" | tail -1); latest $(cat "$out/runs/resume/latest" 2>/dev/null)"
    timeout 300 "$dw" launch -n "$h" -- train --resume "$out/runs/resume" --device "$dev" >"$out/resume-continue.log" 2>&1
    say "resumed on $h ranks: exit $?"
    compare resume-ref resume | tee -a "$out/summary.txt" || fail=1
    ;;
  scale)
    touch "$out/scale.jsonl"
    for spec in ${SCALE_MODELS:-llama-1b:8 moe-e64:4}; do
      model=${spec%:*}; b=${spec#*:}
      for k in ${SCALE_GPUS:-$(seq 1 "$n")}; do
        [ $((k & (k - 1))) = 0 ] && [ "$k" -le "$n" ] || continue # 1, 2, 4, 8
        name="scale-$model-x$k${SCALE_TAG:+-$SCALE_TAG}"; rm -rf "$out/runs/$name"
        # shellcheck disable=SC2206 # SCALE_FLAGS is a list of flags
        cmd=(train --model "$model" --data builtin --seq 2048 --batch "$b" --global-batch $((b * k)) --steps 30
             --warmup 5 --eval-every 0 --device "$dev" --seed 3 --ckpt-minutes 0 --out "$out/runs/$name"
             ${SCALE_FLAGS:-})
        [ "$k" = 1 ] && [[ "${SCALE_FLAGS:-}" == *--ep* ]] && continue # expert parallelism needs ranks
        s=$(date +%s)
        if [ "$k" = 1 ]; then timeout 240 "$dw" "${cmd[@]}" >"$out/$name.log" 2>&1 &
        else timeout 240 "$dw" launch -n "$k" -- "${cmd[@]}" >"$out/$name.log" 2>&1 & fi
        lp=$!
        # only this run's GPUs when CUDA_VISIBLE_DEVICES narrows them (runs side by side on one host)
        nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} --query-gpu=memory.used --format=csv,noheader,nounits \
          -lms 500 >"$out/$name.mem" 2>/dev/null &
        sp=$!
        # the end-of-run checkpoint (13-33 GB of weights and moments, 90 s or more on the lent
        # machines' disks; its progress line comes after it) is not what this measures: once step
        # 30 is in metrics.jsonl, the ranks are killed
        m="$out/runs/$name/metrics.jsonl"
        until grep -q '"step": 30[,}]' "$m" 2>/dev/null || ! kill -0 $lp 2>/dev/null; do sleep 0.2; done
        grep -q '"step": 30[,}]' "$m" && sleep 1 && pkill -9 -f "deepwell train .*runs/$name"
        wait $lp
        kill $sp 2>/dev/null
        python3 - "$m" "$model" "$k" "$b" "$(grep -q '"step": 30[,}]' "$m"; echo $?)" "$(( $(date +%s) - s ))" "$out/$name.mem" "${SCALE_FLAGS:-}" >>"$out/scale.jsonl" <<'PY'
import json, os, statistics, sys
path, model, k, b, rc, wall, mem, flags = sys.argv[1:]
try: used = max(int(x) for x in open(mem).read().split() if x.isdigit())
except (OSError, ValueError): used = None
try: rows = [json.loads(l) for l in open(path)]
except OSError: rows = []
late = [r for r in rows if r.get("step", 0) > 10]
tps = [r["tokens_per_s"] for r in late if "tokens_per_s" in r]
def med_max(key):  # per step the slowest rank's figure, then the median over the steps
    v = [max(r[key]) if isinstance(r[key], list) else r[key] for r in late if key in r]
    return round(statistics.median(v), 5) if v else None
print(json.dumps({"model": model, "gpus": int(k), "batch_per_gpu": int(b), "flags": flags,
                  "tag": os.environ.get("SCALE_TAG", ""), "rc": int(rc),
                  "wall_s": int(wall), "tokens_per_s": round(statistics.median(tps)) if tps else None,
                  "comm_s": med_max("comm_s"), "exposed_comm_s": med_max("exposed_comm_s"),
                  "last_loss": rows[-1]["loss"] if rows else None, "max_gpu_mem_mib": used}))
PY
        tail -1 "$out/scale.jsonl"
      done
    done
    ;;
  ep)
    small_models
    train_run "moe-ep1-x$n" "$n" $((8 / n)) "$out/moe" --ep 1 || { say "moe --ep 1 on $n ranks failed"; fail=1; }
    runs=()
    for e in $(printf '%s\n' 2 "$n" | sort -un); do
      [ "$e" -le "$n" ] && [ $((4 % e)) = 0 ] && [ $((n % e)) = 0 ] || continue
      if train_run "moe-ep$e-x$n" "$n" $((8 / n)) "$out/moe" --ep "$e"; then runs+=("moe-ep$e-x$n")
      else say "moe --ep $e on $n ranks failed"; tail -5 "$out/moe-ep$e-x$n.log"; fail=1; fi
    done
    [ ${#runs[@]} -gt 0 ] && { compare "moe-ep1-x$n" "${runs[@]}" | tee -a "$out/summary.txt" || fail=1; }
    ;;
  planner)
    python3 "$here/plan_vs_measured.py" "$dw" "$out/scale.jsonl" --hw "${HW:-h100-sxm}" | tee "$out/planner.txt" || fail=1
    ;;
  anchors)
    : >"$out/anchors.jsonl"
    for k in 1 "$n"; do
      if [ "$k" = 1 ]; then python3 "$anchors/anchor_train.py" llama compile 8
      else python3 -m torch.distributed.run --nproc-per-node "$k" "$anchors/anchor_train.py" llama compile 8; fi 2>"$out/ddp$k.err" |
        grep '^{' | tee -a "$out/anchors.jsonl"
    done
    python3 -m torch.distributed.run --nproc-per-node "$n" "$here/anchor_fsdp2.py" 8 2048 2>"$out/fsdp2.err" | grep '^{' | tee -a "$out/anchors.jsonl"
    python3 -m torch.distributed.run --nproc-per-node "$n" "$here/nccl_busbw.py" 2>"$out/busbw.err" | grep '^{' | tee -a "$out/anchors.jsonl"
    ;;
  *) echo "multi_gpu.sh: unknown phase '$phase'" >&2; exit 2 ;;
  esac
done
cat "$out/summary.txt" 2>/dev/null
exit $fail
