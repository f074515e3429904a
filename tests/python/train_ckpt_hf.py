#!/usr/bin/python3
"""train_ckpt_hf.py DEEPWELL — a checkpoint written by `deepwell train` is a Hugging Face model.

For a random small GPT-2 and Llama (byte-level vocab): trains a few steps on the built-in data,
then reads the checkpoint with plain Python: config.json carries what GPT2Config / LlamaConfig
need; model.safetensors holds exactly the tensor names and shapes GPT2LMHeadModel /
LlamaForCausalLM expect (GPT-2 Conv1D weights in x out, tied head stored once), all F32;
optimizer.safetensors holds NAME.exp_avg and NAME.exp_avg_sq for each of them; state.json's sizes
and CRC-32s match. Then the PyTorch reference model of tests/python/parity.py, loaded from those
files, reproduces the loss Deepwell computes on the same tokens.
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (the reference models and safetensors reader)
import torch  # noqa: E402


def header(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in h.items()}


def hf_defaults(c):
    """The config as transformers completes it (the defaults of GPT2Config / LlamaConfig)."""
    c = dict(c)
    c.setdefault("tie_word_embeddings", True if c["model_type"] == "gpt2" else False)
    if c["model_type"] == "gpt2":
        if c.get("n_inner") is None:
            c["n_inner"] = 4 * c["n_embd"]
        c.setdefault("layer_norm_epsilon", 1e-5)
    else:
        c.setdefault("num_key_value_heads", c["num_attention_heads"])
        if c.get("head_dim") is None:
            c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
        c.setdefault("rope_theta", 10000.0)
        c.setdefault("rms_norm_eps", 1e-6)
    return c


REQUIRED = {
    "gpt2": ["vocab_size", "n_embd", "n_layer", "n_head", "n_positions", "layer_norm_epsilon",
             "activation_function"],
    "llama": ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
              "rope_theta", "hidden_act"],
}
ARCH = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def case(dw, family, rng, tmp):
    fails = []
    c = parity.random_config(family, rng)
    c["vocab_size"] = 256
    mdir = os.path.join(tmp, family + "-model")
    os.makedirs(mdir)
    json.dump(c, open(os.path.join(mdir, "config.json"), "w"))
    out = os.path.join(tmp, family + "-run")
    steps = rng.randint(2, 4)
    r = subprocess.run([dw, "train", "--model", mdir, "--data", "builtin", "--out", out, "--steps",
                        str(steps), "--batch", "2", "--seq", "16", "--eval-every", "0", "--device", "cpu",
                        "--seed", str(rng.randrange(1 << 30))], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"{family}: deepwell train failed ({r.returncode}): {r.stderr.strip()}"]
    ck = os.path.join(out, f"ckpt-{steps}")
    cfg = json.load(open(os.path.join(ck, "config.json")))
    if cfg.get("model_type") != family or cfg.get("architectures") != [ARCH[family]]:
        fails.append(f"{family}: config.json model_type/architectures: {cfg.get('model_type')}, {cfg.get('architectures')}")
    for k in REQUIRED[family]:
        if k not in cfg:
            fails.append(f"{family}: config.json lacks '{k}'")
    full = hf_defaults(cfg)
    want = {k: ("F32", tuple(v)) for k, v in parity.param_shapes(full).items()}
    got = header(os.path.join(ck, "model.safetensors"))
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            fails.append(f"{family}: model.safetensors '{k}': {got.get(k)}, {ARCH[family]} expects {want.get(k)}")
    # optimizer state: two moments per parameter, in Deepwell's layout (Linear: out x in)
    opt = header(os.path.join(ck, "optimizer.safetensors"))
    for k, (_, shp) in want.items():
        if family == "gpt2" and k.endswith(CONV1D):
            shp = shp[::-1]
        for suffix in (".exp_avg", ".exp_avg_sq"):
            if opt.get(k + suffix) != ("F32", shp):
                fails.append(f"{family}: optimizer.safetensors '{k + suffix}': {opt.get(k + suffix)}, expected F32 {shp}")
    if len(opt) != 2 * len(want):
        fails.append(f"{family}: optimizer.safetensors has {len(opt)} tensors, expected {2 * len(want)}")
    state = json.load(open(os.path.join(ck, "state.json")))
    for name, f in state["files"].items():
        b = open(os.path.join(ck, name), "rb").read()
        if len(b) != f["size"] or "%08x" % zlib.crc32(b) != f["crc32"]:
            fails.append(f"{family}: state.json's size/crc32 of {name} do not match the file")
    if fails:
        return fails
    # the reference model loaded from the checkpoint reproduces Deepwell's loss
    text = "".join(f"{a}+{b}={a + b}\n" for a, b in ((rng.randrange(10), rng.randrange(10)) for _ in range(40)))
    B, T = 2, 16
    stream = list(text.encode())[:B * T + 1]
    shard = os.path.join(tmp, family + ".bin")
    parity.write_shard(shard, stream)
    dump = os.path.join(tmp, family + ".dump.safetensors")
    r = subprocess.run([dw, "eval", ck, "--data", shard, "--batch", str(B), "--seq", str(T), "--dump", dump],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return [f"{family}: deepwell eval of the checkpoint failed: {r.stderr.strip()}"]
    loss_dw = float(parity.st_read(dump)["loss"].reshape(()))
    w = parity.st_read(os.path.join(ck, "model.safetensors"))
    tok = torch.tensor(stream[:B * T]).view(B, T)
    tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
    fwd = parity.gpt2_forward if family == "gpt2" else parity.llama_forward
    with torch.no_grad():
        logits = fwd(full, w, tok)
        loss_ref = float(torch.nn.functional.cross_entropy(logits.view(B * T, -1), tgt.view(-1)))
    rel = abs(loss_dw - loss_ref) / abs(loss_ref)
    if rel > 1e-5:
        fails.append(f"{family}: loss of the checkpoint: Deepwell {loss_dw:.8f}, PyTorch reference {loss_ref:.8f}")
    print(f"{'ok' if not fails else 'FAIL'}: {family} checkpoint after {steps} steps: {len(want)} tensors with "
          f"{ARCH[family]} names and shapes; loss Deepwell {loss_dw:.6f} vs PyTorch {loss_ref:.6f} (rel {rel:.1e})")
    return fails


def main():
    dw = sys.argv[1]
    seed = int(os.environ.get("DW_TEST_SEED", random.randrange(1 << 62)))
    print(f"test seed: DW_TEST_SEED={seed}")
    rng = random.Random(seed)
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("gpt2", "llama"):
            fails += case(dw, family, rng, tmp)
    for f in fails:
        print("FAIL:", f)
    print(f"{len(fails)} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
