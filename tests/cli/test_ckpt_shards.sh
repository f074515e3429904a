#!/usr/bin/env bash
# test_ckpt_shards.sh DEEPWELL — per-rank checkpoint shards and elastic resume on CPU ranks (issue
# 28). 4 ranks under ZeRO-1 write one shard of the AdamW moments each (their range of the pools),
# rank 0 the weights once and the index; the files tile every moment exactly once. The step-3
# checkpoint resumed on 2 ranks (mpirun, ZeRO-1; `deepwell launch`, ZeRO-2) and on 1 continues
# the 4 ranks' losses and gradient norms (asserted within 2e-6 relative, as test_dp.sh's rank-count
# comparisons; measured 0 to 1.3e-8: the ranks' partial sums are added in another grouping), and
# the merged moments match the one-rank continuation's (1e-6 of each tensor's norm; measured
# 9e-8); a 2-rank checkpoint resumes on 4 ranks and on 1 alike. `deepwell eval`
# and `export` read a sharded checkpoint. Damage — a corrupt, truncated or missing shard, an index
# naming another file, index and shard sizes that disagree, pieces that overlap, another model —
# is refused naming the file before anything runs. A rank killed while writing its shard, or one
# whose write fails, leaves the previous checkpoint as `latest`, and the run resumes from it.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env

mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
JSON
cat "$0" "$(dirname "$0")/checks.sh" "$(dirname "$0")/test_dp.sh" >"$tmp/text.txt"
run=(train --model "$tmp/model" --data "$tmp/text.txt" --seq 32 --steps 6 --lr 3e-3 --warmup 2 --eval-every 0
     --ckpt-every 3 --keep 0 --device cpu --seed 7 --batch 1)

# A python helper: read safetensors, merge a sharded checkpoint's moments through its index, and
# reseal a checkpoint after an edit (sizes, CRC-32s and state.json's own CRC-32 made current).
cat >"$tmp/st.py" <<'PY'
import json, os, struct, sys, zlib
import numpy as np
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).reshape(v["shape"])
            for k, v in h.items()}
def merged(cdir):
    ix = json.load(open(f"{cdir}/optimizer.safetensors.index.json"))
    files = {f: read(f"{cdir}/{f}") for f in sorted(os.listdir(cdir)) if f.startswith("optimizer-")}
    out, held = {}, {f: 0 for f in files}
    for name, t in ix["tensors"].items():
        n = int(np.prod(t["shape"])); v = np.full(n, np.nan, np.float32); c = np.zeros(n, int)
        for p in t["pieces"]:
            v[p["begin"]:p["end"]] = files[p["file"]][name]; c[p["begin"]:p["end"]] += 1; held[p["file"]] += 1
        assert (c == 1).all(), (name, "not tiled once")
        out[name] = v.reshape(t["shape"])
    assert all(held[f] == len(files[f]) for f in files), "a shard holds a tensor the index does not place there"
    return out, ix
def reseal(cdir):
    p = f"{cdir}/state.json"; s = json.load(open(p))
    for f in s["files"]:
        b = open(f"{cdir}/{f}", "rb").read(); s["files"][f] = {"size": len(b), "crc32": "%08x" % zlib.crc32(b)}
    s["state_crc32"] = "00000000"
    t = json.dumps(s, indent=2)
    open(p, "w").write(t.replace('"state_crc32": "00000000"', '"state_crc32": "%08x"' % zlib.crc32(t.encode())))
PY
export PYTHONPATH="$tmp"

"$dw" launch -n 4 -- "${run[@]}" --zero 1 --out "$tmp/r4" >/dev/null 2>"$tmp/err"
check "launch -n 4 --zero 1: 4 ranks write shards" 0 $?
/usr/bin/python3 - "$tmp/r4" <<'PY' && ok "  ... index + 4 shards + the weights once; every moment tiled once; state.json lists them" || bad "  ... layout"
import json, os, sys
from st import merged, read
for step in (3, 6):
    c = f"{sys.argv[1]}/ckpt-{step}"
    shards = [f"optimizer-{r:05d}-of-00004.safetensors" for r in range(4)]
    assert sorted(os.listdir(c)) == sorted(["config.json", "model.safetensors", "optimizer.safetensors.index.json", "state.json"] + shards), os.listdir(c)
    s = json.load(open(f"{c}/state.json"))
    assert s["format_version"] == 3 and sorted(s["files"]) == sorted(set(os.listdir(c)) - {"state.json"}), s["files"]
    m, ix = merged(c)
    assert ix["world"] == 4 and ix["zero"] == 1
    params = {k[:-len(".exp_avg")] for k in m if k.endswith(".exp_avg")}
    assert len(m) == 2 * len(params) and all(p + ".exp_avg_sq" in m for p in params), sorted(m)
    w = read(f"{c}/model.safetensors")  # the weights once, whole: as many elements as each moment
    assert sum(v.size for v in m.values()) == 2 * sum(v.size for v in w.values())
    assert all(len(read(f"{c}/{f}")) > 0 for f in shards)  # every rank holds part of the pools
