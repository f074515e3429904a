#!/usr/bin/env bash
# test_parity_gemma2_phi3.sh DEEPWELL — Gemma 2 and Phi-3 against their float64 PyTorch references
# (tests/python/hf_parity_gemma2.py, hf_parity_phi3.py, checks in family_check.py): loss, logits and
# gradients within 1e-5, export -> eval bit for bit, fine-tuning from the directory's weights,
# refusals by name. Both run; either failing fails the test.
set -u
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
rc=0
for family in gemma2 phi3; do /usr/bin/python3 "$src/tests/python/hf_parity_$family.py" "$1" || rc=1; done
exit $rc
