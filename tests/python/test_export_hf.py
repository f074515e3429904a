#!/usr/bin/python3
"""test_export_hf.py CKPT EXPORTED [options] — an independent check of one `deepwell export`
(tests/cli/test_export.sh runs it for each case; torch 1.13 and numpy, no safetensors package).

CKPT is the checkpoint the export was made from (its config.json and FP32 model.safetensors, in
whatever expert layout it keeps); EXPORTED the Hugging Face directory. The safetensors headers are
parsed here, the family's Hugging Face names and shapes are written out here from the config, and
the expert layouts are converted here, so that nothing is taken from Deepwell's own code:
  - names, shapes and dtypes are exactly the family's (llama, qwen2, gpt2, mixtral in the
    per-expert or fused layout), a tied LM head is absent, every file is whole and the index (when
    sharded) maps every tensor once with the right total_size;
  - config.json keeps every key of the checkpoint's, model_type included, with torch_dtype set;
  - values: F32 bit for bit, BF16 equal to torch's round-to-nearest-even of the checkpoint;
  - hf-fp8: quantization_config as specified; each projection's weight_scale_inv equals
    1 / (448 / amax) per 128 x 128 block in FP32; each code is the E4M3 value nearest (ties to
    even) to weight x scale; dequantised weights are within the E4M3 rounding bound of the source.
  - with --forward SHARD LOSS TOL: the float64 reference models of parity.py (plain torch, written
    from transformers' definitions) read the exported directory alone, its config.json and its
    weights (FP8 dequantised), and give LOSS (`deepwell eval` of the checkpoint on the shard's
    first 16 + 1 tokens) within relative TOL.
Options: --layout per-expert|fused, --dtype bf16|f32, --fp8 (what the export must be),
--rounded-out FILE (writes the checkpoint rounded to BF16 as F32 under its own names, for
`deepwell eval --weights`). Exit 1 on any mismatch.
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (the float64 reference forwards)

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F8_E4M3": (np.uint8, 1)}
BLOCK = 128
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL: " + what)
    return cond


def read_file(path):
    """{name: (dtype, shape, numpy array of the stored elements)} of one safetensors file."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    data, out, end = b[8 + n:], {}, 0
    for name, h in header.items():
        npt, size = DTYPES[h["dtype"]]
        s, e = h["data_offsets"]
        numel = int(np.prod(h["shape"])) if h["shape"] else 1
        check(e - s == numel * size and e <= len(data), f"{path}: '{name}' spans {e - s} bytes for {numel} elements")
        out[name] = (h["dtype"], list(h["shape"]), np.frombuffer(data[s:e], dtype=npt).copy())
        end = max(end, e)
    check(end == len(data), f"{path}: {len(data) - end} bytes after the last tensor")
    return out


