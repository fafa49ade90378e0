"""The training-loop idioms of issue 20, one test each, against a real
server and local PyTorch (nn.Embedding(sparse=True) and torch.optim):

1. model.zero_grad() clears the tables' gradients: 3 SGD steps through the
   model's zero_grad equal local's.
2. the dense export, loaded with nn.Embedding.from_pretrained with no
   server, predicts exactly what the remote model predicts (held-out ids,
   never-pushed rows included; max abs difference 0), and so does
   to_local().
3. requires_grad_(False) freezes a table (unchanged, never pushed); a
   table no RemoteOptimizer manages keeps one step of gradient at most
   over 200 steps.
4. copy.deepcopy and AveragedModel refuse with the alternatives named;
   copy_table() is an independent copy; a local nn.Embedding checkpoint
   loads into the remote model; loading a state dict of a table that moved
   on warns.
5. model.double() / .half() / .to(dtype) cast the outputs; a double model
   trains as local's does.
6. clip_grad_norm_ over model.parameters() includes the tables: the
   coefficient equals local's within 1e-6; embps.torch.clip_grad_norm_
   also scales the tables' gradients; GradScaler unscales them and skips
   the push on an inf.
7. from_pretrained, max_norm, scale_grad_by_freq, negative padding_idx,
   sparse=True, torch's attribute names and exception types, double
   per_sample_weights, RemoteEmbedding(10, 4), prefetch counters and the
   2-D bag prefetch hit, torch.jit.
"""
import copy
import gc
import io
import os
import shutil
import subprocess
import tempfile
import unittest
import warnings
from unittest import mock

import numpy as np
import torch
import torch.nn as nn

from harness import ROOT, Server
import embps
import embps.torch as et

CLI = os.path.join(os.path.dirname(os.path.abspath(
    os.environ.get("EMBPS_SERVER_BIN", os.path.join(ROOT, "build",
                                                    "embps-server")))),
    "embps")


