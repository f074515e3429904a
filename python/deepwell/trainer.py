"""trainer.py — dw.Trainer.from_engine(...).fit() and dw.export().

fit() runs the C trainer (dw_train) whatever the data: dw.data(...), a glob string or "builtin"
it reads itself; any other iterable of (inputs, targets) [B, T] it takes through the next_batch
callback (feed.py). Either way: the schedule, validation, metrics.jsonl, atomic checksummed
checkpoints DIR/ckpt-<step>/ that `deepwell train --resume`, `deepwell eval` and `deepwell
sample` read, and resume=. Ctrl-C during fit() finishes the step, writes a checkpoint and raises
KeyboardInterrupt (a second Ctrl-C aborts the process); an exception from a callback or from the
iterable stops training and is re-raised."""
import math
import os
import shutil
import signal
import sys
import threading


from . import _structs as S
from ._core import raise_for
from ._lib import cstr, lib
from .data import Data
from .feed import Feeder
from .tokenizer import Tokenizer
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
                 sample_prompt=None, deterministic=False, callbacks=(), progress=True, log_every=1, tokenizer=None,
                 zero=0, ep=1, overlap=True, max_skips=10, quant_check_every=100, quant_fallback_after=3,
                 quant_overflow_max=0.001, quant_underflow_max=None, quant_counts_after=3, quant_check_elements=1 << 16, spike_zscore=0.0, spike_window=None, max_rollbacks=None, fp8_amax_history=0, moe_bias_update=0.0,
                 profile=False):
        self._args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}  # for fit(**options)
        if not isinstance(engine, Engine):
            raise TypeError(f"Trainer needs a dw.Engine (dw.compile), not {type(engine).__name__}")
        if engine.graph.input_width:
            raise ValueError("Trainer trains language models (token inputs and a loss); this engine is a "
                             f"feed-forward graph (float inputs of width {engine.graph.input_width}, no loss), "
                             "which runs forward only: call it on float arrays")
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
        # `deepwell train`'s guardrail, multi-rank and MoE flags under their names (--no-overlap:
        # overlap=False); dw_train checks the values and its message is raised (DeepwellError)
        if (spike_window is not None or max_rollbacks is not None) and not spike_zscore:
            raise ValueError("spike_window and max_rollbacks need spike_zscore Z (the rollback is off without it)")
        self.zero, self.ep, self.overlap = int(zero), int(ep), bool(overlap)
        self.max_skips, self.quant_check_every = int(max_skips), int(quant_check_every)
        self.quant_fallback_after = int(quant_fallback_after)
        # the counters' rule (--quant-overflow-max, --quant-underflow-max; None: off)
        self.quant_overflow_max = -1.0 if quant_overflow_max is None else float(quant_overflow_max)
        self.quant_underflow_max = -1.0 if quant_underflow_max is None else float(quant_underflow_max)
        self.quant_counts_after = int(quant_counts_after)
        self.quant_check_elements = int(quant_check_elements)  # sampled past this many (0: whole tensors)
        self.spike_zscore = float(spike_zscore)
        self.spike_window = 50 if spike_window is None else int(spike_window)
        self.max_rollbacks = 3 if max_rollbacks is None else int(max_rollbacks)
        self.fp8_amax_history, self.moe_bias_update = int(fp8_amax_history), float(moe_bias_update)
        self.profile = bool(profile)
        # the tokenizer the data went through: given, else the one the engine's model came with (a
        # model directory's or checkpoint's tokenizer.json); recorded in `out` (dw_run_set_tokenizer)
        self.tokenizer = None if tokenizer is None else tokenizer if isinstance(tokenizer, Tokenizer) \
            else Tokenizer(tokenizer)
        self.tokenizer_path = self.tokenizer.path if self.tokenizer is not None else engine.graph.tokenizer
        if self.tokenizer is None and self.tokenizer_path:
            try:  # to decode the samples; recording the file needs no package
                self.tokenizer = Tokenizer(self.tokenizer_path)
            except ImportError:
                pass
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
        o.deterministic, o.profile = self.deterministic, self.profile
        o.zero, o.ep, o.no_overlap = self.zero, self.ep, not self.overlap
        o.max_skips, o.quant_check_every = self.max_skips, self.quant_check_every
        o.quant_fallback_after = self.quant_fallback_after
        o.quant_overflow_max, o.quant_underflow_max = self.quant_overflow_max, self.quant_underflow_max
        o.quant_counts_after = self.quant_counts_after
        o.quant_check_elements = self.quant_check_elements
        o.spike_zscore, o.spike_window, o.max_rollbacks = self.spike_zscore, self.spike_window, self.max_rollbacks
        o.fp8_amax_history, o.moe_bias_update = self.fp8_amax_history, self.moe_bias_update
        return o, keep

    def _sample_text(self, raw):
        """The C trainer's sample: text (byte-level data), or ids ("464 318 ...") that `tokenizer`
        decodes when given."""
        if not raw:
            return None
        text = raw.decode("utf-8", "replace")
        words = text.split()
        if self.tokenizer is not None and words and all(w.isdigit() for w in words):
            return self.tokenizer.decode([int(w) for w in words], errors="replace")
        return text

    def _record_tokenizer(self):
        """The tokenizer.json into the run directory, from where every checkpoint gets a copy."""
        if self.tokenizer_path is not None:
            ctx = self.engine._ctx
            ctx.check(lib().dw_run_set_tokenizer(ctx._h, cstr(self.out), cstr(self.tokenizer_path)))

    def _fit_c(self, pattern, val, stop, feeder=None):
        self._record_tokenizer()
        o, _keep = self._c_opts(pattern, val)
        failure = []
        if feeder is not None:
            feeder.install(o)

        def on_progress(p, _user):
            try:
                p = p.contents
                nan = lambda v: None if math.isnan(v) else v  # noqa: E731
                self._report({"step": p.step, "total": p.total, "loss": p.loss, "val_loss": nan(p.val_loss),
                              "lr": p.lr, "grad_norm": p.grad_norm, "tokens_per_s": p.tokens_per_s,
                              "elapsed_s": p.elapsed_s, "eta_s": p.eta_s,
                              "sample": self._sample_text(p.sample),
                              "checkpoint": p.checkpoint.decode() if p.checkpoint else None,
                              "moe_aux_loss": nan(p.moe_aux_loss), "moe_z_loss": nan(p.moe_z_loss),
                              "expert_load": nan(p.expert_load), "moe_dropped": nan(p.moe_dropped),
                              "moe_dropped_frac": nan(p.moe_dropped_frac), "moe_bias_max": nan(p.moe_bias_max),
                              "skipped": p.skipped.decode() if p.skipped else None,
                              "precision_change": p.precision_change.decode() if p.precision_change else None,
                              "comm_s": [p.comm_s[r] for r in range(p.ranks)] if p.ranks else None,
                              "exposed_comm_s": [p.exposed_comm_s[r] for r in range(p.ranks)] if p.ranks else None,
                              "quant_overflow": p.quant_overflow if p.quant_overflow >= 0 else None,
                              "quant_underflow": p.quant_underflow if p.quant_underflow >= 0 else None})
            except BaseException as e:  # ctypes would print and drop it: stop and re-raise after
                failure.append(e)
                lib().dw_train_request_stop()

        cb = S.PROGRESS_FN(on_progress)
        o.progress = cb
        st = lib().dw_train(self.engine._handle(), S.ctypes.byref(o))
        if failure:
            raise failure[0]
        if feeder is not None and feeder.failure is not None:
            raise feeder.failure  # the iterable's own exception (dw_train stopped before the step's update)
        raise_for(st, self.engine._ctx)
        if stop.hit or lib().dw_train_stop_requested():
            self.checkpoint = _latest_c(self.out) or self.checkpoint

    # ---- entry -----------------------------------------------------------------------------------
    def fit(self, **options):
        """Trains to `steps`; returns the last step's metrics (None when no step ran). Raises
        KeyboardInterrupt after writing a checkpoint when Ctrl-C stopped it. options: any of
        Trainer's keywords (steps=, spike_zscore=, resume=, ...), replacing the trainer's from now on
        (checked as Trainer checks them)."""
        if options:
            bad = sorted(set(options) - set(self._args))
            if bad:
                raise TypeError(f"fit: unknown option(s) {', '.join(bad)} (Trainer's keywords are taken)")
            fresh = Trainer(**{**self._args, **options})
            fresh.history, fresh.checkpoint = self.history, self.checkpoint
            self.__dict__.update(fresh.__dict__)
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
                if self.val is not None and isinstance(self.val, (Data, str, os.PathLike)):
                    raise TypeError("val: with an iterable dataloader, give an iterable of (inputs, targets) too")
                if self.global_batch % self.batch:
                    raise ValueError(f"global_batch {self.global_batch} is not a multiple of batch {self.batch}")
                self._fit_c(None, None, stop, Feeder(dl, self.val))
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


def export(what, out=None, format="hf", layout="as_loaded", path=None):
    """Writes a Hugging Face model directory: out/config.json (the captured config),
    out/model.safetensors (FP32, HF names and layouts; MoE experts in `layout`: as_loaded, fused
    or per_expert) and out/tokenizer.json when the model has one (a Trainer's run's copy, else the
    engine's model's: Graph.tokenizer). what: a Trainer (its engine after training) or an Engine."""
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
    tok = e.graph.tokenizer
    if isinstance(what, Trainer):  # the run's copy (dw_run_set_tokenizer), else the one it would record
        ran = os.path.join(what.out, "tokenizer.json")
        tok = ran if os.path.isfile(ran) else what.tokenizer_path
    if tok and os.path.abspath(tok) != os.path.abspath(os.path.join(out, "tokenizer.json")):
        shutil.copyfile(tok, os.path.join(out, "tokenizer.json"))
    return out
