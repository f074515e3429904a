#!/usr/bin/env bash
# test_moe_fp8.sh DEEPWELL — MoE experts under an fp8_block policy (compile/bind_grouped.c): in
# `deepwell compile --explain` a Mixtral of hidden 128 and experts of 256 runs fprop and dgrad in
# the fp8_block grouped kernel (the CPU reference on the CPU; the sm_90 kernel by default and with
# DW_MOE_FP8=1, BF16 naming the switch with DW_MOE_FP8=0; sm_100 BF16 with its reason), its wgrad
# BF16 by default with the default's reason in --explain and --report, and in fp8_block too under a
# rule's "bf16_passes": [] (no default's reason then), and
# --report gives the experts the policy's recipe, the router BF16; mixtral-tiny (hidden 64) keeps its experts BF16
# saying why; the memory plan prices the expert weight caches; the CPU trains it in fp8_block and
# the loss falls over 30 steps of the built-in data; a policy rule {"op": "moe_linear", "recipe":
# "bf16"} keeps the experts BF16, and with every linear BF16 by rule the losses equal --precision
# bf16's bit for bit; with only the experts in fp8_block they differ (train runs them quantised).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
seed=${DW_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "test seed: DW_TEST_SEED=$seed"

mkdir -p "$tmp/mx"
"$dw" capture mixtral-tiny --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["config"]
c["hidden_size"], c["head_dim"], c["intermediate_size"] = 128, 32, 256
json.dump(c, open(sys.argv[1], "w"))' "$tmp/mx/config.json"
explain() { # explain NAME MODEL FLAGS...: compile --explain into $tmp/NAME
  local n=$1 m=$2; shift 2
  "$dw" compile "$m" --batch 2 --seq 16 --explain "$@" >"$tmp/$n" 2>&1
}
count() { grep -cF -- "$2" "$tmp/$1"; }

explain cpu "$tmp/mx" --precision fp8_block --target cpu --report; check "hidden 128, fp8_block, CPU" 0 $?
has "CPU: the experts in fp8_block, the router BF16" "$tmp/cpu" \
  "recipe fp8_block (policy: default): where a pass runs in fp8_block, x and dy are quantised 1x128 per call" \
  "model.layers.0.mlp.experts.up                moe_linear    recipe fp8_block  (default)" \
  "at this shape: fprop quantised (grouped_cpu_fp8_block); dgrad quantised (grouped_cpu_fp8_block)" \
  "MoE router or shared-expert gate (BF16 under every policy)" "W and W^T of"
[ "$(count cpu "selected: grouped_cpu_fp8_block (fp8_block)")" = 12 ] && ok "CPU: fprop and dgrad of 6 layers in fp8_block" ||
  bad "CPU: $(count cpu "selected: grouped_cpu_fp8_block") fp8 selections, want 12"
default_why='fp8_block experts keep wgrad BF16 by default (the grouped FP8 wgrad is slower on sm_90; a rule'"'"'s "bf16_passes": [] quantises it)'
[ "$(count cpu "       BF16 fallback: $default_why")" = 6 ] && ok "CPU: --explain keeps the 6 wgrads BF16 by default, saying why" ||
  bad "CPU: $(count cpu "BF16 fallback: $default_why") wgrads BF16 by default in --explain, want 6"
[ "$(count cpu "wgrad BF16 FALLBACK: $default_why (grouped_cpu_reference)")" = 6 ] &&
  ok "  ... and --report, with the BF16 kernel" || bad "--report: $(count cpu "wgrad BF16 FALLBACK: $default_why") defaults, want 6"

# a rule's "bf16_passes": [] quantises the wgrad too: 18 fp8_block selections, no word of the default
cat >"$tmp/fp8wgrad.json" <<'EOF'
{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": []}]}
EOF
explain cpuw "$tmp/mx" --policy "$tmp/fp8wgrad.json" --target cpu --report; check "hidden 128, \"bf16_passes\": [], CPU" 0 $?
[ "$(count cpuw "selected: grouped_cpu_fp8_block (fp8_block)")" = 18 ] && ok "  ... fprop, dgrad and wgrad of 6 layers in fp8_block" ||
  bad "\"bf16_passes\": []: $(count cpuw "selected: grouped_cpu_fp8_block") fp8 selections, want 18"
[ "$(count cpuw "by default")" = 0 ] && ok "  ... no default's reason" || bad "\"bf16_passes\": [] still names the default"
[ "$(count cpuw "wgrad quantised (grouped_cpu_fp8_block)")" = 6 ] && ok "  ... --report: the 6 wgrads quantised" ||
  bad "--report with []: $(count cpuw "wgrad quantised (grouped_cpu_fp8_block)") wgrads quantised, want 6"

explain tiny mixtral-tiny --precision fp8_block --target cpu; check "mixtral-tiny fp8_block" 0 $?
has "hidden 64: BF16 with the reason" "$tmp/tiny" \
  "BF16 fallback: grouped_cpu_fp8_block: K and M must be multiples of 128" "selected: grouped_cpu_reference (bf16 fallback)"

unset DW_MOE_FP8
explain sm90 "$tmp/mx" --precision fp8_block --sm 90; check "sm_90, DW_MOE_FP8 unset" 0 $?
[ "$(count sm90 "selected: grouped_fp8block_sm90 (fp8_block)")" = 12 ] && ok "sm_90 by default: the fp8_block kernel" ||
  bad "sm_90 by default: $(count sm90 "selected: grouped_fp8block_sm90") selections: $(head -c 600 "$tmp/sm90")"
[ "$(count sm90 "BF16 fallback: $default_why")" = 6 ] && ok "  ... its wgrad BF16 by default" ||
  bad "sm_90: $(count sm90 "BF16 fallback: $default_why") wgrads BF16 by default, want 6"
explain sm90w "$tmp/mx" --policy "$tmp/fp8wgrad.json" --sm 90; check "sm_90, \"bf16_passes\": []" 0 $?
[ "$(count sm90w "selected: grouped_fp8block_sm90 (fp8_block)")" = 18 ] && ok "  ... the fp8_block kernel for the wgrad too" ||
  bad "sm_90 with []: $(count sm90w "selected: grouped_fp8block_sm90") selections, want 18"
[ "$(count sm90 "DW_MOE_FP8")" = 0 ] && ok "  ... and no word of the switch" || bad "sm_90 by default names DW_MOE_FP8"
DW_MOE_FP8=0 explain sm90off "$tmp/mx" --precision fp8_block --sm 90; check "sm_90 with DW_MOE_FP8=0" 0 $?
has "sm_90 switched off: BF16, the switch named" "$tmp/sm90off" \
  "BF16 fallback: grouped_fp8block_sm90: switched off by DW_MOE_FP8=0" "selected: grouped_wgmma_sm90 (bf16 fallback)"
[ "$(count sm90off "selected: grouped_fp8block_sm90")" = 0 ] && ok "  ... and no fp8_block kernel" ||
  bad "sm_90 switched off still selects grouped_fp8block_sm90"
DW_MOE_FP8=1 explain sm90on "$tmp/mx" --precision fp8_block --sm 90; check "sm_90 with DW_MOE_FP8=1" 0 $?
[ "$(count sm90on "selected: grouped_fp8block_sm90 (fp8_block)")" = 12 ] && ok "sm_90 switched on: the fp8_block kernel" ||
  bad "sm_90 switched on: $(count sm90on "selected: grouped_fp8block_sm90") selections"
explain sm100 "$tmp/mx" --precision fp8_block --sm 100; check "sm_100" 0 $?
has "sm_100: BF16, the architecture named" "$tmp/sm100" "BF16 fallback: grouped_fp8block_sm90: needs sm_90, device is sm_100"

ws() { "$dw" compile "$tmp/mx" --batch 2 --seq 16 --target cpu "$@" | awk '$1 == "workspace" {print $2}'; }
w8=$(ws --precision fp8_block) wb=$(ws --precision bf16)
# 6 expert layers x (W + W^T): 4 x 256 x 128 codes each, scales 4 x 2 x 1 floats
[ -n "$w8" ] && [ -n "$wb" ] && [ $((w8 - wb)) -ge $((6 * 2 * (4 * 256 * 128 + 32))) ] &&
  ok "the workspace prices the experts' weight caches ($wb -> $w8 B)" || bad "workspace $wb -> $w8"

common=(--model "$tmp/mx" --data builtin --batch 4 --seq 32 --eval-every 0 --seed $((seed % 100000)) --device cpu)
"$dw" train "${common[@]}" --steps 30 --precision fp8_block --out "$tmp/fp8" >"$tmp/fp8.out" 2>&1
check "train 30 steps in fp8_block on the CPU" 0 $?
python3 - "$tmp/fp8/metrics.jsonl" <<'PY' && ok "  ... the loss falls" || bad "fp8_block loss did not fall"
import json, sys
r = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert len(r) == 30 and sum(r[-5:]) / 5 < sum(r[:5]) / 5 - 1.0, r
PY

cat >"$tmp/keep.json" <<'EOF'
{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "bf16"}]}
EOF
cat >"$tmp/allbf16.json" <<'EOF'
{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "bf16"}, {"op": "linear", "recipe": "bf16"}]}
EOF
explain keep "$tmp/mx" --policy "$tmp/keep.json" --target cpu --report; check "the moe_linear rule" 0 $?
has "a moe_linear rule keeps the experts BF16" "$tmp/keep" \
  "model.layers.0.mlp.experts.up                moe_linear    recipe bf16       (rule 0)"
