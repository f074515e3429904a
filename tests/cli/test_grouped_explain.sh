#!/usr/bin/env bash
# test_grouped_explain.sh DEEPWELL — `deepwell compile --explain` and `dryrun --explain`: each MoE
# linear layer of mixtral-tiny (2 layers x gate, up, down) with its grouped GEMM per pass, every
# registered grouped kernel eligible or why not, and the one selected — for a CPU program (the
# reference), a CUDA sm_90 BF16 program (wgmma), sm_80 (mma.sync), an FP32 CUDA program (the FMA
# tiles), a random batch and sequence (the rows: batch x seq x top-2); DW_MOE_GEMM forcing one
# kernel and refusing an unknown value or an impossible choice; a dense model says it has none.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
B=$((RANDOM % 3 + 1)) T=$((8 * (RANDOM % 8 + 1)))
R=$((B * T * 2))
explain() { # explain NAME FLAGS...: compile mixtral-tiny with FLAGS --explain into $tmp/NAME
  local n=$1; shift
  "$dw" compile mixtral-tiny --batch $B --seq $T --explain "$@" >"$tmp/$n" 2>&1
}
count() { grep -c -- "$2" "$tmp/$1"; }
explain cpu --target cpu; check "CPU target" 0 $?
has "CPU: the header, a layer, the reference chosen, the CUDA kernels refused" "$tmp/cpu" \
  "grouped GEMM selections (target cpu)" "model.layers.1.mlp.experts.down" \
  "fprop: rows $R, 4 experts, K 64 -> M 128, fp32" "wgrad: rows $R, 4 experts, K 128 -> M 64, fp32" \
  "grouped_cpu_reference        prio   0  eligible" \
  "grouped_wgmma_sm90           prio  30  rejected: CUDA kernel, CPU target" "selected: grouped_cpu_reference"
[ "$(count cpu "selected: grouped_cpu_reference")" = 18 ] && ok "CPU: 6 MoE linear layers x 3 passes" || bad "CPU: $(count cpu selected:) selections"
explain sm90 --sm 90 --report; check "CUDA sm_90 (with --report)" 0 $?
has "sm_90 BF16: wgmma, the others eligible below it" "$tmp/sm90" "grouped GEMM selections (target cuda sm_90)" \
  "dgrad: rows $R, 4 experts, K 64 -> M 128, bf16" "grouped_mma_sm80             prio  20  eligible" \
  "grouped_cpu_reference        prio   0  rejected: CPU kernel, CUDA target" "selected: grouped_wgmma_sm90" \
  "kernel grouped fprop grouped_wgmma_sm90, dgrad grouped_wgmma_sm90, wgrad grouped_wgmma_sm90"
[ "$(count sm90 "selected: grouped_wgmma_sm90")" = 18 ] && ok "sm_90: every selection" || bad "sm_90 selections"
explain sm80 --sm 80; check "CUDA sm_80" 0 $?
has "sm_80: mma.sync, wgmma refused with the reason" "$tmp/sm80" \
  "grouped_wgmma_sm90           prio  30  rejected: needs sm_90, device is sm_80" "selected: grouped_mma_sm80"
explain fp32 --precision fp32; check "CUDA FP32" 0 $?
has "FP32: the FMA tiles" "$tmp/fp32" "grouped_mma_sm80             prio  20  rejected: operands must be bf16, not fp32" \
  "selected: grouped_cuda_simt"
DW_MOE_GEMM=mma explain forced --sm 90; check "DW_MOE_GEMM=mma" 0 $?
has "DW_MOE_GEMM: the one asked for" "$tmp/forced" "(DW_MOE_GEMM asks for one)" \
  "grouped_wgmma_sm90           prio  30  rejected: not the requested backend" "selected: grouped_mma_sm80"
DW_MOE_GEMM=wgmma explain imp --sm 80; check "DW_MOE_GEMM=wgmma on sm_80" 1 $?
has "names the node and the reason" "$tmp/imp" "node 'model.layers.0.mlp.experts.gate' (moe_linear): no grouped kernel" \
  "needs sm_90, device is sm_80"
DW_MOE_GEMM=fast explain unk; check "DW_MOE_GEMM=fast" 2 $?
has "names the variable and the value" "$tmp/unk" "DW_MOE_GEMM must be auto, wgmma, mma or simt, not 'fast'"
"$dw" compile gpt2-tiny --explain >"$tmp/dense" 2>&1; check "a dense model" 0 $?
has "a dense model has no MoE layers" "$tmp/dense" "(no MoE linear layers in this program)"
"$dw" compile mixtral-tiny --batch $B --seq $T >"$tmp/plain" 2>&1
grep -q "grouped GEMM selections" "$tmp/plain" && bad "without --explain: no selections" || ok "without --explain: none"
"$dw" dryrun mixtral-tiny --hw h200 --gpus 1 --seq 64 --global-batch 4 --explain >"$tmp/dry" 2>&1
check "dryrun --explain" 0 $?
has "dryrun: the engine's program and its grouped selections" "$tmp/dry" "== the engine's kernels (--explain)" \
  "grouped GEMM selections (target cuda sm_90)" "model.layers.0.mlp.experts.up" "selected: grouped_wgmma_sm90"
"$dw" compile --help >"$tmp/h" 2>&1; has "compile --help names --explain" "$tmp/h" "--explain"
"$dw" dryrun --help >"$tmp/h" 2>&1; has "dryrun --help names --explain" "$tmp/h" "--explain"
echo "$fails failed"
[ "$fails" = 0 ]
