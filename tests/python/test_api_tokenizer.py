"""test_api_tokenizer.py — dw.Tokenizer and text from sampling: the byte-level and a Hugging Face
byte-level BPE tokenizer (built here from random text with the `tokenizers` package) round-trip
fresh random text; Engine.sample returns the decoded prompt + continuation, equal to decoding
Engine.generate's ids; `python -m deepwell.sample` prints the same; Trainer(tokenizer=...) decodes
the C trainer's samples; a run keeps its tokenizer (each checkpoint a copy: Engine.sample and
`python -m deepwell.sample RUN` decode with it unasked, a changed or missing copy and another
tokenizer for the same run are refused); bad ids and missing tokenizers are refused by name."""
import os
import random
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from test_api_util import SRC, dw, tiny_llama

WORDS = ["alpha", "beta", "gamma", "delta", "épsilon", "ζeta", "ēta", "theta"]


def random_text(rng, n):
    return " ".join(rng.choice(WORDS) + rng.choice(["", ",", ".", "!"]) for _ in range(n))


def bpe_tokenizer(path, rng, vocab=300):
    """A byte-level BPE tokenizer.json trained on random text (vocab ids, <|endoftext|> among them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([random_text(rng, 50) for _ in range(200)], trainer=tr)
    tok.save(path)
    return path


def have_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return True
    except ImportError:
        return False


class TokenizerTests(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        seed = int(os.environ.get("DW_TEST_SEED", np.random.default_rng().integers(1 << 30)))
        print(f"{self.id()}: DW_TEST_SEED={seed}", file=sys.stderr)
        self.rng = random.Random(seed)

    def tearDown(self):
        self.tmp.cleanup()

    def test_bytes_round_trip_and_bad_ids(self):
        tok = dw.Tokenizer("bytes")
        for _ in range(5):
            text = random_text(self.rng, 20)
            ids = tok.encode(text)
            self.assertEqual(ids, list(text.encode("utf-8")))
            self.assertEqual(tok.decode(ids), text)
        with self.assertRaises(ValueError) as e:
            tok.decode([104, 256, 105])
        self.assertIn("id 256 is outside its vocabulary [0, 256)", str(e.exception))
        self.assertEqual(tok.decode([104, 300, 105], errors="replace"), "h\ufffdi")
        with self.assertRaises(FileNotFoundError) as e:
            dw.Tokenizer(os.path.join(self.d, "nothing"))
        self.assertIn("nothing", str(e.exception))

    @unittest.skipUnless(have_tokenizers(), "the tokenizers package is not installed (scripts/test.sh installs it)")
    def test_hf_round_trip(self):
        tok = dw.Tokenizer(bpe_tokenizer(os.path.join(self.d, "tokenizer.json"), self.rng))
        self.assertTrue(256 < tok.vocab <= 300, tok.vocab)  # the bytes, the merges the text allowed, <|endoftext|>
        self.assertIsNotNone(tok.eot)
        for _ in range(5):
            text = random_text(self.rng, 30)
            ids = tok.encode(text)
            self.assertLess(len(ids), len(text.encode("utf-8")))  # merges happened
            self.assertEqual(tok.decode(ids), text)
        self.assertEqual(dw.Tokenizer(self.d).vocab, tok.vocab)  # a directory holding tokenizer.json

    def test_engine_sample_decodes(self):
        e = dw.compile(dw.capture(tiny_llama(), seq_len=32, batch=1), seed=self.rng.randrange(1 << 30))
        prompt = random_text(self.rng, 2)
        text = e.sample(prompt, n=12, temperature=0)
        ids = e.generate(list(prompt.encode()), 12, temperature=0)
        self.assertEqual(text, bytes(ids).decode("utf-8", "replace"))
        self.assertTrue(text.startswith(prompt))
        self.assertEqual(e.sample(list(prompt.encode()), n=12, temperature=0), text)  # ids as the prompt
        with self.assertRaises(ValueError) as ex:
            e.sample([1, 999], n=2)
        self.assertIn("prompt id 999 is outside the model's vocabulary [0, 256)", str(ex.exception))

    @unittest.skipUnless(have_tokenizers(), "the tokenizers package is not installed (scripts/test.sh installs it)")
    def test_hf_sampling_in_python_the_module_and_the_trainer(self):
        path = bpe_tokenizer(os.path.join(self.d, "tokenizer.json"), self.rng)
        tok = dw.Tokenizer(path)
        g = dw.capture(tiny_llama(vocab_size=304), seq_len=32, batch=2)  # padded past the tokenizer's <= 300
        e = dw.compile(g, seed=self.rng.randrange(1 << 30))
        prompt = random_text(self.rng, 3)
        seed = self.rng.randrange(1 << 30)
        text = e.sample(prompt, n=10, temperature=1.0, seed=seed, tokenizer=path)
        ids = e.generate(tok.encode(prompt), 10, temperature=1.0, seed=seed)
        self.assertEqual(text, tok.decode(ids, errors="replace"))
        self.assertTrue(text.startswith(prompt))
        model = dw.export(e, os.path.join(self.d, "model"))
        env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
        p = subprocess.run([sys.executable, "-m", "deepwell.sample", model, "--prompt", prompt, "--tokenizer", path,
                            "-n", "10", "--temperature", "1.0", "--seed", str(seed)], capture_output=True,
                           env=env, timeout=300)  # bytes: text mode would turn a sampled "\r" into "\n"
        self.assertEqual(p.returncode, 0, p.stderr.decode("utf-8", "replace"))
        self.assertEqual(p.stdout.decode("utf-8"), text + "\n")
        p = subprocess.run([sys.executable, "-m", "deepwell.sample", model, "--prompt", "x", "--tokenizer",
                            os.path.join(self.d, "none.json")], capture_output=True, text=True, env=env, timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("none.json", p.stderr)
        # the C trainer's samples (ids: the data came through next_batch) come back as text
        rng = np.random.default_rng(seed)
        w = rng.integers(0, 300, size=(2, 33))
        first = tok.encode(prompt)
        t = dw.Trainer.from_engine(e, lr=1e-3, dataloader=[(w[:, :-1], w[:, 1:])], steps=1,
                                   out=os.path.join(self.d, "run"), progress=False, eval_every=0, sample_every=1,
                                   sample_tokens=4, sample_prompt=" ".join(map(str, first)), tokenizer=tok)
        t.fit()
        self.assertTrue(t.history[0]["sample"].startswith(prompt), t.history[0]["sample"])

    @unittest.skipUnless(have_tokenizers(), "the tokenizers package is not installed (scripts/test.sh installs it)")
    def test_a_run_keeps_its_tokenizer(self):
        import shutil
        path = bpe_tokenizer(os.path.join(self.d, "made.json"), self.rng)
        tok = dw.Tokenizer(path)
        model = dw.export(dw.compile(dw.capture(tiny_llama(vocab_size=304), seq_len=32, batch=2), seed=3),
                          os.path.join(self.d, "model"))
        shutil.copy(path, os.path.join(model, "tokenizer.json"))
        g = dw.capture(model, seq_len=32, batch=2)
        self.assertEqual(g.tokenizer, os.path.join(model, "tokenizer.json"))
        w = np.random.default_rng(self.rng.randrange(1 << 30)).integers(0, 300, size=(2, 33))
        run = os.path.join(self.d, "run")
        t = dw.Trainer.from_engine(dw.compile(g), lr=1e-3, dataloader=[(w[:, :-1], w[:, 1:])], steps=2, out=run,
                                   progress=False, eval_every=0)
        t.fit()
        copy = os.path.join(run, "ckpt-2", "tokenizer.json")
        for f in (os.path.join(run, "tokenizer.json"), copy):
            with open(f, "rb") as a, open(path, "rb") as b:
                self.assertEqual(a.read(), b.read(), f)
        os.remove(os.path.join(model, "tokenizer.json"))  # only the run's copies are left
        hf = dw.export(t, os.path.join(self.d, "hf"))  # the exported model directory has it too
        with open(os.path.join(hf, "tokenizer.json"), "rb") as a, open(path, "rb") as b:
            self.assertEqual(a.read(), b.read())
        e = dw.compile(dw.capture(run, seq_len=32, batch=1))
        self.assertEqual(e.graph.tokenizer, copy)
        prompt = random_text(self.rng, 3)
        text = e.sample(prompt, n=8, temperature=0)
        self.assertEqual(text, tok.decode(e.generate(tok.encode(prompt), 8, temperature=0), errors="replace"))
        env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
        p = subprocess.run([sys.executable, "-m", "deepwell.sample", run, "--prompt", prompt, "-n", "8",
                            "--temperature", "0"], capture_output=True, env=env, timeout=300)  # bytes, as above
        self.assertEqual(p.returncode, 0, p.stderr.decode("utf-8", "replace"))
        self.assertEqual(p.stdout.decode("utf-8"), text + "\n")
        other = bpe_tokenizer(os.path.join(self.d, "other.json"), self.rng, vocab=280)
        t = dw.Trainer.from_engine(e, lr=1e-3, dataloader=[(w[:1, :-1], w[:1, 1:])], steps=3, out=run, resume=run,
                                   progress=False, eval_every=0, batch=1, tokenizer=other)
        with self.assertRaises(dw.DeepwellError) as ex:
            t.fit()
        self.assertIn("another tokenizer", str(ex.exception))
        with open(copy, "ab") as f:
            f.write(b" ")
        with self.assertRaises(ValueError) as ex:
            dw.capture(run).tokenizer
        self.assertIn("state.json records", str(ex.exception))
        os.remove(copy)
        with self.assertRaises(FileNotFoundError) as ex:
            dw.capture(run).tokenizer
        self.assertIn(copy, str(ex.exception))


if __name__ == "__main__":
    unittest.main()
