"""Checkpoints of older formats load (server/ckpt.c): the fixtures under
tests/fixtures/ckpt-vN were written by servers of format N (1: before
admission and eviction state; 2: that state without counters, the old
sketch layout). Today's server restores each, takes the same pushes as the
old server did after restoring it, and must then hold exactly the rows
(and counters) the old server held; then it checkpoints in today's format
and restarts to the same rows."""
import os
import shutil
import tempfile
import unittest

import numpy as np

from harness import Server
import ckpt_fixtures as fx
import embps

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "fixtures")


class OldFormats(unittest.TestCase):

    def check(self, version, shards):
        src = os.path.join(FIXTURES, "ckpt-v%d" % version)
        want = np.load(os.path.join(src, "expected.npz"))
        with tempfile.TemporaryDirectory() as d:
            for e in os.listdir(src):
                if e.startswith("ckpt-"):
                    shutil.copytree(os.path.join(src, e), os.path.join(d, e))
            srv = Server("--shards", shards, "--data-dir", d).start()
            try:
                with embps.Client(srv.address) as c:
                    fx.workload_b(c, version)
                    got = fx.results(c, version)
                    c.checkpoint()
                for k in want.files:
                    self.assertTrue(np.array_equal(got[k], want[k]),
                                    (version, shards, k, got[k], want[k]))
                srv.stop()
                srv.start()
                with embps.Client(srv.address) as c:
                    again = fx.results(c, version)
                for k in want.files:
                    self.assertTrue(np.array_equal(again[k], got[k]), k)
            finally:
                srv.stop()

    def test_version_1(self):
        self.check(1, fx.SHARDS)

    def test_version_1_other_shard_count(self):
        self.check(1, "3")  # no admission sketch: any count is exact

    def test_version_2(self):
        self.check(2, fx.SHARDS)  # the sketch keeps its old layout


if __name__ == "__main__":
    unittest.main()