class Base(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server().start()
        cls.c = embps.Client(cls.server.address)
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        assert cls.server.stop() == 0

    def name(self, prefix="t"):
        type(self).n += 1
        return "%s%d" % (prefix, type(self).n)

    def table(self, name, rows):
        return torch.from_numpy(self.c.pull(name, np.arange(rows)))

    def pair(self, rows=30, dim=4, optimizer="sgd", lr=0.5, **kw):
        """A remote table and a local nn.Embedding(sparse=True) with the
        same initial rows."""
        name = self.name()
        remote = et.RemoteEmbedding.create(self.c, name, rows, dim,
                                           optimizer=optimizer, lr=lr,
                                           init="normal:1", seed=4, **kw)
        local = nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            local.weight.copy_(self.table(name, rows))
        return name, remote, local


class Model(nn.Module):
    """An embedding (remote or local) and a small MLP."""

    def __init__(self, emb, dim=4, seed=0):
        super().__init__()
        self.emb = emb
        torch.manual_seed(seed)
        self.mlp = nn.Sequential(nn.Linear(dim, 8), nn.Tanh(),
                                 nn.Linear(8, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids).sum(1)).squeeze(1)


def batch(gen, rows, n=16, width=3):
    return torch.randint(0, rows, (n, width), generator=gen)


class ZeroGradThroughTheModel(Base):
    """1. model.zero_grad() is the only zeroing in the loop."""

    def loop(self, set_to_none):
        name, remote, local = self.pair(lr=0.5)
        rm, lm = Model(remote), Model(local)
        ropt = et.RemoteOptimizer(rm)
        ldense = torch.optim.SGD(lm.mlp.parameters(), lr=0.5)
        lsparse = torch.optim.SGD([local.weight], lr=0.5)
        rdense = torch.optim.SGD(rm.mlp.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            ids = batch(gen, 30)
            for m, opts in ((rm, (ropt, rdense)), (lm, (lsparse, ldense))):
                m.zero_grad(set_to_none=set_to_none)
                (m(ids) ** 2).mean().backward()
                for o in opts:
                    o.step()
        diff = (self.table(name, 30) - local.weight.detach()).abs().max()
        self.assertLessEqual(float(diff), 1e-6)
        self.assertEqual(self.c.describe(name)["pushes"], 3)

    def test_zero_grad_zeroes(self):  # torch 1.13's default
        self.loop(set_to_none=False)

    def test_zero_grad_to_none(self):
        self.loop(set_to_none=True)

    def test_optimizer_zero_grad_of_another_optimizer_is_not_enough(self):
        # a loop that zeroes only the dense optimizer accumulates, as it
        # does with nn.Embedding(sparse=True): the same numbers as local
        name, remote, local = self.pair(lr=0.1)
        ropt = et.RemoteOptimizer(remote)
        lopt = torch.optim.SGD([local.weight], lr=0.1)
        for _ in range(3):
            for emb, o in ((remote, ropt), (local, lopt)):
                emb(torch.tensor([[1, 2, 2]])).sum().backward()
                o.step()
        diff = (self.table(name, 30) - local.weight.detach()).abs().max()
        self.assertLessEqual(float(diff), 1e-6)


class DenseExportServes(Base):
    """2. The hand-off to serving is exact, with no server."""

    def test_dense_export_predicts_like_the_remote_model(self):
        rows = 500
        name = self.name("serve")
        remote = et.RemoteEmbedding.create(self.c, name, rows, 4,
                                           optimizer="adagrad", lr=0.3,
                                           init="normal:1", seed=9)
        model = Model(remote)
        opt = et.RemoteOptimizer(model)
        dense = torch.optim.Adagrad(model.mlp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(3)
        for _ in range(20):  # trains rows 0..249 only
            ids = batch(gen, rows // 2, n=32)
            model.zero_grad()
            ((model(ids) - 1) ** 2).mean().backward()
            opt.step()
            dense.step()
        self.assertLess(self.c.describe(name)["rows_allocated"], rows)
        held_out = torch.randint(0, rows, (200, 3), generator=gen)
        model.eval()
        with torch.no_grad():
            want = model(held_out)
        out = tempfile.mkdtemp(prefix="embps-serve-")
        try:
            for how in ("python", "cli"):
                d = os.path.join(out, how)
                if how == "python":
                    self.assertEqual(self.c.export(name, d, dense=True), rows)
                else:
                    subprocess.run([CLI, "--servers", self.server.address,
                                    "export", name, "--dense", "--out", d],
                                   check=True, stdout=subprocess.DEVNULL)
                self.assertEqual(sorted(os.listdir(d)),
                                 ["spec.json", "weights.npy"])
                w = np.load(os.path.join(d, "weights.npy"))
                self.assertEqual((w.shape, w.dtype), ((rows, 4), np.float32))
                served = Model(nn.Embedding.from_pretrained(
                    torch.from_numpy(w)))
                served.mlp.load_state_dict(model.mlp.state_dict())
                with torch.no_grad():
                    got = served(held_out)
                self.assertEqual(float((got - want).abs().max()), 0.0, how)
        finally:
            shutil.rmtree(out)
        local = Model(remote.to_local())
        local.mlp.load_state_dict(model.mlp.state_dict())
        self.assertIsInstance(local.emb, nn.Embedding)
        with torch.no_grad():
            self.assertEqual(float((local(held_out) - want).abs().max()), 0)

    def test_bag_to_local(self):
        name = self.name("bag")
        bag = et.RemoteEmbeddingBag.create(self.c, name, 40, 3, mode="sum",
                                           padding_idx=-1, seed=2)
        local = bag.to_local()
        self.assertIsInstance(local, nn.EmbeddingBag)
        self.assertEqual((local.mode, local.padding_idx), ("sum", 39))
        ids = torch.tensor([[1, 39, 5], [7, 7, 0]])
        self.assertTrue(torch.equal(local(ids), bag(ids)))
        with self.assertRaises(ValueError):
            et.RemoteEmbedding.create(self.c, self.name(), None, 3).to_local()


class FreezeAndUnmanaged(Base):
    """3. Frozen tables, and tables no optimizer manages."""

    def test_frozen_table_is_unchanged_and_never_pushed(self):
        name, remote, _ = self.pair()
        other = et.RemoteEmbedding.create(self.c, self.name(), 30, 4, lr=0.5)
        before = self.table(name, 30)
        model = nn.ModuleDict({"a": remote, "b": other})
        model["a"].requires_grad_(False)
        opt = et.RemoteOptimizer(model)
        for _ in range(5):
            model.zero_grad()
            ids = torch.tensor([[1, 2, 3]])
            out = model["a"](ids)
            self.assertFalse(out.requires_grad)
            (out.sum() + model["b"](ids).sum()).backward()
            self.assertIsNone(remote.weight.grad)
            opt.step()
        self.assertTrue(torch.equal(self.table(name, 30), before))
        self.assertEqual(self.c.describe(name)["pushes"], 0)
        self.assertEqual(self.c.describe(other.table)["pushes"], 5)
        # pretrained vectors are frozen by default, as in torch
        pre = et.RemoteEmbedding.from_pretrained(torch.ones(3, 4),
                                                 client=self.c,
                                                 name=self.name())
        self.assertFalse(pre.weight.requires_grad)
        self.assertFalse(pre(torch.tensor([1])).requires_grad)

    def test_unmanaged_table_keeps_one_step_over_200_steps(self):
        emb = et.RemoteEmbedding.create(self.c, self.name(), 100000, 16)
        model = Model(emb, dim=16)
        dense = torch.optim.SGD(model.mlp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(0)
        sizes = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(200):
                dense.zero_grad()  # the tables are nobody's
                model(torch.randint(0, 100000, (64, 4),
                                    generator=gen)).sum().backward()
                dense.step()
                g = emb.weight.grad
                sizes.append(g._nnz() * g.shape[1])
                if step == 5:
                    gc.collect()
                    base = sum(isinstance(o, torch.Tensor)
                               for o in gc.get_objects())
        gc.collect()
        end = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
        self.assertLessEqual(max(sizes), 64 * 4 * 16)  # one batch's rows
        self.assertLessEqual(end, base + 5)
        ours = [w for w in caught if "no RemoteOptimizer" in str(w.message)]
        self.assertEqual(len(ours), 1)  # once, naming what to do
        self.assertIn("requires_grad_(False)", str(ours[0].message))


class Copies(Base):
    """4. deepcopy, AveragedModel, copy_table, state dicts."""

    def test_deepcopy_and_averaged_model_name_the_alternatives(self):
        _, remote, _ = self.pair()
        model = Model(remote)
        for make in (lambda: copy.deepcopy(model),
                     lambda: torch.optim.swa_utils.AveragedModel(model)):
            with self.assertRaises(et.TableCopyError) as e:
                make()
            for alt in ("copy_table(", "to_local()", "same table"):
                self.assertIn(alt, str(e.exception))

    def test_copy_table_is_an_independent_copy(self):
        name, remote, _ = self.pair(optimizer="adagrad", lr=0.5)
        opt = et.RemoteOptimizer(remote)
        remote(torch.tensor([1, 2])).sum().backward()
        opt.step()
        best = remote.copy_table(self.name("best"))
        snapshot = self.table(best.table, 30)
        self.assertTrue(torch.equal(snapshot, self.table(name, 30)))
        for _ in range(3):  # training goes on; the copy stays
            opt.zero_grad()
            remote(torch.tensor([1, 3])).sum().backward()
            opt.step()
        self.assertTrue(torch.equal(self.table(best.table, 30), snapshot))
        self.assertFalse(torch.equal(self.table(name, 30), snapshot))
        # the copy holds the optimizer state too: the same push gives the
        # same rows as it gave the original
        twin = best.copy_table(self.name("twin"))
        for m in (best, twin):
            o = et.RemoteOptimizer(m)
            m(torch.tensor([1])).sum().backward()
            o.step()
        self.assertTrue(torch.equal(self.table(best.table, 30),
                                    self.table(twin.table, 30)))

    def test_local_checkpoint_loads_into_the_remote_model(self):
        name, remote, local = self.pair()
        with torch.no_grad():
            local.weight.mul_(3)
        rm, lm = Model(remote), Model(local, seed=7)
        rm.load_state_dict(lm.state_dict())
        ids = torch.tensor([[0, 5, 29]])
        self.assertTrue(torch.equal(rm(ids), lm(ids)))
        self.assertTrue(torch.equal(self.table(name, 30),
                                    local.weight.detach()))
        bad = {"emb.weight": torch.zeros(31, 4)}
        with self.assertRaises(RuntimeError):
            rm.load_state_dict(bad, strict=False)

    def test_state_dict_of_a_table_that_moved_on_warns(self):
        _, remote, _ = self.pair()
        opt = et.RemoteOptimizer(remote)
        best = copy.deepcopy(remote.state_dict())  # "keep the best model"
        remote(torch.tensor([1])).sum().backward()
        opt.step()
        with self.assertWarns(UserWarning) as w:
            remote.load_state_dict(best)
        self.assertIn("copy_table()", str(w.warning))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            remote.load_state_dict(remote.state_dict())  # same step: quiet


class Dtypes(Base):
    """5. .to(dtype), .double(), .half()."""

    def test_model_double_trains_like_local(self):
        name, remote, local = self.pair(lr=0.25)
        rm, lm = Model(remote).double(), Model(local).double()
        ropt, lopt = et.RemoteOptimizer(rm), torch.optim.SGD(
            [local.weight], lr=0.25)
        rd, ld = (torch.optim.SGD(m.mlp.parameters(), lr=0.25)
                  for m in (rm, lm))
        gen = torch.Generator().manual_seed(5)
        for _ in range(3):
            ids = batch(gen, 30)
            outs = []
            for m, opts in ((rm, (ropt, rd)), (lm, (lopt, ld))):
                m.zero_grad()
                out = m(ids)
                self.assertEqual(out.dtype, torch.float64)
                (out ** 2).mean().backward()
                outs.append(out.detach())
                for o in opts:
                    o.step()
            self.assertLessEqual(float((outs[0] - outs[1]).abs().max()), 1e-6)
        self.assertEqual(remote.weight.dtype, torch.float64)
        diff = (self.table(name, 30).double() - local.weight.detach()).abs()
        self.assertLessEqual(float(diff.max()), 1e-6)  # stored as float32

    def test_half_and_to(self):
        _, remote, _ = self.pair()
        ids = torch.tensor([3, 4])
        want = remote(ids).detach()
        self.assertEqual(remote.half()(ids).dtype, torch.float16)
        self.assertEqual(remote.to(torch.float64)(ids).dtype, torch.float64)
        self.assertTrue(torch.equal(remote.float()(ids), want))
        bag = et.RemoteEmbeddingBag.create(self.c, self.name(), 10, 4,
                                           mode="sum").double()
        self.assertEqual(bag(torch.tensor([[1, 2]])).dtype, torch.float64)
        self.assertEqual(self.c.describe(remote.table)["dtype"], "f32")


def _unscale_on_cpu(grads, found_inf, inv_scale):
    """torch._amp_foreach_non_finite_check_and_unscale_ (CUDA-only in
    torch 1.13), in Python: sets found_inf on a non-finite value, then
    multiplies every tensor by inv_scale in place."""
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        g.mul_(inv_scale)


class _CpuReplicator:
    """GradScaler's _MultiDeviceReplicator without its CUDA assertion: the
    master tensor, copied lazily to each device asked for."""

    def __init__(self, master):
        self.master = master
        self._per_device_tensors = {}

    def get(self, device):
        t = self._per_device_tensors.get(device)
        if t is None:
            t = self.master.to(device=device, copy=True)
            self._per_device_tensors[device] = t
        return t


class Clipping(Base):
    """6. clip_grad_norm_ and GradScaler."""

    def models(self):
        name, remote, local = self.pair(lr=0.5)
        return name, Model(remote), Model(local), local

    def backward(self, models, ids, scale=1.0):
        for m in models:
            m.zero_grad()
            ((m(ids) * 3) ** 2).mean().mul(scale).backward()

    def test_torch_clip_coefficient_equals_local(self):
        name, rm, lm, local = self.models()
        ids = torch.tensor([[1, 2, 2], [4, 1, 9]])
        self.backward((rm, lm), ids)
        norms = [nn.utils.clip_grad_norm_(m.parameters(), 0.5)
                 for m in (rm, lm)]
        coef = [0.5 / (float(n) + 1e-6) for n in norms]
        self.assertLess(coef[1], 0.9)  # it does clip
        self.assertLessEqual(abs(coef[0] - coef[1]), 1e-6)
        # without the tables the norm (and the dense part's clipping) differs
        dense_only = nn.utils.clip_grad_norm_(rm.mlp.parameters(), 1e9)
        self.assertGreater(float(norms[0]) - float(dense_only), 0.1)
        for p, q in zip(rm.mlp.parameters(), lm.mlp.parameters()):
            self.assertTrue(torch.allclose(p.grad, q.grad, atol=1e-6))

    def test_embps_clip_also_scales_the_tables(self):
        name, rm, lm, local = self.models()
        ids = torch.tensor([[1, 2, 2], [4, 1, 9]])
        self.backward((rm, lm), ids)
        before = rm.emb.weight.grad.coalesce()._values().clone()
        norms = [et.clip_grad_norm_(m.parameters(), 0.5) for m in (rm, lm)]
        self.assertLessEqual(abs(float(norms[0]) - float(norms[1])), 1e-5)
        coef = 0.5 / (float(norms[0]) + 1e-6)
        after = rm.emb.weight.grad.coalesce()._values()
        self.assertTrue(torch.allclose(after, before * coef, rtol=1e-6))
        et.RemoteOptimizer(rm).step()
        torch.optim.SGD([local.weight], lr=0.5).step()
        diff = (self.table(name, 30) - local.weight.detach()).abs().max()
        self.assertLessEqual(float(diff), 1e-6)

    def scaler(self):
        with mock.patch("torch.cuda.amp.grad_scaler."
                        "amp_definitely_not_available", return_value=False):
            s = torch.cuda.amp.GradScaler(init_scale=1024.0)
        s._lazy_init_scale_growth_tracker(torch.device("cpu"))
        return s

    @mock.patch("torch._amp_foreach_non_finite_check_and_unscale_",
                _unscale_on_cpu)
    @mock.patch("torch.cuda.amp.grad_scaler._MultiDeviceReplicator",
                _CpuReplicator)
    def test_grad_scaler_unscales_the_tables(self):
        """torch.cuda.amp.GradScaler's own unscale_/step logic, on CPU (its
        two CUDA-only pieces replaced by the Python above)."""
        name, rm, lm, local = self.models()
        ropt, lopt = et.RemoteOptimizer(rm), torch.optim.SGD(
            [local.weight], lr=0.5)
        ids = torch.tensor([[1, 2, 2], [4, 1, 9]])
        self.backward((rm, lm), ids, scale=1024.0)
        rs, ls = self.scaler(), self.scaler()
        rs.step(ropt)  # unscale_, inf check, step
        ls.step(lopt)
        diff = (self.table(name, 30) - local.weight.detach()).abs().max()
        self.assertLessEqual(float(diff), 1e-6)
        self.assertEqual(self.c.describe(name)["pushes"], 1)
        # an inf in the tables' gradient: the step (push) is skipped
        self.backward((rm,), ids, scale=1024.0)
        with torch.no_grad():
            rm.emb.weight.grad._values()[0, 0] = float("inf")
        rs = self.scaler()
        rs.step(ropt)
        self.assertEqual(self.c.describe(name)["pushes"], 1)


class Options(Base):
    """7. What was missing or refused without a word."""

    def test_attributes_and_constructor_errors(self):
        name, remote, _ = self.pair(rows=30)
        self.assertEqual((remote.num_embeddings, remote.embedding_dim,
                          remote.padding_idx, remote.max_norm,
                          remote.norm_type, remote.scale_grad_by_freq,
                          remote.sparse), (30, 4, None, None, 2.0, False,
                                           True))
        self.assertEqual(tuple(remote.weight.shape), (30, 4))
        self.assertEqual(sum(p.numel() for p in remote.parameters()), 120)
        with self.assertRaises(TypeError) as e:
            et.RemoteEmbedding(10, 4)
        self.assertIn("RemoteEmbedding.create(client, name, num_embeddings",
                      str(e.exception))
        with self.assertRaises(LookupError):  # TableNotFound
            et.RemoteEmbedding(self.c, "no-such-table")
        with self.assertRaises(AssertionError):  # as nn.Embedding
            et.RemoteEmbedding(self.c, name, padding_idx=30)
        with self.assertRaises(et.RemoteWeightError) as e:
            remote.weight[3]
        self.assertIn("to_local()", str(e.exception))
        remote(torch.tensor([1])).sum().backward()
        with self.assertRaises(et.RemoteWeightError):  # not torch.optim's
            torch.optim.SGD(remote.parameters(), lr=1).step()
        m = et.RemoteEmbedding(self.c, name, sparse=False)
        self.assertFalse(m.sparse)

    def test_exception_types_match_torch(self):
        _, remote, local = self.pair(rows=10)
        for emb in (remote, local):
            with self.assertRaises(IndexError):
                emb(torch.tensor([10]))
            with self.assertRaises(IndexError):
                emb(torch.tensor([-1]))
            with self.assertRaises(RuntimeError):
                emb(torch.tensor([1.0]))
        bag = et.RemoteEmbeddingBag.create(self.c, self.name(), 10, 4)
        lbag = nn.EmbeddingBag(10, 4)
        for b in (bag, lbag):
            with self.assertRaises(RuntimeError):
                b(torch.tensor([[11, 1]]))
            with self.assertRaises(ValueError):
                b(torch.tensor([[1, 2]]), torch.tensor([0]))
            with self.assertRaises(ValueError):
                b(torch.tensor([1, 2]))
        with self.assertRaises(embps.InvalidParameter):
            self.c.create_table(self.name(), 4, rows=10, lr=-1.0)
        with self.assertRaises(ValueError):  # InvalidParameter is one
            self.c.create_table(self.name(), 4, rows=10, lr=-1.0)

    def test_double_per_sample_weights_refused_like_torch(self):
        bag = et.RemoteEmbeddingBag.create(self.c, self.name(), 10, 4,
                                           mode="sum")
        lbag = nn.EmbeddingBag(10, 4, mode="sum")
        ids, offs = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
        psw = torch.rand(3, dtype=torch.float64)
        for b in (bag, lbag):
            with self.assertRaisesRegex(RuntimeError, "same type as"):
                b(ids, offs, psw)
        pulls = self.c.describe(bag.table)["pulls"]
        self.assertEqual(pulls, 0)  # refused before any pull
        out = bag.double()(ids, offs, psw)  # a double module takes them
        self.assertEqual(out.dtype, torch.float64)

    def test_from_pretrained_both_modules(self):
        w = torch.randn(6, 3)
        emb = et.RemoteEmbedding.from_pretrained(
            w, client=self.c, name=self.name(), padding_idx=-2,
            freeze=False)
        self.assertEqual(emb.padding_idx, 4)
        ids = torch.tensor([0, 4, 5])
        self.assertTrue(torch.equal(emb(ids), w[ids]))  # padding row kept
        emb(ids).sum().backward()
        self.assertEqual(emb.weight.grad.coalesce()._indices().tolist(),
                         [[0, 5]])  # no gradient for the padding row
        bag = et.RemoteEmbeddingBag.from_pretrained(
            w, client=self.c, name=self.name(), mode="max")
        local = nn.EmbeddingBag.from_pretrained(w, mode="max")
        x = torch.tensor([[0, 1], [2, 5]])
        self.assertTrue(torch.equal(bag(x), local(x)))
        # an existing table of that shape is overwritten
        again = et.RemoteEmbedding.from_pretrained(w * 2, client=self.c,
                                                   name=emb.table)
        self.assertTrue(torch.equal(again(ids), w[ids] * 2))
        with self.assertRaises(ValueError):
            et.RemoteEmbedding.from_pretrained(torch.ones(7, 3),
                                               client=self.c, name=emb.table)

    def test_max_norm_and_scale_grad_by_freq_as_torch(self):
        name, remote, local = self.pair(rows=20, dim=5, lr=0.1)
        with torch.no_grad():
            local.weight.mul_(3)
        self.c.write_rows(name, np.arange(20), local.weight.detach().numpy())
        rm = et.RemoteEmbedding(self.c, name, max_norm=1.5, norm_type=1.0,
                                scale_grad_by_freq=True)
        lm = nn.Embedding.from_pretrained(
            local.weight.detach().clone(), freeze=False, max_norm=1.5,
            norm_type=1.0, scale_grad_by_freq=True)  # (not with sparse)
        ropt = et.RemoteOptimizer(rm)
        lopt = torch.optim.SGD(lm.parameters(), lr=0.1)
        ids = torch.tensor([[2, 8, 8, 6], [2, 2, 19, 0]])
        for _ in range(2):
            outs = []
            for m, o in ((rm, ropt), (lm, lopt)):
                o.zero_grad()
                out = m(ids)
                (out * torch.arange(1.0, 6.0)).sum().backward()
                o.step()
                outs.append(out.detach())
            # equal but for the servers' rounding of the SGD steps
            self.assertLessEqual(float((outs[0] - outs[1]).abs().max()), 1e-6)
        self.assertLessEqual(float((self.table(name, 20) -
                                    lm.weight.detach()).abs().max()), 1e-6)
        with self.assertRaises(ValueError):  # state would be reset
            et.RemoteEmbedding.create(self.c, self.name(), 10, 2,
                                      optimizer="adagrad",
                                      module_args={"max_norm": 1.0})

    def test_negative_padding_idx(self):
        emb = et.RemoteEmbedding.create(self.c, self.name(), 10, 3,
                                        padding_idx=-2)
        self.assertEqual(emb.padding_idx, 8)
        self.assertEqual(self.c.describe(emb.table)["padding_id"], 8)
        self.assertTrue(torch.equal(emb(torch.tensor([8])),
                                    torch.zeros(1, 3)))
        with self.assertRaises(AssertionError):
            et.RemoteEmbedding.create(self.c, self.name(), 10, 3,
                                      padding_idx=-11)

    def test_prefetch_counters_and_2d_bag_hit(self):
        bag = et.RemoteEmbeddingBag.create(self.c, self.name(), 50, 2,
                                           mode="sum", init="zeros", lr=1.0)
        opt = et.RemoteOptimizer(bag, overlap=True)
        x = torch.tensor([[1, 2], [3, 3]])
        bag.prefetch(x)
        bag(x).sum().backward()
        self.assertEqual((bag.prefetch_hits, bag.prefetch_misses), (1, 0))
        opt.step()
        bag(torch.tensor([[4, 5]]))  # nothing prefetched
        self.assertEqual((bag.prefetch_hits, bag.prefetch_misses), (1, 1))
        flat, offs = torch.tensor([7, 8, 9]), torch.tensor([0, 1])
        bag.prefetch(flat, offs)
        bag(flat, offs)
        self.assertEqual(bag.prefetch_hits, 2)
        opt.close()

    def test_torch_jit_fails_clearly(self):
        _, remote, _ = self.pair()
        model = Model(remote)
        for f in (lambda: torch.jit.script(model),
                  lambda: torch.jit.trace(model, torch.tensor([[1, 2]]))):
            with self.assertRaises(RuntimeError) as e:
                f()
            self.assertIn("to_local()", str(e.exception))
        local = Model(remote.to_local())
        local.mlp.load_state_dict(model.mlp.state_dict())
        scripted = torch.jit.script(local)  # the way out works
        ids = torch.tensor([[1, 2]])
        self.assertTrue(torch.equal(scripted(ids), model(ids)))

    def test_ddp_ignore(self):
        import torch.distributed as dist
        store = tempfile.NamedTemporaryFile(delete=False)
        store.close()
        os.unlink(store.name)
        dist.init_process_group("gloo", init_method="file://" + store.name,
                                rank=0, world_size=1)
        try:
            name, remote, local = self.pair()
            model = Model(remote)
            ddp = nn.parallel.DistributedDataParallel(et.ddp_ignore(model))
            opt = et.RemoteOptimizer(model)
            ddp(torch.tensor([[1, 2]])).sum().backward()
            opt.step()
            self.assertEqual(self.c.describe(name)["pushes"], 1)
            self.assertIsNotNone(model.mlp[0].weight.grad)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main(verbosity=2)
