"""tokenizer.py — dw.Tokenizer: text <-> ids for prepare (encode) and sampling (decode).

"bytes" is the library's byte-level tokenizer (ids 0..255 are UTF-8 bytes; no package needed);
anything else is a tokenizer.json, or a Hugging Face model directory holding one, read with the
`tokenizers` package. Not a trainer of tokenizers and not the C library's tokenizers (those are
`dw.tokenize`/`dw.detokenize`: "bytes" and "ids").
"""
import os

EOT_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>")


class Tokenizer:
    """Tokenizer(spec): .encode(text) -> ids, .decode(ids) -> text, .vocab (ids are below it),
    .eot (the end-of-text id or None), .name (spec), .path (the tokenizer.json read; None for
    bytes)."""

    def __init__(self, spec="bytes"):
        self.name = os.fspath(spec)
        self.path = None
        if self.name == "bytes":
            self.tok, self.vocab, self.eot = None, 256, None
            return
        f = os.path.join(self.name, "tokenizer.json") if os.path.isdir(self.name) else self.name
        if not os.path.isfile(f):  # a wrong path is named first, package or not
            raise FileNotFoundError(f"tokenizer {self.name}: no tokenizer.json there")
        try:
            from tokenizers import Tokenizer as HF
        except ImportError:
            raise ImportError(f"tokenizer {self.name} needs the `tokenizers` package (pip install tokenizers), "
                              "or use the byte-level tokenizer 'bytes'") from None
        self.tok, self.path = HF.from_file(f), f
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.eot = next((self.tok.token_to_id(n) for n in EOT_NAMES if self.tok.token_to_id(n) is not None), None)

    def encode(self, text):
        if self.tok is None:
            return list(text.encode("utf-8"))
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, errors="strict"):
        """Text of ids (invalid UTF-8 replaced by U+FFFD). An id outside the vocabulary (a model's
        padded rows) is a ValueError, or with errors="replace" decodes as U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [k for k, i in enumerate(ids) if not 0 <= i < self.vocab]
        if bad and errors != "replace":
            raise ValueError(f"tokenizer {self.name}: id {ids[bad[0]]} is outside its vocabulary [0, {self.vocab})")
        parts, start = [], 0
        for k in bad + [len(ids)]:  # runs of valid ids between the bad ones
            parts.append(self._decode(ids[start:k]))
            start = k + 1
        return "\ufffd".join(parts)

    def _decode(self, ids):
        if self.tok is None:
            return bytes(ids).decode("utf-8", "replace")
        return self.tok.decode(ids, skip_special_tokens=False)

    def __repr__(self):
        return f"Tokenizer({self.name!r}, vocab={self.vocab})"
