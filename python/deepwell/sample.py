"""sample.py — `python -m deepwell.sample`: `deepwell sample` with a Hugging Face tokenizer, so a
model trained on deepwell.prepare's shards prints text, not ids.

    python -m deepwell.sample MODEL_OR_CKPT --prompt TEXT [--tokenizer bytes|TOKENIZER.json|HF_DIR]
        [-n 64] [--temperature 0.8] [--top-k 0] [--seed 1337]

MODEL_OR_CKPT: what `deepwell sample` takes (a model directory, a checkpoint, a training run: its
newest checkpoint). The prompt is encoded and prompt + continuation decoded with --tokenizer
(default: the tokenizer.json the model directory or checkpoint came with, else bytes);
Engine.sample does the work.
"""
import argparse
import sys

from .entry import capture, compile


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m deepwell.sample", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model directory, checkpoint or training run")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--tokenizer", default=None, help="bytes, a tokenizer.json or a model directory holding one "
                    "(default: the model's or checkpoint's tokenizer.json, else bytes)")
    ap.add_argument("-n", "--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args(argv)
    if a.tokens < 0 or a.temperature < 0 or a.top_k < 0:
        ap.error("-n, --temperature and --top-k must be >= 0")
    try:
        from .tokenizer import Tokenizer

        e = compile(capture(a.model, seq_len=None, batch=1))
        tok = Tokenizer(a.tokenizer or e.graph.tokenizer or "bytes")
        prompt = tok.encode(a.prompt)
        text = e.sample(prompt, a.tokens, a.temperature, a.top_k, a.seed, tok)
    except (ImportError, OSError, ValueError) as err:
        sys.exit(f"deepwell.sample: {err}")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
