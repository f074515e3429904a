#!/usr/bin/env python3
"""accuracy_setup.py — the data and the model of bench/accuracy.sh: an English corpus every Python 3
has, split into train and validation, and the byte-level Llama's Hugging Face config.json.

Corpus ("python-docs"): the Python documentation this interpreter ships, as text — the Language
Reference's topic pages (`pydoc_data.topics`, the pages `help("if")` shows; sorted by topic) and
then the docstrings of the standard library's modules, classes and functions (every Lib/*.py by
`ast`, parsed in parallel, sorted by path, tests, idlelib and site-packages left out, exact repeats dropped), blocks
separated by a blank line, UTF-8. Python 3.11: 0.47 MB of topics + 1.5 MB of docstrings; the topics
alone are too few bytes for 1200 steps of 16 x 256 (about 12 epochs). The text depends on the
Python version, so corpus.json records the version, sizes and SHA-256 (and a Python installed
without pydoc_data gets the docstrings alone, which its "source" says). Split by bytes: train the
first 90%, validation the last 10%. No torch needed.

Usage: python3 bench/accuracy_setup.py OUT_DIR [--layers 8] [--width 512] [--seq 256]
         [--val-frac 0.1] [--text FILE]
Writes OUT_DIR/train.txt, val.txt, corpus.json and model/config.json (heads of 64, half as many
K/V heads, SwiGLU width 3 x width, vocab 256, RMSNorm eps 1e-5, RoPE theta 10000, untied head,
initializer_range 0.02 — Deepwell's and accuracy_torch.py's initialisation), and prints
corpus.json.
"""
import argparse
import ast
import hashlib
import json
import multiprocessing
import os
import sys
import sysconfig
import warnings

SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}


def topics_text():
    """The topic pages, or [] where this Python was installed without pydoc_data."""
    try:
        from pydoc_data import topics
    except ImportError:
        return []
    return [topics.topics[k].strip() for k in sorted(topics.topics)]


def source_files():
    """The standard library's .py files the corpus reads, in path order."""
    lib = sysconfig.get_paths()["stdlib"]
    out = []
    for root, dirs, files in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return out


def file_docstrings(path):
    """One file's module, class and function docstrings, in ast.walk order ([] if it does not parse)."""
    try:
        with open(path, encoding="utf-8") as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings of old escape sequences
            tree = ast.parse(fh.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, kinds))
    return [d.strip() for d in docs if d and d.strip()]


def docstrings():
    """Every module, class and function docstring of the standard library, in path order. The files
    are parsed in parallel (ast.parse is most of the time: 2.0 s on one core for Python 3.11);
    Pool.map keeps the order, so the bytes are those of a serial pass."""
    files = source_files()
    try:
        with multiprocessing.Pool(min(16, os.cpu_count() or 1)) as pool:
            per_file = pool.map(file_docstrings, files, chunksize=8)
    except OSError:  # no processes to be had (a sandbox): one core
        per_file = [file_docstrings(f) for f in files]
    return [d for docs in per_file for d in docs]


def corpus(text_file):
    if text_file:
        with open(text_file, "rb") as fh:
            return fh.read(), "file " + os.path.abspath(text_file)
    seen, blocks, pages = set(), [], topics_text()
    for b in pages + docstrings():
        if b not in seen:
            seen.add(b)
            blocks.append(b)
    source = "python-docs" if pages else "python-docs (docstrings only: no pydoc_data here)"
    return ("\n\n".join(blocks) + "\n").encode("utf-8"), source


def model_config(layers, width, seq):
    if width % 64:
        sys.exit(f"accuracy_setup.py: --width {width} must be a multiple of 64 (heads of 64)")
    heads = width // 64
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256,
            "hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2), "intermediate_size": 3 * width,
            "max_position_embeddings": seq, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "hidden_act": "silu", "tie_word_embeddings": False, "initializer_range": 0.02}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--val-frac", type=float, default=0.1)
    ap.add_argument("--text", help="a text file instead of the Python docs")
    a = ap.parse_args()
    if a.layers < 1 or a.seq < 1 or not 0 < a.val_frac < 1:
        sys.exit("accuracy_setup.py: --layers and --seq must be >= 1 and --val-frac in (0, 1)")
    data, source = corpus(a.text)
    cut = len(data) - int(len(data) * a.val_frac)
    train, val = data[:cut], data[cut:]
    for name, part in (("train", train), ("validation", val)):
        if len(part) < a.seq + 1:
            sys.exit(f"accuracy_setup.py: the {name} split has {len(part)} bytes, "
                     f"fewer than one window of --seq {a.seq} + 1")
    os.makedirs(os.path.join(a.out, "model"), exist_ok=True)
    with open(os.path.join(a.out, "train.txt"), "wb") as fh:
        fh.write(train)
    with open(os.path.join(a.out, "val.txt"), "wb") as fh:
        fh.write(val)
    with open(os.path.join(a.out, "model", "config.json"), "w") as fh:
        json.dump(model_config(a.layers, a.width, a.seq), fh, indent=1)
    info = {"source": source, "python": sys.version.split()[0], "bytes": len(data),
            "train_bytes": len(train), "val_bytes": len(val),
            "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(a.out, "corpus.json"), "w") as fh:
        json.dump(info, fh)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
