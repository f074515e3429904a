#!/usr/bin/env bash
# test_report.sh DEEPWELL — `deepwell report RUN`: the HTML page of a dense (tiny GPT-2) and a MoE
# (mixtral-tiny) CPU run and of a hand-written metrics.jsonl, checked for structure with python3's
# html.parser (well formed, exactly the expected plots, one polyline point per metrics line with
# that key, nothing external, the summary equal to the last line); the refusals and exit codes.
set -u
dw=$1
. "$(dirname "$0")/checks.sh" # ok, bad, check, has; $tmp
export OMP_NUM_THREADS=1

tiny_gpt2 "$tmp/gpt2"
train=(--data builtin --batch 4 --seq 32 --steps 12 --eval-every 4 --device cpu)
"$dw" train --model "$tmp/gpt2" "${train[@]}" --out "$tmp/dense" >/dev/null 2>"$tmp/err"
check "dense training run" 0 $?
"$dw" train --model mixtral-tiny "${train[@]}" --out "$tmp/moe" >/dev/null 2>"$tmp/err"
check "mixtral-tiny training run" 0 $?

# page METRICS PLOTS [--ckpt]: the page's structure against METRICS; PLOTS the comma-separated ids
cat >"$tmp/check.py" <<'PY'
import json, math, re, sys
from html.parser import HTMLParser
page, mfile, expected = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))
want_ckpt = len(sys.argv) > 4
lines = [json.loads(l) for l in open(mfile) if l.strip()]
text = open(page, encoding="utf-8").read()
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr"}

class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.plots, self.rows, self.svg = [], [], {}, {}, None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "iframe", "img", "object", "embed"):
            self.errors.append(f"<{tag}> present")
        for k, v in attrs:
            if k in ("src", "href") or (v and re.search(r"https?:|url\(", v)):
                self.errors.append(f"external reference {k}={v!r} on <{tag}>")
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "svg":
            self.svg = a["data-plot"]
            assert self.svg not in self.plots, f"plot {self.svg} twice"
            self.plots[self.svg] = {}
        elif tag == "polyline":
            pts = a["points"].split()
            assert all(re.fullmatch(r"-?[0-9.]+,-?[0-9.]+", p) for p in pts), a["points"][:200]
            assert int(a["data-points"]) == len(pts)
            self.plots[self.svg][a["data-series"]] = len(pts)
        elif tag == "tr" and "data-key" in a:
            self.rows[a["data-key"]] = a.get("data-value")
    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'} at line {self.getpos()[0]}")
        else:
            self.stack.pop()

p = Page()
p.feed(text)
p.close()
assert text.startswith("<!DOCTYPE html>"), text[:40]
assert not p.errors, p.errors
assert not p.stack, f"unclosed: {p.stack}"
assert not re.search(r"https?://|@import|@font-face|url\(", text), "external reference in the page"
assert set(p.plots) == expected, (sorted(p.plots), sorted(expected))
def finite(x, k):
    return isinstance(x.get(k), (int, float)) and math.isfinite(x[k])
for plot, series in p.plots.items():
    for key, n in series.items():
        want = sum(finite(x, key) for x in lines)
        assert n == want, f"{plot}/{key}: {n} points, {want} lines with {key}"
        assert want > 0
assert set(p.plots["loss"]) == ({"loss", "val_loss"} if any(finite(x, "val_loss") for x in lines) else {"loss"})
last = lines[-1]
def close(a, b):
    return math.isclose(float(a), float(b), rel_tol=1e-15, abs_tol=0)
assert close(p.rows["step"], last["step"]), (p.rows["step"], last["step"])
for k in ["loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "tokens", "val_loss",
          "moe_aux_loss", "moe_z_loss", "expert_load"]:
    if finite(last, k):
        assert close(p.rows[k], last[k]), (k, p.rows.get(k), last[k])
    elif not any(finite(x, k) for x in lines):
        assert k not in p.rows, k
assert close(p.rows["best_loss"], min(x["loss"] for x in lines if finite(x, "loss")))
assert ("precision" in p.rows and "model" in p.rows) == want_ckpt, sorted(p.rows)
print(f"plots {sorted(p.plots)}, rows {len(p.rows)}")
PY
page() { python3 "$tmp/check.py" "$@"; }

dense_plots=loss,lr,grad_norm,tokens_per_s
"$dw" report "$tmp/dense" >"$tmp/out" 2>"$tmp/err"
check "report of a dense run" 0 $?
[ -s "$tmp/dense/report.html" ] && ok "default output RUN/report.html" || bad "no $tmp/dense/report.html"
[ ! -s "$tmp/out" ] && ok "nothing on stdout" || bad "stdout: $(head -c 300 "$tmp/out")"
page "$tmp/dense/report.html" "$tmp/dense/metrics.jsonl" $dense_plots ckpt && ok "dense page structure" \
  || bad "dense page structure"
has "the dense page names the model and precision" "$tmp/dense/report.html" "<td>gpt2</td>" "<td>fp32</td>"

