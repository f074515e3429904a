#!/usr/bin/env bash
# test_parity.sh DEEPWELL [SCRIPT] — whole-model parity with PyTorch (tests/python/parity.py, or
# SCRIPT there): logits, loss and every gradient of random tiny gpt2, llama (GQA) and qwen2 models;
# weight-file errors.
set -u
dw=$1
script=${2:-parity.py}
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
py=/usr/bin/python3
if ! $py -c "import torch, numpy" 2>/dev/null; then
  echo "FAIL: $py cannot import torch and numpy (Debian: apt-get install python3-torch python3-numpy)"
  echo "1 failed"
  exit 1
fi
$py "$src/tests/python/$script" "$dw"
