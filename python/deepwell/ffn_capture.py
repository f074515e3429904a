"""ffn_capture.py — feed-forward torch modules (nn.Sequential of linears, activations and norms,
residual adds, nested modules; no token embedding) -> a feed-forward graph (include/deepwell.h:
dw_graph_input_width) whose input is a float activation, through torch.fx.

Mapped: nn.Linear (with or without bias) -> linear; nn.GELU / F.gelu -> gelu_erf (approximate
'none') or gelu (the tanh form); nn.SiLU / F.silu -> silu; nn.ReLU / F.relu / .relu() -> relu;
nn.LayerNorm (one normalised dimension; without affine parameters the graph gets ones and zeros)
-> layernorm; an RMSNorm-like module (one 1-D weight, no children; its eps or variance_epsilon)
-> rmsnorm; `a + b` of two activations of one width -> add; nn.Identity and nn.Dropout (the
forward of eval mode) pass their input on. Anything else is refused naming the first node that is
not mapped. The graph is row-wise: it is built for `rows` rows (B x T of the caller folded into
one dimension, seq 1), and its nodes and parameters carry the module's own names ("0", "0.weight").
The reading is checked: on a random input the captured graph's FP32 output must equal the
module's, else the capture is refused with both numbers. Not the decoder LMs (fx_capture.py).
"""
import json
import operator

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .fx_capture import CaptureError, _is_rms

ACTS = {nn.SiLU: "silu", nn.ReLU: "relu"}
PASS = (nn.Identity, nn.Dropout)
FUNCS = {F.silu: "silu", F.relu: "relu", torch.relu: "relu", torch.nn.functional.gelu: "gelu"}
ADDS = (operator.add, operator.iadd, torch.add)
SUPPORTED = ("nn.Linear, nn.GELU, nn.SiLU, nn.ReLU, nn.LayerNorm, an RMSNorm (one 1-D weight), nn.Identity, "
             "nn.Dropout, F.gelu/F.silu/F.relu, and a + b of two activations")


def is_feedforward(module):
    """Whether `module` is a plain torch module for this capture: no transformers config and no
    nn.Embedding (those are language models: fx_capture / torch_capture)."""
    return (isinstance(module, nn.Module) and getattr(module, "config", None) is None
            and not any(isinstance(m, nn.Embedding) for m in module.modules()))


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return _is_rms(m) or super().is_leaf_module(m, qualname)


def _gelu_op(approximate, where):
    if approximate == "none":
        return "gelu_erf"
    if approximate == "tanh":
        return "gelu"
    raise CaptureError(f"{where}: GELU approximate={approximate!r} is neither 'none' nor 'tanh'")


def _node_desc(n):
    t = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return f"node '{n.name}' ({n.op} {t})"


def _op_of(n, mods):
    """(op, module or None) of one fx node: op is an IR op name, "pass", or raises naming it."""
    if n.op == "call_module":
        m = mods[n.target]
        if isinstance(m, nn.Linear):
            return "linear", m
        if isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) != 1:
                raise CaptureError(f"{_node_desc(n)}: LayerNorm over {tuple(m.normalized_shape)}; Deepwell "
                                   f"normalises the last dimension only")
            return "layernorm", m
        if _is_rms(m):
            return "rmsnorm", m
        if isinstance(m, nn.GELU):
            return _gelu_op(getattr(m, "approximate", "none"), _node_desc(n)), m
        for cls, op in ACTS.items():
            if isinstance(m, cls):
                return op, m
        if isinstance(m, PASS):
            return "pass", m
        raise CaptureError(f"{_node_desc(n)} calls {type(m).__name__}, which Deepwell does not map (supported: "
                           f"{SUPPORTED})")
    if n.op == "call_function":
        if n.target in ADDS:
            return "add", None
        if n.target in FUNCS:
            op = FUNCS[n.target]
            if op == "gelu":
                op = _gelu_op(n.kwargs.get("approximate", "none"), _node_desc(n))
            return op, None
    if n.op == "call_method" and n.target in ("relu",):
        return "relu", None
    raise CaptureError(f"{_node_desc(n)} is not an op Deepwell maps onto its IR (supported: {SUPPORTED})")


def _tensor_args(n, op):
    """The node's activation inputs; refuses extra arguments the op would ignore."""
    args = [a for a in n.args if isinstance(a, fx.Node)]
    want = 2 if op == "add" else 1
    extra = [a for a in n.args if not isinstance(a, fx.Node)]
    if len(args) != want or (op == "add" and (extra or n.kwargs)):
        raise CaptureError(f"{_node_desc(n)}: expected {want} activation input(s), got {len(args)} and "
                           f"{extra or dict(n.kwargs) or 'nothing else'} (a + b of two activations only)")
    return args


