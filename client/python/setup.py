"""Builds the embps package (pyproject.toml holds the rest of its metadata)
with the version the top-level CMakeLists.txt defines: embps/_version.py
reads it from the source tree, and what is built (a wheel, an sdist) gets
an embps/_version.py holding the version itself, so it needs no source
tree."""
import os
import runpy

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = runpy.run_path(os.path.join(HERE, "embps", "_version.py"))[
    "__version__"]


def write_version(path):
    """Replaces the file at path (a copy, or a link to the source file) by
    one that holds VERSION."""
    if os.path.exists(path):
        os.remove(path)
    with open(path, "w") as f:
        f.write('"""The package\'s version, from project(embps VERSION) in '
                'embps\'s CMakeLists.txt."""\n__version__ = %r\n' % VERSION)


class BuildPy(build_py):
    def run(self):
        super().run()
        write_version(os.path.join(self.build_lib, "embps", "_version.py"))


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        write_version(os.path.join(base_dir, "embps", "_version.py"))


setup(version=VERSION, cmdclass={"build_py": BuildPy, "sdist": Sdist})
