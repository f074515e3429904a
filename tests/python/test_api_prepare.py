"""test_api_prepare.py — `python -m deepwell.prepare`: text and JSONL documents become llm.c shards
the library's reader accepts, holding exactly each document's tokens after its end-of-text id,
split train/val every 1/val_fraction-th document and cut at --shard-tokens; bad input is refused
naming the file and line. With the `tokenizers` package (when installed) a tokenizer.json built
here gives its own ids and uint32 shards for a vocabulary over 65536."""
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from test_api_util import SRC, dw

from deepwell import prepare


class Prepare(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        rng = random.Random(int.from_bytes(os.urandom(4), "little"))
        words = ["alpha", "beta", "gamma", "délta", "ε"]
        self.docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(23)]
        with open(os.path.join(self.d, "a.jsonl"), "w", encoding="utf-8") as f:
            for t in self.docs[:20]:
                f.write(json.dumps({"text": t, "id": 1}) + "\n")
        for i, t in enumerate(self.docs[20:]):
            with open(os.path.join(self.d, f"b{i}.txt"), "w", encoding="utf-8") as f:
                f.write(t)
        self.inputs = [os.path.join(self.d, "a.jsonl")] + sorted(glob.glob(os.path.join(self.d, "b*.txt")))

    def tearDown(self):
        self.tmp.cleanup()

    def test_bytes_shards_hold_each_document(self):
        out = os.path.join(self.d, "out")
        r = subprocess.run([sys.executable, "-m", "deepwell.prepare", "--tokenizer", "bytes", "--in", *self.inputs,
                            "--out", out, "--val-fraction", "0.2", "--shard-tokens", "300", "--eot", "10"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(SRC, "python")})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("train with: deepwell train", r.stdout)
        self.assertNotIn("--tokenizer", r.stdout)  # bytes: nothing for the run to record
        want = {"train": [], "val": []}
        for n, t in enumerate(self.docs, 1):
            want["val" if n % 5 == 0 else "train"] += [10] + list(t.encode("utf-8"))
        for split in ("train", "val"):
            shards = sorted(glob.glob(os.path.join(out, f"{split}_*.bin")))
            got = np.concatenate([dw.read_shard(p) for p in shards])
            np.testing.assert_array_equal(got, want[split])
            self.assertTrue(all(len(dw.read_shard(p)) <= 300 for p in shards))
        self.assertGreater(len(glob.glob(os.path.join(out, "train_*.bin"))), 1)
        reader = dw.data(os.path.join(out, "train_*.bin")).reader(seq=16, vocab=256)  # the C reader agrees
        x, y = reader.next(2)
        np.testing.assert_array_equal(x[0], want["train"][:16])

    def test_bad_input_names_the_place(self):
        bad = os.path.join(self.d, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"text": "ok"}\n{"body": "no text"}\n')
        with self.assertRaises(SystemExit) as e:
            prepare.prepare("bytes", [bad], os.path.join(self.d, "o"), progress=False)
        self.assertIn("bad.jsonl:2", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            prepare.prepare("bytes", self.inputs, os.path.join(self.d, "o"), eot=300, progress=False)
        self.assertIn("300", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            prepare.prepare("bytes", [os.path.join(self.d, "none.txt")], os.path.join(self.d, "o"), progress=False)
        self.assertIn("none.txt", str(e.exception))

    def test_hf_tokenizer(self):
        try:
            from tokenizers import Tokenizer, models, pre_tokenizers
        except ImportError:
            self.skipTest("the tokenizers package is not installed (pip install tokenizers)")
        for size in (40, 70000):  # uint16 and uint32 shards
            vocab = {"<|endoftext|>": 0, "[UNK]": 1, "alpha": 2, "beta": 3, "gamma": 4, "délta": 5, "ε": 6}
            vocab.update({f"w{i}": i for i in range(len(vocab), size)})
            tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
            tok.pre_tokenizer = pre_tokenizers.Whitespace()
            d = os.path.join(self.d, f"tok{size}")
            os.makedirs(d)
            tok.save(os.path.join(d, "tokenizer.json"))
            r = prepare.prepare(d, self.inputs, os.path.join(self.d, f"out{size}"), val_fraction=0, progress=False)
            self.assertEqual((r["vocab"], r["eot"]), (size, 0))
            self.assertEqual(r["tokenizer"], os.path.join(d, "tokenizer.json"))  # for train --tokenizer
            want = [i for t in self.docs for i in [0] + tok.encode(t).ids]
            got = np.concatenate([dw.read_shard(p) for p in r["train"]])
            np.testing.assert_array_equal(got, want)
            with open(r["train"][0], "rb") as f:
                magic = np.frombuffer(f.read(4), "<i4")[0]
            self.assertEqual(magic, 20240801 if size > 65536 else 20240520)


if __name__ == "__main__":
    unittest.main()
