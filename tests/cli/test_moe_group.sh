#!/usr/bin/env bash
# test_moe_group.sh DEEPWELL — DeepSeek-V3's router variants on a trainable MoE family (issue 24):
# mixtral-tiny's config.json with 8 experts and n_group 4, topk_group 2, sigmoid scores and a
# routed_scaling_factor of 2.5 captures into router nodes that carry them, trains on the CPU (the
# loss falls) and resumes bit for bit; a weights file with model.layers.N.mlp.gate.
# e_score_correction_bias [8] FP32 routes with it (the loss differs from the file without it) and
# goes eval -> export -> eval bit for bit (the dumped logits and loss; the tensors kept FP32 under
# --dtype bf16 too); training from it keeps it as loaded without the bias update and starts the
# update from it with; bad routing keys and bad bias tensors are refused naming the file and field
# or tensor.
set -u
dw=$1
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
export OMP_NUM_THREADS=1
if ldd "$dw" 2>/dev/null | grep -q libasan; then export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"; fi
seed=${DW_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "test seed: DW_TEST_SEED=$seed"
seed=$((seed % 100000))
common=(--data builtin --seq 32 --eval-every 0 --seed $seed --device cpu --warmup 1)

"$dw" capture mixtral-tiny --json >"$tmp/cap.json" 2>"$tmp/err"
check "capture mixtral-tiny --json" 0 $?
mkcfg() { # mkcfg DIR KEY=JSON...: the grouped model's config.json with the keys set
  local d=$1; shift
  mkdir -p "$d"
  python3 - "$tmp/cap.json" "$d/config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["config"]
c.update(num_local_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
         scoring_func="sigmoid")
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], "w"))
PY
}
mkcfg "$tmp/g"

# ---- capture: the router nodes carry the keys ---------------------------------------------------
"$dw" capture "$tmp/g" --json >"$tmp/g.json" 2>"$tmp/err"
check "capture the grouped config" 0 $?
python3 - "$tmp/g.json" <<'PY' && ok "  ... every router: sigmoid, n_group 4, topk_group 2, scale 2.5, renormalised" || bad "router attrs"
import json, sys
g = json.load(open(sys.argv[1]))
r = [n["attrs"] for n in g["nodes"] if n["op"] == "moe_router"]
assert len(r) == 2, r
for a in r:
    assert (a["score"], a["n_group"], a["topk_group"], a["scale"], a["top_k"], a["norm_topk"]) == \
        ("sigmoid", 4, 2, 2.5, 2, True), a
c = g["config"]
assert (c["n_group"], c["topk_group"], c["routed_scaling_factor"], c["scoring_func"]) == (4, 2, 2.5, "sigmoid"), c
PY

# ---- training: the loss falls, a resume continues bit for bit ----------------------------------
"$dw" train --model "$tmp/g" "${common[@]}" --batch 4 --steps 12 --lr 3e-3 --ckpt-every 6 --keep 0 --out "$tmp/run" \
  >/dev/null 2>"$tmp/err"
check "train the grouped model 12 steps" 0 $?
"$dw" train --resume "$tmp/run/ckpt-6" --out "$tmp/res" >/dev/null 2>"$tmp/err"
check "resume it at step 6" 0 $?
python3 - "$tmp/run" "$tmp/res" <<'PY' && ok "  ... the loss falls; steps 7-12 resumed: the same loss and gradient-norm bits" || bad "training / resume"
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
assert len(a) == 12 and len(b) == 6, (len(a), len(b))
first, last = sum(x["loss"] for x in a[:3]) / 3, sum(x["loss"] for x in a[-3:]) / 3
assert last < first - 0.1, (first, last)
key = lambda x: (x["step"], x["loss"], x["grad_norm"])
assert [key(x) for x in a[6:]] == [key(x) for x in b], ([key(x) for x in a[6:]], [key(x) for x in b])
PY

# ---- the selection bias from the weights file -------------------------------------------------
"$dw" export "$tmp/run/ckpt-12" --out "$tmp/hf" --dtype f32 >/dev/null 2>"$tmp/err"
check "export the run (f32)" 0 $?
# st.py IN OUT ok|nan|short|one SEED: IN's model.safetensors plus a bias [8] F32 per layer (seeded) into
# OUT (nan: a NaN value, short: [7], one: layer 0's only); as a module, read() and write() safetensors
cat >"$tmp/st.py" <<'PY'
import json, os, random, shutil, struct, sys
def read(p):
    with open(p, "rb") as h:
        n = struct.unpack("<Q", h.read(8))[0]
        hdr = json.loads(h.read(n)); data = h.read()
    meta = hdr.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items()}, meta
def write(p, t, meta):
    hdr, off, blob = {}, 0, b""
    for k, (dt, shape, b) in t.items():
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b); blob += b
    if meta: hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(p, "wb").write(struct.pack("<Q", len(h)) + h + blob)
if __name__ == "__main__":
    src, out, how, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    shutil.copy(f"{src}/config.json", out)
    t, meta = read(f"{src}/model.safetensors")
    r = random.Random(seed)
    for l in range(2):
        if how == "one" and l == 1: continue
        v = [r.uniform(-0.5, 0.5) for _ in range(8)]
        if how == "nan": v[3] = float("nan")
        n = 7 if how == "short" else 8
        t[f"model.layers.{l}.mlp.gate.e_score_correction_bias"] = ("F32", [n], struct.pack(f"<{n}f", *v[:n]))
    write(f"{out}/model.safetensors", t, meta)
