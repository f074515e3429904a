#!/usr/bin/python3
"""finetune_text.py — fine-tune a Hugging Face model directory on a text file with `import deepwell`.

    python3 examples/finetune_text.py --model MODEL_DIR --text FILE --out DIR [--steps 60] [--device cpu]

MODEL_DIR holds config.json and model.safetensors (a byte-level model: vocabulary 256; for another
vocabulary pass --tokenizer with its tokenizer.json). The text is tokenised into llm.c shards with
a train/val split (deepwell.prepare), the model is captured, compiled and trained by
dw.Trainer (the C trainer: shuffled windows, validation, checkpoints in DIR/run), and the result
is exported to DIR/hf as a Hugging Face directory. Prints the validation loss before and after
and a sample decoded with the same tokenizer;
exits non-zero when fine-tuning did not lower it. `--make-model PRESET` first writes MODEL_DIR
from a preset with random weights (for a demonstration without a downloaded model).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))  # from a clone

import deepwell as dw  # noqa: E402
from deepwell import prepare  # noqa: E402


def val_loss(engine, pattern, batches):
    r = dw.data(pattern).reader(seq=engine.seq, vocab=engine.vocab)
    n = max(1, min(batches, r.windows // engine.batch))
    return sum(engine.forward(*r.next(engine.batch)) for _ in range(n)) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="bytes")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--make-model", metavar="PRESET")
    a = ap.parse_args()

    if a.make_model:  # a model directory from a preset, random weights
        dw.export(dw.compile(dw.capture(a.make_model)), a.model)
    shards = os.path.join(a.out, "data")
    prepare.prepare(a.tokenizer, [a.text], shards, val_fraction=0.1, eot=None if a.tokenizer == "bytes" else "auto")
    train, val = os.path.join(shards, "train_*.bin"), os.path.join(shards, "val_*.bin")
    if not os.path.exists(os.path.join(shards, "val_000000.bin")):  # one document: validate on its training text
        val = train

    ctx = dw.Context(a.device)
    engine = dw.compile(dw.capture(a.model, seq_len=a.seq, batch=a.batch, ctx=ctx))  # the directory's weights
    before = val_loss(engine, val, 4)
    trainer = dw.Trainer.from_engine(engine, lr=a.lr, schedule="cosine", dataloader=dw.data(train, val=val),
                                     steps=a.steps, out=os.path.join(a.out, "run"), warmup=5,
                                     eval_every=max(1, a.steps // 2), eval_batches=4, log_every=10)
    trainer.fit()
    after = val_loss(engine, val, 4)
    hf = dw.export(trainer, os.path.join(a.out, "hf"))
    print(f"validation loss {before:.4f} -> {after:.4f}; checkpoint {trainer.checkpoint}; exported {hf}")
    with open(a.text, encoding="utf-8") as f:  # text back: the start of the file, continued
        prompt = f.read(24).split("\n")[0] or "The"
    print("sample:", repr(engine.sample(prompt, n=32, temperature=0.8, tokenizer=a.tokenizer)))
    return 0 if after < before else 1


if __name__ == "__main__":
    sys.exit(main())
