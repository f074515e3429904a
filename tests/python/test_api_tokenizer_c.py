"""test_api_tokenizer_c.py — the C library's tokenizer.json (dw_hf_tokenizer_*, through ctypes)
against the `tokenizers` package on fresh random text: BPE tokenizers trained here (GPT-2's byte
level; Llama 3's Split regex + ByteLevel with ignore_merges; Qwen2's NFC + Split regex + ByteLevel;
SentencePiece style with byte fallback, as Llama 2's Prepend + Replace normalizer and as
Metaspace; the NFD, NFKC, NFKD, Lowercase and StripAccents normalizers alone and in sequences, on
text with accents, compatibility characters and combining marks) encode to exactly the same
ids and decode to exactly the same text (special tokens kept and skipped), byte-level ones back to
the input. Bad files are refused naming the file and what is wrong; `deepwell sample` decodes with a
model directory's tokenizer.json, or --tokenizer, as the package decodes the same ids."""
import ctypes
import json
import os
import random
import subprocess
import tempfile
import unicodedata
import unittest

import numpy as np

from test_api_util import CLI, tiny_llama

LIB = ctypes.CDLL(os.environ["DEEPWELL_LIB"])
P = ctypes.POINTER
LIB.dw_errmsg.restype = ctypes.c_char_p
LIB.dw_errmsg.argtypes = [ctypes.c_void_p]
LIB.dw_hf_tokenizer_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, P(ctypes.c_void_p)]
LIB.dw_hf_tokenizer_free.argtypes = [ctypes.c_void_p]
LIB.dw_hf_tokenizer_vocab.restype = ctypes.c_int64
LIB.dw_hf_tokenizer_vocab.argtypes = [ctypes.c_void_p]
LIB.dw_hf_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, P(P(ctypes.c_int32)),
                                       P(ctypes.c_int64)]
LIB.dw_hf_tokenizer_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, P(ctypes.c_int32), ctypes.c_int64,
                                       ctypes.c_bool, P(ctypes.c_void_p), P(ctypes.c_size_t)]
LIBC = ctypes.CDLL(None)
LIBC.free.argtypes = [ctypes.c_void_p]


class CTokenizer:
    """The C library's tokenizer.json reader (errors from dw_errmsg(NULL) as ValueError)."""

    def __init__(self, path):
        self.h = ctypes.c_void_p()
        if LIB.dw_hf_tokenizer_open(None, os.fsencode(path), ctypes.byref(self.h)) != 0:
            raise ValueError(LIB.dw_errmsg(None).decode())
        self.vocab = LIB.dw_hf_tokenizer_vocab(self.h)

    def encode(self, text):
        ids, n = P(ctypes.c_int32)(), ctypes.c_int64()
        if LIB.dw_hf_tokenizer_encode(None, self.h, text.encode(), ctypes.byref(ids), ctypes.byref(n)) != 0:
            raise ValueError(LIB.dw_errmsg(None).decode())
        out = [ids[i] for i in range(n.value)]
        LIBC.free(ctypes.cast(ids, ctypes.c_void_p))
        return out

    def decode(self, ids, skip_special=False):
        buf, text, n = (ctypes.c_int32 * max(1, len(ids)))(*ids), ctypes.c_void_p(), ctypes.c_size_t()
        if LIB.dw_hf_tokenizer_decode(None, self.h, buf, len(ids), skip_special, ctypes.byref(text),
                                      ctypes.byref(n)) != 0:
            raise ValueError(LIB.dw_errmsg(None).decode())
        s = ctypes.string_at(text.value, n.value).decode("utf-8")
        LIBC.free(text)
        return s

    def __del__(self):
        LIB.dw_hf_tokenizer_free(self.h)