PY
python3 "$tmp/st.py" "$tmp/hf" "$tmp/hfb" ok $seed
"$dw" eval "$tmp/hfb" --data builtin --seq 32 --batch 4 --dump "$tmp/d1.st" >"$tmp/e1" 2>&1; check "eval the file with the bias" 0 $?
"$dw" eval "$tmp/hf" --data builtin --seq 32 --batch 4 --dump "$tmp/d0.st" >"$tmp/e0" 2>&1; check "eval it without" 0 $?
"$dw" export "$tmp/hfb" --out "$tmp/hfb2" --dtype f32 >/dev/null 2>"$tmp/err"; check "export the biased model (f32)" 0 $?
"$dw" export "$tmp/hfb" --out "$tmp/hfb16" --dtype bf16 >/dev/null 2>"$tmp/err"; check "export it (bf16)" 0 $?
"$dw" eval "$tmp/hfb2" --data builtin --seq 32 --batch 4 --dump "$tmp/d2.st" >"$tmp/e2" 2>&1; check "eval the export" 0 $?
python3 - "$tmp" <<'PY' && ok "  ... the bias routes (loss differs without it); eval -> export -> eval: the same logits and loss bits; the bias FP32 and exact in both exports" || bad "bias round trip"
import sys
t = sys.argv[1]
sys.path.insert(0, t)
from st import read
d0, d1, d2 = (read(f"{t}/{d}.st")[0] for d in ("d0", "d1", "d2"))
assert d1["logits"] == d2["logits"] and d1["loss"] == d2["loss"], "eval of the export differs"
assert d1["loss"] != d0["loss"], "the bias changed nothing"
src = read(f"{t}/hfb/model.safetensors")[0]
for out in ("hfb2", "hfb16"):
    o = read(f"{t}/{out}/model.safetensors")[0]
    for l in range(2):
        k = f"model.layers.{l}.mlp.gate.e_score_correction_bias"
        assert o[k] == src[k], (out, k, o.get(k))
PY

# ---- training from the file: kept as loaded without the update, the update starts from it -----
"$dw" train --model "$tmp/hfb" "${common[@]}" --batch 2 --steps 2 --lr 3e-3 --out "$tmp/ft0" >/dev/null 2>"$tmp/err"
check "train from the biased file (no bias update)" 0 $?
"$dw" train --model "$tmp/hfb" "${common[@]}" --batch 2 --steps 1 --lr 3e-3 --moe-bias-update 0.01 --out "$tmp/ft1" \
  >/dev/null 2>"$tmp/err"
check "train from it with --moe-bias-update 0.01" 0 $?
python3 - "$tmp" <<'PY' && ok "  ... off: the checkpoint keeps the file's bias bits; on: each value moved by exactly 0 or ±0.01 (FP32) from the file's" || bad "training from the biased file"
import json, struct, sys
t = sys.argv[1]
sys.path.insert(0, t)
import st as stio
read = lambda p: {k: v[2] for k, v in stio.read(p)[0].items()}
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
src = read(f"{t}/hfb/model.safetensors")
k = [f"model.layers.{l}.mlp.gate.e_score_correction_bias" for l in range(2)]
ck0 = read(f"{t}/ft0/ckpt-2/model.safetensors")
assert all(ck0[x] == src[x] for x in k), "the bias moved without the update"
assert "moe_bias" not in json.load(open(f"{t}/ft0/ckpt-2/state.json"))
st = json.load(open(f"{t}/ft1/ckpt-1/state.json"))["moe_bias"]
ck1 = read(f"{t}/ft1/ckpt-1/model.safetensors")
g = f32(0.01)
for l in range(2):
    b0 = struct.unpack("<8f", src[k[l]])
    b1 = [float.fromhex(v) for v in st["values"][l]]
    assert list(struct.unpack("<8f", ck1[k[l]])) == b1, "model.safetensors and state.json disagree"
    assert all(y in (x, f32(x + g), f32(x - g)) for x, y in zip(b0, b1)), (b0, b1)
    assert any(y != x for x, y in zip(b0, b1)), (b0, b1)
PY

# ---- refusals -------------------------------------------------------------------------------------
refuse() { # refuse NAME FIELD KEY=JSON...: training a config with the keys exits 2 naming config.json and FIELD
  local name=$1 field=$2; shift 2
  mkcfg "$tmp/bad-$name" "$@"
  "$dw" train --model "$tmp/bad-$name" "${common[@]}" --batch 2 --steps 1 --out "$tmp/out-$name" >/dev/null 2>"$tmp/err"
  rc=$?
  [ $rc != 0 ] && ok "config $name refused (exit $rc)" || bad "config $name accepted"
  has "  ... naming the file and field" "$tmp/err" "config.json" "$field"
}
refuse ngroup3 n_group 'n_group=3'
refuse ngroup0 n_group 'n_group=0'
refuse topk5 topk_group 'topk_group=5'
refuse reach num_experts_per_tok 'num_experts_per_tok=5'
refuse scale0 routed_scaling_factor 'routed_scaling_factor=0'
refuse scaleneg routed_scaling_factor 'routed_scaling_factor=-2'
refuse scalestr routed_scaling_factor 'routed_scaling_factor="big"'
refuse score scoring_func 'scoring_func="tanh"'
for how in short nan one; do
  python3 "$tmp/st.py" "$tmp/hf" "$tmp/bad-$how" $how $seed
  "$dw" eval "$tmp/bad-$how" --data builtin --seq 32 --batch 2 >"$tmp/err" 2>&1
  rc=$?
  [ $rc != 0 ] && ok "a bias file ($how) refused (exit $rc)" || bad "a bias file ($how) accepted"
  has "  ... naming the file and tensor" "$tmp/err" "$tmp/bad-$how" "e_score_correction_bias"
done

[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
