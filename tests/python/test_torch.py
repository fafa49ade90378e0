"""embps.torch against the PyTorch modules it replaces, through a real
server: one optimizer step per table per step with the summed gradient
(nn.Embedding(sparse=True) + torch.optim), nothing recorded or kept alive
without autograd, RemoteEmbeddingBag against nn.EmbeddingBag (forward and
backward), the creation helper, learning-rate schedules, overlap's one-step
staleness, state dicts and pickling, and Client after fork().
"""
import gc
import io
import os
import unittest
import weakref

import numpy as np
import torch

from harness import Server
from test_optimizers import RTOL, batches, rel_err, torch_sparse_grad
import embps
import embps.torch as et


def live_tensors():
    return sum(isinstance(o, torch.Tensor) for o in gc.get_objects())


class TorchBase(unittest.TestCase):

    def setUp(self):
        self.server = Server().start()
        self.c = embps.Client(self.server.address)

    def tearDown(self):
        self.c.close()
        self.assertEqual(self.server.stop(), 0)

    def table_weight(self, name, rows):
        return torch.from_numpy(self.c.pull(name, np.arange(rows)))


class CreateAndInit(TorchBase):

    def test_cli_init_spellings(self):
        for i, (spelling, kind, value) in enumerate([
                ("normal:0.1", "normal", 0.1), ("uniform:0.05", "uniform", 0.05),
                ("constant:1", "constant", 1.0), ("zeros", "zeros", 0.0)]):
            self.c.create_table("a%d" % i, 4, rows=100, init=spelling, seed=7)
            self.c.create_table("b%d" % i, 4, rows=100, init=kind,
                                init_value=value, seed=7)
            d = self.c.describe("a%d" % i)
            self.assertEqual((d["init"], d["init_value"]), (kind, value))
            a = self.c.pull("a%d" % i, np.arange(100))
            self.assertTrue(np.array_equal(a, self.c.pull("b%d" % i,
                                                          np.arange(100))))
        self.assertTrue(np.all(self.c.pull("a2", [5]) == 1.0))
        self.assertLessEqual(np.abs(self.c.pull("a1", np.arange(100))).max(),
                             0.05)
        for bad in ("gauss:1", "normal:x"):
            with self.assertRaises(ValueError):
                self.c.create_table("bad", 4, rows=10, init=bad)
        with self.assertRaises(ValueError):
            self.c.create_table("bad", 4, rows=10, init="normal:1",
                                init_value=2)

    def test_create_defaults_and_exist_ok(self):
        emb = et.RemoteEmbedding.create(self.c, "users", 4000, 16)
        self.assertEqual(emb.spec["init"], "normal")
        self.assertEqual(emb.spec["init_value"], 1.0)  # nn.Embedding: N(0, 1)
        w = self.table_weight("users", 4000)
        self.assertLess(abs(float(w.mean())), 0.02)
        self.assertLess(abs(float(w.std()) - 1.0), 0.02)
        again = et.RemoteEmbedding.create(self.c, "users", 4000, 16)  # fine
        self.assertEqual(again.dim, 16)
        with self.assertRaises(embps.EmbpsError) as e:
            et.RemoteEmbedding.create(self.c, "users", 4000, 16,
                                      optimizer="adagrad", lr=0.5)
        msg = str(e.exception)
        self.assertIn("optimizer 'sgd', not 'adagrad'", msg)
        self.assertIn("lr 0.01, not 0.5", msg)
        self.assertEqual(e.exception.name, "EMBPS_EEXIST")
        with self.assertRaises(embps.EmbpsError):
            et.RemoteEmbedding.create(self.c, "users", 4000, 16,
                                      exist_ok=False)
        dyn = et.RemoteEmbeddingBag.create(self.c, "tags", None, 8, mode="sum",
                                           padding_idx=-1)
        self.assertTrue(dyn.spec["dynamic"])
        self.assertEqual((dyn.padding_id, dyn.mode), (-1, "sum"))