POOLS = {
    "ascii": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?-()[]{}\"'/_@#$%&*+=<>|~`^"),
    "words": ["the", "The", "and", "tokenizer", "hello", "world", "it's", "we'll", "I'M", "they'RE", "don't",
              "café", "naïve", "Ångström", "über", "señor", "garçon"],
    "accented": list("éèêëàâäîïôöùûüçñÉÀÇÑåøæßłśźż"),
    "cjk": list("中文字日本語한국어漢字東京"),
    "emoji": ["😀", "🚀", "👍🏽", "🎉", "❤️", "👨‍👩‍👧"],
    "space": [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\u3000", "\u00a0"],
    "digits": ["0", "7", "42", "123", "2024", "3.14159", "1000000"],
    # decomposed and precomposed forms, marks out of canonical order, Hangul jamo (NFC changes them)
    "marks": ["e\u0301", "A\u030a", "a\u0323\u0302", "a\u0302\u0323", "\u00c5", "\u212b", "\u1100\u1161",
              "\u1100\u1161\u11a8", "\u0915\u093c", "\u0301", "o\u0308\u0304", "\u1e9b\u0323", "\uac00\u11a8"],
}
# compatibility characters (NFKC and NFKD change them), cases that lowercase oddly, more marks
COMPAT = ["\ufb01", "\ufb02", "\u2460", "\u2461", "\uff21", "\uff42", "\uff11", "\uff83", "\uff76\uff9e", "\u2122",
          "\u00bd", "\u210c", "\u01c5", "\u338f", "\u216b", "\u0130", "\u1e9e", "\u03a3", "\u03a3\u0391\u03a3", "\u00b5",
          "\u2163", "\u3000", "\u00aa", "\u0132", "x\u0903", "y\u20dd", "\u1ea0\u0306", "\u00c5\u0327"]
NORMALIZERS = ["NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "NFD+StripAccents+Lowercase", "NFKC+Lowercase",
               "Lowercase+NFKD+StripAccents"]


def normalizer(spec):
    """A `tokenizers` normalizer from "NFD" or "NFD+StripAccents" (a Sequence)."""
    from tokenizers import normalizers

    parts = [getattr(normalizers, name)() for name in spec.split("+")]
    return parts[0] if len(parts) == 1 else normalizers.Sequence(parts)


def accented_text(rng, n):
    pools = [POOLS["words"], POOLS["accented"], POOLS["marks"], COMPAT, COMPAT, POOLS["ascii"], POOLS["space"]]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def random_text(rng, n):
    kinds = list(POOLS)
    return "".join(rng.choice(POOLS[rng.choice(kinds)]) for _ in range(n))


def corpus(rng):
    return [" ".join(rng.choice(POOLS["words"]) for _ in range(40)) for _ in range(150)] + \
           [random_text(rng, 60) for _ in range(100)]


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<s>", "</s>"]


