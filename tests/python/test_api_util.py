"""test_api_util.py — shared set-up of the Python API tests (test_api_*.py): the package from
python/ of this tree, the library from DEEPWELL_LIB (ctest passes the build's), the CLI from
DEEPWELL_CLI, and a tiny Llama config that trains in well under a second per step on the CPU.
Holds no tests itself."""
import os
import subprocess
import sys

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "python"))
sys.path.insert(0, os.path.join(SRC, "tests", "python"))  # parity.py's reference models

if not os.environ.get("DEEPWELL_LIB"):
    os.environ["DEEPWELL_LIB"] = os.path.join(SRC, "build", "libdeepwell.so")
CLI = os.environ.get("DEEPWELL_CLI") or os.path.join(os.path.dirname(os.environ["DEEPWELL_LIB"]), "deepwell")

import deepwell as dw  # noqa: E402


def tiny_llama(**over):
    c = dict(model_type="llama", vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=64, rms_norm_eps=1e-5,
             rope_theta=10000.0, tie_word_embeddings=False)
    c.update(over)
    return c


def cli(*args):
    """Runs the `deepwell` command; returns (exit code, stdout, stderr)."""
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def cli_eval_loss(model, data, batch, seq):
    rc, out, err = cli("eval", model, "--data", data, "--batch", batch, "--seq", seq)
    if rc != 0:
        raise AssertionError(f"deepwell eval {model} failed ({rc}): {err}")
    return float(out.split()[1])  # "loss 2.042961  (perplexity ...)"


__all__ = ["dw", "SRC", "CLI", "tiny_llama", "cli", "cli_eval_loss"]