def read_dir(d):
    """Every tensor of an exported directory, through the index when sharded."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(d, "model.safetensors"))
    check(not os.path.exists(os.path.join(d, "model.safetensors")), "sharded export also has model.safetensors")
    idx = json.load(open(index))
    files = sorted(set(idx["weight_map"].values()))
    n = len(files)
    check(n > 1, "an index over a single file")
    check(files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)], f"shard names {files}")
    out, total = {}, 0
    for f in files:
        for name, t in read_file(os.path.join(d, f)).items():
            check(name not in out, f"'{name}' in two shards")
            check(idx["weight_map"].get(name) == f, f"index maps '{name}' to {idx['weight_map'].get(name)}, found in {f}")
            out[name] = t
            total += t[2].nbytes
    check(set(idx["weight_map"]) == set(out), "index weight_map and the shards name different tensors")
    check(idx["metadata"]["total_size"] == total, f"index total_size {idx['metadata']['total_size']} != {total}")
    return out


def as_f32(t):
    """The stored values as FP32 (BF16 widened exactly); FP8 codes stay codes."""
    dtype, shape, a = t
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return torch.from_numpy(a.copy()).reshape(shape)


# ---- the family's Hugging Face names (written out from transformers' modeling files) ---------
def expected_shapes(cfg, layout):
    mt, V = cfg["model_type"], cfg["vocab_size"]
    out = {}
    if mt == "gpt2":
        C, L = cfg["n_embd"], cfg["n_layer"]
        F = cfg.get("n_inner") or 4 * C
        out["transformer.wte.weight"] = [V, C]
        out["transformer.wpe.weight"] = [cfg["n_positions"], C]
        for i in range(L):
            p = f"transformer.h.{i}."
            for n, shp in [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [C, 3 * C]),
                           ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
                           ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [C, F]),
                           ("mlp.c_fc.bias", [F]), ("mlp.c_proj.weight", [F, C]), ("mlp.c_proj.bias", [C])]:
                out[p + n] = shp
        out["transformer.ln_f.weight"] = [C]
        out["transformer.ln_f.bias"] = [C]
        if not cfg.get("tie_word_embeddings", True):
            out["lm_head.weight"] = [V, C]
        return out
    if mt not in ("llama", "mistral", "qwen2", "mixtral"):
        raise SystemExit(f"test_export_hf.py: model_type {mt} not covered")
    C, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    F = cfg["intermediate_size"]
    qkv_bias = mt == "qwen2" or cfg.get("attention_bias", False)
    out["model.embed_tokens.weight"] = [V, C]
    for i in range(L):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = [C]
        out[p + "post_attention_layernorm.weight"] = [C]
        for n, rows, cols in [("q_proj", H * D, C), ("k_proj", KV * D, C), ("v_proj", KV * D, C), ("o_proj", C, H * D)]:
            out[p + f"self_attn.{n}.weight"] = [rows, cols]
            if qkv_bias and (n != "o_proj" or mt != "qwen2"):
                out[p + f"self_attn.{n}.bias"] = [rows]
        if mt != "mixtral":
            for n, rows, cols in [("gate_proj", F, C), ("up_proj", F, C), ("down_proj", C, F)]:
                out[p + f"mlp.{n}.weight"] = [rows, cols]
        elif layout == "fused":
            E = cfg["num_local_experts"]
            out[p + "mlp.gate.weight"] = [E, C]
            out[p + "mlp.experts.gate_up_proj"] = [E, 2 * F, C]
            out[p + "mlp.experts.down_proj"] = [E, C, F]
        else:
            E = cfg["num_local_experts"]
            out[p + "block_sparse_moe.gate.weight"] = [E, C]
            for e in range(E):
                for n, rows, cols in [("w1", F, C), ("w2", C, F), ("w3", F, C)]:
                    out[p + f"block_sparse_moe.experts.{e}.{n}.weight"] = [rows, cols]
    out["model.norm.weight"] = [C]
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = [V, C]
    return out


def to_per_expert(w):
    """{name: FP32 tensor} with fused expert tensors split into Mixtral's per-expert names."""
    out = {}
    for name, t in w.items():
        m = re.fullmatch(r"(model\.layers\.\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|gate\.weight)", name)
        if not m:
            out[name] = t
        elif m.group(2) == "gate.weight":
            out[m.group(1) + ".block_sparse_moe.gate.weight"] = t
        elif m.group(2) == "experts.gate_up_proj":
            F = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.block_sparse_moe.experts.{e}.w1.weight"] = t[e, :F]
                out[f"{m.group(1)}.block_sparse_moe.experts.{e}.w3.weight"] = t[e, F:]
        else:
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.block_sparse_moe.experts.{e}.w2.weight"] = t[e]
    return out


def to_fused(w):
    """Mixtral's per-expert names stacked into transformers 5's fused tensors."""
    out, experts = {}, {}
    for name, t in w.items():
        m = re.fullmatch(r"(model\.layers\.\d+)\.block_sparse_moe\.(gate\.weight|experts\.(\d+)\.(w[123])\.weight)", name)
        if not m:
            out[name] = t
        elif m.group(2) == "gate.weight":
            out[m.group(1) + ".mlp.gate.weight"] = t
        else:
            experts.setdefault(m.group(1), {})[(int(m.group(3)), m.group(4))] = t
    for p, ex in experts.items():
        E = 1 + max(e for e, _ in ex)
        out[p + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([ex[(e, "w1")], ex[(e, "w3")]]) for e in range(E)])
        out[p + ".mlp.experts.down_proj"] = torch.stack([ex[(e, "w2")] for e in range(E)])
    return out


# ---- E4M3 (OCP FP8, max 448, no infinities; 0x7F/0xFF NaN) ----------------------------------
def e4m3_value(c):
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -v if s else v


