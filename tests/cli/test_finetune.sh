#!/usr/bin/env bash
# test_finetune.sh DEEPWELL — fine-tuning from a Hugging Face model directory's weights
# (tests/python/finetune.py, needs python3-torch and python3-numpy): the first training loss
# equals `deepwell eval`, --init random and --init-from, sharded F32/F16/BF16 files, tied
# embeddings, refusals, resume from the checkpoint.
set -u
src=${DW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_NUM_THREADS=1 # tiny models: no OpenMP barriers stalling on a loaded machine
exec /usr/bin/python3 "$src/tests/python/finetune.py" "$1"
