#!/usr/bin/env python3
# torch_profile.py — where a PyTorch anchor's step time goes, to set beside `deepwell bench step
# --profile`: runs an anchor script (../shared/anchors/anchor_train.py or anchor_moe.py, as
# copied into .anchors) unchanged under torch.profiler (CUDA activity only), then prints the GPU
# kernel time per step by kernel class (GEMM, grouped GEMM, attention forward/backward, Triton
# fusions, optimizer, cross-entropy, NCCL, other) and the 25 largest kernels. The anchor's own JSON
# line still comes out first. Per-step times divide the kernels' totals over the last STEPS steps:
# the profiler starts after the warm-up steps (the anchor's torch.cuda.reset_peak_memory_stats
# call, after its step 4, turns it on), so compilation and autotuning stay out.
# Usage: python3 bench/torch_profile.py SCRIPT ARG... (env STEPS: profiled steps, default the
# anchor's steps after step 4: 20 for anchor_train.py, 15 for anchor_moe.py)
import os
import re
import runpy
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

script = sys.argv[1]
sys.argv = sys.argv[1:]
steps = int(os.environ.get("STEPS", "15" if "moe" in os.path.basename(script) else "20"))
prof = profile(activities=[ProfilerActivity.CUDA])
_reset = torch.cuda.reset_peak_memory_stats


def _start_profiler(*a, **k):  # the anchors call this once, after their warm-up steps
    _reset(*a, **k)
    if not getattr(_start_profiler, "on", False):
        _start_profiler.on = True
        torch.cuda.synchronize()
        prof.__enter__()


torch.cuda.reset_peak_memory_stats = _start_profiler
runpy.run_path(script, run_name="__main__")
torch.cuda.synchronize()
prof.__exit__(None, None, None)

CLASSES = [  # first match wins
    ("grouped GEMM", r"grouped|GroupedGemm|group_gemm"),
    ("attention fwd", r"flash.*fwd|fmha.*fwd|attention.*fwd|flash_fwd"),
    ("attention bwd", r"flash.*bwd|fmha.*bwd|attention.*bwd|flash_bwd|dot_do_o"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|sm90_|wgmma|cublas|scaled_mm"),
    ("optimizer", r"multi_tensor|adam|foreach|fused_adam"),
    ("cross-entropy", r"cross_entropy|log_softmax|nll_loss|softmax"),
    ("NCCL", r"nccl"),
    ("Triton fusion", r"^triton_"),
]
per_class = defaultdict(float)
per_kernel = defaultdict(float)
for ev in prof.events():
    if ev.device_type != torch.autograd.DeviceType.CUDA:
        continue
    us = ev.time_range.elapsed_us()  # a kernel event: its time on the device
    per_kernel[ev.name] += us
    cls = next((c for c, rx in CLASSES if re.search(rx, ev.name, re.I)), "other")
    per_class[cls] += us
total = sum(per_class.values())
print(f"# {os.path.basename(script)} {' '.join(sys.argv[1:])}: GPU kernel time per step "
      f"{total / steps / 1000:.2f} ms over {steps} profiled steps")
print("| class | ms/step | share |")
print("| --- | ---: | ---: |")
for c, us in sorted(per_class.items(), key=lambda kv: -kv[1]):
    print(f"| {c} | {us / steps / 1000:.2f} | {100 * us / total:.1f}% |")
print("| kernel | ms/step |")
print("| --- | ---: |")
for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]:
    print(f"| {name[:110]} | {us / steps / 1000:.3f} |")
