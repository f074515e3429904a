#!/usr/bin/env python3
"""nccl_busbw.py — a plain NCCL loop through PyTorch, the yardstick for the collectives inside
Deepwell's data-parallel training (issue 29): all-reduce of 1 GiB BF16 and of a 16 MiB FP32 bucket
(Deepwell's bucket size), all-to-all of 1 GiB BF16. Bus bandwidth as nccl-tests defines it:
all-reduce bytes x 2(n-1)/n per second, all-to-all bytes x (n-1)/n.

Usage: torchrun --nproc-per-node N bench/nccl_busbw.py      Prints one JSON line per collective (rank 0).
"""
import json
import os

import torch
import torch.distributed as dist


def timed(fn, iters=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters / 1e3


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for name, dtype, nbytes in (("all_reduce", torch.bfloat16, 1 << 30), ("all_reduce", torch.float32, 16 << 20)):
        x = torch.ones(nbytes // x_size(dtype), dtype=dtype, device="cuda")
        t = timed(lambda: dist.all_reduce(x))
        rows.append({"collective": name, "dtype": str(dtype).split(".")[-1], "bytes": nbytes, "gpus": n,
                     "ms": round(t * 1e3, 3), "busbw_gbps": round(nbytes * 2 * (n - 1) / n / t / 1e9, 1)})
    x = torch.ones((1 << 30) // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    t = timed(lambda: dist.all_to_all_single(y, x))
    rows.append({"collective": "all_to_all", "dtype": "bfloat16", "bytes": 1 << 30, "gpus": n, "ms": round(t * 1e3, 3),
                 "busbw_gbps": round((1 << 30) * (n - 1) / n / t / 1e9, 1)})
    if rank == 0:
        for r in rows:
            print(json.dumps(r), flush=True)
    dist.destroy_process_group()


def x_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()


if __name__ == "__main__":
    main()
