#!/usr/bin/env python3
"""quant_sweep.py — medians of `deepwell bench quant` over interleaved repeats.

One `deepwell bench quant` call varies by about +-0.03 in its ratio to the copy from one process
to the next on the H200 (clocks, the copy anchor's own spread), more than the differences between
the kernel variants being compared. This runs each configuration REPS times, interleaved (config
1, 2, ..., 1, 2, ...: slow drifts of the machine hit every configuration alike), each run its own
process with its own copy anchor, and prints per configuration and variant the median ratio to
the copy and every sample.

Usage: python3 bench/quant_sweep.py REPS CONFIGS [--json OUT]
  CONFIGS: a file of lines "name|command", the command a `deepwell bench quant ... --json` call
  (--json is added where missing); blank lines and lines starting with # are skipped.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reps", type=int)
    ap.add_argument("configs")
    ap.add_argument("--json", help="write every sample here")
    a = ap.parse_args()
    cfgs = []
    for line in open(a.configs):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "|" not in line:
            sys.exit(f"{a.configs}: line without 'name|command': {line}")
        name, cmd = line.split("|", 1)
        if "--json" not in shlex.split(cmd):
            cmd += " --json"
        cfgs.append((name.strip(), cmd))
    samples = {}  # (config, variant) -> ratios
    for rep in range(a.reps):
        for name, cmd in cfgs:
            run = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"{name}: '{cmd}' exited {run.returncode}: {run.stderr.strip()}")
            res = json.loads(run.stdout)
            for v in res["variants"]:
                key = (name, v["recipe"] + (" + transposed" if v["transposed"] else ""))
                samples.setdefault(key, []).append(v["ratio_to_copy"])
        print(f"repeat {rep + 1}/{a.reps} done", file=sys.stderr)
    print("%-36s %-24s %7s  %s" % ("config", "variant", "median", "samples (ratio to copy)"))
    for (name, var), v in samples.items():
        print("%-36s %-24s %7.3f  %s" % (name, var, statistics.median(v), " ".join("%.3f" % x for x in v)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"config": n, "variant": k, "ratios": v} for (n, k), v in samples.items()], f, indent=1)


if __name__ == "__main__":
    main()
