"""fx_capture.py — plain torch.nn.Modules (no transformers config) -> a model directory, through
torch.fx: the traced graph's leaf modules (nn.Embedding, nn.Linear, nn.LayerNorm, an RMSNorm-like
module with one 1-D weight) and functions are read as a GPT-2 block (LayerNorm, packed or separate
q/k/v, tanh-GELU MLP, learned positions) or a Llama block (RMSNorm, q/k/v with GQA, RoPE, SwiGLU);
the shapes give the config (heads from the (B, T, H, D) views, RoPE theta from the cos/sin or
inv_freq buffers; any MLP width, GQA group, tied or untied head) and the parameters are renamed
(and GPT-2's transposed to Conv1D) into Hugging Face names, with zero biases (and unit LayerNorm
weights) where the module has none but the config's block does. Parallel attention + MLP blocks
are refused naming the norm nodes. The reading is then checked: on a copy of the module with large random weights, the
captured model's loss on a random batch must equal the copy's, else the capture is refused with
both numbers. A node whose function is not one of the mapped ops is refused by name.
"""
import copy
import dis
import inspect
import json
import math
import os
import tempfile

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn

from . import safetensors

# functions and methods a supported module may use besides the leaf modules (by __name__)
ALLOWED = {
    "add", "iadd", "sub", "mul", "truediv", "floordiv", "matmul", "getitem", "getattr", "neg", "softmax", "gelu",
    "silu", "scaled_dot_product_attention", "cross_entropy", "cat", "transpose", "view", "reshape", "split", "chunk",
    "permute", "contiguous", "size", "float", "type_as", "to", "masked_fill", "tril", "ones", "arange", "cos", "sin",
    "sqrt", "rsqrt", "pow", "mean", "repeat_interleave", "expand", "unsqueeze", "flatten", "dropout", "where",
    "full", "zeros", "bool", "logical_not", "t", "long", "int", "view_as", "_assert", "eq", "le", "lt", "ge", "gt",
    "squeeze", "rms_norm", "dim", "numel", "clone", "detach", "reshape_as", "sum", "max", "log_softmax", "nll_loss",
}


class CaptureError(TypeError):
    pass


def _is_rms(m):
    own = list(m.parameters(recurse=False))
    return (not isinstance(m, (nn.LayerNorm, nn.Linear, nn.Embedding)) and len(own) == 1 and own[0].dim() == 1
            and not list(m.children()))


def _norm_weight(m):
    if isinstance(m, nn.LayerNorm):
        return m.weight if m.weight is not None else torch.ones(m.normalized_shape)
    return next(m.parameters(recurse=False))


def _norm_bias(m):
    return m.bias if m.bias is not None else torch.zeros(m.normalized_shape)


def _bias(m):
    """A linear's bias, zeros when it has none (a block whose config has biases where the module
    left some out computes the same with zeros there)."""
    return m.bias if m.bias is not None else torch.zeros(m.out_features)


def _check_sequential(norms, lin_nodes):
    """Refuses parallel attention + MLP blocks (GPT-J, GPT-NeoX, PaLM): one norm output read by
    the attention's and the MLP's projections, or the MLP's norm reading the block's input."""
    lin = set(lin_nodes)
    feeds = lambda n, names: any(_name(u) in names for u in n.users)  # noqa: E731
    for n, _ in norms:
        readers = [u for u in n.users if u in lin]
        attn = [r.name for r in readers if feeds(r, ("view", "reshape", "split", "chunk"))]  # q/k/v into heads
        mlp = [r.name for r in readers if feeds(r, ("gelu", "silu"))]  # an MLP's activation
        if attn and mlp:
            raise CaptureError(f"norm node '{n.name}' feeds the attention ({', '.join(attn)}) and the MLP "
                               f"({', '.join(mlp)}): a parallel attention + MLP block (GPT-J/PaLM style), which "
                               f"Deepwell's sequential GPT-2 and Llama blocks do not express")
    for (a, _), (b, _) in zip(norms[0::2], norms[1::2]):
        if a.args and b.args and a.args[0] is b.args[0]:
            raise CaptureError(f"norm nodes '{a.name}' and '{b.name}' read the same input '{a.args[0].name}': a "
                               f"parallel attention + MLP block (GPT-NeoX style), which Deepwell's sequential "
                               f"GPT-2 and Llama blocks do not express")


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, (nn.Linear, nn.Embedding, nn.LayerNorm)) or _is_rms(m) or super().is_leaf_module(m, qualname)

    def iter(self, obj):
        """`a, b, c = proxy` (q, k, v = qkv.split(...)): the count from the caller's
        UNPACK_SEQUENCE, found by byte offset (torch.fx's own lookup predates Python 3.11)."""
        frame = inspect.currentframe().f_back.f_back  # the user's frame, below Proxy.__iter__
        inst = next((i for i in dis.get_instructions(frame.f_code) if i.offset == frame.f_lasti), None)
        if inst is not None and inst.opname == "UNPACK_SEQUENCE":
            return (obj[i] for i in range(inst.argval))
        return super().iter(obj)


