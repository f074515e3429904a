"""plan.py — dw.autoplan(): a parallel plan (dw_plan) for a model, a machine and a job, with the
planner's predictions (memory per GPU, step time) and checks; dw.load_plan(), dw.single_plan()."""
import ctypes
import os

from . import _structs as S
from ._core import Handle, JsonDoc, ctx_of, raise_for
from ._lib import cstr, lib, text
from .graph import Graph


def recipe_id(name):
    r = ctypes.c_int()
    if not lib().dw_recipe_parse(cstr(name), ctypes.byref(r)):
        known = [text(lib().dw_recipe_name(i)) for i in range(9)]
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(known)}")
    return r.value


def recipe_name(r):
    return text(lib().dw_recipe_name(r))


class Plan(JsonDoc, Handle):
    """A plan: .summary, .layout, .info, .memory (bytes per GPU by kind), .cost (seconds),
    .checks, .runs_on_engine, .engine_memory/.engine_cost (one-GPU engine plans), .to_dict()."""

    _free, _to_json = "dw_plan_free", "dw_plan_to_json"

    def __init__(self, h, ctx, model=None, hw=None):
        super().__init__(h, ctx, keep=(hw,) if hw is not None else ())
        self.model = model

    def _get(self, fn, cls):
        o = cls.new()
        raise_for(getattr(lib(), fn)(self._handle(), ctypes.byref(o)))
        return o.as_dict()

    summary = property(lambda self: text(lib().dw_plan_summary(self._handle())))
    world_size = property(lambda self: lib().dw_plan_world_size(self._handle()))

    @property
    def layout(self):
        d = self._get("dw_plan_get_layout", S.PlanLayout)
        d["recipe"] = recipe_name(d["recipe"])
        return d

    @property
    def info(self):
        d = self._get("dw_plan_get_info", S.PlanInfo)
        d["recipe"] = recipe_name(d["recipe"])
        return d

    memory = property(lambda self: self._get("dw_plan_get_memory", S.PlanMem))
    cost = property(lambda self: self._get("dw_plan_get_cost", S.PlanCost))

    @property
    def checks(self):
        return self._get("dw_plan_get_checks", S.PlanChecks)

    @property
    def runs_on_engine(self):
        """(True, None) when one CUDA engine runs the plan as it is, else (False, reason)."""
        why = ctypes.c_char_p()
        ok = lib().dw_plan_runs_on_engine(self._handle(), ctypes.byref(why))
        return bool(ok), (None if ok else text(why.value))

    def _engine_get(self, fn, cls):
        o = cls.new()
        self._ctx.check(getattr(lib(), fn)(self._ctx._h, self._handle(), ctypes.byref(o)))
        return o.as_dict()

    @property
    def engine_memory(self):
        d = self._engine_get("dw_plan_get_engine_memory", S.PlanEngineMem)
        d["pool"] = dict(zip(("weights", "grads", "optimizer", "activations", "workspace"), list(d["pool"])))
        return d

    engine_cost = property(lambda self: self._engine_get("dw_plan_get_engine_cost", S.PlanEngineCost))

    def engine_policy(self):
        """The Policy the engine runs the plan's recipe with."""
        from .engine import Policy

        h = ctypes.c_void_p()
        self._ctx.check(lib().dw_plan_engine_policy(self._ctx._h, self._handle(), ctypes.byref(h)))
        return Policy(h.value, self._ctx)

    def __repr__(self):
        return "Plan(closed)" if self.closed else f"Plan({self.summary!r})"


def _model_source(ir):
    if isinstance(ir, Graph):
        if not ir.source:
            raise ValueError("this Graph has no source the planner can read (it was loaded from JSON)")
        return ir.source
    if isinstance(ir, (str, os.PathLike)):
        return os.fspath(ir)
    raise TypeError(f"model must be a dw.Graph, a preset name or a model directory, not {type(ir).__name__}")


def _job(seq_len, global_batch, precision, moe, mem_headroom, gemm_rates, top_k=1):
    j = S.PlanJob.new()
    lib().dw_plan_job_init(ctypes.byref(j), ctypes.sizeof(j))
    j.seq, j.global_batch = int(seq_len), int(global_batch)
    j.recipe = recipe_id(precision)
    moe = dict(moe or {})
    unknown = set(moe) - {"experts", "top_k", "capacity_factor"}
    if unknown:
        raise ValueError(f"moe: unknown keys {sorted(unknown)} (experts, top_k, capacity_factor)")
    j.moe_experts = int(moe.get("experts", 0))
    j.moe_top_k = int(moe.get("top_k", 0))
    j.moe_capacity = float(moe.get("capacity_factor", 0))
    j.mem_headroom = float(mem_headroom or 0)
    j.top_k = top_k
    keep = cstr(gemm_rates)
    j.gemm_rates = keep
    return j, keep


ARCH_PRESETS = {"hopper": "h100-sxm", "blackwell": "b200"}


def autoplan(ir, hw=None, seq_len=None, global_batch=None, precision="bf16", moe=None, mem_headroom=None,
             gemm_rates=None, arch=None, ctx=None):
    """The planner's best plan for training `ir` (a Graph, preset name or model directory) on
    `hw` (a Hardware; None: dw.probe()) at seq_len tokens (default: the graph's) and
    global_batch sequences per step (default: the graph's batch). moe: {"experts", "top_k",
    "capacity_factor"} overriding the config's; arch ("hopper", "blackwell") without hw plans for
    one node of that preset (h100-sxm, b200). Raises UnsupportedError when nothing fits."""
    from .hardware import hardware, probe

    ctx = ctx_of(ctx)
    model = _model_source(ir)
    if arch is not None and arch not in ARCH_PRESETS:
        raise ValueError(f"arch must be one of {', '.join(ARCH_PRESETS)}, got {arch!r}")
    if hw is None:
        hw = hardware(ARCH_PRESETS[arch], ctx=ctx) if arch else probe(ctx)
    if seq_len is None or global_batch is None:
        if not isinstance(ir, Graph):
            raise ValueError("autoplan: seq_len and global_batch are required when the model is not a dw.Graph")
        seq_len = seq_len or ir.seq
        global_batch = global_batch or ir.batch
    job, _keep = _job(seq_len, global_batch, precision, moe, mem_headroom, gemm_rates)
    h = ctypes.c_void_p()
    ctx.check(lib().dw_autoplan(ctx._h, cstr(model), hw._handle(), ctypes.byref(job), ctypes.byref(h)))
    return Plan(h.value, ctx, model, hw)


def load_plan(path, ir, hw, seq_len, global_batch, precision="bf16", moe=None, ctx=None):
    """A plan from a JSON file (`deepwell plan --json` or one plan object), checked and predicted
    for the model, machine and job as autoplan would."""
    ctx = ctx_of(ctx)
    model = _model_source(ir)
    job, _keep = _job(seq_len, global_batch, precision, moe, None, None)
    h = ctypes.c_void_p()
    ctx.check(lib().dw_plan_load(ctx._h, cstr(path), cstr(model), hw._handle(), ctypes.byref(job), ctypes.byref(h)))
    return Plan(h.value, ctx, model, hw)


def single_plan(micro_batch, seq_len, ctx=None):
    """A one-GPU plan without the planner (no predictions)."""
    ctx = ctx_of(ctx)
    h = ctypes.c_void_p()
    ctx.check(lib().dw_plan_single(ctx._h, int(micro_batch), int(seq_len), ctypes.byref(h)))
    return Plan(h.value, ctx)
