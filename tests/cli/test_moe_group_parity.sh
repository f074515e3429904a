#!/usr/bin/env bash
# test_moe_group_parity.sh DEEPWELL — DeepSeek-V3's router variants (group-limited selection,
# sigmoid or softmax scores, routed_scaling_factor, a selection bias from the weights file) in
# whole-model parity with a float64 PyTorch reference (tests/python/parity_router.py): logits, loss
# and every gradient of random tiny Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE models.
set -u
dw=$1
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
py=/usr/bin/python3
if ! $py -c "import torch, numpy" 2>/dev/null; then
  echo "FAIL: $py cannot import torch and numpy (Debian: apt-get install python3-torch python3-numpy)"
  echo "1 failed"
  exit 1
fi
$py "$src/tests/python/parity_router.py" "$dw"