class OneStepPerTable(TorchBase):

    def test_two_lookups_sum_into_one_adagrad_step(self):
        # the case: lr 1, one id used twice, gradient 1 each
        emb = et.RemoteEmbedding.create(self.c, "z", 10, 1, init="zeros",
                                        optimizer="adagrad", lr=1.0)
        opt = et.RemoteOptimizer(emb)
        (emb(torch.tensor([3])).sum() + emb(torch.tensor([3])).sum()).backward()
        opt.step()
        self.assertEqual(float(self.c.pull("z", [3])[0, 0]), -1.0)
        self.assertEqual(self.c.describe("z")["pushes"], 1)

    def test_matches_nn_embedding_sparse_adagrad(self):
        rows, dim = 50, 8
        self.c.create_table("t", dim, rows=rows, optimizer="adagrad", lr=1.0,
                            init="normal:0.5", seed=3)
        remote = et.RemoteEmbedding(self.c, "t")
        other = et.RemoteEmbedding(self.c, "t")  # a second module, same table
        local = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            local.weight.copy_(self.table_weight("t", rows))
        ropt = et.RemoteOptimizer([remote, other])
        lopt = torch.optim.Adagrad(local.parameters(), lr=1.0, eps=1e-10)
        self.assertEqual(len(ropt.param_groups), 1)
        gen = torch.Generator().manual_seed(0)
        for step in range(6):
            ropt.zero_grad()
            lopt.zero_grad()
            batches = [torch.randint(0, rows, (3, 7), generator=gen)
                       for _ in range(3)]
            target = torch.randn(3, 7, dim, generator=gen)
            for emb, out in ((local, []), (remote, [])):
                # two lookups in one forward, then a third forward (another
                # module on the same table for the remote side) before the
                # single update
                (((emb(batches[0]) * emb(batches[1]) - target) ** 2).sum()
                 ).backward()
                third = other if emb is remote else local
                (third(batches[2]) * target).sum().backward()
            ropt.step()
            lopt.step()
            got = self.table_weight("t", rows)
            self.assertTrue(torch.allclose(got, local.weight.detach(),
                                           rtol=1e-5, atol=1e-6), step)
        self.assertEqual(self.c.describe("t")["pushes"], 6)

    def test_no_grad_records_nothing_unused_graphs_go(self):
        emb = et.RemoteEmbedding.create(self.c, "e", 1000, 32)
        emb(torch.arange(5))  # warm up lazily created objects
        gc.collect()
        before = live_tensors()
        refs = []
        with torch.no_grad():
            for _ in range(100):
                out = emb(torch.arange(500))
                self.assertFalse(out.requires_grad)
                refs.append(weakref.ref(out))
        for mode in (emb.eval, emb.train):  # eval records, as nn.Embedding
            mode()
            for _ in range(50):  # recorded, never backpropagated: dropped
                out = emb(torch.arange(500))
                self.assertTrue(out.requires_grad)
                refs.append(weakref.ref(out))
        del out
        gc.collect()
        self.assertIsNone(emb.weight.grad)
        self.assertLessEqual(live_tensors(), before)
        self.assertTrue(all(r() is None for r in refs))
        opt = et.RemoteOptimizer(emb)
        opt.step()  # nothing to push
        self.assertEqual(self.c.describe("e")["pushes"], 0)

    def test_ids_any_container_output_on_ids_device(self):
        emb = et.RemoteEmbedding.create(self.c, "d", 100, 4)
        want = self.c.pull("d", [[1, 2], [2, 9]])
        base = torch.tensor([[1, 2], [2, 9]])
        for ids in (base.tolist(), base.numpy().astype(np.int32),
                    base.int(), base.t().contiguous().t()):  # not contiguous
            out = emb(ids)
            self.assertEqual(out.device, torch.device("cpu"))
            self.assertTrue(np.array_equal(out.detach().numpy(), want))
        self.assertEqual(tuple(emb(torch.empty(0, 3, dtype=torch.long))
                               .shape), (0, 3, 4))
        with self.assertRaises(TypeError):
            emb(torch.tensor([1.0]))


