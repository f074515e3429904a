#!/usr/bin/env bash
# test_moe_bias.sh DEEPWELL — auxiliary-loss-free load balancing (issue 24, DeepSeek-V3's router
# bias) in `deepwell train` of mixtral-tiny (4 experts, top 2, 2 MoE layers) on the CPU:
# --moe-bias-update G writes moe_bias_max to metrics.jsonl and the bias to state.json (hex floats),
# and the bias moves the routing (the losses leave the run without it; the bias grows by G or stays
# per step); 6 steps = 3 steps + a resume of 3 (with and without the flag again), losses and bias
# bit for bit; the bias of 2 micro-batches, of 2 ranks (deepwell launch -n 2) and of one batch of
# twice the size are the same bits — exactly over every step at a learning rate too small to move a
# weight (so the routing can differ only through the bias), and at step 1 with a real learning
# rate; config.json's topk_method "noaux_tc" (γ 0.001) and moe_bias_update_speed turn it on; off,
# nothing of it is written; the export has no bias tensor; `deepwell eval` of a checkpoint routes
# with its bias (the loss differs from the same checkpoint without it); bad values are refused
# naming the flag or the file.
set -u
dw=$1
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DW_COMM_TIMEOUT=60
if ldd "$dw" 2>/dev/null | grep -q libasan; then export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"; fi
seed=${DW_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "test seed: DW_TEST_SEED=$seed"
seed=$((seed % 100000))
common=(--model mixtral-tiny --data builtin --seq 32 --eval-every 0 --seed $seed --device cpu --warmup 1)

# bias A [B...]: each run's state.json moe_bias at its last checkpoint, the same bits (the text)
same_bias() {
  python3 - "$@" <<'PY'
import json, sys
vals = [json.load(open(f))["moe_bias"] for f in sys.argv[1:]]
for v in vals[1:]:
    assert v == vals[0], (vals[0], v)
PY
}

# ---- on with the flag; off without -------------------------------------------------------------
"$dw" train "${common[@]}" --batch 2 --global-batch 4 --steps 6 --lr 3e-3 --ckpt-every 3 --keep 0 \
  --moe-bias-update 0.01 --out "$tmp/full" >/dev/null 2>"$tmp/err"
check "train --moe-bias-update 0.01 (6 steps, checkpoints at 3 and 6)" 0 $?
"$dw" train "${common[@]}" --batch 2 --global-batch 4 --steps 6 --lr 3e-3 --ckpt-every 3 --keep 0 \
  --out "$tmp/off" >/dev/null 2>"$tmp/err"
check "the same run without it" 0 $?
python3 - "$tmp/full" "$tmp/off" <<'PY' && ok "  ... moe_bias_max per step, state.json's moe_bias in hex floats, the routing moved; off writes neither" || bad "bias metrics/state"
import json, sys
on, off = sys.argv[1:]
m = [json.loads(l) for l in open(f"{on}/metrics.jsonl")]
m0 = [json.loads(l) for l in open(f"{off}/metrics.jsonl")]
assert len(m) == 6 and all("moe_bias_max" in x for x in m), m
assert not any("moe_bias_max" in x for x in m0), m0
g = 0.01
# every step adds -g, 0 or +g to each value: after step s, max |b| <= s g and a multiple of g (FP32);
# it can come back to 0 (+g then -g on every expert: seed 911547414), so only step 1 must be > 0
for s, x in enumerate(m, 1):
    assert 0 <= x["moe_bias_max"] <= s * g * (1 + 1e-6), x
    assert abs(x["moe_bias_max"] / g - round(x["moe_bias_max"] / g)) < 1e-4, x
assert m[0]["moe_bias_max"] == float.fromhex("0x1.47ae14p-7"), m[0]  # step 1: exactly float(0.01)
assert m[0]["loss"] == m0[0]["loss"]  # the first step routes before any update
assert [x["loss"] for x in m[1:]] != [x["loss"] for x in m0[1:]], "the bias moved no assignment"
st = json.load(open(f"{on}/ckpt-6/state.json"))["moe_bias"]
assert st["layers"] == 2 and st["experts"] == 4 and st["update_speed"] == "0x1.47ae14p-7", st
vals = [float.fromhex(v) for row in st["values"] for v in row]
assert len(vals) == 8 and max(abs(v) for v in vals) == m[-1]["moe_bias_max"], (vals, m[-1])
assert "moe_bias" not in json.load(open(f"{off}/ckpt-6/state.json"))
PY

# ---- resume: bit for bit ------------------------------------------------------------------------
for how in flag record; do
  extra=(); [ $how = flag ] && extra=(--moe-bias-update 0.01)
  "$dw" train --resume "$tmp/full/ckpt-3" --out "$tmp/res-$how" "${extra[@]}" >/dev/null 2>"$tmp/err"
  check "resume at step 3 ($how's γ)" 0 $?
  python3 - "$tmp/full" "$tmp/res-$how" <<'PY' && ok "  ... steps 4-6: losses, gradient norms, bias = the uninterrupted run's bits" || bad "resume differs ($how)"
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
key = lambda x: (x["step"], x["loss"], x["grad_norm"], x["moe_bias_max"])
assert [key(x) for x in a[3:]] == [key(x) for x in b], ([key(x) for x in a], [key(x) for x in b])
PY
  same_bias "$tmp/full/ckpt-6/state.json" "$tmp/res-$how/ckpt-6/state.json" && ok "  ... state.json's bias too" ||
    bad "resumed bias differs ($how)"
done

# ---- the global batch: micro-batches, ranks ---------------------------------------------------
# lr 1e-30: AdamW moves no FP32 weight, so every configuration routes step s by the same bias alone
for lr in 1e-30 3e-3; do
  steps=6; [ $lr = 3e-3 ] && steps=1
  run=("${common[@]}" --steps $steps --lr $lr --min-lr 0 --moe-bias-update 0.01 --ckpt-every 1 --keep 0)
  "$dw" train "${run[@]}" --batch 4 --out "$tmp/one-$lr" >/dev/null 2>"$tmp/err" &&
  "$dw" train "${run[@]}" --batch 2 --global-batch 4 --out "$tmp/acc-$lr" >/dev/null 2>>"$tmp/err" &&
  "$dw" launch -n 2 -- train "${run[@]}" --batch 2 --out "$tmp/two-$lr" >/dev/null 2>>"$tmp/err"
  check "lr $lr: one batch of 4, 2 micro-batches of 2, 2 ranks x 2" 0 $?
  ok=1
  for s in $(seq 1 $steps); do
    same_bias "$tmp/one-$lr/ckpt-$s/state.json" "$tmp/acc-$lr/ckpt-$s/state.json" "$tmp/two-$lr/ckpt-$s/state.json" ||
      { ok=0; break; }
  done
  [ $ok = 1 ] && ok "  ... the same bias bits after each of $steps steps" || bad "lr $lr: the bias differs at step $s"
done
"$dw" train "${common[@]}" --steps 6 --lr 1e-30 --min-lr 0 --batch 4 --out "$tmp/one-off" >/dev/null 2>"$tmp/err"
check "lr 1e-30 without the bias" 0 $?
python3 - "$tmp/one-1e-30" "$tmp/one-off" <<'PY' && ok "  ... the same weights and data: the bias alone moved the routing (losses, loads)" || bad "the bias changed nothing"
import json, sys
on, off = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
assert on[0]["loss"] == off[0]["loss"] and on[0]["expert_load"] == off[0]["expert_load"], (on[0], off[0])
assert any(a["loss"] != b["loss"] for a, b in zip(on[1:], off[1:])), (on, off)
PY

# ---- config.json asks for it ---------------------------------------------------------------------
"$dw" capture mixtral-tiny --json >"$tmp/cap.json" 2>"$tmp/err"
check "capture mixtral-tiny --json" 0 $?
mkcfg() { # mkcfg DIR KEY=JSON...: mixtral-tiny's config.json with the keys set
  local d=$1; shift
  mkdir -p "$d"
  python3 - "$tmp/cap.json" "$d/config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["config"]
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], "w"))
PY
}
mkcfg "$tmp/noaux" 'topk_method="noaux_tc"'
mkcfg "$tmp/speed" 'moe_bias_update_speed=0.005'
for m in noaux speed; do
  "$dw" train "${common[@]/mixtral-tiny/$tmp/$m}" --batch 2 --steps 2 --lr 3e-3 --out "$tmp/run-$m" >/dev/null 2>"$tmp/err"
  check "config.json $m turns the bias on" 0 $?
