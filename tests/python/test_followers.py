"""A member listed as PRIMARY|FOLLOWER (issue 21, client side): writes find
the primary whatever the order of the list, read_from="follower" sends
pulls to the follower and read_lsn() says at which LSN each read was (the
rows equal the primary's at that LSN), and bad lists or read_from values
are refused by name before anything is connected.
"""
import time
import unittest

import numpy as np

from harness import Server
import embps


class Followers(unittest.TestCase):

    def setUp(self):
        self.primary = Server("--shards", "2").start()
        self.follower = Server("--shards", "2", "--follow",
                               self.primary.address).start()
        self.p, self.f = self.primary.address, self.follower.address

    def tearDown(self):
        self.assertEqual(self.follower.stop(), 0)
        self.assertEqual(self.primary.stop(), 0)

    def test_writes_find_the_primary(self):
        for servers in ("%s|%s" % (self.p, self.f),
                        ["%s|%s" % (self.f, self.p)]):
            with embps.Client(servers) as c:
                c.create_table("t", 4, rows=16, optimizer="sgd", lr=1.0,
                               exist_ok=True)
                c.push("t", [1, 2], -np.ones((2, 4), np.float32))
                self.assertEqual(c.server_address(0), self.p)
        with embps.Client(self.p) as c:
            np.testing.assert_array_equal(c.pull("t", [1, 2]),
                                          2 * np.ones((2, 4), np.float32))

    def test_follower_reads_at_their_lsn(self):
        servers = "%s|%s" % (self.p, self.f)
        with embps.Client(servers) as w, \
                embps.Client(servers, read_from="follower") as r:
            w.create_table("t", 4, rows=16, optimizer="sgd", lr=1.0)
            w.pull("t", [0])
            l0 = w.read_lsn(0)
            self.assertGreater(l0, 0)
            ids = np.arange(16)
            for _ in range(10):
                w.push("t", ids, -np.ones((16, 4), np.float32))
            final = w.pull("t", ids)
            self.assertEqual(w.read_lsn(0), l0 + 10)
            self.assertEqual(w.read_address(0), self.p)
            deadline = time.time() + 30
            while True:
                try:
                    rows = r.pull("t", ids)
                except embps.TableNotFound:
                    # a follower's state is behind: no table "t" there yet
                    self.assertLess(time.time(), deadline)
                    time.sleep(0.02)
                    continue
                lsn = r.read_lsn(0)
                # every row the primary's at the LSN the read reports
                np.testing.assert_array_equal(
                    rows, np.full((16, 4), lsn - l0, np.float32))
                if lsn == l0 + 10 or time.time() > deadline:
                    break
                time.sleep(0.02)
            self.assertEqual(lsn, l0 + 10)
            np.testing.assert_array_equal(rows, final)
            self.assertEqual(r.read_address(0), self.f)

    def test_refusals(self):
        with self.assertRaises(embps.InvalidArgument) as e:
            embps.Client("%s|" % self.p)
        self.assertIn("entry 0", str(e.exception))
        with self.assertRaises(embps.InvalidArgument) as e:
            embps.Client("%s|%s" % (self.p, self.p))
        self.assertIn("twice", str(e.exception))
        with self.assertRaises(embps.InvalidArgument) as e:
            embps.Client(self.p, read_from="nearest")
        self.assertIn("read_from", str(e.exception))
        # a follower listed alone is a seed: it names its primary in its
        # hello, and writes go there (no retry needed)
        with embps.Client(self.f, retry_ms=-1) as c:
            c.create_table("u", 4, rows=4)
            self.assertEqual(c.server_address(0), self.p)
        with embps.Client(self.p) as c:
            self.assertIn("u", [t["name"] for t in c.tables()])
            c.drop_table("u")
        # servers_as_listed: that server alone, its refusals included
        with embps.Client(self.f, retry_ms=-1, servers_as_listed=True) as c:
            self.assertEqual(c.server_address(0), self.f)
            with self.assertRaises(embps.NotPrimary) as e:
                c.create_table("v", 4, rows=4)
            self.assertIn(self.p, str(e.exception))


if __name__ == "__main__":
    unittest.main()
