"""trainer.py — dw.Trainer.from_engine(...).fit() and dw.export().

Two loops, one contract. Data the C trainer can read itself (dw.data(...), a glob string or
"builtin") trains through dw_train: shuffling, validation, metrics.jsonl, atomic checksummed
checkpoints DIR/ckpt-<step>/ that `deepwell train --resume`, `deepwell eval` and `deepwell sample`
read. Any other iterable of (inputs, targets) [B, T] trains through the engine's own calls
(forward_backward, step) with the same schedule, writing DIR/metrics.jsonl and model directories
DIR/step-<step>/ (config.json, model.safetensors, optimizer.safetensors, trainer.json) that
`deepwell eval` loads and resume= continues. Ctrl-C during fit() finishes the step, writes a
checkpoint and raises KeyboardInterrupt (a second Ctrl-C aborts the process).
"""
import glob
import json
import math
import os
import re
import signal
import sys
import threading
import time

import numpy as np

from . import _structs as S
from ._core import raise_for
from ._lib import cstr, lib
from .data import Data
from .engine import Engine

SCHEDULES = {"cosine": 0, "linear": 1, "constant": 2}


def schedule_lr(kind, lr, min_lr, warmup, total, step):
    """The learning rate of 0-based optimizer step `step` (src/train/schedule.c's formula)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if kind == "constant":
        return lr
    span = total - 1 - warmup
    p = min((step - warmup) / span, 1.0) if span > 0 else 1.0
    if kind == "linear":
        return lr + (min_lr - lr) * p
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


class _StopSignal:
    """SIGINT while fit() runs: the first asks the C trainer (and the Python loop) to stop after
    the step; the second restores the default action and re-raises it (the process ends)."""

    def __init__(self):
        self.hit = False
        self.prev = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.prev = signal.signal(signal.SIGINT, self._on)
        return self

    def _on(self, sig, frame):
        if self.hit:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return
        self.hit = True
        lib().dw_train_request_stop()
        sys.stderr.write("\ndeepwell: interrupted: finishing this step and writing a checkpoint "
                         "(a second Ctrl-C aborts)\n")

    def __exit__(self, *exc):
        if self.prev is not None:
            signal.signal(signal.SIGINT, self.prev)


class Trainer:
    """Trains an Engine. Build it with from_engine(); fit() runs it and returns the last metrics.
    .history: every step's metrics (dicts: step, total, loss, val_loss, lr, grad_norm,
    tokens_per_s, elapsed_s, eta_s, checkpoint, sample); .checkpoint: the newest checkpoint."""

    def __init__(self, engine, dataloader, steps, out, optimizer="adamw", lr=3e-4, schedule="cosine", min_lr=None,
                 warmup=10, batch=None, seq=None, global_batch=None, weight_decay=0.1, clip=1.0, betas=(0.9, 0.95),
                 eps=1e-8, val=None, eval_every=50, eval_batches=8, ckpt_every=0, ckpt_minutes=30.0, keep=3,
                 seed=1337, resume=None, sample_every=0, sample_tokens=64, sample_temperature=0.8,
                 sample_prompt=None, deterministic=False, callbacks=(), progress=True, log_every=1):
        if not isinstance(engine, Engine):
            raise TypeError(f"Trainer needs a dw.Engine (dw.compile), not {type(engine).__name__}")
        if optimizer not in ("adamw", "adamw_dw"):
            raise ValueError(f"optimizer must be 'adamw' (the engine's AdamW; 'adamw_dw' names it too), got "
                             f"{optimizer!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        if out is None:
            raise ValueError("out (the run directory) is required")
        if dataloader is None:
            raise ValueError("dataloader is required: dw.data(PATTERN), a glob string, 'builtin', or an iterable "
                             "of (inputs, targets) [batch, seq]")
        self.engine, self.dataloader, self.steps, self.out = engine, dataloader, steps, os.fspath(out)
        self.lr = float(lr)
        self.min_lr = float(min(lr / 10, 1e-4) if min_lr is None else min_lr)
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}: the schedule would rise")
        self.schedule, self.warmup = schedule, int(warmup)
        self.batch = int(batch or engine.batch)
        self.seq = int(seq or engine.seq)
        self.global_batch = int(global_batch or self.batch)
        self.weight_decay, self.clip, self.betas, self.eps = weight_decay, clip, tuple(betas), eps
        self.val, self.eval_every, self.eval_batches = val, eval_every, eval_batches
        self.ckpt_every, self.ckpt_minutes, self.keep, self.seed = ckpt_every, ckpt_minutes, keep, seed
        self.resume = os.fspath(resume) if resume is not None else None
        self.sample_every, self.sample_tokens = sample_every, sample_tokens
        self.sample_temperature, self.sample_prompt = sample_temperature, sample_prompt
        self.deterministic = deterministic
        self.callbacks = list(callbacks)
        self.progress, self.log_every = progress, max(1, int(log_every))
        self.history = []
        self.checkpoint = None

    @classmethod
    def from_engine(cls, engine, optimizer="adamw", lr=3e-4, schedule="cosine", dataloader=None, steps=1000,
                    out=None, **kw):
        """A Trainer of `engine`: AdamW at peak lr with warmup then `schedule` (cosine, linear,
        constant) down to min_lr; dataloader: dw.data(...), a glob/"builtin" string, or any
        iterable of (inputs, targets) int arrays [batch, seq] (NumPy or torch); steps optimizer
        steps; out the run directory. Other keywords: see Trainer."""
        return cls(engine, dataloader, steps, out, optimizer=optimizer, lr=lr, schedule=schedule, **kw)

    # ---- reporting -------------------------------------------------------------------------------
    def _report(self, m):
        self.history.append(m)
        if m.get("checkpoint"):
            self.checkpoint = m["checkpoint"]
        if self.progress:
            tty = sys.stderr.isatty()
            event = m["val_loss"] is not None or m["checkpoint"] or m["step"] == m["total"]
            if tty or event or m["step"] % self.log_every == 0 or m["step"] == 1:
                val = f" | val {m['val_loss']:.4f}" if m["val_loss"] is not None else ""
                sys.stderr.write(f"{chr(13) + chr(27) + '[K' if tty else ''}step {m['step']}/{m['total']} | loss "
                                 f"{m['loss']:.4f}{val} | lr {m['lr']:.2e} | gnorm {m['grad_norm']:.3f} | "
                                 f"{m['tokens_per_s']:.0f} tok/s{'' if tty and not event else chr(10)}")
                if m["checkpoint"]:
                    sys.stderr.write(f"checkpoint: {m['checkpoint']}\n")
        for cb in self.callbacks:
            cb(m)

    # ---- the C trainer -------------------------------------------------------------------------
    def _c_opts(self, pattern, val):
        o = S.TrainOpts.new()
        lib().dw_train_opts_init(o, S.ctypes.sizeof(o))
        keep = [cstr(pattern), cstr(val), cstr(self.out), cstr(self.resume), cstr(self.sample_prompt)]
        o.data, o.val, o.out_dir, o.resume, o.sample_prompt = keep
        o.steps, o.batch, o.seq, o.global_batch = self.steps, self.batch, self.seq, self.global_batch
        o.lr, o.min_lr, o.warmup, o.schedule = self.lr, self.min_lr, self.warmup, SCHEDULES[self.schedule]
        o.weight_decay, o.clip, (o.beta1, o.beta2), o.eps = self.weight_decay, self.clip, self.betas, self.eps
        o.eval_every, o.eval_batches = self.eval_every, self.eval_batches
        o.sample_every, o.sample_tokens, o.sample_temperature = self.sample_every, self.sample_tokens, \
            self.sample_temperature
        o.ckpt_every, o.ckpt_minutes, o.keep, o.seed = self.ckpt_every, self.ckpt_minutes, self.keep, self.seed
        o.deterministic = self.deterministic
        return o, keep

    def _fit_c(self, pattern, val, stop):
        o, _keep = self._c_opts(pattern, val)
        failure = []

        def on_progress(p, _user):
            try:
                p = p.contents
                nan = lambda v: None if math.isnan(v) else v  # noqa: E731
                self._report({"step": p.step, "total": p.total, "loss": p.loss, "val_loss": nan(p.val_loss),
                              "lr": p.lr, "grad_norm": p.grad_norm, "tokens_per_s": p.tokens_per_s,
                              "elapsed_s": p.elapsed_s, "eta_s": p.eta_s,
                              "sample": p.sample.decode("utf-8", "replace") if p.sample else None,
                              "checkpoint": p.checkpoint.decode() if p.checkpoint else None,
                              "moe_aux_loss": nan(p.moe_aux_loss), "moe_z_loss": nan(p.moe_z_loss),
                              "expert_load": nan(p.expert_load)})
            except BaseException as e:  # ctypes would print and drop it: stop and re-raise after
                failure.append(e)
                lib().dw_train_request_stop()

        cb = S.PROGRESS_FN(on_progress)
        o.progress = cb
        st = lib().dw_train(self.engine._handle(), S.ctypes.byref(o))
        if failure:
            raise failure[0]
        raise_for(st, self.engine._ctx)
        if stop.hit or lib().dw_train_stop_requested():
            self.checkpoint = _latest_c(self.out) or self.checkpoint

    # ---- the Python loop over an iterable ------------------------------------------------------
    def _save_py(self, step):
        d = os.path.join(self.out, f"step-{step}")
        tmp = d + ".tmp"
        os.makedirs(tmp, exist_ok=True)
        export(self.engine, tmp)
        self.engine.save_optimizer(os.path.join(tmp, "optimizer.safetensors"))
        with open(os.path.join(tmp, "trainer.json"), "w") as f:
            json.dump({"step": step, "total": self.steps, "lr": self.lr, "min_lr": self.min_lr,
                       "warmup": self.warmup, "schedule": self.schedule, "batch": self.batch, "seq": self.seq,
                       "global_batch": self.global_batch, "precision": self.engine.precision}, f, indent=1)
        if os.path.isdir(d):
            _rmtree(d)
        os.replace(tmp, d)
        if self.keep:
            for old in _py_ckpts(self.out)[:-self.keep]:
                _rmtree(old)
        return d

    def _resume_py(self):
        d = self.resume
        if not os.path.exists(os.path.join(d, "trainer.json")):
            found = _py_ckpts(d)
            if not found:
                raise FileNotFoundError(f"resume: {d} holds no trainer.json and no step-<N>/ checkpoint")
            d = found[-1]
        with open(os.path.join(d, "trainer.json")) as f:
            state = json.load(f)
        self.engine.load_weights(os.path.join(d, "model.safetensors"))
        self.engine.load_optimizer(os.path.join(d, "optimizer.safetensors"))
        self.engine.step_count = state["step"]
        return state["step"]

    def _fit_py(self, stop):
        e = self.engine
        if self.global_batch % self.batch:
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of batch {self.batch}")
        accum = self.global_batch // self.batch
        step = self._resume_py() if self.resume else 0
        os.makedirs(self.out, exist_ok=True)
        metrics = open(os.path.join(self.out, "metrics.jsonl"), "a")
        it = iter(self.dataloader)
        t0, t_ckpt, first = time.time(), time.time(), step
        try:
            while step < self.steps:
                ts = time.time()
                e.zero_grad()
                loss, tokens = 0.0, 0
                for _ in range(accum):
                    try:
                        x, y = next(it)
                    except StopIteration:
                        it = iter(self.dataloader)  # a new epoch
                        x, y = next(it)
                    loss += e.forward_backward(x, y, 1.0 / accum) / accum
                    tokens += int(np.prod(tuple(np.shape(x))))
                lr = schedule_lr(self.schedule, self.lr, self.min_lr, self.warmup, self.steps, step)
                norm = e.step(lr=lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay, clip=self.clip,
                              step=step + 1)
                step += 1
                t1 = time.time()
                m = {"step": step, "total": self.steps, "loss": loss, "val_loss": None, "lr": lr, "grad_norm": norm,
                     "tokens_per_s": tokens / max(t1 - ts, 1e-9), "elapsed_s": t1 - t0,
                     "eta_s": (t1 - t0) / (step - first) * (self.steps - step), "sample": None, "checkpoint": None}
                if self.val is not None and self.eval_every and (step % self.eval_every == 0 or step == self.steps):
                    m["val_loss"] = self._validate()
                due = self.ckpt_minutes and t1 - t_ckpt >= 60 * self.ckpt_minutes
                if (self.ckpt_every and step % self.ckpt_every == 0) or step == self.steps or stop.hit or due:
                    m["checkpoint"] = self._save_py(step)
                    t_ckpt = time.time()
                metrics.write(json.dumps({k: v for k, v in m.items() if k not in ("sample",)}) + "\n")
                metrics.flush()
                self._report(m)
                if stop.hit:  # (also when it came during the callbacks)
                    if not m["checkpoint"]:
                        self.checkpoint = self._save_py(step)
                    break
        finally:
            metrics.close()

    def _validate(self):
        n, total = 0, 0.0
        for x, y in self.val:
            total += self.engine.forward(x, y)
            n += 1
            if n >= self.eval_batches:
                break
        return total / max(n, 1)

    # ---- entry -----------------------------------------------------------------------------------
    def fit(self):
        """Trains to `steps`; returns the last step's metrics (None when no step ran). Raises
        KeyboardInterrupt after writing a checkpoint when Ctrl-C stopped it."""
        dl = self.dataloader
        with _StopSignal() as stop:
            if isinstance(dl, (Data, str, os.PathLike)):
                pattern = dl.pattern if isinstance(dl, Data) else os.fspath(dl)
                val = self.val.pattern if isinstance(self.val, Data) else self.val
                if val is None and isinstance(dl, Data):
                    val = dl.val
                if val is not None and not isinstance(val, (str, os.PathLike)):
                    raise TypeError("val: with data the C trainer reads, give a pattern or dw.data(...) too")
                self._fit_c(pattern, val, stop)
            else:
                self._fit_py(stop)
        if stop.hit:
            raise KeyboardInterrupt(f"training stopped at step {self.history[-1]['step'] if self.history else 0}; "
                                    f"checkpoint: {self.checkpoint}")
        return self.history[-1] if self.history else None


def _latest_c(run):
    try:
        with open(os.path.join(run, "latest")) as f:
            return os.path.join(run, f.read().strip())
    except OSError:
        return None


def _py_ckpts(run):
    """step-<N>/ directories of a run, oldest first."""
    found = [d for d in glob.glob(os.path.join(glob.escape(run), "step-*")) if re.search(r"step-\d+$", d)]
    return sorted(found, key=lambda d: int(d.rsplit("-", 1)[1]))


def _rmtree(d):
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def export(what, out=None, format="hf", layout="as_loaded", path=None):
    """Writes a Hugging Face model directory: out/config.json (the captured config) and
    out/model.safetensors (FP32, HF names and layouts; MoE experts in `layout`: as_loaded, fused
    or per_expert). what: a Trainer (its engine after training) or an Engine."""
    out = out if out is not None else path  # dw.export(engine, path=...) as the origin documents write it
    if out is None:
        raise ValueError("export: give the output directory")
    if format != "hf":
        raise ValueError(f"export: format must be 'hf', got {format!r}")
    e = what.engine if isinstance(what, Trainer) else what
    if not isinstance(e, Engine):
        raise TypeError(f"export takes a dw.Trainer or dw.Engine, not {type(what).__name__}")
    cfg = lib().dw_graph_config_json(e.graph._handle())
    if not cfg:
        raise ValueError("export: the engine's graph carries no config.json")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "wb") as f:
        f.write(cfg if cfg.endswith(b"\n") else cfg + b"\n")
    e.save_weights(os.path.join(out, "model.safetensors"), layout)
    return out
