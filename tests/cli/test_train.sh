#!/usr/bin/env bash
# test_train.sh DEEPWELL — `deepwell train` / `deepwell sample` end to end on the CPU engine with a
# small model: loss falls; resuming is bit-identical to an uninterrupted run (constant and cosine
# schedules); SIGINT checkpoints and exits 130 (SIGTERM, SIGHUP, SIGUSR1: 128 + signal), a second
# SIGINT aborts without harming the last checkpoint; --recompute selective gives the same losses; one run per directory (a lock naming its
# holder; a dead holder's lock taken over); damaged checkpoints and bad data are refused naming the file; flag errors;
# checkpoints load as Hugging Face models (tests/python/train_ckpt_hf.py, needs python3-torch);
# mixtral-tiny trains, resumes bit-identically and checkpoints its experts in the fused layout;
# qwen2-moe-tiny and qwen3-moe-tiny train and checkpoint under transformers' names.
set -u
dw=$1
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
# The model is tiny: one thread avoids OpenMP barriers stalling on a loaded CI machine (results
# do not depend on the thread count; the kernel tests check that).
export OMP_NUM_THREADS=1
seed=${DW_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "test seed: DW_TEST_SEED=$seed"

# A small GPT-2 (byte-level vocab) so that every run takes seconds.
mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
JSON
common=(--model "$tmp/model" --data builtin --batch 4 --seq 32 --global-batch 8 --lr 3e-3
        --warmup 3 --eval-every 0 --seed "$seed" --device cpu)

losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }

# --- loss falls -----------------------------------------------------------------------------------
"$dw" train "${common[@]}" --steps 40 --eval-every 20 --sample-every 40 --sample-tokens 24 \
  --out "$tmp/run" >"$tmp/out" 2>"$tmp/err"
check "short training run" 0 $?
python3 - "$tmp/run/metrics.jsonl" <<'PY' && ok "loss falls (last-10 mean well below first-10 mean)" || bad "loss falls"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert [x["step"] for x in m] == list(range(1, 41)), [x["step"] for x in m]
for x in m:
    for k in ["loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"]:
        assert isinstance(x[k], float), (k, x)
first = sum(x["loss"] for x in m[:10]) / 10
last = sum(x["loss"] for x in m[-10:]) / 10
print(f"first-10 mean {first:.4f}, last-10 mean {last:.4f}")
assert last < first - 0.5, (first, last)
assert "val_loss" in m[19] and "val_loss" in m[39] and "val_loss" not in m[20]
PY
has "progress lines on stderr" "$tmp/err" "step 40/40" "loss " "lr " "gnorm " "tok/s" "ETA"
has "a sample at the end" "$tmp/out" "--- sample after step 40 ---"
[ "$(cat "$tmp/run/latest")" = "ckpt-40" ] && ok "latest -> ckpt-40" || bad "latest: $(cat "$tmp/run/latest")"
python3 - "$tmp/run/ckpt-40" <<'PY' && ok "state.json fields" || bad "state.json fields"
import json, os, sys, zlib
d = sys.argv[1]
s = json.load(open(os.path.join(d, "state.json")))
assert s["step"] == 40 and s["total_steps"] == 40 and s["tokens_seen"] == 40 * 8 * 32, s
assert s["precision"] == "fp32" and s["plan"] is None and s["quant_scales"] == {}
assert s["data"]["tokenizer"] == "bytes" and s["schedule"]["kind"] == "cosine"
for name, f in s["files"].items():
    b = open(os.path.join(d, name), "rb").read()
    assert len(b) == f["size"] and "%08x" % zlib.crc32(b) == f["crc32"], name
PY

# --- sample ---------------------------------------------------------------------------------------
"$dw" sample "$tmp/run" --prompt "12+7=" -n 20 --temperature 0 >"$tmp/s1"; check "sample from a run dir" 0 $?
"$dw" sample "$tmp/run/ckpt-40" --prompt "12+7=" -n 20 --temperature 0 >"$tmp/s2"; check "sample from a checkpoint" 0 $?
cmp -s "$tmp/s1" "$tmp/s2" && ok "greedy samples agree" || bad "greedy samples differ"
head -c 5 "$tmp/s1" | grep -q "12+7=" && ok "sample starts with the prompt" || bad "sample lacks the prompt"
"$dw" sample "$tmp/run" --prompt "1" -n 30 --seed 5 >"$tmp/s3"; "$dw" sample "$tmp/run" --prompt "1" -n 30 --seed 5 >"$tmp/s4"
cmp -s "$tmp/s3" "$tmp/s4" && ok "seeded samples repeat" || bad "seeded samples differ"

