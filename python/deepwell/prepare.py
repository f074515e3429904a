"""prepare.py — `python -m deepwell.prepare`: text or JSONL -> llm.c token shards for `deepwell
train --data 'DIR/train_*.bin'` (docs/training.md "Token shards"), with a train/val split.

    python -m deepwell.prepare --tokenizer TOKENIZER --in FILE [FILE ...] --out DIR
        [--val-fraction 0.01] [--shard-tokens 100000000] [--field text] [--eot ID|none]

TOKENIZER: "bytes" (byte-level ids 0..255, the library's own "bytes" tokenizer: no package
needed), a tokenizer.json, or a Hugging Face model directory holding one (read with the
`tokenizers` package: `pip install tokenizers`). Each document (a .jsonl line's `field`, else a
whole file) is tokenised and preceded by the end-of-text token (--eot; default: the tokenizer's
<|endoftext|>, </s> or <|end_of_text|> when it has one), as llm.c's data scripts do. Every
`1 / val_fraction`-th document goes to val_*.bin. Shards are uint16, or uint32 when the vocabulary
exceeds 65536 ids. Prints a progress line per file and a summary.
"""
import argparse
import json
import os
import sys

import numpy as np

from .data import write_shard
from .tokenizer import Tokenizer

def documents(path, field):
    """(text) of each document of a file: .jsonl lines' `field`, else the whole file."""
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"deepwell.prepare: {path}:{n}: not JSON: {e}")
                if not isinstance(doc, dict) or not isinstance(doc.get(field), str):
                    raise SystemExit(f"deepwell.prepare: {path}:{n}: no string field '{field}' (--field)")
                yield doc[field]
    else:
        with open(path, encoding="utf-8") as f:
            yield f.read()


class ShardWriter:
    """Buffers tokens and writes DIR/<split>_<k>.bin shards of at most `limit` tokens."""

    def __init__(self, out, split, limit, vocab):
        self.out, self.split, self.limit, self.vocab = out, split, limit, vocab
        self.buf, self.n, self.k, self.paths = [], 0, 0, []

    def add(self, ids):
        self.buf.append(np.asarray(ids, dtype=np.int64))
        self.n += len(ids)
        while self.n >= self.limit:
            allt = np.concatenate(self.buf)
            self._write(allt[:self.limit])
            rest = allt[self.limit:]
            self.buf, self.n = [rest], len(rest)

    def _write(self, tokens):
        path = os.path.join(self.out, f"{self.split}_{self.k:06d}.bin")
        write_shard(path, tokens, vocab=self.vocab)
        self.paths.append(path)
        self.k += 1

    def close(self):
        if self.n:
            self._write(np.concatenate(self.buf))
        self.buf, self.n = [], 0
        return self.paths


def prepare(tokenizer, inputs, out, val_fraction=0.01, shard_tokens=100_000_000, field="text", eot="auto",
            progress=True):
    """Tokenises `inputs` into shards under `out`; returns {"train": [paths], "val": [paths],
    "tokens": {"train": n, "val": n}, "vocab": V, "eot": id or None}."""
    try:
        tok = Tokenizer(tokenizer)
    except (ImportError, FileNotFoundError) as e:
        raise SystemExit(f"deepwell.prepare: --tokenizer: {e}")
    if eot == "auto":
        eot = tok.eot
    elif eot in (None, "none"):
        eot = None
    else:
        eot = int(eot)
        if not 0 <= eot < tok.vocab:
            raise SystemExit(f"deepwell.prepare: --eot {eot} is outside the vocabulary [0, {tok.vocab})")
    if not 0 <= val_fraction < 1:
        raise SystemExit(f"deepwell.prepare: --val-fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise SystemExit(f"deepwell.prepare: --shard-tokens must be >= 1, got {shard_tokens}")
    for p in inputs:
        if not os.path.isfile(p):
            raise SystemExit(f"deepwell.prepare: --in {p}: no such file")
    os.makedirs(out, exist_ok=True)
    writers = {s: ShardWriter(out, s, shard_tokens, tok.vocab) for s in ("train", "val")}
    counts = {"train": 0, "val": 0}
    every = round(1 / val_fraction) if val_fraction > 0 else 0
    ndoc = 0
    for i, path in enumerate(inputs, 1):
        for text in documents(path, field):
            ndoc += 1
            ids = ([eot] if eot is not None else []) + tok.encode(text)
            split = "val" if every and ndoc % every == 0 else "train"
            writers[split].add(ids)
            counts[split] += len(ids)
        if progress:
            sys.stderr.write(f"\rdeepwell.prepare: [{i}/{len(inputs)}] {path}: {ndoc} documents, "
                             f"{counts['train']} train + {counts['val']} val tokens\033[K")
    if progress:
        sys.stderr.write("\n")
    res = {s: w.close() for s, w in writers.items()}
    return {**res, "tokens": counts, "vocab": tok.vocab, "eot": eot, "tokenizer": tok.path}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m deepwell.prepare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help='"bytes", a tokenizer.json, or a model directory with one')
    ap.add_argument("--in", dest="inputs", nargs="+", required=True, help="text or .jsonl files")
    ap.add_argument("--out", required=True, help="output directory (train_*.bin, val_*.bin)")
    ap.add_argument("--val-fraction", type=float, default=0.01)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--field", default="text", help="the text field of .jsonl lines")
    ap.add_argument("--eot", default="auto", help="end-of-text id before each document, or none")
    a = ap.parse_args(argv)
    r = prepare(a.tokenizer, a.inputs, a.out, a.val_fraction, a.shard_tokens, a.field, a.eot)
    print(f"{r['tokens']['train']} train tokens in {len(r['train'])} shard(s), {r['tokens']['val']} val tokens in "
          f"{len(r['val'])} shard(s); vocabulary {r['vocab']}, end-of-text {r['eot']}; "
          f"train with: deepwell train --data '{os.path.join(a.out, 'train_*.bin')}' "
          f"--val '{os.path.join(a.out, 'val_*.bin')}'"
          + (f" --tokenizer '{os.path.abspath(r['tokenizer'])}'" if r["tokenizer"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