E4M3_POS = np.array([e4m3_value(c) for c in range(127)])  # codes 0..126, increasing
E4M3_ALL = np.array([e4m3_value(c) if (c & 127) != 127 else np.nan for c in range(256)], dtype=np.float64)


def nearest_e4m3(y):
    """The E4M3 value nearest to each y (float64 array), ties to the even code, saturating at 448."""
    a = np.minimum(np.abs(y), 448.0)
    hi = np.clip(np.searchsorted(E4M3_POS, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - E4M3_POS[lo], E4M3_POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(y) * E4M3_POS[pick]


def check_fp8(name, x, codes, scales):
    """x [..., R, C] FP32 source; codes the stored E4M3 codes; scales the stored weight_scale_inv."""
    R, C = x.shape[-2], x.shape[-1]
    BR, BC = -(-R // BLOCK), -(-C // BLOCK)
    if not check(list(scales.shape) == list(x.shape[:-2]) + [BR, BC], f"{name}: scale shape {list(scales.shape)}"):
        return
    x3 = x.reshape(-1, R, C)
    s3 = scales.reshape(-1, BR, BC)
    deq_ok = codes_ok = scale_ok = True
    decoded = torch.from_numpy(E4M3_ALL[codes.numpy().astype(np.int64)]).reshape(x3.shape)
    for l in range(x3.shape[0]):
        for br in range(BR):
            for bc in range(BC):
                blk = x3[l, br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK]
                amax = blk.abs().max()
                scale = torch.tensor(448.0, dtype=torch.float32) / amax if amax > 0 else torch.tensor(1.0)
                inv = (torch.tensor(1.0, dtype=torch.float32) / scale).float()
                scale_ok &= bool(s3[l, br, bc] == inv)
                y = (blk * scale).double().numpy()  # FP32 product, as the exporter's
                want = nearest_e4m3(y)
                got = decoded[l, br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK].numpy()
                codes_ok &= bool(np.array_equal(got, want))
                err = np.abs(got * float(s3[l, br, bc]) - blk.double().numpy())
                bound = float(s3[l, br, bc]) * np.maximum(np.abs(y) * 2.0 ** -4, 2.0 ** -10) * (1 + 1e-6) + 1e-30
                deq_ok &= bool(np.all(err <= bound))
    check(scale_ok, f"{name}: weight_scale_inv != 1 / (448 / amax) per 128x128 block")
    check(codes_ok, f"{name}: E4M3 codes are not the nearest-even values of weight x scale")
    check(deq_ok, f"{name}: dequantised weights outside the E4M3 rounding bound")


def forward_loss(cfg, got, shard, T=16):
    """The reference model's loss on the shard's first T + 1 tokens, from the export alone."""
    w = {}
    for n, t in got.items():
        if n.endswith("_scale_inv"):
            continue
        x = as_f32(t).double()
        if t[0] == "F8_E4M3":
            sname = n[:-len("weight")] + "weight_scale_inv" if n.endswith(".weight") else n + "_scale_inv"
            s = as_f32(got[sname]).double()
            x = torch.from_numpy(E4M3_ALL[t[2].astype(np.int64)]).reshape(t[1])
            R, C = x.shape[-2], x.shape[-1]
            s = s.repeat_interleave(BLOCK, dim=-2)[..., :R, :].repeat_interleave(BLOCK, dim=-1)[..., :C]
            x = x * s
        w[n] = x
    raw = np.fromfile(shard, dtype=np.uint16, offset=256 * 4)[:T + 1].astype(np.int64)
    tok, tgt = torch.from_numpy(raw[:T]).view(1, T), torch.from_numpy(raw[1:]).view(1, T)
    with torch.no_grad():
        logits = parity.gpt2_forward(cfg, w, tok) if cfg["model_type"] == "gpt2" else parity.llama_forward(cfg, w, tok)
        return float(torch.nn.functional.cross_entropy(logits.view(T, -1), tgt.view(-1)))


PROJ = re.compile(r".*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)\.weight|.*\.experts\.(gate_up_proj|down_proj)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("exported")
    ap.add_argument("--layout", choices=["per-expert", "fused"], default="per-expert")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--rounded-out")
    ap.add_argument("--forward", nargs=3, metavar=("SHARD", "LOSS", "TOL"))
    a = ap.parse_args()

    own = json.load(open(os.path.join(a.ckpt, "config.json")))
    cfg = json.load(open(os.path.join(a.exported, "config.json")))
    for k, v in own.items():
        if k != "torch_dtype":
            check(cfg.get(k) == v, f"config.json '{k}': {cfg.get(k)!r}, the checkpoint has {v!r}")
    check(cfg.get("torch_dtype") == ("float32" if a.dtype == "f32" else "bfloat16"), f"torch_dtype {cfg.get('torch_dtype')}")

    ck = {n: as_f32(t) for n, t in read_file(os.path.join(a.ckpt, "model.safetensors")).items()}
    canon = to_per_expert(ck)
    src = to_fused(canon) if a.layout == "fused" else canon
    if a.rounded_out:  # the checkpoint's own names, each value rounded to BF16 by torch
        blobs, header, off = [], {"__metadata__": {"format": "pt"}}, 0
        for n, t in ck.items():
            b = t.to(torch.bfloat16).to(torch.float32).contiguous().numpy().tobytes()
            header[n] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        open(a.rounded_out, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

    got = read_dir(a.exported)
    want = expected_shapes(cfg, a.layout)
    check(set(src) == set(want), f"the checkpoint's tensors are not the family's: {sorted(set(src) ^ set(want))[:6]}")
    scales = {n for n in got if n.endswith("_scale_inv")}
    names = set(got) - scales
    check(names == set(want), f"exported names differ from the family's: missing {sorted(set(want) - names)[:4]}, "
          f"unexpected {sorted(names - set(want))[:4]}")
    vdtype = "F32" if a.dtype == "f32" else "BF16"
    quantised = []
    for n in sorted(names & set(want)):
        dt, shape, arr = got[n]
        check(shape == want[n], f"{n}: shape {shape}, expected {want[n]}")
        q = a.fp8 and PROJ.fullmatch(n) is not None
        check(dt == ("F8_E4M3" if q else vdtype), f"{n}: dtype {dt}, expected {'F8_E4M3' if q else vdtype}")
        if shape != want[n] or n not in src:
            continue
        x = src[n].float()
        if dt == "F8_E4M3":
            sname = n[:-len("weight")] + "weight_scale_inv" if n.endswith(".weight") else n + "_scale_inv"
            if check(sname in got and got[sname][0] == "F32", f"{n}: no F32 {sname}"):
                check_fp8(n, x, torch.from_numpy(arr), as_f32(got[sname]))
            quantised.append(n)
        elif dt == "F32":
            check(torch.equal(as_f32(got[n]).view(torch.int32), x.contiguous().view(torch.int32)), f"{n}: F32 values differ")
        else:
            want_bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            check(np.array_equal(arr.reshape(want_bits.shape), want_bits), f"{n}: BF16 values are not torch's rounding")
    check(len(scales) == len(quantised), f"{len(scales)} scale tensors for {len(quantised)} FP8 weights")
    if a.fp8:
        qc = cfg.get("quantization_config") or {}
        check({k: qc.get(k) for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} ==
              {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
              f"quantization_config {qc}")
        skip = qc.get("modules_to_not_convert") or []
        check("lm_head" in skip, "modules_to_not_convert lacks lm_head")
        check(not any(n.rsplit(".", 1)[0] in skip for n in quantised), "a quantised module in modules_to_not_convert")
        check(len(quantised) > 0, "hf-fp8 quantised nothing")
    else:
        check("quantization_config" not in cfg, "quantization_config in an unquantised export")
    if a.forward:
        loss, want, tol = forward_loss(cfg, got, a.forward[0]), float(a.forward[1]), float(a.forward[2])
        check(abs(loss - want) <= tol * abs(want), f"reference forward of the export: loss {loss:.6f}, "
              f"deepwell eval of the checkpoint {want:.6f} (relative tolerance {tol})")
        print(f"reference forward of {a.exported}: loss {loss:.6f} vs {want:.6f}")
    print(f"{'ok' if not FAILS else 'FAIL'}: {a.exported}: {len(names)} tensors ({len(quantised)} FP8), "
          f"{cfg['model_type']}, {a.layout if 'mixtral' == cfg['model_type'] else 'dense'}, {vdtype}")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