class Bag(TorchBase):

    def compare(self, mode, input, offsets=None, weights=False,
                include_last=False, padding=None, name="b"):
        rows, dim = 40, 6
        self.c.create_table(name, dim, rows=rows, optimizer="sgd", lr=1.0,
                            init="normal:1", seed=11, padding_id=padding)
        remote = et.RemoteEmbeddingBag(self.c, name, mode=mode,
                                       include_last_offset=include_last)
        w0 = self.table_weight(name, rows)
        local = torch.nn.EmbeddingBag(rows, dim, mode=mode,
                                      include_last_offset=include_last,
                                      padding_idx=padding)
        with torch.no_grad():
            local.weight.copy_(w0)
        psw_l = psw_r = None
        if weights:
            psw_l = torch.rand(input.shape, generator=torch.Generator()
                               .manual_seed(5)).requires_grad_()
            psw_r = psw_l.detach().clone().requires_grad_()
        opt = et.RemoteOptimizer(remote)
        out_l = local(input, offsets, psw_l)
        out_r = remote(input, offsets, psw_r)
        self.assertTrue(torch.allclose(out_r, out_l, rtol=1e-5, atol=1e-6),
                        (mode, out_r, out_l))
        g = torch.randn(out_l.shape, generator=torch.Generator().manual_seed(2))
        (out_l * g).sum().backward()
        (out_r * g).sum().backward()
        opt.step()  # sgd lr 1: the table becomes w0 - grad
        want = w0 - local.weight.grad
        self.assertTrue(torch.allclose(self.table_weight(name, rows), want,
                                       rtol=1e-5, atol=1e-5), mode)
        if weights:
            self.assertTrue(torch.allclose(psw_r.grad, psw_l.grad, rtol=1e-5,
                                           atol=1e-5))

    def test_modes_and_inputs(self):
        gen = torch.Generator().manual_seed(1)
        flat = torch.randint(0, 40, (30,), generator=gen)
        flat[::4] = flat[1]  # repeats within and across bags
        offsets = torch.tensor([0, 3, 3, 10, 22])  # an empty bag too
        two_d = torch.randint(0, 40, (5, 4), generator=gen)
        n = 0
        for mode in ("sum", "mean", "max"):
            for args in ({"input": two_d}, {"input": flat, "offsets": offsets},
                         {"input": flat, "include_last": True,
                          "offsets": torch.cat([offsets,
                                                torch.tensor([30])])},
                         {"input": two_d, "padding": int(two_d[0, 0])}):
                n += 1
                with self.subTest(mode=mode, case=n):
                    self.compare(mode, name="b%d" % n, **args)
        self.compare("sum", flat, offsets, weights=True, name="w1")
        self.compare("sum", two_d, weights=True, padding=int(two_d[1, 1]),
                     name="w2")

    def test_sqrtn_and_bad_input(self):
        self.c.create_table("s", 2, rows=10, init="constant:1")
        bag = et.RemoteEmbeddingBag(self.c, "s", mode="sqrtn")
        out = bag(torch.tensor([[1, 2, 3, 4]]))
        self.assertTrue(torch.allclose(out, torch.full((1, 2), 2.0)))
        with self.assertRaises(ValueError):
            bag(torch.tensor([1, 2, 3]))  # 1-D without offsets
        with self.assertRaises(RuntimeError):  # as nn.EmbeddingBag
            bag(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))  # not from 0
        with self.assertRaises(NotImplementedError):
            et.RemoteEmbeddingBag(self.c, "s", mode="mean")(
                torch.tensor([[1, 2]]), None, torch.ones(1, 2))