def read(module):
    """The module as [(op, name, [input names], module)], the input width and the output name,
    after torch.fx traced it; CaptureError naming the first node that does not map."""
    mods = dict(module.named_modules())
    try:
        g = _Tracer().trace(module)
    except Exception as e:  # data-dependent control flow and the like
        raise CaptureError(f"torch.fx cannot trace {type(module).__name__}: {e}") from None
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise CaptureError(f"the module's forward takes {len(placeholders)} inputs "
                           f"({', '.join(p.name for p in placeholders)}); a feed-forward network takes one")
    alias = {placeholders[0]: "input"}  # fx node -> the graph tensor holding its value
    steps, width, used = [], {"input": None}, {"input"}
    out = None
    for n in g.nodes:
        if n.op in ("placeholder",):
            continue
        if n.op == "get_attr":
            raise CaptureError(f"{_node_desc(n)} reads a tensor attribute directly; only modules' parameters "
                               f"through the mapped modules are supported ({SUPPORTED})")
        if n.op == "output":
            res = n.args[0]
            if not isinstance(res, fx.Node) or res not in alias:
                raise CaptureError(f"the module returns {type(res).__name__}, not one tensor")
            out = alias[res]
            continue
        op, m = _op_of(n, mods)
        ins = [alias[a] for a in _tensor_args(n, op)]
        if op == "pass":
            alias[n] = ins[0]
            continue
        name = n.target if n.op == "call_module" else n.name
        while name in used:  # a module called twice: its second node gets fx's unique name
            name = n.name if name != n.name else name + "_"
        used.add(name)
        w_in = width[ins[0]]
        if op == "linear":
            need = m.in_features
        elif op in ("layernorm", "rmsnorm"):
            need = (m.normalized_shape[0] if op == "layernorm" else next(m.parameters(recurse=False)).shape[0])
        else:
            need = None
        if op == "add" and width[ins[1]] != w_in:
            raise CaptureError(f"{_node_desc(n)} adds activations of {w_in} and {width[ins[1]]} features")
        if need is not None and w_in is not None and need != w_in:
            raise CaptureError(f"{_node_desc(n)} takes {need} features but its input '{ins[0]}' has {w_in}")
        if need is not None and w_in is None:  # the input's width, from its first reader that says
            for k in width:
                if width[k] is None:
                    width[k] = need
            w_in = need
        width[name] = m.out_features if op == "linear" else w_in
        alias[n] = name
        steps.append((op, name, ins, m))
    if width["input"] is None:
        raise CaptureError("no nn.Linear or norm says how many features the input has")
    if out == "input":
        raise CaptureError("the module returns its input unchanged")
    return steps, width, out


def _linear_params(name, m):
    ps = [(name + ".weight", m.weight, "normal")]
    if m.bias is not None:
        ps.append((name + ".bias", m.bias, "zeros"))
    return ps


def _norm_params(op, name, m):
    if op == "rmsnorm":
        (pn, p), = list(m.named_parameters(recurse=False))
        return [(f"{name}.{pn}", p, "ones")]
    C = m.normalized_shape[0]
    w = m.weight if m.weight is not None else torch.ones(C)
    b = m.bias if m.bias is not None else torch.zeros(C)
    return [(name + ".weight", w, "ones"), (name + ".bias", b, "zeros")]


def _eps(op, m):
    for a in ("eps", "variance_epsilon"):
        v = getattr(m, a, None)
        if isinstance(v, (int, float)):
            return float(v)
    return 1e-5 if op == "layernorm" else 1e-6


def build(module, rows):
    """(graph JSON text, {parameter name: FP32 numpy array}) of the module for `rows` rows."""
    steps, width, out = read(module)
    shape = lambda c: [rows, 1, c]  # noqa: E731
    tensors = [{"name": "input", "kind": "input", "dtype": "f32", "shape": shape(width["input"])}]
    nodes, values = [], {}
    for op, name, ins, m in steps:
        params = _linear_params(name, m) if op == "linear" else _norm_params(op, name, m) \
            if op in ("layernorm", "rmsnorm") else []
        for pn, p, init in params:
            if pn in values:
                raise CaptureError(f"parameter '{pn}' is used by two nodes (a shared module); Deepwell's graph "
                                   f"gives each node its own")
            values[pn] = np.ascontiguousarray(p.detach().cpu().float().numpy())
            t = {"name": pn, "kind": "param", "dtype": "f32", "shape": list(values[pn].shape), "init": init,
                 "decay": op == "linear" and pn.endswith(".weight")}
            if init == "normal":
                t["init_std"] = 0.02
            tensors.append(t)
        node = {"name": name, "op": op, "inputs": ins + [pn for pn, _, _ in params], "output": name,
                "shape": shape(width[name])}
        if op in ("layernorm", "rmsnorm"):
            node["attrs"] = {"eps": _eps(op, m)}
        nodes.append(node)
    doc = {"format": "deepwell-graph", "version": 2, "model_type": "feedforward", "batch": rows, "seq": 1,
           "model": {"summary": f"feed-forward {width['input']} -> {width[out]}, {len(nodes)} ops", "blocks": 0,
                     "vocab": 1, "max_seq": 1},
           "config": None, "roles": {"input": "input", "output": out}, "tensors": tensors, "nodes": nodes}
    return json.dumps(doc), values