PY

# the step-3 checkpoint continues on 2 ranks (mpirun ZeRO-1, launch ZeRO-2) and on 1
mpirun -np 2 "$dw" train --resume "$tmp/r4/ckpt-3" --zero 1 --out "$tmp/r2m" >/dev/null 2>"$tmp/err"
check "4-rank checkpoint resumed by mpirun -np 2 --zero 1" 0 $?
"$dw" launch -n 2 -- train --resume "$tmp/r4/ckpt-3" --zero 2 --out "$tmp/r2l" >/dev/null 2>"$tmp/err"
check "4-rank checkpoint resumed by launch -n 2 --zero 2" 0 $?
"$dw" train --resume "$tmp/r4/ckpt-3" --out "$tmp/r1" >/dev/null 2>"$tmp/err"
check "4-rank checkpoint resumed on 1 rank" 0 $?
/usr/bin/python3 - "$tmp" <<'PY' && ok "  ... steps 4-6 as the 4 ranks ran them (2e-6); merged moments and weights as the one rank's (1e-6 of each tensor's norm)" || bad "  ... resumed"
import json, sys
import numpy as np
from st import merged, read
t = sys.argv[1]
m = {k: [json.loads(l) for l in open(f"{t}/{k}/metrics.jsonl")] for k in ("r4", "r2m", "r2l", "r1")}
worst = 0.0
for k in ("r2m", "r2l", "r1"):
    assert [x["step"] for x in m[k]] == [4, 5, 6], m[k]
    for x, y in zip(m["r4"][3:], m[k]):
        for key in ("loss", "grad_norm"):
            d = abs(x[key] - y[key]) / abs(x[key]); worst = max(worst, d)
            assert d <= 2e-6, (k, key, x, y)
print(f"worst relative difference of resumed losses and norms: {worst:.2e}", file=sys.stderr)
def near(x, y, what):  # per tensor |x - y| / |y| (elements near zero make elementwise ratios meaningless)
    assert sorted(x) == sorted(y), what
    for k in x:
        d = np.linalg.norm(x[k] - y[k]) / max(np.linalg.norm(y[k]), 1e-30)
        assert d <= 1e-6, (what, k, d)
a, _ = merged(f"{t}/r4/ckpt-6")
near(a, read(f"{t}/r1/ckpt-6/optimizer.safetensors"), "moments: 4 ranks vs the one-rank format")
for k in ("r2m", "r2l"):
    c, ix = merged(f"{t}/{k}/ckpt-6")
    assert ix["world"] == 2 and ix["zero"] == (1 if k == "r2m" else 2), ix["zero"]
    near(c, a, k)
near(read(f"{t}/r4/ckpt-6/model.safetensors"), read(f"{t}/r1/ckpt-6/model.safetensors"), "weights")
PY

# a 2-rank (ZeRO-2) checkpoint on 4 ranks (ZeRO-0) and on 1: the same two further steps
"$dw" launch -n 4 -- train --resume "$tmp/r2l/ckpt-6" --steps 8 --out "$tmp/g4" >/dev/null 2>"$tmp/err" &&
  "$dw" train --resume "$tmp/r2l/ckpt-6" --steps 8 --out "$tmp/g1" >/dev/null 2>>"$tmp/err"
check "2-rank checkpoint resumed on 4 ranks and on 1" 0 $?
/usr/bin/python3 - "$tmp/g4/metrics.jsonl" "$tmp/g1/metrics.jsonl" <<'PY' && ok "  ... the same steps 7-8 (2e-6)" || bad "  ... 2 -> 4 ranks"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [x["step"] for x in a] == [x["step"] for x in b] == [7, 8], (a, b)
assert all(abs(x["loss"] - y["loss"]) <= 2e-6 * x["loss"] for x, y in zip(a, b)), (a, b)
PY