def _name(n):
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def trace(module):
    try:
        g = _Tracer().trace(module)
    except Exception as e:  # data-dependent control flow and the like
        raise CaptureError(f"torch.fx cannot trace {type(module).__name__}: {e}") from None
    return g


def _check_nodes(graph, mods):
    for n in graph.nodes:
        if n.op in ("call_function", "call_method"):
            name = _name(n)
            if name not in ALLOWED:
                raise CaptureError(f"node '{n.name}' ({n.op} {name}) is not an op Deepwell maps onto its "
                                   f"IR (supported: {', '.join(sorted(ALLOWED))} and the modules nn.Embedding, "
                                   f"nn.Linear, nn.LayerNorm, RMSNorm)")
            if name == "gelu" and n.kwargs.get("approximate", "none") != "tanh":
                raise CaptureError(f"node '{n.name}': GELU without approximate='tanh' (Deepwell's GPT-2 "
                                   f"block uses the tanh form, gelu_new)")
        elif n.op == "call_module" and not isinstance(mods[n.target], (nn.Linear, nn.Embedding, nn.LayerNorm)) \
                and not _is_rms(mods[n.target]):
            raise CaptureError(f"node '{n.name}' calls module {n.target} "
                               f"({type(mods[n.target]).__name__}), which Deepwell does not map")


def _heads(graph, width):
    """{H*D: (H, D)} of the 4-D (B, T, H, D) views and reshapes."""
    out = {}
    for n in graph.nodes:
        if n.op == "call_method" and _name(n) in ("view", "reshape"):
            shape = n.args[1:] if len(n.args) > 2 else (n.args[1] if len(n.args) > 1 else ())
            shape = shape if isinstance(shape, (tuple, list)) else ()
            if len(shape) == 4 and isinstance(shape[2], int) and isinstance(shape[3], int) and shape[2] > 0:
                out.setdefault(shape[2] * shape[3], (shape[2], shape[3]))
    return out


def _rope_theta(module, hd):
    """(theta, positions) from cos/sin buffers [P, HD] or an inv_freq buffer [HD/2], or (None, None)."""
    bufs = dict(module.named_buffers())
    cos = next((b for n, b in bufs.items() if n.split(".")[-1].startswith("cos") and b.dim() == 2), None)
    sin = next((b for n, b in bufs.items() if n.split(".")[-1].startswith("sin") and b.dim() == 2), None)
    if cos is not None and sin is not None and cos.shape[0] > 1 and hd >= 4:
        inv1 = math.atan2(float(sin[1, 1]), float(cos[1, 1]))
        return inv1 ** (-hd / 2), cos.shape[0]
    inv = next((b for n, b in bufs.items() if "inv_freq" in n and b.dim() == 1), None)
    if inv is not None and inv.numel() > 1:
        return float(inv[1]) ** (-hd / 2), None
    return None, None


def _round(x):
    return float(f"{x:.4g}")


