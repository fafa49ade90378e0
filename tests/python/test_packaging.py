"""Packaging: `pip install ./client/python` offline with Debian's pip and
setuptools, then `import embps` finds the libembps.so that `cmake --install`
put in the same prefix, with EMBPS_LIBRARY unset, and talks to a server.
Two layouts: a virtual environment made in the prefix, and pip's --prefix
(Debian's scheme: PREFIX/local/lib/python3.X/dist-packages). The installed
package's version is the one CMakeLists.txt defines, which the installed
library reports too. And the README's install block, run as written with
another `python3` first on PATH.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from harness import ROOT, SERVER_BIN, Server

CHECK = """
import sys, numpy as np, embps
lib = embps.load_library()._name
c = embps.Client(sys.argv[1])
c.create_table(sys.argv[2], 2, rows=10, init="constant:1")
c.push(sys.argv[2], [3], np.ones((1, 2), np.float32))
print(lib)
print(embps.__file__)
print(c.pull(sys.argv[2], [3]).tolist())
print(embps.__version__, embps.load_library().embps_version_string().decode())
"""


def build_dir():
    d = os.path.dirname(os.path.abspath(SERVER_BIN))
    while d != "/" and not os.path.exists(os.path.join(d, "CMakeCache.txt")):
        d = os.path.dirname(d)
    return d


def run(*cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, **kw)
    if p.returncode:
        raise AssertionError("%s failed:\n%s" % (" ".join(cmd), p.stdout))
    return p.stdout


@unittest.skipIf(subprocess.run([sys.executable, "-m", "pip", "--version"],
                                capture_output=True).returncode,
                 "pip missing: apt-get install python3-pip python3-setuptools")
class Install(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="embps-pkg-")
        # a copy: an in-tree setuptools build leaves build/ and egg-info;
        # with the CMakeLists.txt the version comes from, where it is in a
        # checkout
        self.src = os.path.join(self.tmp, "src", "client", "python")
        shutil.copytree(os.path.join(ROOT, "client", "python"), self.src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                      "__pycache__"))
        shutil.copy(os.path.join(ROOT, "CMakeLists.txt"),
                    os.path.join(self.tmp, "src"))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("EMBPS_LIBRARY", "PYTHONPATH",
                                 "LD_LIBRARY_PATH")}
        self.server = Server().start()

    def tearDown(self):
        self.server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self, python, prefix, table, env=None):
        out = run(python, "-c", CHECK, self.server.address, table,
                  cwd=self.tmp, env=env or self.env).split("\n")
        lib, pkg, rows, versions = out[0], out[1], out[2], out[3]
        self.assertTrue(lib.startswith(os.path.join(prefix, "lib")), lib)
        self.assertTrue(pkg.startswith(prefix), pkg)
        self.assertEqual(rows, "[[0.9900000095367432, 0.9900000095367432]]")
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            want = re.search(r"project\(embps VERSION (\S+)", f.read())[1]
        self.assertEqual(versions, "%s %s" % (want, want))
        # installed, _version.py holds the version: no source tree to read
        with open(os.path.join(os.path.dirname(pkg), "_version.py")) as f:
            text = f.read()
        self.assertIn("__version__ = %r" % want, text)
        self.assertNotIn("from_cmake", text)

    def test_venv_in_the_install_prefix(self):
        prefix = os.path.join(self.tmp, "venv")
        run(sys.executable, "-m", "venv", "--system-site-packages", prefix)
        run("cmake", "--install", build_dir(), "--prefix", prefix)
        py = os.path.join(prefix, "bin", "python")
        run(py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
            self.src, env=self.env)
        self.check(py, prefix, "v")

    def test_pip_prefix(self):
        prefix = os.path.join(self.tmp, "p")
        run("cmake", "--install", build_dir(), "--prefix", prefix)
        run(sys.executable, "-m", "pip", "install", "--no-index",
            "--no-build-isolation", "--no-deps", "--prefix", prefix,
            self.src, env=self.env)
        (init,) = glob.glob(os.path.join(prefix, "**", "embps", "__init__.py"),
                            recursive=True)
        env = dict(self.env,
                   PYTHONPATH=os.path.dirname(os.path.dirname(init)))
        self.check(sys.executable, prefix, "p", env)

    def test_readme_install_block_as_written(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            blocks = re.findall(r"```sh\n(.*?)```", f.read(), re.S)
        (block,) = [b for b in blocks if "-m venv" in b]
        # a source tree as the block expects it: build/, client/python and
        # CMakeLists.txt (the package's version)
        top = os.path.join(self.tmp, "src")
        os.symlink(build_dir(), os.path.join(top, "build"))
        fake = os.path.join(self.tmp, "fakebin")
        os.makedirs(fake)
        with open(os.path.join(fake, "python3"), "w") as f:
            f.write("#!/bin/sh\necho 'not this python3' >&2\nexit 3\n")
        os.chmod(os.path.join(fake, "python3"), 0o755)
        env = dict(self.env, HOME=self.tmp,
                   PATH=fake + os.pathsep + self.env.get("PATH", ""))
        run("bash", "-euc", block, cwd=top, env=env)
        prefix = os.path.join(self.tmp, "embps-venv")
        self.check(os.path.join(prefix, "bin", "python"), prefix, "r")
        for f in ("py.typed", os.path.join("torch", "weight.py")):
            self.assertTrue(glob.glob(os.path.join(
                prefix, "lib", "python3*", "site-packages", "embps", f)), f)


if __name__ == "__main__":
    unittest.main()