# eval and export read a sharded checkpoint (the weights are rank 0's one file)
"$dw" eval "$tmp/r4" --data "$tmp/text.txt" --batch 2 --seq 32 >"$tmp/ev1" 2>"$tmp/err"
check "eval of a run whose checkpoints are sharded" 0 $?
"$dw" export "$tmp/r4/ckpt-6" --out "$tmp/hf" --dtype f32 >/dev/null 2>"$tmp/err"
check "export of a sharded checkpoint into one HF directory" 0 $?
"$dw" eval "$tmp/hf" --data "$tmp/text.txt" --batch 2 --seq 32 >"$tmp/ev2" 2>"$tmp/err"
cmp -s "$tmp/ev1" "$tmp/ev2" && [ -s "$tmp/ev1" ] && ! ls "$tmp/hf" | grep -q optimizer &&
  ok "  ... the export evaluates as the checkpoint ($(cut -c1-14 "$tmp/ev1")) and holds no optimizer state" ||
  bad "  ... export: $(cat "$tmp/ev1" "$tmp/ev2"; ls "$tmp/hf")"

# damage, each on a copy of the step-3 checkpoint: refused naming the file, before any step
n=0
damaged() { # damaged DESCRIPTION PYTHON-EDIT TEXT...: edit a copy (reseal it unless the edit says no), resume, expect TEXT
  local what=$1 edit=$2; shift 2
  n=$((n + 1))
  local c="$tmp/bad$n/ckpt-3"
  mkdir -p "$tmp/bad$n" && cp -r "$tmp/r4/ckpt-3" "$c"
  /usr/bin/python3 -c "import json, os, sys; from st import reseal; c = sys.argv[1]; $edit" "$c" || { bad "$what: the edit failed"; return; }
  "$dw" train --resume "$c" --out "$tmp/out$n" >/dev/null 2>"$tmp/err"
  local rc=$?
  [ $rc -ne 0 ] && [ ! -s "$tmp/out$n/metrics.jsonl" ] && [ ! -d "$tmp/out$n/ckpt-4" ] &&
    has "$what: refused (exit $rc), nothing run" "$tmp/err" "$@" || bad "$what: exit $rc, $(head -c 400 "$tmp/err")"
}
ix='p = f"{c}/optimizer.safetensors.index.json"; ix = json.load(open(p))'
put='json.dump(ix, open(p, "w")); reseal(c)'
damaged "a corrupt shard" 'f = open(f"{c}/optimizer-00002-of-00004.safetensors", "r+b"); f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 4]))' \
  "optimizer-00002-of-00004.safetensors: CRC-32"
damaged "a truncated shard" 'os.truncate(f"{c}/optimizer-00003-of-00004.safetensors", 1000)' \
  "optimizer-00003-of-00004.safetensors: 1000 bytes, but state.json records"
damaged "a missing shard" 'os.remove(f"{c}/optimizer-00001-of-00004.safetensors")' \
  "optimizer-00001-of-00004.safetensors: missing"
damaged "a shard state.json does not list" 'os.remove(f"{c}/optimizer-00001-of-00004.safetensors"); s = json.load(open(f"{c}/state.json")); del s["files"]["optimizer-00001-of-00004.safetensors"]; json.dump(s, open(f"{c}/state.json", "w")); reseal(c)' \
  "state.json: files: 3 of the 4 shards listed"
damaged "an index naming a file that is not a shard" "$ix; ix['tensors']['transformer.wpe.weight.exp_avg']['pieces'][0]['file'] = 'optimizer-00009-of-00004.safetensors'; $put" \
  "optimizer.safetensors.index.json: tensor 'transformer.wpe.weight.exp_avg' piece 0 names 'optimizer-00009-of-00004.safetensors'"
damaged "an index of another world size" "$ix; ix['world'] = 5; $put" "optimizer.safetensors.index.json: field 'world': expected 4"
damaged "index and shard sizes that disagree" "$ix; t = [v for v in ix['tensors'].values() if len(v['pieces']) > 1][0]; t['pieces'][0]['end'] -= 1; t['pieces'][1]['begin'] -= 1; $put" \
  "the shard and the index do not match"
