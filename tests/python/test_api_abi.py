"""test_api_abi.py — the ctypes mirrors agree with include/deepwell.h, completely: every mirrored
struct has every field the header declares, in the header's order (read from the header's text), and
a C file compiled here prints sizeof and every field's offsetof, which must equal ctypes'. A field
added to a struct in C without its mirror fails here. The `size` contract holds from Python: a result
struct whose size is 0 is refused, one shorter than the library's is written only up to its size,
and an options struct shorter than the library's has its missing tail taken as defaults (never read
past). Every function the package declares is a DW_API function of the header."""
import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from test_api_util import SRC, dw, tiny_llama  # noqa: F401  (sets up the import path)

from deepwell import _lib, _structs


def header_text():
    with open(os.path.join(SRC, "include", "deepwell.h")) as fh:
        return fh.read()


def header_fields(cname, text=None):
    """The field names of `typedef struct {...} cname;` in the header, in order (function pointers,
    arrays and comma lists included)."""
    h = re.sub(r"/\*.*?\*/", "", text or header_text(), flags=re.S)
    h = re.sub(r"//[^\n]*", "", h)
    m = re.search(r"typedef\s+struct\s*(?:\w+\s*)?\{([^{}]*)\}\s*" + cname + r"\s*;", h)
    if not m:
        raise AssertionError(f"{cname}: no typedef struct {{...}} {cname}; in include/deepwell.h")
    out = []
    for decl in (d.strip() for d in m.group(1).split(";")):
        if not decl:
            continue
        fp = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)  # void (*progress)(...)
        if fp:
            out.append(fp.group(1))
            continue
        parts = re.sub(r"\[[^\]]*\]", "", decl).split(",")  # int a, *b, c[4]
        out += [re.findall(r"\w+", p)[-1] for p in parts]
    return out


