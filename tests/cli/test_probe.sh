#!/usr/bin/env bash
# test_probe.sh DEEPWELL — `deepwell probe` end to end: table, JSON schema, presets, exit codes.
set -u
dw=$1
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$dw" probe >"$tmp/table" 2>"$tmp/err"; check "probe table" 0 $?
grep -q "source: probe" "$tmp/table" || { echo "FAIL: table lacks source"; fails=$((fails + 1)); }
"$dw" probe --json >"$tmp/p.json" 2>"$tmp/err"; check "probe --json" 0 $?
python3 - "$tmp/p.json" "$tmp/err" <<'PY' || fails=$((fails + 1))
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"] == "probe", d
assert isinstance(d["gpus"], list) and isinstance(d["links"], list)
assert d["host"]["cpus"] >= 1 and d["host"]["ram_bytes"] > 0
if not d["gpus"]:
    err = open(sys.argv[2]).read().strip().splitlines()
    assert len(err) == 1 and "no GPUs" in err[0], err  # one-line notice on stderr
for g in d["gpus"]:
    for k in ["index","name","cc","sms","hbm_bytes","hbm_free_bytes","sm_clock_mhz","mem_clock_mhz","l2_bytes","features"]:
        assert k in g, k
    for k in ["wgmma","fp8","tcgen05","tmem","mx_block_scaling","fp4"]:
        assert isinstance(g["features"][k], bool), k
print("ok: probe JSON schema")
PY
"$dw" probe --preset b200 --nodes 8 --json >"$tmp/b.json"; check "preset b200 x8" 0 $?
python3 - "$tmp/b.json" <<'PY' || fails=$((fails + 1))
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"] == "preset" and d["preset"] == "b200" and d["nodes"] == 8, d
assert len(d["gpus"]) == 8 and "datasheet" in d["label"]
g = d["gpus"][0]
assert g["features"]["tcgen05"] and g["features"]["fp4"] and not g["features"]["wgmma"]
assert g["peak"]["fp4_tflops"] > g["peak"]["fp8_tflops"] > g["peak"]["bf16_tflops"] > 0
print("ok: preset JSON")
PY
"$dw" probe --hw "$tmp/b.json" --json >"$tmp/b2.json"; check "load back" 0 $?
cmp -s "$tmp/b.json" "$tmp/b2.json" || { echo "FAIL: preset JSON does not round-trip"; fails=$((fails + 1)); }
"$dw" probe --list-presets | grep -q gb200-nvl72; check "list presets" 0 $?
"$dw" probe --help | grep -q -- "--preset"; check "help" 0 $?

"$dw" probe --preset a100 2>"$tmp/err"; check "unknown preset exits 2" 2 $?
grep -q "a100" "$tmp/err" || { echo "FAIL: message does not name the preset"; fails=$((fails + 1)); }
"$dw" probe --hw /nonexistent.json 2>"$tmp/err"; check "missing file exits 3 (I/O)" 3 $?
grep -q "/nonexistent.json" "$tmp/err" || { echo "FAIL: message does not name the file"; fails=$((fails + 1)); }
echo '{"gpus": [' >"$tmp/bad.json"
"$dw" probe --hw "$tmp/bad.json" 2>"$tmp/err"; check "malformed JSON exits 2" 2 $?
grep -q "bad.json:2" "$tmp/err" || { echo "FAIL: message lacks file:line"; cat "$tmp/err"; fails=$((fails + 1)); }
"$dw" probe --nodes 4 2>/dev/null; check "--nodes without --preset exits 2" 2 $?
"$dw" probe --preset h200 --nodes zero 2>/dev/null; check "bad --nodes exits 2" 2 $?
"$dw" probe --bogus 2>/dev/null; check "unknown flag exits 2" 2 $?
"$dw" nosuchcommand 2>/dev/null; check "unknown command exits 2" 2 $?

echo "$fails failed"
[ "$fails" -eq 0 ]