[ "$(count keep "in fp8_block:")" = 0 ] && ok "  ... and asks for no fp8 kernel" || bad "the rule's experts asked for fp8"
"$dw" train "${common[@]}" --steps 3 --precision bf16 --out "$tmp/b1" >/dev/null 2>&1; check "bf16 run" 0 $?
"$dw" train "${common[@]}" --steps 3 --policy "$tmp/allbf16.json" --out "$tmp/b2" >/dev/null 2>&1; check "every linear bf16 by rule" 0 $?
python3 - "$tmp/b1/metrics.jsonl" "$tmp/b2/metrics.jsonl" <<'PY' && ok "  ... the same losses bit for bit" || bad "bf16 losses differ"
import json, sys
a, b = ([json.loads(x)["loss"] for x in open(f)] for f in sys.argv[1:])
assert len(a) == 3 and a == b, (a, b)
PY
cat >"$tmp/experts.json" <<'EOF'
{"default": "fp8_block", "rules": [{"op": "linear", "recipe": "bf16"}]}
EOF
"$dw" train "${common[@]}" --steps 3 --policy "$tmp/experts.json" --out "$tmp/b3" >/dev/null 2>&1; check "only the experts fp8_block" 0 $?
python3 - "$tmp/b1/metrics.jsonl" "$tmp/b3/metrics.jsonl" <<'PY' && ok "  ... train ran them in fp8: other losses than BF16's, close to them" || bad "experts-only fp8 losses"
import json, sys
a, b = ([json.loads(x)["loss"] for x in open(f)] for f in sys.argv[1:])
assert len(b) == 3 and a != b and all(abs(x - y) < 0.05 * x for x, y in zip(a, b)), (a, b)
PY

echo "$fails failed"
[ $fails -eq 0 ]