# --- resume is bit-identical ----------------------------------------------------------------------
# constant schedule: 6 steps, then resume the same directory up to 12, against 12 straight
"$dw" train "${common[@]}" --schedule constant --steps 12 --out "$tmp/straight" >/dev/null 2>&1
check "12 steps straight" 0 $?
"$dw" train "${common[@]}" --schedule constant --steps 6 --out "$tmp/halves" >/dev/null 2>&1
check "first 6 steps" 0 $?
"$dw" train --resume "$tmp/halves" --steps 12 >/dev/null 2>"$tmp/err" # the rest from its record
check "resume to 12" 0 $?
if [ "$(losses "$tmp/straight/metrics.jsonl")" = "$(losses "$tmp/halves/metrics.jsonl")" ] &&
   [ "$(losses "$tmp/straight/metrics.jsonl" | wc -l)" = 12 ]; then ok "resumed losses bit-identical (constant)"
else bad "resumed losses differ (constant)"; diff <(losses "$tmp/straight/metrics.jsonl") <(losses "$tmp/halves/metrics.jsonl") | head; fi
# --deterministic: accepted; the CPU engine is deterministic anyway, so the same 12 losses
"$dw" train "${common[@]}" --schedule constant --steps 12 --deterministic --out "$tmp/det" >/dev/null 2>"$tmp/err"
check "--deterministic on the CPU" 0 $?
if [ "$(losses "$tmp/straight/metrics.jsonl")" = "$(losses "$tmp/det/metrics.jsonl")" ]; then ok "--deterministic: same losses"
else bad "--deterministic changed the CPU losses"; fi
# --recompute selective: the norms and the MLP activation run again in the backward; the same 12 losses
"$dw" train "${common[@]}" --schedule constant --steps 12 --recompute selective --out "$tmp/sel" >/dev/null 2>"$tmp/err"
check "--recompute selective" 0 $?
if [ "$(losses "$tmp/straight/metrics.jsonl")" = "$(losses "$tmp/sel/metrics.jsonl")" ]; then ok "--recompute selective: same losses"
else bad "--recompute selective changed the losses"; fi
"$dw" train "${common[@]}" --steps 2 --recompute partial --out "$tmp/rcbad" >/dev/null 2>"$tmp/err"
check "--recompute partial refused" 2 $?
has "$tmp/err" "--recompute must be none, selective, full"
# cosine: resume from the middle checkpoint of a 12-step run into a new directory
"$dw" train "${common[@]}" --steps 12 --ckpt-every 6 --keep 0 --out "$tmp/cos" >/dev/null 2>&1
check "12 cosine steps with a checkpoint at 6" 0 $?
"$dw" train --resume "$tmp/cos/ckpt-6" --out "$tmp/cos2" >/dev/null 2>&1
check "resume cosine from ckpt-6" 0 $?
if [ "$(losses "$tmp/cos/metrics.jsonl" | tail -6)" = "$(losses "$tmp/cos2/metrics.jsonl")" ]; then ok "resumed losses bit-identical (cosine)"
else bad "resumed losses differ (cosine)"; fi
cmp -s "$tmp/cos/ckpt-12/model.safetensors" "$tmp/cos2/ckpt-12/model.safetensors" && ok "final weights identical" || bad "final weights differ"
"$dw" train "${common[@]}" --steps 12 --out "$tmp/cos" >/dev/null 2>"$tmp/err"
check "a fresh run into a used directory is refused" 2 $?
has "  ... and says to resume" "$tmp/err" "--resume"
"$dw" train --batch 2 --resume "$tmp/cos/ckpt-6" --out "$tmp/cos3" >/dev/null 2>"$tmp/err"
check "resume with another batch is refused" 2 $?
has "  ... naming both values" "$tmp/err" "trained with --batch 4; --batch 2 contradicts it"