def c_layout():
    """{(c name, field or "sizeof()"): bytes} from a C program compiled against the header."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise AssertionError("no C compiler (scripts/deps.sh installs build-essential)")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "deepwell.h"', "int main(void) {"]
    for cls, cname in _structs.C_NAMES.items():
        lines.append(f'printf("{cname} sizeof() %zu\\n", sizeof({cname}));')
        for f in header_fields(cname):
            lines.append(f'printf("{cname} {f} %zu\\n", offsetof({cname}, {f}));')
    lines.append("return 0; }")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "abi.c"), os.path.join(d, "abi")
        with open(src, "w") as fh:
            fh.write("\n".join(lines))
        subprocess.run([cc, "-std=c11", "-I", os.path.join(SRC, "include"), src, "-o", exe], check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    c = {}
    for line in out.splitlines():
        name, field, value = line.split()
        c[(name, field)] = int(value)
    return c


class Abi(unittest.TestCase):
    def test_header_parser_reads_every_kind_of_declaration(self):
        text = ("typedef struct { size_t size; char name[16]; int a, *b, c[4];\n"
                "  /* a comment; with a semicolon */ void (*fn)(const int *p, void *u); bool last; } dw_x;")
        self.assertEqual(header_fields("dw_x", text), ["size", "name", "a", "b", "c", "fn", "last"])

    def test_mirrors_have_every_field_in_c_order(self):
        for cls, cname in _structs.C_NAMES.items():
            mine = [f for f, _ in cls._fields_]
            self.assertEqual(mine, header_fields(cname), f"{cls.__name__} mirrors {cname}: fields differ "
                             "(python/deepwell/_structs.py must list every field of the header, in its order)")

    def test_struct_layouts_match_the_header(self):
        c = c_layout()
        for cls, cname in _structs.C_NAMES.items():
            self.assertEqual(ctypes.sizeof(cls), c[(cname, "sizeof()")], f"sizeof({cname})")
            for f, _ in cls._fields_:
                self.assertEqual(getattr(cls, f).offset, c[(cname, f)], f"offsetof({cname}, {f})")

    def test_result_struct_size_is_honoured(self):
        """dw_hw_get_info refuses size 0 and writes no byte past a short size."""
        L = _lib.lib()
        ctx = dw.Context("cpu")
        hw = ctypes.c_void_p()
        ctx.check(L.dw_hw_preset(ctx._h, b"h200", 1, ctypes.byref(hw)))
        try:
            full = ctypes.sizeof(_structs.HwInfo)
            buf = (ctypes.c_ubyte * (full + 64))(*([0xA5] * (full + 64)))
            info = _structs.HwInfo.from_buffer(buf)
            info.size = 0
            self.assertNotEqual(L.dw_hw_get_info(hw, ctypes.byref(info)), 0, "size 0 must be refused")
            short = _structs.HwInfo.nodes.offset  # source, preset, label only
            info.size = short
            self.assertEqual(L.dw_hw_get_info(hw, ctypes.byref(info)), 0)
            self.assertEqual(info.source, b"preset")
            self.assertEqual(bytes(buf[short:]), b"\xa5" * (full + 64 - short), "written past the given size")
            info.size = full
            self.assertEqual(L.dw_hw_get_info(hw, ctypes.byref(info)), 0)
            self.assertEqual(info.nodes, 1)
            self.assertEqual(bytes(buf[full:]), b"\xa5" * 64, "written past sizeof(dw_hw_info)")
        finally:
            L.dw_hw_free(hw)

    def test_options_init_writes_only_its_size(self):
        L = _lib.lib()
        full = ctypes.sizeof(_structs.TrainOpts)
        short = _structs.TrainOpts.spike_zscore.offset
        buf = (ctypes.c_ubyte * (full + 16))(*([0x5A] * (full + 16)))
        o = _structs.TrainOpts.from_buffer(buf)
        L.dw_train_opts_init(ctypes.byref(o), short)
        self.assertEqual(o.size, short)
        self.assertEqual(o.steps, 100)
        self.assertEqual(bytes(buf[short:]), b"\x5a" * (full + 16 - short))
        L.dw_train_opts_init(ctypes.byref(o), full)
        self.assertEqual((o.spike_window, o.max_rollbacks, o.spike_zscore), (50, 3, 0.0))

    def test_short_train_opts_are_not_read_past(self):
        """A dw_train_opts from an older caller (size before spike_zscore) trains with the defaults
        of the fields it lacks: the garbage after its end (a spike_zscore the trainer refuses) is
        never read; the same garbage inside the size is refused with the C message."""
        L = _lib.lib()
        e = dw.compile(dw.capture(tiny_llama(), seq_len=8, batch=1), seed=3)
        with tempfile.TemporaryDirectory() as d:
            def run(size):
                o = _structs.TrainOpts.new()
                L.dw_train_opts_init(ctypes.byref(o), ctypes.sizeof(o))
                keep = [b"builtin", os.fsencode(os.path.join(d, f"run{size}"))]
                o.data, o.out_dir = keep
                o.steps, o.batch, o.seq, o.global_batch, o.eval_every = 1, 1, 8, 1, 0
                o.spike_zscore = -7.0  # refused when read
                o.size = size
                st = L.dw_train(e._handle(), ctypes.byref(o))
                return st, (L.dw_errmsg(e._ctx._h) or b"").decode()

            st, msg = run(ctypes.sizeof(_structs.TrainOpts))
            self.assertNotEqual(st, 0)
            self.assertIn("--spike-zscore -7", msg)
            st, msg = run(_structs.TrainOpts.spike_zscore.offset)
            self.assertEqual(st, 0, msg)
            self.assertTrue(os.path.isdir(os.path.join(d, f"run{_structs.TrainOpts.spike_zscore.offset}", "ckpt-1")))

    def test_declared_functions_are_published(self):
        header = header_text()
        published = set(re.findall(r"DW_API[^;(]*?\b(dw_\w+)\s*\(", header))
        self.assertGreater(len(published), 100)
        for name in _lib.PROTOTYPES:
            self.assertIn(name, published, name)
        lib = _lib.lib()
        for name, (res, args) in _lib.PROTOTYPES.items():
            self.assertEqual(getattr(lib, name).argtypes, args)


if __name__ == "__main__":
    unittest.main()
