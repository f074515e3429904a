#!/usr/bin/env bash
# test_bench_step_args.sh DEEPWELL — `deepwell bench step`'s arguments before any GPU work (they are
# checked on a CPU context, so a build without CUDA answers the same): --policy FILE beside
# --precision or --fallback is a usage error (2) saying so; a policy file that does not exist or
# has a bad "bf16_passes" is refused naming the file and the field; --help names --policy.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
echo '{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": ["wgrad"]}]}' >"$tmp/ok.json"
echo '{"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": ["bwd"]}]}' >"$tmp/bad.json"
"$dw" bench step mixtral-tiny --seq 64 --policy "$tmp/ok.json" --precision bf16 >/dev/null 2>"$tmp/err"
check "--policy with --precision" 2 $?
has "  ... saying why" "$tmp/err" "--policy FILE replaces --precision and --fallback"
"$dw" bench step mixtral-tiny --seq 64 --policy "$tmp/ok.json" --fallback safe >/dev/null 2>"$tmp/err"
check "--policy with --fallback" 2 $?
"$dw" bench step mixtral-tiny --seq 64 --policy "$tmp/bad.json" >/dev/null 2>"$tmp/err"
check "a policy with an unknown pass" 2 $?
has "  ... naming the file and the field" "$tmp/err" "$tmp/bad.json: rules[0]: field 'bf16_passes'[0]"
"$dw" bench step mixtral-tiny --seq 64 --policy "$tmp/none.json" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && ok "a missing policy file refused (exit $rc)" || bad "a missing policy file ran"
has "  ... naming it" "$tmp/err" "$tmp/none.json"
"$dw" bench step --help | grep -q -- "--policy FILE"
check "--help names --policy" 0 $?
[ "$fails" -eq 0 ] || exit 1
