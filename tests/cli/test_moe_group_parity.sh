#!/usr/bin/env bash
# test_moe_group_parity.sh DEEPWELL — DeepSeek-V3's router variants (group-limited selection,
# sigmoid or softmax scores, routed_scaling_factor, a selection bias from the weights file) in
# whole-model parity with a float64 PyTorch reference (tests/python/parity_router.py): logits, loss
# and every gradient of random tiny Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE models.
exec bash "$(dirname "$0")/test_parity.sh" "$1" parity_router.py # its torch check, then the script