# --- gradient accumulation: 2 x 4 sequences per step = one batch of 8 ---------------------------
"$dw" train "${common[@]}" --batch 8 --global-batch 8 --steps 3 --out "$tmp/acc1" >/dev/null 2>&1
check "3 steps of batch 8" 0 $?
"$dw" train "${common[@]}" --batch 4 --global-batch 8 --steps 3 --out "$tmp/acc2" >/dev/null 2>&1
check "3 steps of 2 x 4 accumulated" 0 $?
python3 - "$tmp/acc1/metrics.jsonl" "$tmp/acc2/metrics.jsonl" <<'PY' && ok "accumulated steps match the big batch" || bad "accumulation"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert abs(a[0] - b[0]) <= 2.4e-7 * a[0], (a, b)          # same windows, mean of equal-size means (each an FP32 loss)
assert all(abs(x - y) <= 1e-5 * x for x, y in zip(a, b)), (a, b)  # summation order differs after
assert a[2] < a[0]
PY

# --- a mixture of experts: mixtral-tiny trains, resumes bit-identically, checkpoints in HF layout --
mix=(--model mixtral-tiny --data builtin --batch 4 --seq 32 --lr 3e-3 --warmup 2 --seed $((seed % 100000)))
"$dw" train "${mix[@]}" --steps 30 --out "$tmp/mix" >/dev/null 2>"$tmp/err"
check "mixtral-tiny trains" 0 $?
python3 - "$tmp/mix/metrics.jsonl" <<'PY' && ok "  ... its loss falls" || bad "mixtral-tiny loss did not fall"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert len(l) == 30 and sum(l[-5:]) / 5 < sum(l[:5]) / 5 - 0.5, (l[:5], l[-5:])
PY
python3 - "$tmp/mix/metrics.jsonl" <<'PY' && ok "  ... load-balancing loss and expert load logged" || bad "mixtral-tiny MoE metrics"
import json, sys
for x in open(sys.argv[1]):
    m = json.loads(x)
    # 4 experts top 2 at coef 0.001: transformers' loss is K = 2 when balanced, near it while the
    # router learns (below it when loads and probabilities anti-correlate); the load max/mean >= 1
    assert 0.0015 <= m["moe_aux_loss"] < 0.004 and m["moe_z_loss"] is None and 1 <= m["expert_load"] <= 2, m
PY
grep -q "| aux 0.00[0-9]* | load [0-9.]* |" "$tmp/err" && ok "  ... and shown in the progress line" ||
  bad "mixtral-tiny progress line lacks aux/load: $(tail -2 "$tmp/err")"
"$dw" train "${mix[@]}" --steps 12 --ckpt-every 6 --keep 0 --out "$tmp/mixa" >/dev/null 2>&1
"$dw" train --resume "$tmp/mixa/ckpt-6" --out "$tmp/mixb" >/dev/null 2>&1
check "mixtral-tiny resumes from ckpt-6" 0 $?
if [ "$(losses "$tmp/mixa/metrics.jsonl" | tail -6)" = "$(losses "$tmp/mixb/metrics.jsonl")" ]; then ok "  ... bit-identical losses"
else bad "mixtral-tiny resumed losses differ"; fi
cmp -s "$tmp/mixa/ckpt-12/model.safetensors" "$tmp/mixb/ckpt-12/model.safetensors" && ok "  ... identical final weights" ||
  bad "mixtral-tiny final weights differ"
python3 - "$tmp/mixa/ckpt-12/model.safetensors" <<'PY' && ok "  ... checkpoint in transformers 5's fused layout" || bad "mixtral checkpoint layout"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
assert h["model.layers.0.mlp.experts.gate_up_proj"]["shape"] == [4, 256, 64], h["model.layers.0.mlp.experts.gate_up_proj"]
assert h["model.layers.1.mlp.experts.down_proj"]["shape"] == [4, 64, 128]
assert h["model.layers.0.mlp.gate.weight"]["shape"] == [4, 64]
assert not any("gate_proj" in k for k in h), [k for k in h if "gate_proj" in k]
PY
"$dw" train "${mix[@]}" --steps 2 --device cuda --out "$tmp/mixc" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "mixtral on --device cuda refused here" || bad "mixtral on --device cuda: exit 0"