def train(rng, path, kind, norm=None):
    """A tokenizer.json of the given kind, trained on random text, saved to path; norm: a
    normalizer spec (normalizer()) replacing the kind's own."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind in ("gpt2", "llama3", "qwen2"):
        tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
        if kind == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if kind == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # SentencePiece style: "▁" for spaces, unknown characters as <0xNN> bytes
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if kind == "llama2":
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"] + SPECIALS, limit_alphabet=60)
    if norm is not None:
        tok.normalizer = normalizer(norm)
    texts = corpus(rng) + ([accented_text(rng, 50) for _ in range(100)] if norm is not None else [])
    tok.train_from_iterator(texts, trainer=tr)
    if kind in ("llama2", "metaspace"):  # the 256 byte tokens Llama 2 has in its vocabulary
        j = json.loads(tok.to_str())
        vocab = j["model"]["vocab"]
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        tok = Tokenizer.from_str(json.dumps(j))
    tok.save(path)
    return tok


def have_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(have_tokenizers(), "the tokenizers package is not installed (scripts/test.sh installs it)")
class TokenizerC(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.seed = int(np.random.default_rng().integers(1 << 30))
        self.rng = random.Random(self.seed)

    def tearDown(self):
        self.tmp.cleanup()

    def check_kind(self, kind, byte_level, nfc=False):
        path = os.path.join(self.d, f"{kind}.json")
        hf = train(self.rng, path, kind)
        c = CTokenizer(path)
        self.assertEqual(c.vocab, hf.get_vocab_size(with_added_tokens=True))
        texts = [random_text(self.rng, self.rng.randint(1, 40)) for _ in range(300)]
        texts += ["", " ", "  leading and trailing  ", "<|endoftext|>hi</s> <s>", "a<|endoftext|>",
                  " ".join(self.rng.choice(POOLS["words"]) for _ in range(30))]
        texts += [t.replace(" ", f" {self.rng.choice(SPECIALS)} ", 1) for t in texts[:50]]
        merged = 0
        for t in texts:
            want = hf.encode(t, add_special_tokens=False).ids
            got = c.encode(t)
            self.assertEqual(got, want, f"{kind} (seed {self.seed}): encode({t!r})")
            merged += len(got) < len(t.encode())
            for skip in (False, True):
                self.assertEqual(c.decode(got, skip), hf.decode(got, skip_special_tokens=skip),
                                 f"{kind} (seed {self.seed}): decode(encode({t!r})), skip_special={skip}")
            if byte_level:
                want_back = unicodedata.normalize("NFC", t) if nfc else t
                self.assertEqual(c.decode(got), want_back, f"{kind}: the round trip of {t!r}")
        self.assertGreater(merged, len(texts) // 2, "the merges were used")
        # random id sequences (invalid UTF-8 in pieces, specials anywhere) decode alike too
        for _ in range(200):
            ids = [self.rng.randrange(c.vocab) for _ in range(self.rng.randint(0, 12))]
            for skip in (False, True):
                self.assertEqual(c.decode(ids, skip), hf.decode(ids, skip_special_tokens=skip),
                                 f"{kind} (seed {self.seed}): decode({ids}), skip_special={skip}")
        self.assertEqual(c.decode([c.vocab, 0][:1]), "\ufffd")  # outside the vocabulary
        return c, hf

    def test_gpt2_byte_level(self):
        self.check_kind("gpt2", True)

    def test_llama3_split_regex(self):
        self.check_kind("llama3", True)

    def test_qwen2_nfc_split_regex(self):
        c, _ = self.check_kind("qwen2", True, nfc=True)
        self.assertEqual(c.encode("e\u0301"), c.encode("\u00e9"))  # one text after NFC

    def test_nfc_matches_unicodedata(self):
        """NFC + ByteLevel with no merges: decode(encode(s)) is NFC(s), held to Python's unicodedata on
        random strings from the blocks with compositions, marks, singletons and Hangul."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
        tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        path = os.path.join(self.d, "nfc.json")
        tok.save(path)
        c = CTokenizer(path)
        blocks = [(0x41, 0x7A), (0xC0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x591, 0x5C7),
                  (0x900, 0x97F), (0x9BC, 0x9D7), (0xE00, 0xE7F), (0xF71, 0xF81), (0x1100, 0x11FF), (0x1E00, 0x1FFF),
                  (0x2126, 0x212B), (0x3099, 0x309A), (0x304B, 0x30FA), (0xAC00, 0xD7A3), (0xF900, 0xFAFF),
                  (0x1D15E, 0x1D164), (0x2F800, 0x2F8FF)]
        for _ in range(2000):
            s = "".join(chr(self.rng.randint(*self.rng.choice(blocks))) for _ in range(self.rng.randint(1, 8)))
            self.assertEqual(c.decode(c.encode(s)), unicodedata.normalize("NFC", s), f"NFC of {s!r} (seed {self.seed})")
            self.assertEqual(c.encode(s), tok.encode(s).ids, f"encode({s!r}) (seed {self.seed})")

    def test_normalizers_match_the_package(self):
        """Each normalizer, alone and in sequences, under a byte-level BPE trained with it and under
        SentencePiece-style byte fallback: the ids and the decoded text equal the package's, and the
        byte-level round trip gives the package's normalized text."""
        for spec in NORMALIZERS:
            for kind in ("gpt2", "metaspace"):
                path = os.path.join(self.d, f"{kind}-{spec}.json")
                hf = train(self.rng, path, kind, norm=spec)
                c = CTokenizer(path)
                norm = normalizer(spec)
                texts = [accented_text(self.rng, self.rng.randint(1, 30)) for _ in range(150)]
                texts += ["".join(COMPAT), "".join(POOLS["marks"]), "ÀÉÎÕÜ ÇÑ Å İstanbul ΣΟΦΟΣ ﬁnal ①②", "",
                          "\u0301abc", "\u0301\u0323 x", "\u0344e"]  # leading marks StripAccents removes
                for t in texts:
                    got = c.encode(t)
                    self.assertEqual(got, hf.encode(t, add_special_tokens=False).ids,
                                     f"{spec}, {kind} (seed {self.seed}): encode({t!r})")
                    self.assertEqual(c.decode(got), hf.decode(got), f"{spec}, {kind} (seed {self.seed}): decode")
                    if kind == "gpt2":
                        self.assertEqual(c.decode(got), norm.normalize_str(t), f"{spec}: the round trip of {t!r}")

    def test_llama2_prepend_replace_byte_fallback(self):
        c, hf = self.check_kind("llama2", False)
        ids = c.encode("中文 😀")  # characters the 60-character alphabet left out: bytes
        self.assertTrue(any(hf.id_to_token(i).startswith("<0x") for i in ids), [hf.id_to_token(i) for i in ids])

    def test_metaspace_byte_fallback(self):
        self.check_kind("metaspace", False)

    def bad(self, content, *needles):
        path = os.path.join(self.d, "bad.json")
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        with self.assertRaises(ValueError) as e:
            CTokenizer(path)
        for n in (path,) + needles:
            self.assertIn(n, str(e.exception))

    def test_bad_files(self):
        path = os.path.join(self.d, "gpt2.json")
        train(self.rng, path, "gpt2")
        with open(path) as f:
            good = json.load(f)
        with self.assertRaises(ValueError) as e:
            CTokenizer(os.path.join(self.d, "missing.json"))
        self.assertIn("missing.json", str(e.exception))
        with self.assertRaises(ValueError) as e:
            CTokenizer(os.path.join(self.d))  # a directory without tokenizer.json
        self.assertIn(os.path.join(self.d, "tokenizer.json"), str(e.exception))
        self.bad("{\"model\": [1, 2", "invalid JSON")
        self.bad(dict(good, model=dict(good["model"], type="WordPiece")), "model type 'WordPiece' is not supported")
        self.bad(dict(good, model=dict(good["model"], type="Unigram")), "model type 'Unigram'")
        self.bad(dict(good, decoder={"type": "CTC"}), "decoder type 'CTC' is not supported")
        self.bad(dict(good, normalizer={"type": "Precompiled", "precompiled_charsmap": ""}),
                 "normalizer type 'Precompiled'")
        self.bad(dict(good, normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Strip"}]}),
                 "normalizer type 'Strip'")
        self.bad(dict(good, pre_tokenizer={"type": "BertPreTokenizer"}), "pre-tokenizer type 'BertPreTokenizer'")
        m = dict(good["model"], merges=good["model"]["merges"][:3] + [["Ġnotatoken", "x"]])
        self.bad(dict(good, model=m), "model.merges[3]", "'Ġnotatoken' is not in the vocabulary")
        m = dict(good["model"], merges=["a b c"])
        self.bad(dict(good, model=m), "model.merges[0]")
        self.bad(dict(good, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(unclosed"},
                                           "behavior": "Isolated", "invert": False}), "(unclosed")
        c = CTokenizer(path)
        with self.assertRaises(ValueError) as e:
            ids, n = P(ctypes.c_int32)(), ctypes.c_int64()
            if LIB.dw_hf_tokenizer_encode(None, c.h, b"ok \xff\xfe", ctypes.byref(ids), ctypes.byref(n)) != 0:
                raise ValueError(LIB.dw_errmsg(None).decode())
        self.assertIn("not UTF-8 (byte 3", str(e.exception))

    def sample(self, *args):
        p = subprocess.run([CLI, "sample", *map(str, args)], capture_output=True, timeout=300)  # bytes: \r kept
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.decode("utf-8")

    def test_sample_decodes_with_the_tokenizer(self):
        model = os.path.join(self.d, "model")
        os.makedirs(model)
        hf = train(self.rng, os.path.join(model, "tokenizer.json"), "gpt2")
        V = hf.get_vocab_size(with_added_tokens=True)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(tiny_llama(vocab_size=V), f)
        prompt = " ".join(self.rng.choice(POOLS["words"]) for _ in range(5)) + " <|endoftext|>"
        common = ["--prompt", prompt, "-n", 24, "--temperature", 0.9, "--seed", self.seed % 1000, "--device", "cpu"]
        text = self.sample(model, *common)  # the directory's tokenizer.json by default
        ids_prompt = " ".join(map(str, hf.encode(prompt, add_special_tokens=False).ids))
        ids = list(map(int, self.sample(model, "--tokenizer", "ids", *common[2:], "--prompt", ids_prompt).split()))
        self.assertEqual(len(ids), len(ids_prompt.split()) + 24)
        self.assertEqual(text, hf.decode(ids, skip_special_tokens=False) + "\n")
        self.assertTrue(text.startswith(prompt), text)
        skipped = self.sample(model, "--skip-special", *common)
        self.assertEqual(skipped, hf.decode(ids, skip_special_tokens=True) + "\n")
        other = os.path.join(self.d, "other.json")  # --tokenizer FILE wins over the directory's
        os.replace(os.path.join(model, "tokenizer.json"), other)
        self.assertEqual(self.sample(model, "--tokenizer", other, *common), text)
        p = subprocess.run([CLI, "sample", model, "--tokenizer", os.path.join(self.d, "nope.json"), *map(str, common)],
                           capture_output=True, timeout=300)
        self.assertEqual(p.returncode, 3, p.stderr)  # an I/O failure (docs/cli.md)
        self.assertIn("nope.json", p.stderr.decode())


if __name__ == "__main__":
    unittest.main()
