"""Export and import (issue 10) against real servers: a dynamic Adam table
trained on two servers round-trips bit for bit (rows, optimizer state,
step, and the pushes after it) into fresh clusters of other sizes and
--shards counts; numpy.load of the files equals pulls; pretrained vectors
written by numpy warm-start a table; bad files are refused whole, naming
the file; an export taken while pushes run holds whole rows only; an
import survives kill -9 with --data-dir. The dense export (issue 20):
[rows, dim] by id equal to pulls of every id on clusters of 1 and 3
servers, every init and storage type, padding; a dynamic table's lookup as
the README builds it; a link planted at a temporary name is never
followed.
"""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

import numpy as np
import torch

from harness import ROOT, SERVER_BIN, Server
import embps

CLI = os.path.join(os.path.dirname(os.path.abspath(SERVER_BIN)), "embps")

DIM = 8


def cluster(k, shards, *extra):
    return [Server("--cluster-size", str(k), "--cluster-index", str(i),
                   "--shards", str(shards), *extra).start() for i in range(k)]


def stop_all(servers):
    for s in servers:
        s.stop()


def load(d, name):
    return np.load(os.path.join(d, name + ".npy"))


def by_id(d, names):
    """The arrays of an export, rows ordered by id."""
    ids = load(d, "ids")
    order = np.argsort(ids)
    return ids[order], [load(d, n)[order] for n in names]