# --- the Qwen MoE families train on the CPU: qwen2-moe-tiny (a dense layer among MoE ones, the
# sigmoid-gated shared expert), qwen3-moe-tiny (per-head q/k norms, decoder_sparse_step 2) ---------
for m in qwen2-moe-tiny qwen3-moe-tiny; do
  "$dw" train --model $m --data builtin --batch 4 --seq 32 --lr 3e-3 --warmup 2 --seed $((seed % 100000)) \
    --steps 30 --device cpu --out "$tmp/$m" >/dev/null 2>"$tmp/err"
  check "$m trains" 0 $?
  python3 - "$tmp/$m/metrics.jsonl" <<'PY' && ok "  ... its loss falls" || bad "$m loss did not fall"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert len(l) == 30 and sum(l[-5:]) / 5 < sum(l[:5]) / 5 - 0.5, (l[:5], l[-5:])
PY
done
python3 - "$tmp/qwen2-moe-tiny/ckpt-30" "$tmp/qwen3-moe-tiny/ckpt-30" <<'PY' && ok "  ... checkpoints with transformers' names, dense and MoE layers where the configs say" || bad "Qwen MoE checkpoints"
import json, struct, sys
def header(d):
    f = open(d + "/model.safetensors", "rb"); n = struct.unpack("<Q", f.read(8))[0]
    return {k: v["shape"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
q2, q3 = header(sys.argv[1]), header(sys.argv[2])
c2, c3 = json.load(open(sys.argv[1] + "/config.json")), json.load(open(sys.argv[2] + "/config.json"))
assert c2["mlp_only_layers"] == [1] and c2["shared_expert_intermediate_size"] == 48, c2
assert q2["model.layers.0.mlp.shared_expert_gate.weight"] == [1, 64]
assert q2["model.layers.2.mlp.shared_expert.down_proj.weight"] == [64, 48]
assert q2["model.layers.0.mlp.experts.gate_up_proj"] == [8, 64, 64] and q2["model.layers.0.self_attn.q_proj.bias"] == [64]
assert q2["model.layers.1.mlp.gate_proj.weight"] == [96, 64] and "model.layers.1.mlp.gate.weight" not in q2
assert c3["decoder_sparse_step"] == 2 and c3["head_dim"] == 24, c3
assert q3["model.layers.0.self_attn.q_norm.weight"] == [24] and q3["model.layers.1.self_attn.k_norm.weight"] == [24]
assert q3["model.layers.0.mlp.down_proj.weight"] == [64, 96] and q3["model.layers.1.mlp.experts.down_proj"] == [8, 64, 32]
assert not any("shared_expert" in k or k.endswith(".bias") for k in q3), q3
PY

# --- SIGINT ---------------------------------------------------------------------------------------
wait_steps() { # wait_steps FILE N: until FILE has N lines (max 60 s)
  for _ in $(seq 600); do [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1
}
"$dw" train "${common[@]}" --steps 100000 --out "$tmp/int" >/dev/null 2>"$tmp/err" &
pid=$!
wait_steps "$tmp/int/metrics.jsonl" 3 || bad "training did not start"
kill -INT $pid
wait $pid; rc=$?
check "SIGINT: checkpoint and exit 130" 130 $rc
n=$(wc -l <"$tmp/int/metrics.jsonl")
[ "$(cat "$tmp/int/latest")" = "ckpt-$n" ] && ok "checkpoint at the last finished step ($n)" || bad "latest $(cat "$tmp/int/latest") vs $n steps"
has "  ... message" "$tmp/err" "interrupted"
"$dw" train --steps $((n + 2)) --resume "$tmp/int" >/dev/null 2>&1
check "resume after SIGINT" 0 $?
# SIGTERM (what Slurm, Kubernetes, systemd and docker stop send), SIGHUP and SIGUSR1 (Slurm's
# pre-emption warning) do the same: finish the step, checkpoint, exit 128 + signal
for sig in TERM:143 HUP:129 USR1:138; do
  name=${sig%:*} want=${sig#*:}
  rm -rf "$tmp/sig"
  "$dw" train "${common[@]}" --steps 100000 --out "$tmp/sig" >/dev/null 2>"$tmp/err" &
  pid=$!
  wait_steps "$tmp/sig/metrics.jsonl" 2 || bad "training did not start ($name)"
  kill -$name $pid
  wait $pid; rc=$?
  check "SIG$name: checkpoint and exit $want" $want $rc
  m=$(wc -l <"$tmp/sig/metrics.jsonl")
  [ "$(cat "$tmp/sig/latest" 2>/dev/null)" = "ckpt-$m" ] && ok "  ... checkpoint at the last finished step ($m)" ||
    bad "SIG$name: latest '$(cat "$tmp/sig/latest" 2>/dev/null)' vs $m steps"
  has "  ... message names SIG$name" "$tmp/err" "SIG$name: interrupted"
done
# --- one run per directory -------------------------------------------------------------------------
rm -rf "$tmp/lock"
"$dw" train "${common[@]}" --steps 100000 --out "$tmp/lock" >/dev/null 2>"$tmp/err1" &
pid=$!
wait_steps "$tmp/lock/metrics.jsonl" 2 || bad "training did not start (lock)"
"$dw" train "${common[@]}" --steps 10 --out "$tmp/lock" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && ok "a second run into a busy --out is refused (exit $rc)" || bad "a second run into a busy --out: exit 0"
has "  ... naming the holder" "$tmp/err" "in use by another training run" "pid $pid on host"
"$dw" train --steps 100000 --resume "$tmp/lock" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "  ... and so is resuming it" || bad "resuming a busy run: exit 0"
kill -INT $pid; wait $pid
check "the first run was not disturbed" 130 $?
[ ! -e "$tmp/lock/.deepwell.lock" ] && ok "its lock is gone when it ends" || bad "lock file left after the run"
# a lock left by a process that has ended (kill -9: no cleanup) is taken over with a notice
"$dw" train --steps 100000 --resume "$tmp/lock" >/dev/null 2>&1 &
pid=$!
n=$(wc -l <"$tmp/lock/metrics.jsonl")
wait_steps "$tmp/lock/metrics.jsonl" $((n + 1)) || bad "resumed training did not run (lock)"
kill -KILL $pid; wait $pid 2>/dev/null
[ -e "$tmp/lock/.deepwell.lock" ] && ok "kill -9 leaves the lock file" || bad "no lock file after kill -9"
m=$(cat "$tmp/lock/latest"); m=${m#ckpt-}
"$dw" train --steps $((m + 1)) --resume "$tmp/lock" >/dev/null 2>"$tmp/err"
check "a stale lock does not block the next run" 0 $?
has "  ... which says it took it over" "$tmp/err" "taking over the run lock" "pid $pid on host"

# a second SIGINT aborts at once; the last complete checkpoint stays loadable
"$dw" train "${common[@]}" --steps 100000 --ckpt-every 1 --keep 2 --out "$tmp/abort" >/dev/null 2>&1 &
pid=$!
wait_steps "$tmp/abort/metrics.jsonl" 5 || bad "training did not run (abort)"
kill -INT $pid; kill -INT $pid
wait $pid; rc=$?
[ $rc -ne 0 ] && ok "double SIGINT ends the process (exit $rc)" || bad "double SIGINT: exit 0"
"$dw" sample "$tmp/abort" --prompt "1" -n 4 >/dev/null 2>"$tmp/err"
check "the latest checkpoint is intact after an abort" 0 $?
"$dw" train --steps $(( $(wc -l <"$tmp/abort/metrics.jsonl") + 1 )) --resume "$tmp/abort" >/dev/null 2>"$tmp/err"
check "and training resumes from it" 0 $?

# --- damaged checkpoints are refused, naming the file ---------------------------------------------
damage() { # damage NAME HOW: copy ckpt-12 of $tmp/cos, damage one file, try to resume
  rm -rf "$tmp/dmg"; cp -r "$tmp/cos/ckpt-12" "$tmp/dmg"
  case $2 in
    rm) rm "$tmp/dmg/$1" ;;
    cut) truncate -s -1 "$tmp/dmg/$1" ;;
    flip) python3 - "$tmp/dmg/$1" "$seed" <<'PY'
import sys, random
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); r = random.Random(int(sys.argv[2]))
i = r.randrange(len(b)); b[i] ^= 1 << r.randrange(8); open(p, "wb").write(b)
PY
    ;;
    json) printf '{"step": 12, ' >"$tmp/dmg/$1" ;;
  esac
  "$dw" train --steps 13 --resume "$tmp/dmg" --out "$tmp/dmgout" >/dev/null 2>"$tmp/err"
  check "resume refuses $1 ($2)" 2 $?
  has "  ... naming $1" "$tmp/err" "$tmp/dmg/$1"
  [ ! -e "$tmp/dmgout/metrics.jsonl" ] && ok "  ... before writing anything" || bad "  ... wrote metrics"
}
for f in config.json model.safetensors optimizer.safetensors; do damage $f rm; done
for f in config.json model.safetensors optimizer.safetensors; do damage $f flip; done
damage model.safetensors cut
damage state.json json
damage state.json rm

