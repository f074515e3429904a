"""dryrun.py — dw.dryrun(): what an engine (or a plan) will cost before training: the compiled
memory per pool, the planner's prediction of memory and step time on a GPU, its checks, and
optionally a few timed steps on the engine's own device."""
import ctypes
import time

import numpy as np

from ._core import DeepwellError
from ._lib import cstr, lib
from .engine import Engine
from .plan import Plan, _job

PLANNED_RECIPES = ("bf16", "fp8_block", "mxfp8", "nvfp4")


class Report(dict):
    """A dict: pools (bytes per memory pool of the compiled program), total_bytes, predicted
    (the planner's one-GPU figures for hw: step_time_s, tokens_per_s, mfu, memory_bytes,
    memory, gpu, recipe; None with predicted_why when there is no GPU to predict for), checks,
    measured (with steps: step_time_s on this engine's device). str() is a readable summary."""

    def __str__(self):
        gib = 1024.0 ** 3
        lines = [f"memory pools ({self['backend']} engine, {self['precision']}):"]
        lines += [f"  {k:12s} {v / gib:10.4f} GiB" for k, v in self["pools"].items()]
        lines.append(f"  {'total':12s} {self['total_bytes'] / gib:10.4f} GiB")
        p = self.get("predicted")
        if p:
            lines.append(f"predicted on one {p['gpu']} ({p['recipe']}): {p['step_time_s']:.4g} s/step, "
                         f"{p['tokens_per_s']:.4g} tokens/s, MFU {100 * p['mfu']:.1f}%, "
                         f"memory {p['memory_bytes'] / gib:.3f} GiB")
            c = self["checks"]
            lines.append("checks: " + ", ".join(f"{k} {'PASS' if c[k] else 'FAIL'}"
                                                for k in ("constraints_ok", "memory_ok", "overlap_ok", "bubble_ok")))
        else:
            lines.append(f"predicted: none ({self.get('predicted_why')})")
        m = self.get("measured")
        if m:
            lines.append(f"measured on this {self['backend']} engine: {m['step_time_s']:.4g} s per forward+backward "
                         f"({m['steps']} steps)")
        return "\n".join(lines)


def _one_gpu_plan(engine, hw, recipe):
    B, T = engine.batch, engine.seq
    text_ = ('{"parallel":{"dp":1,"tp":1,"pp":1,"cp":1,"ep":1},"micro_batch":%d,"grad_accum":1}' % B).encode()
    job, _keep = _job(T, B, recipe, None, None, None)
    h = ctypes.c_void_p()
    ctx = engine._ctx
    ctx.check(lib().dw_plan_from_json(ctx._h, text_, len(text_), cstr("dryrun"), cstr(engine.graph.source),
                                      hw._handle(), ctypes.byref(job), ctypes.byref(h)))
    return Plan(h.value, ctx, engine.graph.source, hw)


def _plan_report(plan):
    c = plan.cost
    i = plan.info
    return {"step_time_s": c["step"], "tokens_per_s": c["tokens_per_s"], "mfu": c["mfu"],
            "memory_bytes": plan.memory["total"], "memory": plan.memory, "gpu": i["gpu"], "recipe": i["recipe"],
            "plan": plan.summary}


def dryrun(what, hw=None, steps=0):
    """A Report for an Engine (hw: a Hardware to predict for on one of its GPUs, default this
    machine's; steps: also time this many forward+backward passes on the engine) or for a Plan
    (its predictions and checks)."""
    if isinstance(what, Plan):
        r = Report(backend="plan", precision=what.info["recipe"], checks=what.checks)
        m = what.memory
        r["pools"] = {k: m[k] for k in ("weights", "grads", "optimizer", "activations", "workspace")}
        r["total_bytes"] = m["total"]
        r["predicted"] = _plan_report(what)
        return r
    if not isinstance(what, Engine):
        raise TypeError(f"dryrun takes a dw.Engine or a dw.Plan, not {type(what).__name__}")
    e = what
    pools = e.pool_bytes
    r = Report(backend=e.backend, precision=e.precision, pools=pools, total_bytes=sum(pools.values()),
               predicted=None, checks=None)
    if hw is None:
        from .hardware import probe

        hw = probe(e._ctx)
    if hw.gpu_count == 0:
        r["predicted_why"] = (f"no GPU here ({hw.notice or 'none found'}); pass hw=dw.hardware('h100-sxm') or "
                              "another preset to predict for one")
    elif not e.graph.source:
        r["predicted_why"] = "the engine's graph has no model source for the planner"
    else:
        recipe = e.precision if e.precision in PLANNED_RECIPES else "bf16"
        try:
            plan = _one_gpu_plan(e, hw if hw.gpu_count == 1 and hw.info["nodes"] == 1 else hw.one_gpu(), recipe)
            r["checks"] = plan.checks
            r["predicted"] = _plan_report(plan)
            if recipe != e.precision:
                r["predicted"]["note"] = f"predicted for bf16: the planner does not model {e.precision}"
        except DeepwellError as err:
            r["predicted_why"] = str(err)
    if steps:
        rng = np.random.default_rng(0)
        x = rng.integers(0, e.vocab, size=(e.batch, e.seq), dtype=np.int32)
        y = rng.integers(0, e.vocab, size=(e.batch, e.seq), dtype=np.int32)
        e.forward_backward(x, y)  # warm-up
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = e.forward_backward(x, y)
        r["measured"] = {"step_time_s": (time.perf_counter() - t0) / steps, "steps": steps, "loss": loss}
        e.zero_grad()
    return r