def recognise(module):
    """(config dict, {HF name: tensor}) of a supported module; CaptureError otherwise."""
    mods = dict(module.named_modules())
    g = trace(module)
    _check_nodes(g, mods)
    calls = [(n, mods[n.target]) for n in g.nodes if n.op == "call_module"]
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    embs = [(n, m) for n, m in calls if isinstance(m, nn.Embedding)]
    norms = [(n, m) for n, m in calls if isinstance(m, nn.LayerNorm) or _is_rms(m)]
    lins = [m for n, m in calls if isinstance(m, nn.Linear)]
    silu_inputs = {a for n in g.nodes if _name(n) == "silu" for a in n.args if isinstance(a, fx.Node)}
    _check_sequential(norms, [n for n, m in calls if isinstance(m, nn.Linear)])
    tok = next((m for n, m in embs if placeholders and n.args[0] is placeholders[0]), None)
    if tok is None:
        raise CaptureError("no nn.Embedding applied to the module's first input (the token ids)")
    pos = [m for n, m in embs if m is not tok]
    V, C = tok.weight.shape
    head = lins[-1] if lins and lins[-1].out_features == V else None
    if head is None:
        raise CaptureError(f"the last nn.Linear is not an LM head to the {V}-token vocabulary")
    tied = head.weight is tok.weight
    gpt2 = all(isinstance(m, nn.LayerNorm) for _, m in norms)
    if len(norms) % 2 != 1 or (not gpt2 and any(isinstance(m, nn.LayerNorm) for _, m in norms)):
        raise CaptureError(f"{len(norms)} norm calls do not make blocks of two plus a final norm")
    L = (len(norms) - 1) // 2
    blk = lins[:-1]
    per = len(blk) // L if L else 0
    if not L or per * L != len(blk) or (gpt2 and per not in (4, 6)) or (not gpt2 and per != 7):
        raise CaptureError(f"{len(blk)} linear layers in {L} blocks do not match a GPT-2 block (4 or 6) "
                           f"or a Llama block (7)")
    heads = _heads(g, C)
    if C not in heads:
        raise CaptureError(f"no view/reshape to (B, T, H, D) with H x D = {C} tells the heads")
    H, D = heads[C]
    lin_nodes = [n for n, m in calls if isinstance(m, nn.Linear)]
    w = {}
    P = lambda t: t.detach().float().clone()  # noqa: E731
    if gpt2:
        if len(pos) != 1:
            raise CaptureError("a LayerNorm model needs one learned position nn.Embedding (GPT-2)")
        F_ = blk[per - 2].out_features
        cfg = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=V, n_embd=C, n_layer=L,
                   n_head=H, n_inner=F_, n_positions=pos[0].weight.shape[0], layer_norm_epsilon=norms[0][1].eps,
                   activation_function="gelu_new", tie_word_embeddings=tied)
        w["transformer.wte.weight"], w["transformer.wpe.weight"] = P(tok.weight), P(pos[0].weight)
        for l in range(L):
            p, ls = f"transformer.h.{l}.", blk[l * per:(l + 1) * per]
            if per == 6:  # separate q, k, v -> packed c_attn
                qkv_w = torch.cat([m.weight for m in ls[:3]], 0)
                qkv_b = torch.cat([_bias(m) for m in ls[:3]], 0)
                ls = [None] + ls[3:]
            else:
                qkv_w, qkv_b = ls[0].weight, _bias(ls[0])
            ln1, ln2 = norms[2 * l][1], norms[2 * l + 1][1]
            w.update({p + "ln_1.weight": P(_norm_weight(ln1)), p + "ln_1.bias": P(_norm_bias(ln1)),
                      p + "attn.c_attn.weight": P(qkv_w.T), p + "attn.c_attn.bias": P(qkv_b),
                      p + "attn.c_proj.weight": P(ls[1].weight.T), p + "attn.c_proj.bias": P(_bias(ls[1])),
                      p + "ln_2.weight": P(_norm_weight(ln2)), p + "ln_2.bias": P(_norm_bias(ln2)),
                      p + "mlp.c_fc.weight": P(ls[2].weight.T), p + "mlp.c_fc.bias": P(_bias(ls[2])),
                      p + "mlp.c_proj.weight": P(ls[3].weight.T), p + "mlp.c_proj.bias": P(_bias(ls[3]))})
        nf = norms[-1][1]
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = P(_norm_weight(nf)), P(_norm_bias(nf))
    else:
        if pos:
            raise CaptureError("an RMSNorm model with a learned position embedding is neither GPT-2 "
                               "nor Llama")
        kv = blk[1].out_features
        if kv % D or blk[2].out_features != kv:
            raise CaptureError(f"k/v projections of {kv} and {blk[2].out_features} features are not "
                               f"whole heads of {D}")
        theta, positions = _rope_theta(module, D)
        eps = next((getattr(norms[0][1], a) for a in ("eps", "variance_epsilon") if hasattr(norms[0][1], a)), 1e-5)
        # biases on some attention (or MLP) projections: all of them, zeros where the module has none
        attn_bias = any(blk[l * per + i].bias is not None for l in range(L) for i in range(4))
        mlp_bias = any(blk[l * per + i].bias is not None for l in range(L) for i in range(4, 7))
        cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=V, hidden_size=C,
                   num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=kv // D, head_dim=D,
                   intermediate_size=blk[4].out_features, max_position_embeddings=positions or 4096,
                   rms_norm_eps=float(eps), rope_theta=_round(theta) if theta else 10000.0, hidden_act="silu",
                   tie_word_embeddings=tied, attention_bias=attn_bias, mlp_bias=mlp_bias)
        w["model.embed_tokens.weight"] = P(tok.weight)
        for l in range(L):
            p, ls = f"model.layers.{l}.", blk[l * per:(l + 1) * per]
            nodes = lin_nodes[l * per:(l + 1) * per]
            g_i = 4 if nodes[4] in silu_inputs else 5  # the gate is the projection SiLU reads
            names = {0: "self_attn.q_proj", 1: "self_attn.k_proj", 2: "self_attn.v_proj", 3: "self_attn.o_proj",
                     g_i: "mlp.gate_proj", 9 - g_i: "mlp.up_proj", 6: "mlp.down_proj"}
            w[p + "input_layernorm.weight"] = P(_norm_weight(norms[2 * l][1]))
            w[p + "post_attention_layernorm.weight"] = P(_norm_weight(norms[2 * l + 1][1]))
            for i, n in names.items():
                w[p + n + ".weight"] = P(ls[i].weight)
                if (attn_bias if i < 4 else mlp_bias):
                    w[p + n + ".bias"] = P(_bias(ls[i]))
        w["model.norm.weight"] = P(_norm_weight(norms[-1][1]))
    if not tied:
        w["lm_head.weight"] = P(head.weight)
    return cfg, w