# --- data errors ----------------------------------------------------------------------------------
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(name, magic, version, toks, claim=None, fmt="H"):
    hdr = struct.pack("<256i", magic, version, len(toks) if claim is None else claim, *([0] * 253))
    open(f"{d}/{name}", "wb").write(hdr + struct.pack("<%d%s" % (len(toks), fmt), *toks))
shard("good_0.bin", 20240520, 1, [i % 200 for i in range(3000)])
shard("good_1.bin", 20240801, 7, [(i * 7) % 256 for i in range(2000)], fmt="I")
shard("magic.bin", 20240521, 1, [1] * 100)
shard("short.bin", 20240520, 1, [1] * 100, claim=150)
toks = [1] * 100; toks[37] = 300
shard("vocab.bin", 20240520, 1, toks)
PY
"$dw" train "${common[@]}" --data "$tmp/good_*.bin" --val "$tmp/good_1.bin" --eval-every 3 --steps 3 \
  --out "$tmp/shards" >/dev/null 2>&1
check "train on a glob of uint16 + uint32 shards, validate on a shard" 0 $?
grep -q '"tokenizer": "ids"' "$tmp/shards/ckpt-3/state.json" && ok "  ... token ids" || bad "  ... tokenizer"
grep -q '"val_loss"' "$tmp/shards/metrics.jsonl" && ok "  ... val loss from --val" || bad "  ... no val loss"
"$dw" sample "$tmp/shards" --prompt "1 2 3" -n 5 --seed 3 >"$tmp/ids" 2>/dev/null
check "sample token ids" 0 $?
python3 -c 'import sys; t = open(sys.argv[1]).read().split(); assert len(t) == 8 and t[:3] == ["1", "2", "3"] and all(0 <= int(x) < 256 for x in t), t' "$tmp/ids" &&
  ok "  ... prompt and 5 ids" || bad "  ... ids output: $(cat "$tmp/ids")"
