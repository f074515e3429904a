#!/usr/bin/env bash
# test_nvfp4_recipe.sh DEEPWELL — the NVFP4 training recipe at the command line: `deepwell compile
# --precision nvfp4 --report` keeps the LM head and the last ~15% of the blocks in BF16 with the
# recipe's reason (llama-tiny: 4 blocks, so block 3), a policy file's "nvfp4" field switches the
# tail and head off, and a bad field is refused with a non-zero exit naming the file and the key.
set -u
dw=$1
fails=0
check() { if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi; }
has() { if grep -qF -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in:"; cat "$2"; fails=$((fails + 1)); fi; }
hasnt() { if grep -qF -- "$3" "$2"; then echo "FAIL: $1: '$3' unexpectedly in $2"; fails=$((fails + 1)); else echo "ok: $1"; fi; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
why="nvfp4 recipe: the LM head and the last blocks stay BF16"

"$dw" compile llama-tiny --batch 1 --seq 32 --precision nvfp4 --report >"$tmp/r" 2>&1; check "compile --precision nvfp4" 0 $?
grep -F "model.layers.3.mlp.down_proj " "$tmp/r" >"$tmp/l3"; has "the last block stays BF16" "$tmp/l3" "$why"
grep -F "lm_head " "$tmp/r" >"$tmp/head"; has "the LM head stays BF16" "$tmp/head" "$why"
grep -F "model.layers.2.mlp.down_proj " "$tmp/r" >"$tmp/l2"; has "block 2 is nvfp4" "$tmp/l2" "recipe nvfp4"

printf '{"default": "nvfp4", "nvfp4": {"bf16_last_blocks": 0, "bf16_head": false, "rht": true}}' >"$tmp/p.json"
"$dw" compile llama-tiny --batch 1 --seq 32 --policy "$tmp/p.json" --report >"$tmp/r2" 2>&1; check "compile --policy (no tail)" 0 $?
hasnt "no node kept BF16 by the recipe" "$tmp/r2" "$why"

printf '{"default": "nvfp4", "nvfp4": {"rht": "yes"}}' >"$tmp/bad.json"
"$dw" compile llama-tiny --batch 1 --seq 32 --policy "$tmp/bad.json" >"$tmp/e" 2>&1; rc=$?
[ $rc -ne 0 ]; check "a bad nvfp4 field is refused" 0 $?
has "the refusal names the file" "$tmp/e" "bad.json"
has "the refusal names the key" "$tmp/e" "nvfp4.rht"

[ $fails -eq 0 ] && echo "all ok" || { echo "$fails failure(s)"; exit 1; }
