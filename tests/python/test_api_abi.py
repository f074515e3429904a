"""test_api_abi.py — the ctypes mirrors agree with include/deepwell.h: a C file compiled here prints
sizeof and every field's offsetof of each mirrored struct, compared with ctypes' (a mirror may
lack fields a struct gained at its end); every function the package declares is a DW_API
function of the header."""
import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from test_api_util import SRC, dw  # noqa: F401  (sets up the import path)

from deepwell import _lib, _structs


class Abi(unittest.TestCase):
    def test_struct_layouts_match_the_header(self):
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            self.fail("no C compiler (scripts/deps.sh installs build-essential)")
        lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "deepwell.h"', "int main(void) {"]
        for cls, cname in _structs.C_NAMES.items():
            lines.append(f'printf("{cname} sizeof() %zu\\n", sizeof({cname}));')
            for f, _ in cls._fields_:
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
        for cls, cname in _structs.C_NAMES.items():
            # a mirror may be a prefix of a struct that grew (the `size` field's contract): every
            # field it has sits where C has it, and it is no larger than C's
            self.assertLessEqual(ctypes.sizeof(cls), c[(cname, "sizeof()")], f"sizeof({cname})")
            for f, _ in cls._fields_:
                self.assertEqual(getattr(cls, f).offset, c[(cname, f)], f"offsetof({cname}, {f})")
            self.assertEqual(len(cls._fields_), len({f for f, _ in cls._fields_}))

    def test_declared_functions_are_published(self):
        with open(os.path.join(SRC, "include", "deepwell.h")) as fh:
            header = fh.read()
        published = set(re.findall(r"DW_API[^;(]*?\b(dw_\w+)\s*\(", header))
        self.assertGreater(len(published), 100)
        for name in _lib.PROTOTYPES:
            self.assertIn(name, published, name)
        lib = _lib.lib()
        for name, (res, args) in _lib.PROTOTYPES.items():
            self.assertEqual(getattr(lib, name).argtypes, args)


if __name__ == "__main__":
    unittest.main()
