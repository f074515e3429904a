#!/usr/bin/env python3
"""accuracy_report.py — bench/accuracy.sh's bookkeeping: one Deepwell run's metrics.jsonl as one
JSON line (`row`), and the Markdown table of all runs with the issue's accuracy bands (`table`).

  row RUN_DIR RECIPE SEED WALL_S RC LOG    prints {"impl": "deepwell", "recipe", "seed", "steps",
      "first_loss" (step 1's loss: the initial weights on the first batch), "val_loss" (the last
      evaluation), "tokens_per_s" (tokens over the sum of the step times: training only),
      "wall_s", "skipped" (steps the guard skipped), "fallbacks" (layers that fell back to BF16)};
      or {"impl", "recipe", "seed", "error"} when the run failed or left no validation loss (the
      error ends with LOG's last line)
  table FILE.jsonl... [--corpus corpus.json]    prints the table: per recipe the mean and sample
      standard deviation of the validation loss over its seeds, the relative gap of the means to
      PyTorch BF16 and to Deepwell BF16, and PASS/FAIL against the band: nvfp4 within 2% of
      Deepwell BF16, mxfp8 and fp8_block within 1% (issue 31), Deepwell bf16 within 1% of PyTorch
      BF16 (the anchor). A gap below zero passes. Exit status 0 whatever the bands say.
"""
import json
import math
import os
import sys

ORDER = ["torch_bf16", "bf16", "mxfp8", "fp8_block", "nvfp4"]
BANDS = {"bf16": ("torch_bf16", 0.01), "mxfp8": ("bf16", 0.01), "fp8_block": ("bf16", 0.01),
         "nvfp4": ("bf16", 0.02)}
NAMES = {"torch_bf16": "PyTorch BF16", "bf16": "Deepwell BF16"}


def row(run, recipe, seed, wall, rc, log):
    base = {"impl": "deepwell", "recipe": recipe, "seed": int(seed)}
    path = os.path.join(run, "metrics.jsonl")
    lines = []
    if os.path.exists(path):
        with open(path) as fh:
            lines = [json.loads(l) for l in fh if l.strip().startswith("{") and l.strip().endswith("}")]
    steps = [l for l in lines if "loss" in l and "step" in l]
    vals = [l["val_loss"] for l in steps if l.get("val_loss") is not None]
    if rc != "0" or not steps or not vals:
        last = ""
        if os.path.exists(log):
            with open(log, errors="replace") as fh:
                last = ([l.strip() for l in fh if l.strip()] or [""])[-1][:200]
        base["error"] = f"exit {rc}, {len(steps)} steps logged, {len(vals)} validations: {last}"
        return base
    step_s, prev = 0.0, 0
    for l in steps:
        step_s += (l["tokens"] - prev) / l["tokens_per_s"] if l.get("tokens_per_s") else 0.0
        prev = l["tokens"]
    decisions = os.path.join(run, "precision_decisions.jsonl")
    fallbacks = sum(1 for l in open(decisions) if l.strip()) if os.path.exists(decisions) else 0
    base.update({"steps": steps[-1]["step"], "first_loss": steps[0]["loss"], "val_loss": vals[-1],
                 "tokens_per_s": steps[-1]["tokens"] / step_s if step_s > 0 else None,
                 "wall_s": float(wall), "skipped": sum(1 for l in steps if l.get("skipped")),
                 "fallbacks": fallbacks})
    return base


def stats(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def table(files, corpus):
    runs, errors = [], []
    for f in files:
        with open(f) as fh:
            for l in fh:
                if l.strip():
                    r = json.loads(l)
                    (errors if "error" in r else runs).append(r)
    out = []
    if corpus:
        with open(corpus) as fh:
            c = json.load(fh)
        out.append(f"Corpus: {c['source']} (Python {c['python']}), {c['bytes']:,} bytes, sha256 "
                   f"{c['sha256'][:16]}…; train {c['train_bytes']:,} bytes, validation {c['val_bytes']:,}.")
    recipes = sorted({r["recipe"] for r in runs}, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))
    by = {k: [r for r in runs if r["recipe"] == k] for k in recipes}
    mean = {k: stats([r["val_loss"] for r in v])[0] for k, v in by.items()}
    steps = sorted({r["steps"] for r in runs})
    if steps:
        out.append(f"Steps: {', '.join(map(str, steps))}. Validation loss after the last step (nats per byte).")
    out.append("")
    out.append("| recipe | seeds | val loss mean ± sd | min … max | vs PyTorch BF16 | vs Deepwell BF16 | band | "
               "result | first loss | tokens/s | wall s |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    verdicts = []
    for k in recipes:
        v = by[k]
        m, sd = stats([r["val_loss"] for r in v])
        gap = {b: f"{100 * (m / mean[b] - 1):+.2f}%" if b in mean and b != k else "" for b in ("torch_bf16", "bf16")}
        band, res = "", ""
        if k in BANDS:
            ref, lim = BANDS[k]
            band = f"≤ {100 * lim:g}% vs {NAMES[ref]}"
            if ref in mean:
                res = "PASS" if m / mean[ref] - 1 <= lim else "FAIL"
                verdicts.append(res)
            else:
                res = "n/a (no reference runs)"
        fb = sum(r.get("fallbacks", 0) for r in v)
        sk = sum(r.get("skipped", 0) for r in v)
        note = (f" ({fb} BF16 fallbacks)" if fb else "") + (f" ({sk} skipped steps)" if sk else "")
        tps = [r["tokens_per_s"] for r in v if r.get("tokens_per_s")]
        out.append(f"| {NAMES.get(k, k)} | {','.join(str(r['seed']) for r in sorted(v, key=lambda r: r['seed']))} | "
                   f"{m:.4f} ± {sd:.4f} | {min(r['val_loss'] for r in v):.4f} … {max(r['val_loss'] for r in v):.4f} | "
                   f"{gap['torch_bf16']} | {gap['bf16']} | {band} | {res}{note} | "
                   f"{stats([r['first_loss'] for r in v])[0]:.4f} | {sum(tps) / len(tps) if tps else 0:,.0f} | "
                   f"{stats([r['wall_s'] for r in v])[0]:.1f} |")
    out.append("")
    out.append(f"Bands: {verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL; "
               f"{len(runs)} runs, {len(errors)} failed.")
    for e in errors:
        out.append(f"- failed: {e['recipe']} seed {e['seed']}: {e['error']}")
    print("\n".join(out))


def main():
    if len(sys.argv) == 8 and sys.argv[1] == "row":
        print(json.dumps(row(*sys.argv[2:])))
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        args, corpus = sys.argv[2:], None
        if "--corpus" in args:
            i = args.index("--corpus")
            corpus = args[i + 1] if i + 1 < len(args) else sys.exit("accuracy_report.py: --corpus needs a file")
            args = args[:i] + args[i + 2:]
        if not args:
            sys.exit("accuracy_report.py: table needs at least one .jsonl file")
        table(args, corpus)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