done
python3 - "$tmp" <<'PY' && ok "  ... γ 0.001 (noaux_tc) and 0.005 (moe_bias_update_speed), recorded in the checkpoint's config" || bad "config γ"
import json, sys
t = sys.argv[1]
for m, g in (("noaux", "0x1.0624dep-10"), ("speed", "0x1.47ae14p-8")):
    st = json.load(open(f"{t}/run-{m}/ckpt-2/state.json"))["moe_bias"]
    assert st["update_speed"] == g, (m, st["update_speed"])
    assert json.load(open(f"{t}/run-{m}/ckpt-2/config.json"))["moe_bias_update_speed"] == (0.001 if m == "noaux" else 0.005)
    assert [json.loads(l) for l in open(f"{t}/run-{m}/metrics.jsonl")][0]["moe_bias_max"] == float.fromhex(g)
PY

# ---- export: the model has no bias tensor to write-------------------------------------------
"$dw" export "$tmp/full/ckpt-6" --out "$tmp/hf" --dtype f32 >/dev/null 2>"$tmp/err"
check "export of the biased run" 0 $?
python3 - "$tmp/hf" "$tmp/off" <<'PY' && ok "  ... writes the same tensor names as the run without (no bias tensor)" || bad "export names"
import json, os, struct, sys
def names(d):
    n = set()
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as h:
                k = struct.unpack("<Q", h.read(8))[0]
                n |= {x for x in json.loads(h.read(k)) if x != "__metadata__"}
    return n