class Optimizer(TorchBase):

    def test_sgd_follows_an_lr_schedule(self):
        emb = et.RemoteEmbedding.create(self.c, "s", 10, 2, init="zeros",
                                        lr=0.5)
        opt = et.RemoteOptimizer(emb)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        lrs = []
        for _ in range(3):
            opt.zero_grad()
            emb(torch.tensor([4])).sum().backward()
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        self.assertEqual(lrs, [0.5, 0.25, 0.125])
        self.assertTrue(np.allclose(self.c.pull("s", [4]), -sum(lrs)))
        self.assertEqual(self.c.describe("s")["lr"], 0.125)  # the last sent

    def schedule_matches_torch(self, optimizer, make_local, make_sched,
                               steps=50, rows=40, dim=8, **params):
        """The same random sparse gradients and the same lr schedule
        through RemoteOptimizer and through a local nn.Embedding(sparse=
        True) with its torch.optim optimizer: equal to float32 rounding."""
        name = "lr_" + optimizer
        emb = et.RemoteEmbedding.create(self.c, name, rows, dim, init="normal",
                                        init_value=0.5, seed=11,
                                        optimizer=optimizer, **params)
        local = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            local.weight.copy_(self.table_weight(name, rows))
        ropt, lopt = et.RemoteOptimizer(emb), make_local(local.parameters())
        rs, ls = make_sched(ropt), make_sched(lopt)
        lrs = set()
        for idx, vals in batches(np.random.default_rng(5), rows, dim, steps):
            ropt.zero_grad()
            lopt.zero_grad()
            # the remote side through autograd: d(sum(out * vals))/dw = vals
            (emb(torch.from_numpy(idx)) * torch.from_numpy(vals)).sum(
            ).backward()
            local.weight.grad = torch_sparse_grad(idx, vals, rows, dim)
            self.assertEqual(ropt.param_groups[0]["lr"],
                             lopt.param_groups[0]["lr"])
            lrs.add(ropt.param_groups[0]["lr"])
            ropt.step()
            lopt.step()
            rs.step()
            ls.step()
        got = self.c.pull(name, np.arange(rows))
        err = rel_err(got, local.weight.detach().numpy())
        self.assertLessEqual(err, RTOL, "%s: relative error %.3g"
                             % (optimizer, err))
        self.assertGreater(len(lrs), 3)  # the schedule did move
        self.assertEqual(self.c.describe(name)["pushes"], steps)

    def test_adagrad_follows_step_lr(self):
        self.schedule_matches_torch(
            "adagrad", lambda p: torch.optim.Adagrad(p, lr=0.5, eps=1e-10),
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=10,
                                                      gamma=0.5),
            lr=0.5, eps=1e-10)

    def test_adam_follows_lambda_lr(self):
        self.schedule_matches_torch(
            "adam", lambda p: torch.optim.SparseAdam(p, lr=0.05, eps=1e-8),
            lambda o: torch.optim.lr_scheduler.LambdaLR(
                o, lambda s: min(1.0, (s + 1) / 10) * 0.97 ** s),
            lr=0.05, eps=1e-8)

    def test_lr_refused_names_the_problem(self):
        emb = et.RemoteEmbedding.create(self.c, "a", 10, 2,
                                        optimizer="adagrad", lr=0.5)
        opt = et.RemoteOptimizer(emb)
        opt.param_groups[0]["lr"] = 0.0
        emb(torch.tensor([1])).sum().backward()
        with self.assertRaises(embps.EmbpsError) as e:
            opt.step()
        self.assertIn("lr must be > 0", str(e.exception))
        self.assertEqual(e.exception.name, "EMBPS_EPARAM")
        d = self.c.describe("a")
        self.assertEqual((d["lr"], d["pushes"]), (0.5, 0))
        self.assertEqual(self.c.set_lr("a", 0.25)["lr"], 0.25)
        self.assertEqual(self.c.alter("a", eps=1e-6, l2=0.5)["l2"], 0.5)
        with self.assertRaises(ValueError):
            self.c.alter("a", dim=3)

    def test_synchronous_table_steps(self):
        emb = et.RemoteEmbedding.create(self.c, "y", 10, 2, init="zeros",
                                        lr=1.0, sync_workers=1)
        opt = et.RemoteOptimizer(emb)
        for _ in range(3):
            opt.zero_grad()
            emb(torch.tensor([2])).sum().backward()
            opt.step()
        opt.zero_grad()
        opt.step()  # no gradient: still the next step, pushed empty
        self.assertTrue(np.array_equal(self.c.pull("y", [2]),
                                       [[-3.0, -3.0]]))
        self.assertEqual(self.c.describe("y")["step"], 4)

    def test_overlap_is_at_most_one_step_stale(self):
        for overlap in (False, True):
            name = "o%d" % overlap
            emb = et.RemoteEmbedding.create(self.c, name, 10, 1, init="zeros",
                                            lr=1.0)
            opt = et.RemoteOptimizer(emb, overlap=overlap)
            seen = []
            ids = torch.tensor([7])
            emb.prefetch(ids)  # the first batch's
            for t in range(8):
                emb.prefetch(ids)  # the next batch's, before this forward
                opt.zero_grad()
                out = emb(ids)
                seen.append(float(out))
                out.sum().backward()
                opt.step()
            opt.close()
            if overlap:  # step t's rows miss exactly step t-1's push
                self.assertEqual(seen, [0.0, 0.0] + [-float(t - 1)
                                                     for t in range(2, 8)])
            else:
                self.assertEqual(seen, [-float(t) for t in range(8)])
            self.assertEqual(float(self.c.pull(name, [7])), -8.0)

    def test_overlap_matches_sync_when_prefetch_misses(self):
        emb = et.RemoteEmbedding.create(self.c, "m", 10, 1, init="zeros",
                                        lr=1.0)
        opt = et.RemoteOptimizer(emb, overlap=True)
        for t in range(5):
            emb.prefetch(torch.tensor([1]))  # not what the forward asks
            out = emb(torch.tensor([7]))
            self.assertEqual(float(out), -float(t))  # pulled behind pushes
            opt.zero_grad()
            out.sum().backward()
            opt.step()
        opt.flush()
        self.assertEqual(float(self.c.pull("m", [7])), -5.0)
        opt.close()


