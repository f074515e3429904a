"""setup.py — only to record, at install time, where this source tree builds libdeepwell.so
(deepwell/_paths.py: the repository's build*/ folders), so that an installed package finds the
library there. Nothing is compiled. Metadata lives in pyproject.toml."""
import glob
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPy(build_py):
    def run(self):
        super().run()
        repo = os.path.dirname(HERE)
        # build/ (scripts/build.sh's) first, then other plain builds; never a sanitizer build,
        # whose library cannot be loaded into an uninstrumented python
        found = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(repo, "build*", "libdeepwell.so")))
        plain = [d for d in found if not re.search(r"asan|san|fuzz", os.path.basename(d))]
        dirs = [os.path.join(repo, "build")] + [d for d in plain if d != os.path.join(repo, "build")]
        target = os.path.join(self.build_lib, "deepwell", "_paths.py")
        with open(target, "w") as f:
            f.write('"""Written by setup.py at install: build folders of the source tree."""\n')
            f.write(f"BUILD_DIRS = {dirs!r}\n")


setup(cmdclass={"build_py": BuildPy})
