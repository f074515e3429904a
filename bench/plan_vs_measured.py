#!/usr/bin/env python3
"""plan_vs_measured.py — issue 29's item 4: the planner's predicted step time and memory per rank
beside what `bench/multi_gpu.sh ... scale` measured (its scale.jsonl), one row per run.

Usage: bench/plan_vs_measured.py DEEPWELL SCALE_JSONL [--hw PRESET] [--seq T] [--json]

For each run (model, GPUs, batch per GPU, flags --zero Z / --ep E) it asks `deepwell plan MODEL
--hw PRESET --gpus N --seq T --global-batch B*N --json` for the plan that ran (dp N, tp = pp = cp =
1, ep E, micro-batch B, no accumulation, no recompute, ZeRO Z, no all-to-all overlap) and prints
predicted against measured: the step per rank (B*T over each GPU's tokens/s) and the memory
(nvidia-smi's largest memory.used, which the planner's 1 GiB fixed workspace stands for). Runs
that did not finish (rc != 0) are listed without a ratio. Exit status 2 on unusable input."""
import json
import subprocess
import sys


def flag(flags, name, default):
    parts = flags.split()
    return int(parts[parts.index(name) + 1]) if name in parts[:-1] else default


def planned(dw, hw, model, gpus, batch, seq, zero, ep):
    cmd = [dw, "plan", model, "--hw", hw, "--gpus", str(gpus), "--seq", str(seq), "--global-batch",
           str(batch * gpus), "--json", "--top", "100000", "--headroom", "0.01"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"plan_vs_measured: {' '.join(cmd)} failed: {out.stderr.strip()}")
    doc = json.loads(out.stdout)
    for e in [doc.get("best")] + doc.get("alternatives", []):
        if not e:
            continue
        p = e["parallel"]
        if (p["dp"], p["tp"], p["pp"], p["cp"], p["ep"]) == (gpus, 1, 1, 1, ep) and e["micro_batch"] == batch \
                and e["grad_accum"] == 1 and e["recompute"] == "none" and e["zero"] == zero \
                and not e.get("a2a_overlap") and e.get("virtual_stages", 1) == 1:
            return e
    return None


def main(argv):
    args, opts, i = [], {}, 0
    while i < len(argv):
        if argv[i] in ("--hw", "--seq") and i + 1 < len(argv):
            opts[argv[i]], i = argv[i + 1], i + 2
        else:
            args.append(argv[i]) if argv[i] != "--json" else None
            i += 1
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dw, path = args[0], args[1]
    hw, seq, as_json = opts.get("--hw", "h100-sxm"), int(opts.get("--seq", 2048)), "--json" in argv
    try:
        runs = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError) as e:
        print(f"plan_vs_measured: {path}: {e}", file=sys.stderr)
        return 2
    print(f"{'run':<34} {'step pred':>9} {'measured':>9} {'err':>6}   {'mem pred':>9} {'measured':>9} {'err':>6}")
    for r in runs:
        flags = r.get("flags", "")
        zero, ep = flag(flags, "--zero", 0), flag(flags, "--ep", 1)
        rest, parts = [], flags.split()
        for i, p in enumerate(parts):  # flags other than --zero Z / --ep E, named in the row
            if p not in ("--zero", "--ep") and (i == 0 or parts[i - 1] not in ("--zero", "--ep")):
                rest.append(p)
        name = f"{r['model']} x{r['gpus']} B{r['batch_per_gpu']} zero{zero}" + (f" ep{ep}" if ep > 1 else "") + \
            "".join(" " + p for p in rest) + (f" [{r['tag']}]" if r.get("tag") else "")
        e = planned(dw, hw, r["model"], r["gpus"], r["batch_per_gpu"], seq, zero, ep)
        row = {"run": name, "rc": r.get("rc")}
        if e is None:
            print(f"{name:<34} no such plan in `deepwell plan`'s list")
            row["plan"] = None
        else:
            row["step_pred_s"], row["mem_pred_gib"] = e["step_time_s"], e["peak_memory_bytes"] / 2**30
            ok = r.get("rc") == 0 and r.get("tokens_per_s") and r.get("max_gpu_mem_mib")
            if ok:
                row["step_meas_s"] = r["batch_per_gpu"] * seq / (r["tokens_per_s"] / r["gpus"])
                row["mem_meas_gib"] = r["max_gpu_mem_mib"] / 1024
                row["step_err"] = row["step_pred_s"] / row["step_meas_s"] - 1
                row["mem_err"] = row["mem_pred_gib"] / row["mem_meas_gib"] - 1
                print(f"{name:<34} {row['step_pred_s']:8.4f}s {row['step_meas_s']:8.4f}s {row['step_err']:+6.1%}"
                      f"   {row['mem_pred_gib']:7.2f}Gi {row['mem_meas_gib']:7.2f}Gi {row['mem_err']:+6.1%}")
            else:
                print(f"{name:<34} {row['step_pred_s']:8.4f}s {'(rc %s)' % r.get('rc'):>9}        "
                      f"{row['mem_pred_gib']:7.2f}Gi")
        if as_json:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