class Model(torch.nn.Module):

    def __init__(self, client):
        super().__init__()
        self.users = et.RemoteEmbedding(client, "u")
        self.tags = et.RemoteEmbeddingBag(client, "g", mode="sum")
        self.mlp = torch.nn.Linear(4, 1)

    def forward(self, u, g):
        return self.mlp(self.users(u) * self.tags(g))


class StateAndFork(TorchBase):

    def test_torch_save_load_and_state_dict(self):
        self.c.create_table("u", 4, rows=100, init="normal:1")
        self.c.create_table("g", 4, rows=100, init="normal:1")
        model = Model(self.c)
        u, g = torch.tensor([1, 2]), torch.tensor([[3, 4], [5, 6]])
        want = model(u, g)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf)
        with self.assertRaises(RuntimeError) as e:
            loaded(u, g)
        self.assertIn("attach", str(e.exception))
        et.attach(loaded, self.c)
        self.assertTrue(torch.equal(loaded(u, g), want))
        sd = model.state_dict()
        self.assertEqual(sd["users._extra_state"]["table"], "u")
        self.assertEqual(sd["tags._extra_state"]["spec"]["dim"], 4)
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        self.c.create_table("u2", 4, rows=100)
        other = et.RemoteEmbedding(self.c, "u2")
        other.load_state_dict({"_extra_state": torch.load(buf)[
            "users._extra_state"]})
        self.assertEqual(other.table, "u")
        self.c.create_table("narrow", 2, rows=100)
        bad = {"_extra_state": {"table": "narrow",
                                "spec": dict(other.spec, dim=4)}}
        with self.assertRaises(ValueError):
            other.load_state_dict(bad)
        with self.assertRaises(TypeError):
            torch.save(self.c, io.BytesIO())

    def test_client_after_fork_fails_clearly(self):
        self.c.create_table("f", 2, rows=10)
        self.c.push("f", [1], [[1.0, 1.0]])
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: must not touch the parent's connection
            code = 1
            try:
                os.close(r)
                try:
                    self.c.pull("f", [1])
                except embps.ForkError as e:
                    os.write(w, str(e).encode())
                    with embps.Client(self.server.address) as mine:
                        code = 0 if mine.pull("f", [1]).shape == (1, 2) else 3
                    self.c.close()  # releases the child's copy only
            finally:
                os._exit(code)
        os.close(w)
        msg = os.read(r, 4096).decode()
        os.close(r)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertIn("create a new Client in the child", msg)
        for _ in range(20):  # the parent's client is intact
            self.c.push("f", [1], [[1.0, 1.0]])
        self.assertTrue(np.allclose(self.c.pull("f", [1]), -0.21))


if __name__ == "__main__":
    unittest.main()
