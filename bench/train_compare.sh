#!/usr/bin/env bash
# train_compare.sh — issue 8's benchmark in one device call: for each model, PyTorch eager and
# torch.compile (bench/train_anchor.py on the config.json Deepwell exports, so both train the same
# shapes) and Deepwell's CUDA engine under bf16, fp8_block and mxfp8 (`deepwell bench step
# --json`), then one table: tokens/s, MFU (PaLM convention, 989 TFLOP/s), memory, ratio to
# torch.compile. JSON lines in $OUT/compare.jsonl. Not a test: it measures.
# Usage (GPU machine, after a build): bash bench/train_compare.sh BUILD [gpt2] [llama]
#   env: PRECISIONS (default "bf16 fp8_block mxfp8"), MODES (default "eager,compile"), STEPS
set -u
b=${1:?usage: train_compare.sh BUILD [gpt2] [llama]}
shift
models=${*:-gpt2 llama}
out=${OUT:-out}
mkdir -p "$out"
jl="$out/compare.jsonl"
: >"$jl"
for m in $models; do
  case $m in
  gpt2) args="gpt2-124m --vocab 50304 --batch 16 --seq 1024"; B=16; T=1024 ;;
  llama) args="llama-1b --batch 8 --seq 2048"; B=8; T=2048 ;;
  *) echo "unknown model $m (gpt2, llama)"; exit 2 ;;
  esac
  mkdir -p "$out/$m"
  for p in ${PRECISIONS:-bf16 fp8_block mxfp8}; do
    "$b/deepwell" bench step $args --precision "$p" --steps "${STEPS:-10}" --json \
      --config-out "$out/$m/config.json" >"$out/$m/step_$p.json" 2>"$out/$m/step_$p.err"
    rc=$?
    if [ $rc -eq 0 ]; then
      python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["model"]=sys.argv[2]; print(json.dumps(d))' \
        "$out/$m/step_$p.json" "$m" >>"$jl"
    else
      echo "{\"model\": \"$m\", \"impl\": \"deepwell-$p\", \"error\": \"exit $rc: $(tail -1 "$out/$m/step_$p.err" | tr -d '"\\')\"}" >>"$jl"
    fi
  done
  timeout "${ANCHOR_S:-300}" python3 bench/train_anchor.py --config "$out/$m/config.json" --batch $B --seq $T \
    --modes "${MODES:-eager,compile}" --steps "${STEPS:-10}" --warmup 3 2>"$out/$m/anchor.err" |
    python3 -c 'import json,sys
for l in sys.stdin:
    d=json.loads(l); d["model"]=sys.argv[1]; print(json.dumps(d))' "$m" >>"$jl"
done
python3 - "$jl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | implementation | tokens/s | MFU | memory GiB | ratio to torch.compile |")
print("| --- | --- | ---: | ---: | --- | ---: |")
for m in dict.fromkeys(r["model"] for r in rows):
    rs = [r for r in rows if r["model"] == m]
    comp = next((r.get("tokens_per_s") for r in rs if r["impl"] == "pytorch-compile"), None)
    for r in rs:
        if "error" in r:
            print(f"| {m} | {r['impl']} | error: {r['error'][:80]} | | | |")
            continue
        mem = (f"{r['device_mem_gib']:.1f} (engine, cudaMemGetInfo)" if "device_mem_gib" in r else
               f"{r['peak_mem_gib']:.1f} allocated / {r.get('peak_reserved_gib', float('nan')):.1f} reserved")
        ratio = f"{r['tokens_per_s'] / comp:.3f}" if comp else "—"
        print(f"| {m} | {r['impl']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {mem} | {ratio} |")
PY
