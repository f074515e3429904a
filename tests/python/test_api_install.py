"""test_api_install.py — `pip install ./python` installs a package that finds the library: pip
(--no-build-isolation --no-index: nothing downloaded) installs into a temporary folder, and a fresh
interpreter outside the tree imports it and finds libdeepwell.so through DEEPWELL_LIB, beside the
package, or in the build folders recorded at install; a wrong DEEPWELL_LIB fails naming it."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from test_api_util import SRC

LIB = os.environ["DEEPWELL_LIB"]


def run_py(code, path, env_lib=None):
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPWELL_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = path
    if env_lib is not None:
        env["DEEPWELL_LIB"] = env_lib
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env,
                          timeout=120)


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.target = os.path.join(cls.tmp.name, "site")
        src = os.path.join(cls.tmp.name, "src")
        shutil.copytree(os.path.join(SRC, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_paths.py"))
        os.symlink(os.path.dirname(LIB), os.path.join(src, "build"))  # a tree whose build/ holds LIB
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                            "--no-index", "--target", cls.target, os.path.join(src, "python")],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"pip install failed:\n{p.stdout}\n{p.stderr}")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_installed_package_finds_the_recorded_build(self):
        r = run_py("import deepwell as dw; print(dw.library_path()); print(dw.capture('gpt2-tiny').params)",
                   self.target)
        self.assertEqual(r.returncode, 0, r.stderr)
        path, params = r.stdout.split()
        self.assertEqual(os.path.realpath(path), os.path.realpath(LIB))
        self.assertTrue(path.startswith(self.tmp.name), path)  # through the recorded build/ folder
        self.assertEqual(int(params), 858880)

    def test_deepwell_lib_folder_and_wrong_value(self):
        r = run_py("import deepwell as dw; print(dw.library_path())", self.target, env_lib=os.path.dirname(LIB))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(os.path.dirname(LIB), "libdeepwell.so"))
        r = run_py("import deepwell as dw; dw.version()", self.target, env_lib="/nowhere/libdeepwell.so")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nowhere/libdeepwell.so", r.stderr)
        self.assertIn("DEEPWELL_LIB", r.stderr)

    def test_library_beside_the_package_comes_first(self):
        beside = os.path.join(self.tmp.name, "beside")
        shutil.copytree(self.target, beside)
        shutil.copy(LIB, os.path.join(beside, "deepwell", "libdeepwell.so"))
        r = run_py("import deepwell as dw; print(dw.library_path())", beside)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(beside, "deepwell", "libdeepwell.so"))


if __name__ == "__main__":
    unittest.main()