a = names(sys.argv[1])
assert a and not any("bias" in x for x in a), sorted(a)
PY

# ---- refusals ---------------------------------------------------------------------------------
for v in -0.001 nan inf 2 abc; do
  "$dw" train "${common[@]}" --batch 2 --steps 1 --lr 3e-3 --moe-bias-update $v --out "$tmp/bad" >/dev/null 2>"$tmp/err"
  check "--moe-bias-update $v refused" 2 $?
  has "  ... naming the flag" "$tmp/err" "--moe-bias-update"
done
tiny_gpt2 "$tmp/dense"
"$dw" train --model "$tmp/dense" --data builtin --seq 32 --batch 2 --steps 1 --device cpu --moe-bias-update 0.01 \
  --out "$tmp/bad-dense" >/dev/null 2>"$tmp/err"
check "--moe-bias-update on a dense model refused" 2 $?
has "  ... naming the flag and why" "$tmp/err" "--moe-bias-update" "no MoE router"
mkcfg "$tmp/badk" 'topk_method="sometimes"'
mkcfg "$tmp/bads" 'moe_bias_update_speed=-1'
for m in badk bads; do
  "$dw" train "${common[@]/mixtral-tiny/$tmp/$m}" --batch 2 --steps 1 --out "$tmp/bad-$m" >/dev/null 2>"$tmp/err"
  rc=$?
  [ $rc != 0 ] && ok "config.json $m refused (exit $rc)" || bad "config.json $m accepted"
  has "  ... naming the file and field" "$tmp/err" "config.json" "$([ $m = badk ] && echo topk_method || echo moe_bias_update_speed)"
done

# ---- eval and sample of a checkpoint route with the bias it trained ----------------------------
"$dw" train "${common[@]}" --batch 2 --global-batch 4 --steps 3 --lr 3e-3 --moe-bias-update 1 --out "$tmp/big" \
  >/dev/null 2>"$tmp/err"
check "train with a large update speed (the bias dominates the scores)" 0 $?
"$dw" eval "$tmp/big" --data builtin --seq 32 --batch 2 >"$tmp/ev1" 2>&1; check "eval the run" 0 $?
cp -r "$tmp/big" "$tmp/nobias"
c=$(cat "$tmp/nobias/latest")
python3 - "$tmp/nobias/$c/state.json" <<'PY'
import json, sys, zlib
p = sys.argv[1]; s = json.load(open(p)); del s["moe_bias"]
# state.json carries its own CRC-32 (state_crc32: of the text with those 8 digits read as zeros)
s["state_crc32"] = "00000000"; t = json.dumps(s, indent=2) + "\n"
t = t.replace('"state_crc32": "00000000"', '"state_crc32": "%08x"' % zlib.crc32(t.encode()))
open(p, "w").write(t)
PY
"$dw" eval "$tmp/nobias" --data builtin --seq 32 --batch 2 >"$tmp/ev2" 2>&1; check "eval it without the bias" 0 $?
l1=$(grep -o 'loss [0-9.]*' "$tmp/ev1"); l2=$(grep -o 'loss [0-9.]*' "$tmp/ev2")
[ -n "$l1" ] && [ -n "$l2" ] && [ "$l1" != "$l2" ] && ok "eval applies the checkpoint's bias ($l1 with, $l2 without)" ||
  bad "eval of the biased checkpoint: '$l1', without the bias '$l2' (they should differ)"

[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
