"""safetensors.py — a small reader and writer of safetensors files (F32/F16/BF16/F64/ints), for
moving torch or NumPy weights to and from the library's Hugging Face files without the
`safetensors` package. Writes F32 (what the engine stores)."""
import json
import os
import struct

import numpy as np

_NP = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1",
       "BOOL": "?"}


def _numpy(t):
    if hasattr(t, "detach"):  # torch
        t = t.detach().cpu()
        if not t.is_floating_point():
            return t.numpy()
        return t.float().numpy()
    return np.asarray(t)


def write(path, tensors, metadata=None):
    """Writes {name: tensor or array} to path (floating tensors as F32), atomically."""
    header, blobs, off = {"__metadata__": dict(metadata or {"format": "pt"})}, [], 0
    for name, t in tensors.items():
        a = _numpy(t)
        if a.dtype.kind == "f":
            a, dt = np.ascontiguousarray(a, dtype="<f4"), "F32"
        else:
            dt = {v: k for k, v in _NP.items()}.get(a.dtype.str) or {"<i8": "I64"}.get(a.dtype.str)
            if dt is None:
                raise TypeError(f"{path}: tensor '{name}' has unsupported dtype {a.dtype}")
            a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read(path):
    """{name: NumPy array} of a safetensors file (BF16 widened to float32)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
    n = struct.unpack("<Q", data[:8])[0]
    if 8 + n > len(data):
        raise ValueError(f"{path}: header size {n} runs past the end of the file")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if v["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif v["dtype"] in _NP:
            arr = np.frombuffer(raw, dtype=_NP[v["dtype"]])
        else:
            raise ValueError(f"{path}: tensor '{name}' has dtype {v['dtype']} this reader does not convert")
        out[name] = arr.reshape(v["shape"]).copy()
    return out
