"""embps against the real frameworks: every optimizer, trained through a real
server on random IndexedSlices with heavy duplicates, must match PyTorch
(SGD, Adagrad, SparseAdam on nn.Embedding(sparse=True)) or TensorFlow's
FTRL formula (numpy) to float32 rounding: normwise relative error <= 1e-5
after 200 steps. Also: f16/bf16 storage, duplicates vs pre-merged pushes,
deterministic initial rows across shard counts and restarts, synchronous
tables, and refusal of bad input.

Run with Debian's /usr/bin/python3 (python3-torch, python3-numpy).
"""
import multiprocessing
import unittest

import numpy as np
import torch

from harness import Server
import embps

STEPS = 200
RTOL = 1e-5


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def batches(rng, rows, dim, steps, n=64, hot=None):
    """Random IndexedSlices with heavy duplicates: n indices per step drawn
    from a small hot set, so most indices repeat."""
    hot = hot or max(2, rows // 3)
    for _ in range(steps):
        pool = rng.choice(rows, size=hot, replace=False)
        idx = rng.choice(pool, size=n).astype(np.int64)
        vals = rng.standard_normal((n, dim)).astype(np.float32)
        yield idx, vals


def torch_sparse_grad(idx, vals, rows, dim):
    return torch.sparse_coo_tensor(torch.from_numpy(idx).unsqueeze(0),
                                   torch.from_numpy(vals), (rows, dim))


class FrameworkParity(unittest.TestCase):
    """Each optimizer against its framework, for several dims."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--shards", "5").start()
        cls.client = embps.Client(cls.server.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.server.stop() == 0

    def run_torch(self, name, opt, rows, dim, make_optimizer, seed, **params):
        c = self.client
        c.create_table(name, dim, rows=rows, optimizer=opt, init="normal",
                       init_value=0.5, seed=seed, **params)
        w0 = c.pull(name, np.arange(rows))
        emb = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            emb.weight.copy_(torch.from_numpy(w0))
        optim = make_optimizer(emb.parameters())
        rng = np.random.default_rng(seed)
        for idx, vals in batches(rng, rows, dim, STEPS):
            c.push(name, idx, vals)
            optim.zero_grad()
            emb.weight.grad = torch_sparse_grad(idx, vals, rows, dim)
            optim.step()
        got = c.pull(name, np.arange(rows))
        want = emb.weight.detach().numpy()
        err = rel_err(got, want)
        self.assertLessEqual(err, RTOL, "%s dim %d: relative error %.3g"
                             % (opt, dim, err))
        self.assertFalse(np.allclose(got, w0), "the table never moved")
        c.drop_table(name)
        return err

    def test_sgd(self):
        for dim in (1, 7, 64):
            self.run_torch("sgd%d" % dim, "sgd", 40, dim,
                           lambda p: torch.optim.SGD(p, lr=0.05), seed=dim,
                           lr=0.05)

    def test_adagrad(self):
        for dim, iav in ((1, 0.0), (7, 0.1), (64, 0.0)):
            self.run_torch(
                "adagrad%d" % dim, "adagrad", 40, dim,
                lambda p, iav=iav: torch.optim.Adagrad(
                    p, lr=0.1, eps=1e-10, initial_accumulator_value=iav),
                seed=dim + 100, lr=0.1, eps=1e-10, initial_accumulator=iav)

    def test_sparse_adam(self):
        for dim, betas in ((1, (0.9, 0.999)), (7, (0.8, 0.99)),
                           (64, (0.9, 0.999))):
            self.run_torch(
                "adam%d" % dim, "adam", 40, dim,
                lambda p, b=betas: torch.optim.SparseAdam(p, lr=0.01,
                                                          betas=b, eps=1e-8),
                seed=dim + 200, lr=0.01, beta1=betas[0], beta2=betas[1],
                eps=1e-8)

    def test_adam_decoupled_weight_decay(self):
        """Lazy Adam plus decoupled decay on the touched rows, against a
        float64 numpy reference of the formula (PyTorch's SparseAdam has no
        weight decay)."""
        c, rows, dim, lr, wd = self.client, 30, 8, 0.01, 0.1
        b1, b2, eps = 0.9, 0.999, 1e-8
        c.create_table("adamw", dim, rows=rows, optimizer="adam", lr=lr,
                       weight_decay=wd, init="normal", init_value=0.5, seed=3)
        w = c.pull("adamw", np.arange(rows)).astype(np.float64)
        m = np.zeros_like(w)
        v = np.zeros_like(w)
        rng = np.random.default_rng(3)
        for t, (idx, vals) in enumerate(batches(rng, rows, dim, STEPS), 1):
            c.push("adamw", idx, vals)
            g = np.zeros_like(w)
            np.add.at(g, idx, vals.astype(np.float64))
            u = np.unique(idx)
            m[u] = b1 * m[u] + (1 - b1) * g[u]
            v[u] = b2 * v[u] + (1 - b2) * g[u] ** 2
            step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            w[u] = w[u] - lr * wd * w[u] - step * m[u] / (np.sqrt(v[u]) + eps)
        got = c.pull("adamw", np.arange(rows))
        self.assertLessEqual(rel_err(got, w), RTOL)

    def test_ftrl(self):
        """TensorFlow ApplyFtrl (numpy, float64), several lr_power, l1, l2."""
        cases = [(4, -0.5, 0.0, 0.0), (16, -0.5, 0.05, 0.01),
                 (7, -0.3, 0.01, 0.1), (64, -0.5, 0.001, 0.0)]
        for dim, p, l1, l2 in cases:
            c, rows, lr, init_acc = self.client, 40, 0.1, 0.1
            name = "ftrl%d" % dim
            c.create_table(name, dim, rows=rows, optimizer="ftrl", lr=lr,
                           l1=l1, l2=l2, lr_power=p,
                           initial_accumulator=init_acc, init="normal",
                           init_value=0.5, seed=dim)
            w = c.pull(name, np.arange(rows)).astype(np.float64)
            n = np.full_like(w, init_acc)
            z = np.zeros_like(w)
            rng = np.random.default_rng(dim + 7)
            for idx, vals in batches(rng, rows, dim, STEPS):
                c.push(name, idx, vals)
                g = np.zeros_like(w)
                np.add.at(g, idx, vals.astype(np.float64))
                u = np.unique(idx)
                nn = n[u] + g[u] ** 2
                z[u] += g[u] - (nn ** -p - n[u] ** -p) / lr * w[u]
                quad = nn ** -p / lr + 2 * l2
                w[u] = np.where(np.abs(z[u]) > l1,
                                (np.sign(z[u]) * l1 - z[u]) / quad, 0.0)
                n[u] = nn
            got = c.pull(name, np.arange(rows))
            err = rel_err(got, w)
            self.assertLessEqual(err, RTOL, "ftrl dim %d p %g: %.3g"
                                 % (dim, p, err))
            c.drop_table(name)


class HalfStorage(unittest.TestCase):
    """f16/bf16 tables: weights stored rounded to nearest even after every
    step (optimizer state float32), pulled exactly. SGD (lr a power of two,
    distinct ids) equals float32 math then rounding bit for bit; SparseAdam
    stays within one unit in the last place of torch's run rounded the same
    way; dense and dynamic."""

    def test_half_storage(self):
        rows, dim = 30, 8
        with Server("--shards", "3") as s, embps.Client(s.address) as c:
            with self.assertRaises(ValueError):
                c.create_table("bad", dim, rows=rows, dtype="f64")
            for dt, tdt, ulp in (("f16", torch.float16, 2.0 ** -10),
                                 ("bf16", torch.bfloat16, 2.0 ** -7)):
                for opt, dynamic in (("sgd", False), ("sgd", True),
                                     ("adam", False)):
                    self.check(c, dt, tdt, ulp, opt, dynamic, rows, dim)

    def check(self, c, dt, tdt, ulp, opt, dynamic, rows, dim):
        name = "half_%s_%s_%d" % (dt, opt, dynamic)
        lr = 0.25 if opt == "sgd" else 0.05
        c.create_table(name, dim, rows=None if dynamic else rows,
                       dynamic=dynamic, optimizer=opt, init="normal",
                       init_value=0.5, seed=3, dtype=dt, lr=lr)
        info = c.describe(name)
        self.assertEqual(info["dtype"], dt)
        ids = np.arange(rows) * (7919 if dynamic else 1)
        w0 = c.pull(name, ids)
        rounded = torch.from_numpy(w0).to(tdt).float().numpy()
        self.assertTrue(np.array_equal(w0, rounded), "initial rows rounded")
        emb = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            emb.weight.copy_(torch.from_numpy(w0))
        optim = (torch.optim.SGD(emb.parameters(), lr=lr) if opt == "sgd"
                 else torch.optim.SparseAdam(emb.parameters(), lr=lr))
        rng = np.random.default_rng(7)
        for _ in range(50):
            pos = rng.choice(rows, size=12, replace=False).astype(np.int64)
            vals = rng.standard_normal((12, dim)).astype(np.float32)
            c.push(name, ids[pos], vals)
            optim.zero_grad()
            emb.weight.grad = torch_sparse_grad(pos, vals, rows, dim)
            optim.step()
            with torch.no_grad():
                emb.weight.copy_(emb.weight.to(tdt).float())
        got, want = c.pull(name, ids), emb.weight.detach().numpy()
        if opt == "sgd":
            self.assertTrue(np.array_equal(got, want), name)
        else:
            tol = ulp * np.maximum(np.abs(want), 2.0 ** -14)
            self.assertTrue(np.all(np.abs(got - want) <= tol), name)
        self.assertFalse(np.array_equal(got, w0), "the table never moved")
        c.drop_table(name)


class Semantics(unittest.TestCase):

    def test_duplicates_equal_premerged(self):
        with Server() as s, embps.Client(s.address) as c:
            for opt in ("sgd", "adagrad", "adam", "ftrl"):
                c.create_table("dup_" + opt, 16, rows=50, optimizer=opt,
                               init="uniform", init_value=0.1, seed=1)
                c.create_table("pre_" + opt, 16, rows=50, optimizer=opt,
                               init="uniform", init_value=0.1, seed=1)
                rng = np.random.default_rng(5)
                for idx, vals in batches(rng, 50, 16, 30, n=200, hot=10):
                    c.push("dup_" + opt, idx, vals)
                    u, inv = np.unique(idx, return_inverse=True)
                    merged = np.zeros((u.size, 16), np.float32)
                    np.add.at(merged, inv, vals)
                    c.push("pre_" + opt, u, merged)
                a = c.pull("dup_" + opt, np.arange(50))
                b = c.pull("pre_" + opt, np.arange(50))
                self.assertLessEqual(rel_err(a, b), 1e-6, opt)

    def test_initial_rows_same_across_shards_and_restart(self):
        ids = np.array([0, 1, 5, 999, 12345, 2**40, -7, 2**62], np.int64)
        pulled = []
        for shards in ("1", "7"):
            with Server("--shards", shards) as s:
                with embps.Client(s.address) as c:
                    c.create_table("d", 24, dynamic=True, init="normal",
                                   init_value=1.0, seed=42)
                    pulled.append(c.pull("d", ids))
                s.restart()
                with embps.Client(s.address) as c:
                    c.create_table("d", 24, dynamic=True, init="normal",
                                   init_value=1.0, seed=42)
                    pulled.append(c.pull("d", ids))
                    self.assertEqual(c.describe("d")["rows_allocated"], 0)
        for p in pulled[1:]:
            self.assertTrue(np.array_equal(p, pulled[0]))
        self.assertGreater(np.std(pulled[0]), 0.5)

    def test_nonfinite_refused_table_unchanged(self):
        with Server() as s, embps.Client(s.address) as c:
            c.create_table("t", 4, rows=10, optimizer="adagrad",
                           init="uniform", init_value=1.0, seed=9)
            c.push("t", [1, 2], np.ones((2, 4), np.float32))
            before = c.pull("t", np.arange(10))
            vals = np.ones((3, 4), np.float32)
            vals[1, 2] = np.nan
            with self.assertRaises(embps.EmbpsError) as e:
                c.push("t", [3, 7, 3], vals)
            self.assertEqual(e.exception.name, "EMBPS_ENONFINITE")
            self.assertIn("index 7", str(e.exception))
            vals[1, 2] = np.inf
            with self.assertRaises(embps.EmbpsError):
                c.push("t", [3, 7, 3], vals)
            self.assertTrue(np.array_equal(before, c.pull("t", np.arange(10))))

    def test_bad_parameters_refused(self):
        with Server() as s, embps.Client(s.address) as c:
            bad = [dict(optimizer="sgd", lr=-0.1),
                   dict(optimizer="adam", beta1=1.0),
                   dict(optimizer="adam", beta2=-0.1),
                   dict(optimizer="ftrl", lr_power=0.5),
                   dict(optimizer="ftrl", initial_accumulator=0.0),
                   dict(optimizer="adagrad", eps=-1.0)]
            for params in bad:
                with self.assertRaises(embps.EmbpsError) as e:
                    c.create_table("bad", 4, rows=10, **params)
                self.assertEqual(e.exception.name, "EMBPS_EPARAM", params)
            self.assertEqual(c.tables(), [])


def sync_worker(address, table, worker, steps, seed, queue):
    """One synchronous worker process: its own client, one push per step."""
    try:
        with embps.Client(address) as c:
            rng = np.random.default_rng(seed * 1000 + worker)
            for step in range(1, steps + 1):
                idx = rng.integers(0, 20, size=30).astype(np.int64)
                vals = rng.standard_normal((30, 8)).astype(np.float32)
                c.push(table, idx, vals, step=step)
                queue.put((worker, step, idx, vals))
        queue.put((worker, "done", None, None))
    except Exception as e:  # reported to the parent, which fails the test
        queue.put((worker, "error: %s" % e, None, None))


class SyncMode(unittest.TestCase):

    def test_sync_equals_averaged_push(self):
        workers, steps = 3, 10
        with Server("--shards", "3") as s, embps.Client(s.address) as c:
            c.create_table("sync", 8, rows=20, optimizer="adagrad", lr=0.1,
                           init="normal", init_value=0.3, seed=4,
                           sync_workers=workers)
            c.create_table("ref", 8, rows=20, optimizer="adagrad", lr=0.1,
                           init="normal", init_value=0.3, seed=4)
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            procs = [ctx.Process(target=sync_worker,
                                 args=(s.address, "sync", w, steps, 1, q))
                     for w in range(workers)]
            for p in procs:
                p.start()
            per_step = {}
            done = 0
            while done < workers:
                w, step, idx, vals = q.get(timeout=60)
                if step == "done":
                    done += 1
                elif isinstance(step, str):
                    self.fail("worker %d: %s" % (w, step))
                else:
                    per_step.setdefault(step, []).append((idx, vals))
            for p in procs:
                p.join(timeout=30)
                self.assertEqual(p.exitcode, 0)
            for step in range(1, steps + 1):
                idx = np.concatenate([i for i, _ in per_step[step]])
                vals = np.concatenate([v for _, v in per_step[step]])
                u, inv = np.unique(idx, return_inverse=True)
                merged = np.zeros((u.size, 8), np.float32)
                np.add.at(merged, inv, vals)
                c.push("ref", u, merged / workers)
            got = c.pull("sync", np.arange(20))
            want = c.pull("ref", np.arange(20))
            self.assertLessEqual(rel_err(got, want), RTOL)
            self.assertEqual(c.describe("sync")["step"], steps)

    def test_sync_refuses_stale_duplicate_and_unnumbered(self):
        with Server() as s, embps.Client(s.address) as a, \
                embps.Client(s.address) as b:
            a.create_table("s2", 2, rows=4, sync_workers=2)
            g = np.ones((1, 2), np.float32)
            t = a.push_async("s2", [1], g)  # no step number
            with self.assertRaises(embps.EmbpsError) as e:
                t.wait()
            self.assertEqual(e.exception.name, "EMBPS_ESTEP")
            with self.assertRaises(embps.EmbpsError) as e:
                a.push("s2", [1], g, step=2)  # ahead of step 1
            self.assertIn("ahead", str(e.exception))
            # a's push for step 1 is held until a second worker pushes
            held = a.push_async("s2", [1], g, step=1)
            with self.assertRaises(embps.EmbpsError) as e:
                a.push("s2", [3], g, step=1)  # a again in the same step
            self.assertIn("already pushed", str(e.exception))
            b.push("s2", [2], g, step=1)  # completes step 1
            held.wait()
            self.assertEqual(a.describe("s2")["step"], 1)
            with self.assertRaises(embps.EmbpsError) as e:
                b.push("s2", [1], g, step=1)  # stale
            self.assertIn("stale", str(e.exception))
            # step 1 applied the average of a's and b's rows: sgd lr 0.01
            want = np.zeros((4, 2), np.float32)
            want[1] -= 0.01 * 0.5
            want[2] -= 0.01 * 0.5
            self.assertTrue(np.allclose(a.pull("s2", np.arange(4)), want))

if __name__ == "__main__":
    unittest.main(verbosity=2)
