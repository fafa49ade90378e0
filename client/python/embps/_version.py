"""The package's version, written in one place: project(embps VERSION
X.Y.Z) in the CMakeLists.txt at the top of the source tree, which also
makes the C header's EMBPS_VERSION_* and the library's embps_version().
From a checkout this file reads it there; in what setup.py builds (a wheel
or an sdist) it is replaced by one holding the version itself."""
import os
import re


def from_cmake(path):
    """The VERSION of project(embps VERSION ...) in the CMakeLists.txt at
    path."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ImportError("embps: no version: %s (this copy of the package "
                          "is neither installed nor in an embps source "
                          "tree; install it with pip)" % e)
    m = re.search(r"^project\(embps\s+VERSION\s+(\d+\.\d+\.\d+)", text, re.M)
    if not m:
        raise ImportError("embps: %s has no project(embps VERSION X.Y.Z)"
                          % path)
    return m.group(1)


__version__ = from_cmake(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
    "CMakeLists.txt"))
