"""engine.py — compile_graph(): a Graph + plan + precision policy -> an Engine (dw_compiled run by a
dw_engine on the context's device) with its weights; the engine's low-level calls for custom
loops (forward, forward_backward, step, state_dict, generate)."""
import ctypes
import json
import os
import tempfile

import numpy as np

from . import _structs as S
from ._core import Handle, ctx_of
from ._lib import c_free, cstr, lib, take_string, text

POOLS = ("weights", "grads", "optimizer", "activations", "workspace")
LAYOUTS = {"as_loaded": 0, "fused": 1, "per_expert": 2}


class Policy(Handle):
    """A precision policy (dw_policy): a default recipe, ordered rules, the safe fallback."""

    _free = "dw_policy_free"

    def to_dict(self):
        return json.loads(self._string("dw_policy_to_json"))

    def __repr__(self):
        return "Policy(closed)" if self.closed else f"Policy({self.to_dict()})"


def make_policy(precision=None, fallback=None, policy=None, ctx=None):
    """A Policy from a recipe name ("bf16", "fp8_block", "mxfp8", "nvfp4", ...) with fallback
    "head" (or None: the LM head stays BF16), "safe" or "none", or from policy= a dict or a JSON
    file path ({"default":..., "fallback":"safe", "rules":[{"match":..., "op":..., "recipe":...,
    "bf16_passes": ["wgrad"]}]}: docs/precision.md; under fp8_block the MoE experts ("op":
    "moe_linear") keep their wgrad BF16 by default, and "bf16_passes": [] quantises it too).
    None when all are None (FP32 mode)."""
    ctx = ctx_of(ctx)
    if fallback not in (None, "safe", "head", "none"):
        raise ValueError(f"fallback must be 'safe', 'head', 'none' or None (head), got {fallback!r}")
    if policy is not None and (precision is not None or fallback is not None):
        raise ValueError("policy= replaces precision= and fallback=; give one or the other")
    h = ctypes.c_void_p()
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, dict):
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="deepwell-policy-", delete=False) as f:
            json.dump(policy, f)
        try:
            ctx.check(lib().dw_policy_load(ctx._h, cstr(f.name), ctypes.byref(h)))
        finally:
            os.unlink(f.name)
    elif policy is not None:
        ctx.check(lib().dw_policy_load(ctx._h, cstr(os.fspath(policy)), ctypes.byref(h)))
    elif precision is not None or fallback is not None:
        ctx.check(lib().dw_policy_from_precision(ctx._h, cstr(precision or "bf16"), fallback == "safe",
                                                 ctypes.byref(h)))
        if fallback is not None:
            ctx.check(lib().dw_policy_set_fallback(ctx._h, h, cstr(fallback)))
    else:
        return None
    return Policy(h.value, ctx)


def _tokens(a, name):
    """An int32 C-contiguous [B, T] array from a NumPy array, torch tensor or nested list."""
    if a is None:
        return None
    if hasattr(a, "detach"):  # torch
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{name} must be [batch, seq], got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.size and a.dtype.itemsize >= 4 and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"{name}: id {a.max() if a.max() >= 2**31 else a.min()} does not fit int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _iptr(a):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


