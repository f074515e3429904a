"""data.py — training data the C trainer reads: dw.data(pattern) names llm.c token shards, text
files (bytes) or "builtin", for Trainer (which hands the pattern to dw_train) and as an iterable of
(inputs, targets) [B, T] read by the library's own reader (dw_data_open_pattern, file order);
write_shard() writes llm.c shards (docs/training.md "Token shards")."""
import ctypes
import os

import numpy as np

from ._core import Handle, ctx_of
from ._lib import cstr, lib

SHARD_HEADER_INTS = 256
MAGIC_U16, VERSION_U16 = 20240520, 1  # uint16 tokens (GPT-2, llm.c fineweb.py)
MAGIC_U32, VERSION_U32 = 20240801, 7  # uint32 tokens (llm.c's llama-3 files)


def write_shard(path, tokens, vocab=None):
    """Writes tokens (1-D ints) as an llm.c shard: uint16 when every id fits (vocab <= 65536, or
    no vocab given and max id < 65536), else uint32. Atomic (temporary file + rename). Returns
    the token size in bytes (2 or 4)."""
    t = np.asarray(tokens).reshape(-1)
    if t.size and (t.dtype.kind not in "iu" or t.min() < 0):
        raise ValueError(f"{path}: token ids must be non-negative integers")
    if t.size >= 2 ** 31:
        raise ValueError(f"{path}: {t.size} tokens do not fit one shard's int32 count; split them")
    top = int(t.max()) if t.size else 0
    if vocab is not None and top >= vocab:
        raise ValueError(f"{path}: token {top} is >= vocab {vocab}")
    wide = (vocab is not None and vocab > 65536) or top >= 65536
    hdr = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = (MAGIC_U32, VERSION_U32, t.size) if wide else (MAGIC_U16, VERSION_U16, t.size)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(hdr.tobytes())
        f.write(t.astype("<u4" if wide else "<u2").tobytes())
    os.replace(tmp, path)
    return 4 if wide else 2


def read_shard(path):
    """The tokens of an llm.c shard (int64 NumPy array); errors name the file."""
    with open(path, "rb") as f:
        hdr = np.frombuffer(f.read(SHARD_HEADER_INTS * 4), dtype="<i4")
        if hdr.size < 3 or (hdr[0], hdr[1]) not in ((MAGIC_U16, VERSION_U16), (MAGIC_U32, VERSION_U32)):
            raise ValueError(f"{path}: not an llm.c token shard (magic/version)")
        dt = "<u2" if hdr[0] == MAGIC_U16 else "<u4"
        t = np.frombuffer(f.read(), dtype=dt)
    if t.size != hdr[2]:
        raise ValueError(f"{path}: the header promises {hdr[2]} tokens, the file holds {t.size}")
    return t.astype(np.int64)


class Data:
    """Data for training: `pattern` (a glob of .bin shards, of text files, or "builtin") and an
    optional validation pattern. Iterating yields (inputs, targets) int32 [batch, seq] in file
    order, as `deepwell eval` reads them; the trainer shuffles with its seed."""

    def __init__(self, pattern, val=None, seq=None, batch=None, vocab=None):
        self.pattern = os.fspath(pattern)
        self.val = os.fspath(val) if val is not None else None
        self.seq, self.batch, self.vocab = seq, batch, vocab

    def __repr__(self):
        return f"dw.data({self.pattern!r}, val={self.val!r}, seq={self.seq}, batch={self.batch})"

    def reader(self, seq=None, vocab=None, ctx=None):
        seq, vocab = seq or self.seq, vocab or self.vocab
        if not seq or not vocab:
            raise ValueError("dw.data: seq and vocab are needed to read (give them here or to dw.data)")
        return Reader(self.pattern, seq, vocab, ctx)

    def __iter__(self):
        if not self.batch:
            raise ValueError("dw.data: batch is needed to iterate")
        r = self.reader()
        try:
            while True:
                yield r.next(self.batch)
        finally:
            r.close()


def data(pattern, val=None, seq=None, batch=None, vocab=None):
    """Data for Trainer and for iteration: see Data."""
    return Data(pattern, val, seq, batch, vocab)


class Reader(Handle):
    """The library's reader (dw_data) of a pattern: windows of seq + 1 tokens in file order."""

    _free = "dw_data_free"

    def __init__(self, pattern, seq, vocab, ctx=None):
        ctx = ctx_of(ctx)
        h = ctypes.c_void_p()
        ctx.check(lib().dw_data_open_pattern(ctx._h, cstr(pattern), int(seq), int(vocab), ctypes.byref(h)))
        super().__init__(h.value, ctx)
        self.seq = int(seq)

    @property
    def windows(self):
        return lib().dw_data_windows(self._handle())

    def next(self, batch):
        x = np.empty((batch, self.seq), dtype=np.int32)
        y = np.empty((batch, self.seq), dtype=np.int32)
        p = ctypes.POINTER(ctypes.c_int32)
        lib().dw_data_next(self._handle(), int(batch), x.ctypes.data_as(p), y.ctypes.data_as(p))
        return x, y
