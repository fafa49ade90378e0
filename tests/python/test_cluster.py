"""Scale-out: three embps-server processes form one store. Every pushed row
lands on exactly one server (the one the jump hash names), values are exact
through the cluster, and a client
whose list puts servers in the wrong slots is refused at connect. A member
that comes back empty is not refilled by create_table(exist_ok=True), as
workers call it at every start: PartialError names it, and
complete_table() is the explicit act. A push that gives up on a member is
owed to it, not pushed again: resume_pushes() completes it there once.
"""
import os
import shutil
import tempfile
import unittest

import numpy as np

from harness import Server
import embps

K = 3


class Cluster(unittest.TestCase):

    def setUp(self):
        self.servers = [Server("--cluster-size", str(K), "--cluster-index",
                               str(i)).start() for i in range(K)]
        self.addrs = [s.address for s in self.servers]

    def tearDown(self):
        for s in self.servers:
            self.assertEqual(s.stop(), 0)

    def test_every_row_on_exactly_one_server(self):
        with embps.Client(self.addrs) as c:
            self.assertEqual(c.n_servers, K)
            c.create_table("t", 4, dynamic=True, optimizer="sgd", lr=1.0)
            rng = np.random.default_rng(1)
            ids = np.unique(rng.integers(-2**62, 2**62, size=3000))
            batch = np.concatenate([ids, ids[:500]])  # duplicates too
            vals = np.ones((batch.size, 4), np.float32)
            c.push("t", batch, vals)
            want = np.full((ids.size, 4), -1.0, np.float32)
            want[:500] = -2.0
            self.assertTrue(np.array_equal(c.pull("t", ids), want))
            # each server holds exactly the rows the hash gives it
            owners = np.array([embps.route(i, K) for i in ids])
            counts = [0] * K
            for i in range(K):
                with embps.Client(self.addrs) as ci:
                    stats = ci.stats()[i]
                self.assertEqual(stats["cluster_index"], i)
                (info,) = stats["tables"]
                counts[i] = info["rows_allocated"]
                self.assertEqual(counts[i], int(np.sum(owners == i)))
            self.assertEqual(sum(counts), ids.size)
            self.assertTrue(all(n > 0 for n in counts))

    def test_lost_member_not_refilled(self):
        with embps.Client(self.addrs) as c:
            c.create_table("t", 4, rows=64, lr=1.0, exist_ok=True)
            ids = [next(i for i in range(64) if embps.route(i, K) == k)
                   for k in range(K)]
            c.push("t", ids, np.ones((K, 4), np.float32))
            port = self.servers[1].port
            self.servers[1].proc.kill()  # its rows are gone with it
            self.servers[1].stop()
            self.servers[1] = Server(
                "--cluster-size", str(K), "--cluster-index", "1",
                "--listen", "127.0.0.1:%d" % port).start()
            with self.assertRaises(embps.PartialError) as e:
                c.create_table("t", 4, rows=64, lr=1.0, exist_ok=True)
            self.assertEqual(e.exception.name, "EMBPS_EPARTIAL")
            self.assertIn("missing on server 1 (%s)" % self.addrs[1],
                          e.exception.message)
            self.assertIn("complete-table", e.exception.message)
            with self.assertRaises(embps.TableNotFound):
                c.pull("t", [ids[1]])  # nothing was created
            self.assertEqual(c.complete_table("t"), 1)
            rows = c.pull("t", ids)
            self.assertTrue(np.array_equal(rows[:, 0], [-1.0, 0.0, -1.0]))
            c.create_table("t", 4, rows=64, lr=1.0, exist_ok=True)
            self.assertEqual(c.complete_table("t"), 0)

    def test_push_that_gives_up_is_owed(self):
        tmp = tempfile.mkdtemp(prefix="embps-owed-")
        member = lambda i, *extra: Server(  # noqa: E731
            "--cluster-size", str(K), "--cluster-index", str(i),
            "--data-dir", os.path.join(tmp, str(i)), "--fsync", "always",
            *extra).start()
        servers = [member(i) for i in range(K)]
        addrs = [x.address for x in servers]
        try:
            with embps.Client(addrs, retry_ms=1000) as c:
                c.create_table("g", 4, rows=64, lr=1.0)
                ids = [next(i for i in range(64) if embps.route(i, K) == k)
                       for k in range(K)]
                port = servers[1].port
                servers[1].proc.kill()
                servers[1].stop()
                with self.assertRaises(embps.PartialError) as e:
                    c.push("g", ids, np.ones((K, 4), np.float32))
                self.assertIn("owed to server 1 (%s)" % addrs[1],
                              e.exception.message)
                self.assertEqual(c.pushes_owed, 1)
                servers[1] = member(1, "--listen", "127.0.0.1:%d" % port)
                c.resume_pushes()
                self.assertEqual(c.pushes_owed, 0)
                self.assertTrue(np.array_equal(
                    c.pull("g", ids), -np.ones((K, 4), np.float32)))
        finally:
            for x in servers:
                x.stop()
            shutil.rmtree(tmp)

    def test_wrong_slot_refused(self):
        with self.assertRaises(embps.EmbpsError) as e:
            embps.Client([self.addrs[1], self.addrs[0], self.addrs[2]])
        self.assertEqual(e.exception.name, "EMBPS_EWRONGSERVER")
        with self.assertRaises(embps.EmbpsError) as e:
            embps.Client(self.addrs[0])  # one server posing as the cluster
        self.assertEqual(e.exception.name, "EMBPS_EWRONGSERVER")


if __name__ == "__main__":
    unittest.main(verbosity=2)
