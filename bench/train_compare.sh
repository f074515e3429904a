#!/usr/bin/env bash
# train_compare.sh — the dense speed issue's comparison in one device call: for each model, the
# strongest PyTorch setups of ../shared/anchors/anchor_train.py (nanoGPT-style model, SDPA, fused
# AdamW, clipping, BF16 autocast: torch.compile, max-autotune, torchao float8 tensorwise with the LM
# head in BF16; copied into $ANCHORS) and Deepwell's CUDA engine (`deepwell bench step --json`)
# under bf16 and fp8_block, then one table: tokens/s, MFU (PaLM convention, 989 TFLOP/s), memory,
# and each Deepwell row's ratio to its anchor — BF16 to the faster of compile and max-autotune,
# the quantised recipes to torchao fp8 — and fp8_block's to Deepwell's own BF16. JSON lines in
# $OUT/compare.jsonl. Not a test: it measures.
# Usage (GPU machine, after a build): bash bench/train_compare.sh BUILD [gpt2] [llama]
#   env: ANCHORS (folder holding anchor_train.py; default .anchors), PRECISIONS (default
#   "bf16 fp8_block"), MODES (default "compile max-autotune fp8-tensorwise"), STEPS (default 10),
#   EXTRA (more `bench step` flags for every Deepwell run, e.g. "--recompute full"), ANCHOR_S
set -u
b=${1:?usage: train_compare.sh BUILD [gpt2] [llama]}
shift
models=${*:-gpt2 llama}
out=${OUT:-out}
anchors=${ANCHORS:-.anchors}
[ -f "$anchors/anchor_train.py" ] || { echo "train_compare.sh: no $anchors/anchor_train.py (set ANCHORS)"; exit 2; }
mkdir -p "$out"
jl="$out/compare.jsonl"
: >"$jl"
for m in $models; do
  case $m in
  gpt2) args="gpt2-124m --vocab 50304 --batch 16 --seq 1024"; B=16 ;;
  llama) args="llama-1b --batch 8 --seq 2048"; B=8 ;;
  *) echo "unknown model $m (gpt2, llama)"; exit 2 ;;
  esac
  mkdir -p "$out/$m"
  for p in ${PRECISIONS:-bf16 fp8_block}; do
    # shellcheck disable=SC2086 # args and EXTRA are flag lists
    "$b/deepwell" bench step $args --precision "$p" --steps "${STEPS:-10}" --json ${EXTRA:-} \
      >"$out/$m/step_$p.json" 2>"$out/$m/step_$p.err"
    rc=$?
    if [ $rc -eq 0 ]; then
      python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["model"]=sys.argv[2]; print(json.dumps(d))' \
        "$out/$m/step_$p.json" "$m" >>"$jl"
    else
      echo "{\"model\": \"$m\", \"impl\": \"deepwell-$p\", \"error\": \"exit $rc: $(tail -1 "$out/$m/step_$p.err" | tr -d '"\\')\"}" >>"$jl"
    fi
  done
  for mode in ${MODES:-compile max-autotune fp8-tensorwise}; do
    timeout "${ANCHOR_S:-400}" python3 "$anchors/anchor_train.py" "$m" "$mode" "$B" 2>"$out/$m/anchor_$mode.err" |
      grep '^{' >>"$jl" || echo "{\"model\": \"$m\", \"impl\": \"pytorch-$mode\", \"error\": \"$(tail -1 "$out/$m/anchor_$mode.err" | tr -d '"\\')\"}" >>"$jl"
  done
done
python3 - "$jl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
FLOPS = {}  # PaLM-convention FLOPs per token, from Deepwell's rows (the same shapes as the anchors')
for r in rows:
    if "flops_per_token" in r:
        FLOPS[r["model"]] = r["flops_per_token"]
print("| model | implementation | tokens/s | MFU | memory GiB | ratio | to |")
print("| --- | --- | ---: | ---: | --- | ---: | --- |")
for m in dict.fromkeys(r["model"] for r in rows):
    rs = [r for r in rows if r["model"] == m]
    tps = {r["impl"]: r["tokens_per_s"] for r in rs if "tokens_per_s" in r}
    compiled = max((tps[k], k) for k in ("pytorch-compile", "pytorch-max-autotune") if k in tps) if any(
        k in tps for k in ("pytorch-compile", "pytorch-max-autotune")) else None
    fp8 = ("pytorch-fp8-tensorwise", tps["pytorch-fp8-tensorwise"]) if "pytorch-fp8-tensorwise" in tps else None
    for r in rs:
        if "error" in r:
            print(f"| {m} | {r['impl']} | error: {r['error'][:80]} | | | | |")
            continue
        mfu = r.get("mfu", r["tokens_per_s"] * FLOPS.get(m, 0) / 989e12)
        mem = (f"{r['device_mem_gib']:.1f} (engine, cudaMemGetInfo)" if "device_mem_gib" in r else
               f"{r['peak_alloc_gib']:.1f} (peak allocated)" if "peak_alloc_gib" in r else "—")
        ratio, to = "", ""
        if r["impl"] == "deepwell-bf16" and compiled:
            ratio, to = f"{r['tokens_per_s'] / compiled[0]:.3f}", compiled[1]
        elif r["impl"].startswith("deepwell-") and fp8:
            ratio, to = f"{r['tokens_per_s'] / fp8[1]:.3f}", fp8[0]
            if "deepwell-bf16" in tps:
                ratio += f"; {r['tokens_per_s'] / tps['deepwell-bf16']:.3f}"
                to += "; deepwell-bf16"
        print(f"| {m} | {r['impl']} | {r['tokens_per_s']:,.0f} | {100 * mfu:.1f}% | {mem} | {ratio} | {to} |")
PY
