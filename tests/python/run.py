"""Runs the Python test suites (unittest). Exits 77 (ctest's skip code) with
a clear message only when numpy or torch is really absent."""
import os
import sys
import unittest

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    print("SKIP: %s (install python3-numpy and python3-torch, and run with "
          "/usr/bin/python3)" % e)
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
pattern = sys.argv[1] if len(sys.argv) > 1 else "test_*.py"
suite = unittest.defaultTestLoader.discover(here, pattern=pattern)
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