class Engine(Handle):
    """A compiled program on a device, with its parameters, gradients and AdamW state."""

    _free = "dw_engine_free"

    def __init__(self, h, ctx, graph, program_h, policy_):
        super().__init__(h, ctx, keep=(graph, policy_))
        self.graph = graph
        self.policy = policy_
        self._program = program_h
        self.step_count = 0  # optimizer steps taken through step()

    def close(self):
        super().close()
        p, self._program = self._program, None
        if p:
            lib().dw_compiled_free(p)

    backend = property(lambda self: text(lib().dw_engine_backend(self._handle())))
    batch = property(lambda self: self.graph.batch)
    seq = property(lambda self: self.graph.seq)
    vocab = property(lambda self: self.graph.vocab)

    @property
    def precision(self):
        """The policy's default recipe, or "fp32" (no policy)."""
        return self.policy.to_dict().get("default", "bf16") if self.policy is not None else "fp32"

    @property
    def head_chunk(self):
        """Rows of logits the fused LM head holds at a time; 0 when the head and the loss are apart."""
        return lib().dw_compiled_head_chunk(self._program)

    @property
    def pool_bytes(self):
        """Planned bytes of the program's memory pools."""
        return {n: lib().dw_compiled_pool_bytes(self._program, i) for i, n in enumerate(POOLS)}

    def report(self):
        """The compile report: per node the recipe and kernel and why; per pool the bytes."""
        s = ctypes.c_void_p()
        self._ctx.check(lib().dw_compiled_report(self._ctx._h, self._program, ctypes.byref(s)))
        return take_string(s.value)

    # ---- weights -------------------------------------------------------------------------------
    def init_weights(self, seed=1337):
        self._ctx.check(lib().dw_engine_init_weights(self._handle(), int(seed)))

    def load_weights(self, path):
        """Hugging Face safetensors (a file, or a directory with model.safetensors or an index)."""
        self._ctx.check(lib().dw_engine_load_weights(self._handle(), cstr(os.fspath(path))))

    def save_weights(self, path, layout="as_loaded"):
        self._ctx.check(lib().dw_engine_save_weights_layout(self._handle(), cstr(os.fspath(path)), LAYOUTS[layout]))

    def save_optimizer(self, path):
        self._ctx.check(lib().dw_engine_save_optimizer(self._handle(), cstr(os.fspath(path))))

    def load_optimizer(self, path):
        self._ctx.check(lib().dw_engine_load_optimizer(self._handle(), cstr(os.fspath(path))))

    def param_names(self):
        L, h = lib(), self._handle()
        return [text(L.dw_engine_param_name(h, i)) for i in range(L.dw_engine_param_count(h))]

    def _shape(self, i):
        shp = (ctypes.c_int64 * 4)()
        nd = lib().dw_engine_param_shape(self._handle(), i, shp)
        return tuple(shp[:nd])

    def _read(self, fn, i):
        a = np.empty(self._shape(i), dtype=np.float32)
        self._ctx.check(fn(self._handle(), i, a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return a

    def state_dict(self, torch_tensors=None):
        """{name: FP32 values} in Deepwell's names and layouts (linear weights out x in), as torch
        tensors when torch is importable (or torch_tensors=True), else NumPy arrays."""
        conv = _to_torch if (torch_tensors or (torch_tensors is None and _have_torch())) else (lambda a: a)
        return {n: conv(self._read(lib().dw_engine_param_read, i)) for i, n in enumerate(self.param_names())}

    def grads(self):
        """{name: FP32 gradient} (NumPy), as accumulated by forward_backward."""
        return {n: self._read(lib().dw_engine_grad_read, i) for i, n in enumerate(self.param_names())}

    def load_state_dict(self, sd, strict=True):
        """Writes {name: array or tensor} into the parameters (shapes checked; with strict, every
        parameter must be given and nothing else)."""
        names = self.param_names()
        if strict:
            missing, extra = set(names) - set(sd), set(sd) - set(names)
            if missing or extra:
                raise KeyError(f"load_state_dict: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
        for i, n in enumerate(names):
            if n not in sd:
                continue
            v = sd[n]
            if hasattr(v, "detach"):
                v = v.detach().cpu().float().numpy()
            a = np.ascontiguousarray(v, dtype=np.float32)
            if a.shape != self._shape(i):
                raise ValueError(f"load_state_dict: '{n}' has shape {a.shape}, the engine's is {self._shape(i)}")
            self._ctx.check(lib().dw_engine_param_write(self._handle(), i,
                                                        a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))

    # ---- compute -------------------------------------------------------------------------------
    def forward(self, x, y=None, logits=False):
        """The mean cross-entropy of next-token targets y (None: no loss) for tokens x [B, T];
        with logits=True returns (loss, logits [B, T, V] float32)."""
        x, y = _tokens(x, "x"), _tokens(y, "y")
        if y is not None and y.shape != x.shape:
            raise ValueError(f"targets shape {y.shape} differs from inputs {x.shape}")
        B, T = x.shape
        out = np.empty((B, T, self.vocab), dtype=np.float32) if logits else None
        loss = ctypes.c_double()
        self._ctx.check(lib().dw_engine_forward(self._handle(), _iptr(x), _iptr(y), B, T,
                                                out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if logits else None,
                                                ctypes.byref(loss) if y is not None else None))
        lv = loss.value if y is not None else None
        return (lv, out) if logits else lv

    def __call__(self, x):
        """The logits [B, T, V] of tokens x, as a torch tensor when x is one, else NumPy; for a
        feed-forward graph (dw.optimize of an nn.Sequential) forward_float(x)."""
        if self.graph.input_width:
            return self.forward_float(x)
        _, out = self.forward(x, logits=True)
        return _to_torch(out) if hasattr(x, "detach") else out

    def forward_float(self, x):
        """A feed-forward graph's output for float activations x [..., C_in] (NumPy or torch, any
        floating dtype, any number of rows: run in slices of the graph's batch): [..., C_out] of
        x's type and dtype (dw_engine_forward_float)."""
        from .floats import float_rows

        rows, back = float_rows(x, self.graph.input_width, self.graph.output_width)
        cap = self.graph.batch * self.graph.seq
        out = np.empty((rows.shape[0], self.graph.output_width), dtype=np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        for lo in range(0, rows.shape[0], cap):
            a, y = rows[lo:lo + cap], out[lo:lo + cap]
            self._ctx.check(lib().dw_engine_forward_float(self._handle(), a.ctypes.data_as(fp), a.shape[0], 1,
                                                          y.ctypes.data_as(fp)))
        return back(out)

    def forward_backward(self, x, y, grad_scale=1.0):
        """Forward and backward; gradients of loss x grad_scale are added to the parameters'.
        Returns the loss."""
        x, y = _tokens(x, "x"), _tokens(y, "y")
        if y.shape != x.shape:
            raise ValueError(f"targets shape {y.shape} differs from inputs {x.shape}")
        loss = ctypes.c_double()
        self._ctx.check(lib().dw_engine_forward_backward(self._handle(), _iptr(x), _iptr(y), x.shape[0], x.shape[1],
                                                         float(grad_scale), ctypes.byref(loss)))
        return loss.value

    def zero_grad(self):
        self._ctx.check(lib().dw_engine_zero_grad(self._handle()))

    def step(self, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0, step=None):
        """One AdamW step (step: 1-based number for bias correction; default the next). Returns
        the gradient norm before clipping."""
        o = S.AdamwOpts.new()
        lib().dw_adamw_opts_init(ctypes.byref(o), ctypes.sizeof(o))
        o.lr, (o.beta1, o.beta2), o.eps, o.weight_decay, o.clip = lr, betas, eps, weight_decay, clip
        n = self.step_count + 1 if step is None else int(step)
        norm = ctypes.c_double()
        self._ctx.check(lib().dw_engine_step(self._handle(), ctypes.byref(o), n, ctypes.byref(norm)))
        self.step_count = n
        return norm.value

    def generate(self, prompt, n, temperature=0.8, top_k=0, seed=1337):
        """prompt (a list of ids) followed by n sampled tokens (temperature 0: greedy)."""
        p = [int(t) for t in prompt]
        if not p:
            raise ValueError("generate: the prompt needs at least one token")
        buf = (ctypes.c_int32 * (len(p) + int(n)))(*p)
        rng = ctypes.c_uint64(int(seed))
        self._ctx.check(lib().dw_engine_generate(self._handle(), buf, len(p), int(n), float(temperature), int(top_k),
                                                 ctypes.byref(rng)))
        return list(buf)

    def sample(self, prompt, n=64, temperature=0.8, top_k=0, seed=1337, tokenizer=None):
        """Text: prompt (text, encoded with `tokenizer`, or a list of ids) followed by n sampled
        tokens, decoded with `tokenizer` — a dw.Tokenizer, "bytes", or a tokenizer.json / Hugging
        Face model directory (the one deepwell.prepare tokenised the data with); None: the one the
        model came with (Graph.tokenizer: its model directory's or checkpoint's), else bytes. Ids
        past the tokenizer's vocabulary (padded rows) decode as U+FFFD."""
        from .tokenizer import Tokenizer

        if tokenizer is None:
            tokenizer = self.graph.tokenizer or "bytes"
        tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
        ids = tok.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        vocab = self.graph.vocab
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ValueError(f"sample: prompt id {bad} is outside the model's vocabulary [0, {vocab}) "
                             f"(tokenizer {tok.name})")
        return tok.decode(self.generate(ids, n, temperature, top_k, seed), errors="replace")

    def __repr__(self):
        if self.closed:
            return "Engine(closed)"
        return (f"Engine(backend={self.backend!r}, model_type={self.graph.model_type!r}, params={self.graph.params}, "
                f"batch={self.batch}, seq={self.seq}, precision={self.precision!r})")


def _have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def _to_torch(a):
    import torch

    return torch.from_numpy(a)


RECOMPUTE = ("none", "selective", "full")  # dw_recompute's order


def _recompute_opts(recompute):
    """recompute as (dw_recompute, recompute_blocks): None (the plan's, else none), "none",
    "selective", "full" or a block count N >= 1 (full recompute of the first N blocks)."""
    if recompute is None:
        return 0, 0
    if isinstance(recompute, str) and recompute in RECOMPUTE:
        return RECOMPUTE.index(recompute), 0
    if isinstance(recompute, int) and not isinstance(recompute, bool) and recompute >= 1:
        return RECOMPUTE.index("full"), recompute
    raise ValueError(f"recompute must be None, 'none', 'selective', 'full' or a block count >= 1, got {recompute!r}")


def compile_graph(ir, plan=None, precision=None, fallback=None, policy=None, weights="auto", seed=1337, device=None,
                  target=None, sm=0, fuse=None, cuda_graphs=None, fused_head=None, head_chunk=None, recompute=None,
                  ctx=None):
    """An Engine for the Graph `ir` (dw.compile, in entry.py, takes any model). plan: a Plan (one
    GPU) or None; precision/fallback or policy (dict, path, Policy): the recipes (none: FP32 on the CPU,
    BF16 on CUDA); weights: "auto" (the graph's model weights if it has them, else random from
    seed), "random", None (zeros), or a safetensors path; device: "cpu", "cuda" or "auto" (default:
    the graph's context); target/sm: compile for another backend or compute capability;
    fused_head: the LM head and the loss as one op over chunks of head_chunk rows (None: the
    compiler's) that never holds the B x T x V logits (`deepwell train`'s default; None: the library's default, DW_FUSED_HEAD; such an
    engine trains, but forward(logits=True) and sampling are refused); recompute: "selective" (the
    norms feeding linear layers and the MLP activations run again in the backward), "full" (every
    block's forwards again), a block count N (the first N blocks, full), "none" or None (the
    plan's, else none) — the same values bit for bit, less activation memory."""
    ctx = ctx_of(ctx, device) if (ctx is not None or device is not None) else ir._ctx
    pol = make_policy(precision, fallback, policy, ctx)
    if pol is None and ctx.device == "cuda":
        pol = make_policy("bf16", None, None, ctx)
    o = S.CompileOpts.new()
    lib().dw_compile_opts_init(ctypes.byref(o), ctypes.sizeof(o))
    if target is not None:
        o.device = {"cpu": 0, "cuda": 1, "auto": 2}[target]
    o.sm = int(sm)
    if fuse is not None:
        o.fuse = bool(fuse)
    if fused_head is not None:
        o.fused_head = bool(fused_head)
    if head_chunk is not None:
        o.head_chunk = int(head_chunk)
    o.recompute, o.recompute_blocks = _recompute_opts(recompute)
    prog = ctypes.c_void_p()
    ctx.check(lib().dw_compile(ctx._h, ir._handle(), plan._handle() if plan is not None else None,
                               pol._handle() if pol is not None else None, ctypes.byref(o), ctypes.byref(prog)))
    eo = S.EngineOpts.new()
    lib().dw_engine_opts_init(ctypes.byref(eo), ctypes.sizeof(eo))
    if cuda_graphs is not None:
        eo.record = bool(cuda_graphs)
    h = ctypes.c_void_p()
    st = lib().dw_engine_create(ctx._h, prog, ctypes.byref(eo), ctypes.byref(h))
    if st != 0:
        lib().dw_compiled_free(prog)
        ctx.check(st)
    e = Engine(h.value, ctx, ir, prog.value, pol)
    if weights == "auto":
        if ir.weights:
            e.load_weights(ir.weights)
        else:
            e.init_weights(seed)
    elif weights == "random":
        e.init_weights(seed)
    elif weights is not None:
        e.load_weights(weights)
    return e


def tokenize(text_, tokenizer="bytes", vocab=256, ctx=None):
    """Text -> ids with a built-in tokenizer: "bytes" (byte-level) or "ids" (space-separated)."""
    ctx = ctx_of(ctx)
    ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_int64()
    ctx.check(lib().dw_tokenize(ctx._h, cstr(tokenizer), text_.encode(), int(vocab), ctypes.byref(ids),
                                ctypes.byref(n)))
    try:
        return [ids[i] for i in range(n.value)]
    finally:
        c_free(ctypes.cast(ids, ctypes.c_void_p))


def detokenize(ids, tokenizer="bytes"):
    """ids -> text with a built-in tokenizer (bytes: ids above 255 as "<id>")."""
    buf = (ctypes.c_int32 * len(ids))(*[int(i) for i in ids])
    p = lib().dw_detokenize(cstr(tokenizer), buf, len(ids))
    if not p:
        raise MemoryError("detokenize: out of memory")
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        c_free(p)