head -c 3000 "$0" >"$tmp/text.txt"
"$dw" train "${common[@]}" --data "$tmp/text.txt" --steps 2 --out "$tmp/text" >/dev/null 2>&1
check "train on a raw text file" 0 $?
grep -q '"tokenizer": "bytes"' "$tmp/text/ckpt-2/state.json" && ok "  ... as bytes" || bad "  ... tokenizer"
"$dw" train "${common[@]}" --data "$tmp/magic.bin" --steps 3 --out "$tmp/x1" >/dev/null 2>"$tmp/err"
check "wrong magic" 2 $?; has "  ... names file and offset" "$tmp/err" "$tmp/magic.bin" "byte offset 0"
"$dw" train "${common[@]}" --data "$tmp/short.bin" --steps 3 --out "$tmp/x2" >/dev/null 2>"$tmp/err"
check "truncated shard" 2 $?; has "  ... names file and offset" "$tmp/err" "$tmp/short.bin" "byte offset 1224"
"$dw" train "${common[@]}" --data "$tmp/vocab.bin" --steps 3 --out "$tmp/x3" >/dev/null 2>"$tmp/err"
check "token >= vocab" 2 $?; has "  ... names file and offset" "$tmp/err" "$tmp/vocab.bin" "byte offset 1098" "token 300"
"$dw" train "${common[@]}" --data "$tmp/none_*.bin" --steps 3 --out "$tmp/x4" >/dev/null 2>"$tmp/err"
check "no matching data (I/O: exit 3)" 3 $?; has "  ... names the pattern" "$tmp/err" "$tmp/none_*.bin"