damaged "pieces that overlap" "$ix; t = [v for v in ix['tensors'].values() if len(v['pieces']) > 1][0]; t['pieces'][1]['begin'] -= 3; $put" \
  "optimizer.safetensors.index.json: tensor" "are in two pieces"
damaged "moments of another shape" "$ix; ix['tensors']['transformer.h.0.ln_1.weight.exp_avg_sq']['shape'] = [33]; $put" \
  "tensor 'transformer.h.0.ln_1.weight.exp_avg_sq' has shape [33]" "not of this model"
damaged "an index missing a tensor" "$ix; del ix['tensors']['transformer.h.1.mlp.c_fc.bias.exp_avg']; $put" \
  "optimizer.safetensors.index.json: " "not of this model"
damaged "another model's config" 'open(f"{c}/config.json", "w").write(json.dumps({"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 3, "n_head": 2, "n_positions": 64})); reseal(c)' \
  "model.safetensors: missing tensor 'transformer.h.2"
"$dw" eval "$tmp/bad1/ckpt-3" --data "$tmp/text.txt" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && has "eval refuses the corrupt shard too" "$tmp/err" "optimizer-00002-of-00004.safetensors: CRC-32" ||
  bad "eval read a checkpoint with a corrupt shard"

# a rank killed while writing its shard (rank 1 may write 16 KiB: SIGXFSZ part-way through its
# ~145 KiB shard of step 6): rank 0 names it, `latest` stays at step 3, and the run resumes there
"$dw" launch -n 2 -- "${run[@]}" --steps 3 --out "$tmp/die" >/dev/null 2>"$tmp/err"
check "a 2-rank run to step 3" 0 $?
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(ulimit -f 16; RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port exec "$dw" train --resume "$tmp/die" \
  --steps 6 >/dev/null 2>/dev/null) &
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$dw" train --resume "$tmp/die" --steps 6 >/dev/null 2>"$tmp/err0"
rc0=$?
wait $!
rc1=$?
[ $rc0 -ne 0 ] && [ $rc1 -eq 153 ] && ok "rank 1 killed by SIGXFSZ mid-write (exit $rc1), rank 0 fails (exit $rc0)" ||
  bad "exits $rc0, $rc1 (rank 1 expected 153: SIGXFSZ)"
has "  ... rank 0 names the rank that left" "$tmp/err0" "rank 1"
[ "$(cat "$tmp/die/latest")" = ckpt-3 ] && [ ! -e "$tmp/die/ckpt-6" ] && ok "  ... latest still names ckpt-3; no ckpt-6" ||
  bad "  ... latest: $(cat "$tmp/die/latest"); $(ls -a "$tmp/die")"
# a rank whose write fails (SIGXFSZ ignored: write() says EFBIG) says so, and so does every other
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(trap '' XFSZ; ulimit -f 16; RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port exec "$dw" train --resume \
  "$tmp/die" --steps 6 >/dev/null 2>"$tmp/err1") &
start=$SECONDS
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$dw" train --resume "$tmp/die" --steps 6 >/dev/null 2>"$tmp/err0"
rc0=$?
wait $!
rc1=$?
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $rc1 -ne 153 ] && [ $((SECONDS - start)) -lt 30 ] &&
  ok "a rank whose shard cannot be written: both exit at once (exit $rc0, $rc1)" || bad "exits $rc0, $rc1"
has "  ... rank 1 names its file" "$tmp/err1" "optimizer-00001-of-00002.safetensors"
has "  ... rank 0 names rank 1" "$tmp/err0" "checkpoint of step 6: rank 1 could not write its files" "\`latest\` is unchanged"
[ "$(cat "$tmp/die/latest")" = ckpt-3 ] && [ ! -e "$tmp/die/ckpt-6" ] && ok "  ... latest still names ckpt-3" ||
  bad "  ... latest: $(cat "$tmp/die/latest")"
"$dw" train --resume "$tmp/die" --steps 6 >/dev/null 2>"$tmp/err"
check "  ... the run resumes from ckpt-3 on one rank" 0 $?
[ "$(cat "$tmp/die/latest")" = ckpt-6 ] && ! ls -a "$tmp/die" | grep -q '^\.tmp-' &&
  ok "  ... and writes ckpt-6 (the dead rank's temporary directory pruned)" || bad "  ... $(ls -a "$tmp/die")"

[ "$fails" -eq 0 ] || exit 1
