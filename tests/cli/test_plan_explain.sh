#!/usr/bin/env bash
# test_plan_explain.sh DEEPWELL — `deepwell plan --explain` against `plan --json` of the same job:
# every candidate's printed terms add up to its printed step, the candidates and their order are
# the JSON's, the layout lists pp x v stages covering the model's blocks in order, the families
# say what the JSON's "families" say, the rejection counts are the JSON's; a value given to the
# flag is bad input (exit 2).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
models=(llama-8b mixtral-8x7b)
model=${models[$((RANDOM % 2))]}
nodes=$((1 << (RANDOM % 3)))
gb=$(( (RANDOM % 4 + 1) * 64 ))
args=("$model" --hw h100-sxm --nodes $nodes --seq 4096 --global-batch $gb --top 3)
"$dw" plan "${args[@]}" --explain >"$tmp/x.txt" 2>"$tmp/err"; check "plan $model --explain ($nodes nodes, batch $gb)" 0 $?
"$dw" plan "${args[@]}" --json >"$tmp/p.json" 2>>"$tmp/err"; check "plan $model --json" 0 $?
python3 - "$tmp/x.txt" "$tmp/p.json" <<'PY' || fails=$((fails + 1))
import json, re, sys
text = open(sys.argv[1]).read(); d = json.load(open(sys.argv[2]))
assert "== why this plan (--explain) ==" in text, text[:400]
ex = text.split("== why this plan (--explain) ==")[1]
cand = ex.split("\nbest plan:")[0]
rows = [l.split() for l in cand.splitlines() if re.match(r"^  \d+ ", l)]
plans = [d["best"]] + d["alternatives"]
assert len(rows) == len(plans), (len(rows), len(plans))
for r, p in zip(rows, plans):
    step, terms = float(r[1]), [float(x) for x in r[2:10]]
    assert abs(sum(terms) - step) <= 0.01 * step + 1e-3, (r, sum(terms))
    assert abs(step - p["step_time_s"]) <= 1e-3 * p["step_time_s"], (step, p["step_time_s"])
    assert " ".join(r[11:]) == p["summary"], (r[11:], p["summary"])
best = d["best"]
stages = [l for l in ex.splitlines() if re.match(r"^    stage \d+", l)]
assert len(stages) == best["parallel"]["pp"] * best["virtual_stages"], (len(stages), best["summary"])
nxt = 0
for l in stages:
    m = re.search(r"blocks (\d+)-(\d+)", l)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        assert a == nxt and b >= a, l
        nxt = b + 1
assert nxt == 32, nxt  # llama-8b and mixtral-8x7b: 32 blocks
assert "+ embedding" in stages[0] and "+ LM head" in stages[-1]
ranks = [l for l in ex.splitlines() if re.match(r"^    rank \d+", l)]
assert len(ranks) == best["parallel"]["pp"]
fams = ex.split("\nfamilies")[1].split("\nrejected configurations")[0].splitlines()[1:]
fams = [l for l in fams if l.strip()]
assert len(fams) == len(d["families"]) == 12, (len(fams), len(d["families"]))
for l, f in zip(fams, d["families"]):
    assert l.strip().startswith(f["family"]), (l, f)
    if f["kept"] >= 0:
        assert "kept: #%d is one" % (f["kept"] + 1) in l, (l, f)
    elif f["feasible"] > 0:
        assert "none kept: %d fit" % f["feasible"] in l, (l, f)
        if "fastest" in f:
            assert f["fastest"] in l and f["fastest_step_s"] >= best["step_time_s"] * (1 - 1e-9), (l, f)
    else:
        assert "none feasible" in l or "not searched" in l, l
rej = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s+(\d+)  ([a-z0-9_]+): ", ex, re.M)}
assert rej == {r["reason"]: r["count"] for r in d["rejected"]}, (rej, d["rejected"])
PY
"$dw" plan "${args[@]}" --explain=yes >/dev/null 2>"$tmp/err"; check "--explain=yes refused" 2 $?
has "the refusal names --explain" "$tmp/err" "explain"
[ $fails -eq 0 ] || exit 1