# --- flags ----------------------------------------------------------------------------------------
"$dw" train "${common[@]}" --global-batch 6 --steps 3 --out "$tmp/x5" >/dev/null 2>"$tmp/err"
check "global batch not a multiple of batch" 2 $?; has "  ... says so" "$tmp/err" "--global-batch 6" "--batch 4"
"$dw" train "${common[@]}" --device cuda --steps 3 --out "$tmp/x6" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ]; then # a CUDA build on a machine with a GPU: it must have trained there
  [ -f "$tmp/x6/latest" ] && grep -q '"recipes": {' "$tmp/x6/$(cat "$tmp/x6/latest")/state.json" &&
    ok "--device cuda trained on the GPU (checkpoint with per-node recipes)" || bad "--device cuda: no GPU checkpoint"
else
  ok "--device cuda fails here (exit $rc)"
  grep -Eq -- "--device cuda: (this build has no CUDA|no usable GPU)" "$tmp/err" && ok "  ... says why" ||
      bad "  ... no reason in: $(cat "$tmp/err")"
fi
# --device auto says in one line which device it chose and why
"$dw" train "${common[@]}" --device auto --steps 1 --out "$tmp/x7" >/dev/null 2>"$tmp/err"
check "--device auto" 0 $?
grep -Eq -- "^deepwell train: --device auto: (cpu \((this build has no CUDA|no usable GPU found)\)|cuda:[0-9]+ \(.+\))$" "$tmp/err" &&
  ok "  ... names the device and why" || bad "  ... no device line in: $(head -c 300 "$tmp/err")"
# the CPU backend runs every recipe (FORMATS.md quantisation, the reference GEMM) and profiles
"$dw" train "${common[@]}" --precision fp8_block --steps 3 --out "$tmp/x8" >/dev/null 2>"$tmp/err"
check "--precision fp8_block on the CPU" 0 $?
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['precision'] == 'fp8_block' and s['recipes'], s" \
  "$tmp/x8/ckpt-3/state.json" && ok "  ... state.json records fp8_block" || bad "  ... state.json lacks the recipe"
"$dw" train "${common[@]}" --device cpu --profile --steps 3 --out "$tmp/xp" >"$tmp/out" 2>"$tmp/err"
check "--profile on the CPU" 0 $?
has "  ... prints the per-op table" "$tmp/out" "per op" "linear fwd" "attention bwd"
[ -s "$tmp/xp/profile.json" ] && ok "  ... writes profile.json" || bad "  ... no profile.json"
"$dw" train "${common[@]}" --device auto --precision fp8_block --policy /dev/null --steps 3 --out "$tmp/x9" \
    >/dev/null 2>"$tmp/err"
check "--precision with --policy" 2 $?
"$dw" train "${common[@]}" --device auto --fallback maybe --steps 3 --out "$tmp/x9" >/dev/null 2>"$tmp/err"
check "--fallback maybe" 2 $?
"$dw" train "${common[@]}" --schedule step --steps 3 --out "$tmp/x7" >/dev/null 2>"$tmp/err"
check "unknown schedule" 2 $?
"$dw" train --help | grep -q -- "--global-batch"; check "train --help" 0 $?
"$dw" train --help | grep -q -- "--deterministic"; check "train --help lists --deterministic" 0 $?
"$dw" sample --help | grep -q -- "--top-k"; check "sample --help" 0 $?
"$dw" sample "$tmp/nothing" --prompt x >/dev/null 2>"$tmp/err"
check "sample of a missing model" 2 $?

# --- checkpoints are Hugging Face models (names, shapes, config; PyTorch reproduces the loss) ------
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DW_TEST_SEED=$seed /usr/bin/python3 "$src/tests/python/train_ckpt_hf.py" "$dw" || bad "HF checkpoints (python3-torch needed)"

echo "$fails failed"
[ $fails -eq 0 ]