"$dw" report "$tmp/moe" --out "$tmp/moe.html" 2>"$tmp/err"
check "report of a MoE run to --out" 0 $?
[ ! -e "$tmp/moe/report.html" ] && ok "--out replaces the default" || bad "RUN/report.html written despite --out"
page "$tmp/moe.html" "$tmp/moe/metrics.jsonl" $dense_plots,moe_aux_loss,expert_load ckpt && ok "MoE page structure" \
  || bad "MoE page structure (mixtral-tiny: no z-loss configured, so no moe_z_loss plot)"
ls "$tmp" | grep -q '\.tmp\.' && bad "temporary left: $(ls "$tmp")" || ok "no temporary left"

# A hand-written run without checkpoint: null and absent points skipped, the z-loss plotted.
mkdir -p "$tmp/hand"
cat >"$tmp/hand/metrics.jsonl" <<'EOF'
{"step": 1, "loss": 3.5, "lr": 0.001, "grad_norm": null, "tokens_per_s": 100, "elapsed_s": 1.5, "tokens": 64, "moe_aux_loss": 0.01, "moe_z_loss": 2.5, "expert_load": 1.5}
{"step": 2, "loss": null, "lr": 0.002, "grad_norm": 1.25, "tokens_per_s": 110, "elapsed_s": 3, "tokens": 128, "val_loss": 3.25, "moe_aux_loss": 0.01, "moe_z_loss": null, "expert_load": 1.25}

{"step": 3, "loss": 2.75, "lr": 0.002, "grad_norm": 1.5, "tokens_per_s": 120, "elapsed_s": 4.5, "tokens": 192, "moe_aux_loss": 0.01, "moe_z_loss": 2.25, "expert_load": 1.125}
EOF
"$dw" report "$tmp/hand" 2>"$tmp/err"
check "report of hand-written metrics (nulls, a blank line)" 0 $?
page "$tmp/hand/report.html" "$tmp/hand/metrics.jsonl" $dense_plots,moe_aux_loss,moe_z_loss,expert_load \
  && ok "hand-written page structure" || bad "hand-written page structure"
cp "$tmp/hand/report.html" "$tmp/hand.keep"
printf '{"step": 4, "loss": 2.' >>"$tmp/hand/metrics.jsonl" # the trainer mid-write
"$dw" report "$tmp/hand" 2>"$tmp/err"
check "an unfinished last line is ignored" 0 $?
has "... with a notice" "$tmp/err" "metrics.jsonl:5: ignoring an unfinished last line"

# --- refusals ------------------------------------------------------------------------------------
"$dw" report "$tmp/none" 2>"$tmp/err"
check "a missing run directory: I/O" 3 $?
has "... named" "$tmp/err" "$tmp/none"
mkdir -p "$tmp/empty"
"$dw" report "$tmp/empty" 2>"$tmp/err"
check "a run without metrics.jsonl: I/O" 3 $?
has "... named" "$tmp/err" "$tmp/empty/metrics.jsonl"
: >"$tmp/empty/metrics.jsonl"
"$dw" report "$tmp/empty" 2>"$tmp/err"
check "an empty metrics.jsonl: bad input" 2 $?
mkdir -p "$tmp/bad"
sed '3s/.*/{"step": 3, "loss": 2.75,, "lr": 1}/' "$tmp/dense/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
"$dw" report "$tmp/bad" 2>"$tmp/err"
check "a malformed line: bad input" 2 $?
has "... named by file and line" "$tmp/err" "$tmp/bad/metrics.jsonl:3: malformed line"
sed '5s/"loss": [^,]*/"loss": "low"/' "$tmp/dense/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
"$dw" report "$tmp/bad" 2>"$tmp/err"
check "a string loss: bad input" 2 $?
has "... named by file, line and key" "$tmp/err" "$tmp/bad/metrics.jsonl:5: malformed line" '"loss": expected a number'
sed '2s/"step": 2/"step": "two"/' "$tmp/dense/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
"$dw" report "$tmp/bad" 2>"$tmp/err"
check "a step that is no integer: bad input" 2 $?
has "... named" "$tmp/err" "$tmp/bad/metrics.jsonl:2:" '"step"'
[ ! -e "$tmp/bad/report.html" ] && ok "no page after a refusal" || bad "a page was written after a refusal"
"$dw" report "$tmp/hand" --out /dev/full 2>"$tmp/err"
check "--out /dev/full: I/O" 3 $?
[ -c /dev/full ] && ok "/dev/full still a device" || bad "/dev/full replaced"
"$dw" report "$tmp/hand" --out "$tmp/no/such/dir/r.html" 2>"$tmp/err"
check "--out in a missing directory: I/O" 3 $?
has "... named" "$tmp/err" "$tmp/no/such/dir/r.html"
cmp -s "$tmp/hand.keep" "$tmp/hand/report.html" && ok "the existing page untouched by failures" \
  || bad "the existing page changed"
"$dw" report 2>/dev/null
check "no RUN: usage" 2 $?
"$dw" report "$tmp/hand" --bogus 2>/dev/null
check "an unknown flag: usage" 2 $?
"$dw" report --help >"$tmp/out"
check "report --help" 0 $?
has "... describes the page" "$tmp/out" "Usage: deepwell report RUN [--out FILE]" "moe_z_loss" "Exit status"
"$dw" --help >"$tmp/out"
has "deepwell --help lists report" "$tmp/out" "  report "

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all report checks passed"