class ExportImport(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="embps-export-")
        self.servers = []

    def tearDown(self):
        stop_all(self.servers)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, k, shards, *extra):
        s = cluster(k, shards, *extra)
        self.servers += s
        return [x.address for x in s]

    def train(self, c, name, rng, ids, steps):
        for _ in range(steps):
            batch = rng.choice(ids, size=300)
            c.push(name, batch, rng.standard_normal(
                (batch.size, DIM)).astype(np.float32))

    def test_adam_round_trip_bit_for_bit(self):
        a = self.start(2, 4)
        rng = np.random.default_rng(7)
        ids = np.unique(rng.integers(-2**62, 2**62, size=2000))
        out = os.path.join(self.tmp, "adam")
        with embps.Client(a) as c:
            c.create_table("emb", DIM, dynamic=True, optimizer="adam",
                           lr=0.05, init="normal", init_value=0.1, seed=3)
            self.train(c, "emb", rng, ids, 20)
            n = c.export("emb", out, with_state=True)
            step = c.describe("emb")["step"]
            self.assertEqual(step, 20)
            touched = np.unique(load(out, "ids"))
            self.assertEqual(n, touched.size)
            self.assertEqual(load(out, "ids").size, touched.size)  # distinct
            # numpy.load (and torch.from_numpy) of the files equal pulls
            w = load(out, "weights")
            self.assertEqual(w.dtype, np.float32)
            self.assertEqual(w.shape, (n, DIM))
            self.assertTrue(np.array_equal(
                torch.from_numpy(w).numpy(), c.pull("emb", load(out, "ids"))))
            for f in ("adam_m", "adam_v"):
                self.assertEqual(load(out, f).shape, (n, DIM))
            self.assertFalse(np.all(load(out, "adam_m") == 0))
            before = c.pull("emb", ids)
        # fresh clusters: same size with other shards, and one server
        targets = [a]
        for k, shards in ((2, 3), (1, 5)):
            b = self.start(k, shards)
            targets.append(b)
            with embps.Client(b) as c:
                self.assertEqual(c.import_("emb", out, with_state=True,
                                           create=True), n)
                self.assertEqual(c.describe("emb")["step"], 20)
                self.assertTrue(np.array_equal(c.pull("emb", ids), before))
                again = os.path.join(self.tmp, "again-%d" % k)
                c.export("emb", again, with_state=True)
                names = ("weights", "adam_m", "adam_v")
                i1, x1 = by_id(out, names)
                i2, x2 = by_id(again, names)
                self.assertTrue(np.array_equal(i1, i2))
                for u, v in zip(x1, x2):
                    self.assertTrue(np.array_equal(u, v))
        # further pushes give identical results everywhere
        clients = [embps.Client(t) for t in targets]
        try:
            for step in range(5):
                rng2 = np.random.default_rng(100 + step)
                batch = rng2.choice(ids, size=200)
                g = rng2.standard_normal((batch.size, DIM)).astype(np.float32)
                for c in clients:
                    c.push("emb", batch, g)
            rows = [c.pull("emb", ids) for c in clients]
            self.assertTrue(np.array_equal(rows[0], rows[1]))
            self.assertTrue(np.array_equal(rows[0], rows[2]))
            self.assertFalse(np.array_equal(rows[0], before))
        finally:
            for c in clients:
                c.close()

    def test_import_without_state_resets_state(self):
        a = self.start(1, 2)
        out = os.path.join(self.tmp, "ada")
        with embps.Client(a) as c:
            c.create_table("t", DIM, dynamic=True, optimizer="adagrad",
                           lr=0.1)
            c.push("t", [1, 2], np.ones((2, DIM), np.float32))
            c.export("t", out, with_state=True)
            self.assertTrue(np.all(load(out, "adagrad_accumulator") == 1))
            c.drop_table("t")
            c.import_("t", out, create=True)  # rows, initial state
            self.assertTrue(np.array_equal(c.pull("t", [1, 2]),
                                           load(out, "weights")))
            c.export("t", out + "2", with_state=True)
            self.assertTrue(np.all(load(out + "2", "adagrad_accumulator")
                                   == 0))

    def test_pretrained_vectors_from_numpy(self):
        a = self.start(2, 4)
        d = os.path.join(self.tmp, "pre")
        os.makedirs(d)
        rng = np.random.default_rng(5)
        vec = rng.standard_normal((50, DIM))  # float64, as numpy makes it
        np.save(os.path.join(d, "weights.npy"), vec)
        with embps.Client(a) as c:
            c.create_table("dense", DIM, rows=100, optimizer="sgd")
            self.assertEqual(c.import_("dense", d), 50)  # rows 0..49
            self.assertTrue(np.array_equal(c.pull("dense", np.arange(50)),
                                           vec.astype(np.float32)))
            self.assertTrue(np.all(c.pull("dense", [50, 99]) == 0))
            ids = rng.integers(-2**40, 2**40, size=50)
            np.save(os.path.join(d, "ids.npy"), ids)
            np.save(os.path.join(d, "weights.npy"), vec.astype(np.float32))
            c.create_table("dyn", DIM, dynamic=True, optimizer="adam")
            self.assertEqual(c.import_("dyn", d), 50)
            self.assertTrue(np.array_equal(c.pull("dyn", ids),
                                           vec.astype(np.float32)))

    def bad(self, c, d, name, arr, fragment, **save):
        """Saves arr as d/name.npy; the import must fail naming the file
        and change nothing."""
        path = os.path.join(d, name + ".npy")
        if arr is not None:
            np.save(path, arr, **save)
        before = c.pull("t", np.arange(10))
        with self.assertRaises(embps.EmbpsError) as e:
            c.import_("t", d)
        self.assertIn(name + ".npy", str(e.exception))
        self.assertIn(fragment, str(e.exception))
        self.assertTrue(np.array_equal(c.pull("t", np.arange(10)), before))

    def test_bad_files_refused(self):
        a = self.start(2, 2)
        d = os.path.join(self.tmp, "bad")
        os.makedirs(d)
        good = np.ones((10, DIM), np.float32)
        with embps.Client(a) as c:
            c.create_table("t", DIM, rows=10, optimizer="sgd")
            self.bad(c, d, "weights", good.astype(np.int16), "dtype")
            self.bad(c, d, "weights", np.asfortranarray(good), "fortran")
            self.bad(c, d, "weights", np.ones((10, DIM + 1), np.float32),
                     "shape")
            nan = good.copy()
            nan[9, 3] = np.nan
            self.bad(c, d, "weights", nan, "row 9")  # found before any write
            self.bad(c, d, "weights", good.astype(">f4"), "dtype")
            np.save(os.path.join(d, "weights.npy"), good)
            with open(os.path.join(d, "weights.npy"), "r+b") as f:
                f.truncate(os.path.getsize(f.name) - 4)
            self.bad(c, d, "weights", None, "size")
            np.save(os.path.join(d, "weights.npy"), good)
            self.bad(c, d, "ids", np.arange(9), "shape")
            self.bad(c, d, "ids", np.arange(10) + 5, "out of range")
            with open(os.path.join(d, "ids.npy"), "wb") as f:
                f.write(b"not numpy at all")
            self.bad(c, d, "ids", None, "magic")
            os.unlink(os.path.join(d, "ids.npy"))
            self.assertEqual(c.import_("t", d), 10)
            self.assertTrue(np.array_equal(c.pull("t", np.arange(10)), good))

    def test_export_while_pushing(self):
        """SGD, lr 1, every push adds -1 to whole rows: a row is torn iff
        its elements differ. The export runs in small chunks meanwhile."""
        a = self.start(2, 4)
        ids = np.arange(20000, dtype=np.int64) * 7919
        with embps.Client(a) as c:
            c.create_table("t", 64, dynamic=True, optimizer="sgd", lr=1.0)
            c.push("t", ids, -np.ones((ids.size, 64), np.float32))
        stop = threading.Event()
        pushes = [0]

        def pusher():
            rng = np.random.default_rng(1)
            with embps.Client(a) as c:
                while not stop.is_set():
                    batch = np.unique(rng.choice(ids, size=500))
                    c.push("t", batch, -np.ones((batch.size, 64), np.float32))
                    pushes[0] += 1

        t = threading.Thread(target=pusher)
        t.start()
        try:
            out = os.path.join(self.tmp, "live")
            with embps.Client(a) as c:
                for r in range(3):
                    c.export("t", out + str(r))
        finally:
            stop.set()
            t.join()
        self.assertGreater(pushes[0], 0)
        for r in range(3):
            got = load(out + str(r), "weights")
            self.assertEqual(np.sort(load(out + str(r), "ids")).tolist(),
                             ids.tolist())
            self.assertTrue(np.all(got == got[:, :1]))  # whole rows
            self.assertTrue(np.all(got >= 1))
        with embps.Client(a) as c:  # quiet now: the export equals pulls
            c.export("t", out)
            self.assertTrue(np.array_equal(load(out, "weights"),
                                           c.pull("t", load(out, "ids"))))

    def test_dense_export_is_every_row_by_id(self):
        for k in (1, 3):
            a = self.start(k, 4)
            with embps.Client(a) as c:
                specs = [("n", dict(init="normal:1", seed=5)),
                         ("u", dict(init="uniform:0.1", seed=6,
                                    dtype="f16")),
                         ("z", dict(init="zeros", dtype="bf16",
                                    padding_id=7, optimizer="adagrad"))]
                for name, kw in specs:
                    rows = 1000 + k  # not a multiple of any chunk
                    c.create_table(name, DIM, rows=rows, **kw)
                    hit = np.arange(0, rows, 3)
                    c.push(name, hit, np.full((hit.size, DIM), 0.5,
                                              np.float32))
                    d = os.path.join(self.tmp, "dense-%d-%s" % (k, name))
                    self.assertEqual(c.export(name, d, dense=True), rows)
                    w = load(d, "weights")
                    self.assertEqual((w.shape, w.dtype),
                                     ((rows, DIM), np.float32))
                    self.assertTrue(np.array_equal(
                        w, c.pull(name, np.arange(rows))), (k, name))
                    self.assertFalse(os.path.exists(os.path.join(d,
                                                                 "ids.npy")))
                    with open(os.path.join(d, "spec.json")) as f:
                        spec = json.load(f)
                    self.assertEqual((spec["dense"], spec["n"],
                                      spec["rows"]), (True, rows, rows))
                    if name == "z":
                        self.assertTrue(np.all(w[7] == 0))
                # a dense export imports back (no ids.npy: rows 0..n-1)
                c.create_table("back", DIM, rows=1000 + k)
                c.import_("back", os.path.join(self.tmp,
                                               "dense-%d-n" % k))
                self.assertTrue(np.array_equal(
                    c.pull("back", np.arange(1000 + k)),
                    c.pull("n", np.arange(1000 + k))))
                with self.assertRaises(embps.InvalidArgument):
                    c.export("n", os.path.join(self.tmp, "x"), dense=True,
                             with_state=True)
            stop_all(self.servers)
            self.servers = []

    def test_dense_cli_and_dynamic_lookup(self):
        a = self.start(2, 3)
        with embps.Client(a) as c:
            c.create_table("f", DIM, rows=50, init="normal:1", seed=2)
            d = os.path.join(self.tmp, "cli")
            out = subprocess.run([CLI, "--servers", ",".join(a), "export",
                                  "f", "--dense", "--out", d], check=True,
                                 capture_output=True, text=True).stdout
            self.assertIn("exported 50 rows", out)
            self.assertTrue(np.array_equal(load(d, "weights"),
                                           c.pull("f", np.arange(50))))
            # a dynamic table: ids + rows, and the README's lookup
            c.create_table("dyn", DIM, dynamic=True, init="normal:1", seed=3)
            ids = np.array([-2**62, -5, 0, 17, 2**40], np.int64)
            c.push("dyn", ids, np.ones((ids.size, DIM), np.float32))
            d = os.path.join(self.tmp, "dyn")
            self.assertEqual(c.export("dyn", d, dense=True), ids.size)
            exported, weights = load(d, "ids"), load(d, "weights")
            order = np.argsort(exported)
            exported, weights = exported[order], weights[order]
            query = np.array([17, -5, 2**40, 17])
            rows = weights[np.searchsorted(exported, query)]
            self.assertTrue(np.array_equal(rows, c.pull("dyn", query)))

    def test_export_never_follows_a_planted_link(self):
        a = self.start(1, 2)
        victim = os.path.join(self.tmp, "victim")
        with open(victim, "w") as f:
            f.write("precious")
        with embps.Client(a) as c:
            c.create_table("t", DIM, rows=20, init="normal:1")
            for dense, names in ((True, ("weights.npy", "spec.json")),
                                 (False, ("ids.npy", "weights.npy",
                                          "spec.json"))):
                d = os.path.join(self.tmp, "links-%d" % dense)
                os.makedirs(d)
                for n in names:
                    os.symlink(victim, os.path.join(d, n + ".tmp"))
                c.export("t", d, dense=dense)
                with open(victim) as f:
                    self.assertEqual(f.read(), "precious")
                self.assertEqual(sorted(os.listdir(d)), sorted(names))
                for n in names:
                    self.assertFalse(os.path.islink(os.path.join(d, n)))

    def test_import_survives_kill_9(self):
        data = os.path.join(self.tmp, "data")
        s = Server("--data-dir", data, "--fsync", "always", "--shards", "4")
        self.servers.append(s.start())
        rng = np.random.default_rng(9)
        d = os.path.join(self.tmp, "in")
        os.makedirs(d)
        ids = np.unique(rng.integers(0, 2**50, size=500))
        w1 = rng.standard_normal((ids.size, DIM)).astype(np.float32)
        np.save(os.path.join(d, "ids.npy"), ids)
        np.save(os.path.join(d, "weights.npy"), w1)
        with embps.Client(s.address) as c:
            c.create_table("t", DIM, dynamic=True, optimizer="adagrad")
            c.import_("t", d)
            c.checkpoint()  # the first import is in the checkpoint
            c.push("t", ids[:100], np.ones((100, DIM), np.float32))
            half = ids.size // 2
            w2 = w1[:half] * 2
            np.save(os.path.join(d, "ids.npy"), ids[:half])
            np.save(os.path.join(d, "weights.npy"), w2)
            c.import_("t", d)  # in the log only
            want = c.pull("t", ids)
        s.proc.kill()  # kill -9
        s.proc.wait()
        s.proc = None
        s.start()
        with embps.Client(s.address) as c:
            got = c.pull("t", ids)
            self.assertTrue(np.array_equal(got, want))
            self.assertTrue(np.array_equal(got[:ids.size // 2], w2))
            c.push("t", ids[:3], np.ones((3, DIM), np.float32))


if __name__ == "__main__":
    unittest.main(verbosity=2)