def _module_loss(module, x, y):
    """The module's mean next-token loss on (x, y): its own when forward takes targets, else the
    cross-entropy of the logits it returns."""
    nargs = len([p for p in inspect.signature(module.forward).parameters.values()
                 if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
    with torch.no_grad():
        out = module(x, y) if nargs >= 2 else module(x)
        if isinstance(out, (tuple, list)):
            out = next((o for o in out if torch.is_tensor(o) and o.dim() == 0), out[0])
        if out.dim() == 0:
            return float(out)
        return float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1)))


def _loud_copy(module, seed=1234):
    """A copy of module with large random parameters (matrices 0.15 N(0,1), norm weights around
    one, biases 0.3 N(0,1); tied ones stay tied), so that every path changes the loss visibly."""
    probe = copy.deepcopy(module)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in probe.named_parameters():
            r = torch.randn(p.shape, generator=gen)  # (a bias the module lacks stays absent: zeros)
            p.copy_(0.3 * r if name.endswith("bias") else 1 + 0.2 * r if p.dim() == 1 else 0.15 * r)
    return probe


def _verify(probe, cfg, w, seq_len):
    """Refuses unless the captured model computes probe's loss on a random batch."""
    from ._core import default_context
    from .engine import compile_graph
    from .graph import Graph, _capture_path

    with tempfile.TemporaryDirectory(prefix="deepwell-fx-check-") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        safetensors.write(os.path.join(d, "model.safetensors"), w)
        ctx = default_context()
        T = min(seq_len or 16, 16, cfg.get("n_positions") or cfg.get("max_position_embeddings"))
        g = Graph(_capture_path(ctx, d, 2, T, None), ctx, source=d, weights=d)
        e = compile_graph(g, ctx=ctx)
        rng = np.random.default_rng(0)
        x = rng.integers(0, cfg["vocab_size"], size=(2, T))
        y = rng.integers(0, cfg["vocab_size"], size=(2, T))
        probe.eval()
        ref = _module_loss(probe, torch.from_numpy(x).long(), torch.from_numpy(y).long())
        got = e.forward(x, y)
        e.close()
        g.close()
    if not abs(got - ref) <= 1e-4 * max(1.0, abs(ref)):
        raise CaptureError(f"it was read as a {cfg['model_type']} model ({json.dumps(cfg)}), but with random "
                           f"weights its loss on a random batch is {ref:.6f} and the captured model's {got:.6f}: "
                           f"some operation differs from that architecture")


def write_model_dir(module, out, seq_len=None):
    """Writes out/config.json and out/model.safetensors for a module recognise() maps, once a
    copy with large random weights showed the captured model computes the module's loss."""
    cfg, w = recognise(module)
    probe = _loud_copy(module)
    pcfg, pw = recognise(probe)
    _verify(probe, pcfg, pw, seq_len)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    safetensors.write(os.path.join(out, "model.safetensors"), w)
    return cfg
