"""PyTorch's own embedding tests, ported to run against two backends: local
torch (nn.Embedding / nn.EmbeddingBag) and embps (RemoteEmbedding /
RemoteEmbeddingBag on a real server).

Where the cases come from. The CPU cases of PyTorch's
test/nn/test_embedding.py (TestEmbeddingNN and TestEmbeddingNNDeviceType;
in torch 1.13, the version Debian ships and the one installed here, the same
cases live in test/test_nn.py), rewritten here against a small backend
interface instead of PyTorch's test harness. Each case keeps the inputs and
the expectations of the original; where the original reads or writes the
weight tensor directly (weight.data, weight[i] = v, weight.grad), the case
goes through the backend (weight(), set_row(), grad()), which for embps
pulls the rows, writes them, and densifies the table's sparse gradient.
Cases of the original that test torch.nn.functional alone (no module: F.*
on a weight tensor, gradcheck, forward-mode AD on the weight, CUDA-only
cases) have no embps counterpart and are not ported. Added at the end: the
optimizer and learning-rate-scheduler cases (a module trained by
torch.optim on sparse gradients against RemoteOptimizer).

Every case runs on both backends. A case embps does not pass is listed in
EMBPS_DIFFERENCES with its reason; the README's PyTorch section lists the
same differences (a test checks that the two lists agree). The cases
torch 1.13 itself fails (bugs fixed in later versions) are listed in
TORCH_1_13_FAILS and skipped on torch.
"""
import itertools
import os
import random
import re
import unittest

import numpy as np
import torch
import torch.nn as nn

from harness import ROOT, Server
import embps
import embps.torch as et

# case -> why embps differs (also in README.md, "PyTorch")
EMBPS_DIFFERENCES = {
    "test_embedding_sparse_empty_tensor":
        "a table has at least one row and one column",
    "test_embedding_from_pretrained_integer_dtypes":
        "tables store floats: integer pretrained weights give float32 "
        "outputs",
    "test_embedding_from_pretrained_renorms_the_tensor_given":
        "from_pretrained copies the tensor into the table, so max_norm "
        "renormalises the table's rows, not the caller's tensor",
}
# case -> why torch 1.13 fails it (the case is skipped on torch: the
# first corrupts the heap)
TORCH_1_13_FAILS = {
    "test_embeddingbag_include_last_offset":
        "pytorch/pytorch#89677: include_last_offset with padding_idx reads "
        "past the offsets (heap corruption, then abort)",
    "test_embedding_bag_per_sample_weights_grad":
        "a frozen EmbeddingBag with per_sample_weights that require grad "
        "fails an INTERNAL ASSERT (isDifferentiableType)",
    "test_embedding_from_pretrained_integer_dtypes":
        "from_pretrained makes a Parameter that requires grad before "
        "freezing it, which integer tensors refuse",
}


# torch.testing's default tolerances (rtol, atol), by dtype
_TOL = {torch.float16: (1e-3, 1e-5), torch.float32: (1.3e-6, 1e-5),
        torch.float64: (1e-7, 1e-7)}


def _close(test, a, b, atol=None, msg=None):
    """a equals b to torch's default tolerance of a's dtype (the port's
    stand-in for PyTorch's TestCase.assertEqual)."""
    test.assertEqual(tuple(a.shape), tuple(b.shape), msg)
    rtol, tol = _TOL.get(a.dtype, (1e-5, 1e-5))
    test.assertTrue(torch.allclose(a.double(), b.double(), rtol=rtol,
                                   atol=tol if atol is None else atol),
                    msg or (a, b))


class TorchBackend:
    """nn.Embedding / nn.EmbeddingBag as they are."""

    name = "torch"

    def start(self):
        pass

    def stop(self):
        pass

    def embedding(self, num, dim, weight=None, **kw):
        m = nn.Embedding(num, dim, **kw)
        if weight is not None:
            with torch.no_grad():
                m.weight.copy_(weight)
        return m

    def bag(self, num, dim, weight=None, **kw):
        m = nn.EmbeddingBag(num, dim, **kw)
        if weight is not None:
            with torch.no_grad():
                m.weight.copy_(weight)
        return m

    def embedding_from_pretrained(self, w, **kw):
        return nn.Embedding.from_pretrained(w, **kw)

    def bag_from_pretrained(self, w, **kw):
        return nn.EmbeddingBag.from_pretrained(w, **kw)

    def weight(self, m):
        return m.weight.detach().clone()

    def grad(self, m):
        g = m.weight.grad
        if g is None:
            return torch.zeros(m.weight.shape, dtype=m.weight.dtype)
        return g.to_dense() if g.is_sparse else g

    def set_row(self, m, i, value):
        with torch.no_grad():
            m.weight[i] = value

    def optimizer(self, m, kind, **hyper):
        cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
               "adam": torch.optim.SparseAdam}[kind]
        return cls(m.parameters(), **hyper)


class EmbpsBackend:
    """The embps modules, each on a fresh table made by from_pretrained
    (what nn.Embedding's constructor does: the weight given, or N(0, 1)
    with the padding row zeroed), and given to a RemoteOptimizer as a
    training script does."""

    name = "embps"

    def start(self):
        self.server = Server().start()
        self.client = embps.Client(self.server.address)
        self.n = 0
        self.hyper = {}

    def stop(self):
        self.client.close()
        assert self.server.stop() == 0

    def _table(self):
        self.n += 1
        return "port%d" % self.n

    def _initial(self, num, dim, weight, kw):
        if weight is None:
            weight = torch.randn(num, dim)
            p = kw.get("padding_idx")
            if p is not None and -num <= p < num:
                weight[p] = 0
        return weight

    def _table_args(self, kw):
        opt = kw.pop("_optimizer", None)
        if opt is None:
            return {}
        kind, hyper = opt
        args = dict(optimizer=kind, lr=hyper["lr"])
        for k in ("eps", "beta1", "beta2", "initial_accumulator"):
            if k in hyper:
                args[k] = hyper[k]
        return args

    @staticmethod
    def _managed(m, dtype=None):
        """A module as training uses it: given to a RemoteOptimizer (a
        module no optimizer manages keeps one backward's gradient only)."""
        m.port_optimizer = et.RemoteOptimizer(m)
        return m.to(dtype) if dtype is not None else m

    def embedding(self, num, dim, weight=None, dtype=None, **kw):
        w = self._initial(num, dim, weight, kw)
        args = self._table_args(kw)
        return self._managed(et.RemoteEmbedding.from_pretrained(
            w, freeze=False, client=self.client, name=self._table(),
            **kw, **args), dtype)

    def bag(self, num, dim, weight=None, dtype=None, **kw):
        w = self._initial(num, dim, weight, kw)
        args = self._table_args(kw)
        return self._managed(et.RemoteEmbeddingBag.from_pretrained(
            w, freeze=False, client=self.client, name=self._table(),
            **kw, **args), dtype)

    def embedding_from_pretrained(self, w, **kw):
        return self._managed(et.RemoteEmbedding.from_pretrained(
            w, client=self.client, name=self._table(), **kw))

    def bag_from_pretrained(self, w, **kw):
        return self._managed(et.RemoteEmbeddingBag.from_pretrained(
            w, client=self.client, name=self._table(), **kw))

    def weight(self, m):
        return m.pull(torch.arange(m.num_embeddings))

    def grad(self, m):
        g = m.weight.grad
        if g is None:
            return torch.zeros(m.weight.shape, dtype=m.weight.dtype)
        return g.to_dense()

    def set_row(self, m, i, value):
        m.client.write_rows(m.table, [i], value.float().reshape(1, -1))

    def optimizer(self, m, kind, **hyper):
        return m.port_optimizer  # the table's optimizer is fixed at creation


class Port:
    """The cases; a subclass supplies self.b, the backend."""

    backend = None

    @classmethod
    def setUpClass(cls):
        cls.b = cls.backend()
        cls.b.start()

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()

    def setUp(self):
        name = self._testMethodName
        if self.b.name == "embps" and name in EMBPS_DIFFERENCES:
            self.skipTest("a listed difference: " + EMBPS_DIFFERENCES[name])
        if self.b.name == "torch" and name in TORCH_1_13_FAILS:
            self.skipTest("fails on torch 1.13: " + TORCH_1_13_FAILS[name])
        torch.manual_seed(0)
        random.seed(0)

    # ---------------------------------------------------- TestEmbeddingNN
    def test_embedding_sparse_basic(self):
        e = self.b.embedding(10, 20, sparse=True)
        x = torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]])
        e(x).sum().backward()
        self.assertTrue(e.weight.grad.is_sparse)
        self.assertEqual(e.weight.grad.shape, e.weight.shape)

    def test_embedding_sparse_empty_tensor(self):
        e = self.b.embedding(0, 0, sparse=True)
        e(torch.tensor([], dtype=torch.int64)).sum().backward()
        self.assertTrue(e.weight.grad.is_sparse)
        e = self.b.embedding(10, 0, sparse=True)
        e(torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]])).sum().backward()
        self.assertEqual(e.weight.grad.shape, e.weight.shape)

    def test_move_sparse_half_embedding(self):
        e = self.b.embedding(10, 3, sparse=True)
        self.assertEqual(e.weight.dtype, torch.float32)
        e.to(torch.float16)
        self.assertEqual(e.weight.dtype, torch.float16)
        self.assertEqual(e(torch.tensor([1, 2])).dtype, torch.float16)
        self.assertEqual((e.embedding_dim, e.num_embeddings), (3, 10))

    def test_embedding_max_norm(self):
        e = self.b.embedding(22, 5, max_norm=1.0)
        out = e(torch.tensor([2, 8, 8, 6]))
        self.assertTrue(torch.equal(out[1], out[2]))
        self.assertTrue(out.detach().norm(p=2, dim=1).le(1).all())

    def test_embedding_from_pretrained_float_dtypes(self):
        for dtype in (torch.float32, torch.float64):
            a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=dtype)
            e = self.b.embedding_from_pretrained(a)
            self.assertTrue(torch.equal(self.b.weight(e), a))
            out = e(torch.tensor([0, 1]))
            self.assertEqual(out.dtype, dtype)
            self.assertTrue(torch.equal(out, a))

    def test_embedding_from_pretrained_integer_dtypes(self):
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                      torch.int64):
            a = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype)
            out = self.b.embedding_from_pretrained(a)(torch.tensor([0, 1]))
            self.assertEqual(out.dtype, dtype)
            self.assertTrue(torch.equal(out, a))

    def test_embedding_bag_from_pretrained(self):
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        e = self.b.bag_from_pretrained(a)
        self.assertTrue(torch.equal(self.b.weight(e), a))
        x = torch.tensor([0, 1])
        self.assertTrue(torch.equal(e(x, torch.arange(x.size(0))), a))

    def test_embedding_from_pretrained_padding_idx(self):
        vec = torch.ones(3) * 7
        w = torch.rand(4, 3)
        w[2] = vec
        e = self.b.embedding_from_pretrained(w, padding_idx=2)
        self.assertTrue(torch.equal(self.b.weight(e)[2], vec))
        self.assertTrue(torch.equal(e(torch.tensor([2]))[0], vec))

    def test_embedding_bag_from_pretrained_padding_idx(self):
        w = torch.rand(4, 3)
        e = self.b.bag_from_pretrained(w, padding_idx=2)
        self.assertTrue(torch.equal(self.b.weight(e), w))

    def test_embedding_from_pretrained_options(self):
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
                         dtype=torch.float64)
        opts = {"max_norm": 2.0, "norm_type": 0.5,
                "scale_grad_by_freq": False, "sparse": True}
        e = self.b.embedding_from_pretrained(a.clone(), **opts)
        out = e(torch.tensor([0, 1]))
        w = self.b.weight(e)  # renormalised in the module
        self.assertTrue(torch.equal(out, w))
        self.assertTrue(w.ne(torch.arange(1, 7, dtype=w.dtype)
                             .view(2, 3)).all())
        self.assertTrue(out.detach().norm(p=0.5, dim=1).le(2.0).all())

    def test_embedding_from_pretrained_renorms_the_tensor_given(self):
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        e = self.b.embedding_from_pretrained(a, max_norm=2.0, norm_type=0.5)
        e(torch.tensor([0, 1]))
        self.assertTrue(a.ne(torch.arange(1.0, 7.0).view(2, 3)).all())

    def test_embedding_functional(self):
        a = torch.tensor([[1, 3, 2], [0, 2, 1]])
        w = torch.rand(4, 3)
        e = self.b.embedding(4, 3, weight=w)
        self.assertTrue(torch.equal(e(a), nn.functional.embedding(a, w)))
        e = self.b.embedding_from_pretrained(w, padding_idx=2)
        self.assertTrue(torch.equal(
            e(a), nn.functional.embedding(a, w, padding_idx=2)))

    def test_embedding_bag_functional(self):
        a = torch.tensor([[1, 3, 2], [0, 2, 1]])
        w = torch.rand(4, 3)
        e = self.b.bag(4, 3, weight=w)
        self.assertTrue(torch.equal(e(a), nn.functional.embedding_bag(a, w)))
        e = self.b.bag_from_pretrained(w, padding_idx=2)
        self.assertTrue(torch.equal(
            e(a), nn.functional.embedding_bag(a, w, padding_idx=2)))

    def test_embedding_bag_padding_idx_error(self):
        n = 4
        for p in range(-(n + 2), n + 2):
            if p < -n or p >= n:
                with self.assertRaisesRegex(AssertionError,
                                            "(?i)padding_idx must be within"):
                    self.b.bag(n, 3, padding_idx=p)
            else:
                self.b.bag(n, 3, padding_idx=p)

    def test_embeddingbag_from_pretrained(self):
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        e = self.b.bag_from_pretrained(a)
        self.assertTrue(torch.equal(self.b.weight(e), a))
        out = e(torch.tensor([[0, 1]]))
        self.assertTrue(torch.equal(out, a.mean(0, keepdim=True)))

    def test_embeddingbag_from_pretrained_options(self):
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
                         dtype=torch.float64)
        opts = {"max_norm": 2.0, "norm_type": 0.5,
                "scale_grad_by_freq": False, "mode": "max", "sparse": False}
        e = self.b.bag_from_pretrained(a.clone(), **opts)
        out = e(torch.tensor([[0, 1]]))
        w = self.b.weight(e)
        self.assertTrue(torch.equal(out, w.max(0, keepdim=True)[0]))
        self.assertTrue(w.ne(torch.arange(1, 7, dtype=w.dtype)
                             .view(2, 3)).all())
        self.assertTrue(w.norm(p=0.5, dim=1).le(2.0).all())

    def test_embeddingbag_include_last_offset(self):
        e = self.b.bag(100, 3, include_last_offset=True, padding_idx=61)
        x = torch.tensor([0, 1, 2, 3])
        w = self.b.weight(e)
        ref = torch.stack([w[0:3].mean(0), w[3]])
        self.assertTrue(torch.allclose(e(x, torch.tensor([0, 3, 3])), ref))
        self.assertTrue(torch.allclose(e(x, torch.tensor([0, 3, 4])), ref))

    # ------------------------------------------ TestEmbeddingNNDeviceType
    def test_embedding_dense_grad(self):
        # the original gradchecks F.embedding; the module's weight gradient
        # of a sum is the count of each id
        e = self.b.embedding(20, 20, dtype=torch.float64)
        x = torch.tensor([[0, 1, 1, 2], [3, 5, 7, 11]])
        e(x).sum().backward()
        want = torch.zeros(20, 20, dtype=torch.float64)
        for i in x.reshape(-1).tolist():
            want[i] += 1
        self.assertTrue(torch.equal(self.b.grad(e), want))

    def test_embedding_backward(self):
        e = self.b.embedding(10, 3, sparse=True, dtype=torch.float64)
        t = torch.tensor([[7, 1, 3]])
        ones = torch.ones(3, 3, dtype=torch.float64)

        def grad_of(pairs):
            want = torch.zeros(10, 3, dtype=torch.float64)
            for ids in pairs:
                for i in ids:
                    want[i] += 1
            return want
        e.zero_grad()
        e(t[0]).sum().backward()
        self.assertTrue(torch.equal(self.b.grad(e), grad_of([[7, 1, 3]])))
        g = e.weight.grad.coalesce()
        self.assertEqual(g._indices().tolist(), [[1, 3, 7]])
        self.assertTrue(torch.equal(g._values(), ones))
        e.zero_grad()
        e(t[0]).sum().backward()
        e(t[0]).sum().backward()
        self.assertTrue(torch.equal(self.b.grad(e),
                                    grad_of([[7, 1, 3], [7, 1, 3]])))
        e.zero_grad()
        e(t[0]).sum().backward()
        t[0, 0] = 8
        e(t[0]).sum().backward()
        self.assertTrue(torch.equal(self.b.grad(e),
                                    grad_of([[7, 1, 3], [8, 1, 3]])))

    def test_embedding_max_norm_backward(self):
        w = torch.randn(4, 4) * 2
        e = self.b.embedding(4, 4, weight=w, max_norm=1.0)
        e(torch.tensor([0, 1, 2, 2])).sum().backward()
        want = torch.tensor([[1.0, 1.0, 2.0, 0.0]]).t().expand(4, 4)
        self.assertTrue(torch.equal(self.b.grad(e), want))

    def test_embedding_padding_idx(self):
        for sparse in (False, True):
            e = self.b.embedding(10, 20, padding_idx=0, sparse=sparse)
            out = e(torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]]))
            self.assertEqual(float(out[0][0].sum()), 0)
            self.assertEqual(float(out[1][2].sum()), 0)
            # negative: padding_idx=-2 of 10 pads id 8
            e = self.b.embedding(10, 20, padding_idx=-2, sparse=sparse)
            out = e(torch.tensor([[0, 2, 8, 5], [4, 8, 0, 9]]))
            self.assertEqual(float(out[0][2].sum()), 0)
            self.assertEqual(float(out[1][1].sum()), 0)
        # a padding vector changed by hand
        vec = torch.ones(20)
        e = self.b.embedding(10, 20, padding_idx=2, sparse=True)
        self.b.set_row(e, 2, vec)
        self.assertTrue(torch.equal(e(torch.tensor([0, 2]))[1], vec))
        for bad in (25, -25):
            with self.assertRaises(AssertionError):
                self.b.embedding(10, 20, padding_idx=bad)
        e = self.b.embedding(5, 2, padding_idx=0)
        for n in (1, 2, 1000):
            for others in ([], [1, 3], [2]):
                ids = torch.tensor(others + [0] * n)
                pre = self.b.weight(e)[0].clone()
                e(ids).sum().backward()
                after = (self.b.weight(e) + self.b.grad(e))[0]
                e.zero_grad()
                self.assertTrue(torch.equal(after, pre))
                # double backward
                s = e(ids).sum()
                g = torch.autograd.grad(outputs=s, inputs=list(
                    e.parameters()), retain_graph=True)
                (g[0].coalesce()._values().sum() if g[0].is_sparse
                 else g[0].sum()).add(s).backward()
                after = (self.b.weight(e) + self.b.grad(e))[0]
                e.zero_grad()
                self.assertTrue(torch.equal(after, pre))

    def test_embedding_bag_1D_padding_idx(self):
        num_features, max_per_bag, num_bags, num_words = 3, 10, 10, 100

        def gen_1d(include_last, allpad):
            idx, offs, cur = [], [], 0
            empty = random.randint(0, num_bags - 1)
            full = empty
            while full == empty:
                full = random.randint(0, num_bags - 1)
            for bag in range(num_bags):
                offs.append(cur)
                size = (max_per_bag if bag == full else 0 if bag == empty
                        else random.randint(1, max_per_bag - 1))
                idx += [1 if allpad else random.randint(0, num_words - 1)
                        for _ in range(size)]
                cur += size
            idx = torch.tensor(idx)
            if include_last:
                offs.append(idx.size(0))
            return idx, torch.tensor(offs)

        def to_2d(idx, offs, include_last, pad):
            if include_last:
                offs = offs[:-1]
            out = torch.empty(num_bags, max_per_bag, dtype=torch.long)
            for bag in range(num_bags):
                lo = int(offs[bag])
                hi = len(idx) if bag + 1 == num_bags else int(offs[bag + 1])
                row = [int(idx[lo + k]) if lo + k < hi else pad
                       for k in range(max_per_bag)]
                out[bag] = torch.tensor(row)
            return out

        for dtype in (torch.float32, torch.float64):
            for mode, sparse, last, allpad in itertools.product(
                    ("max", "mean", "sum"), (False, True), (False, True),
                    (False, True)):
                if mode == "max" and sparse:
                    continue
                idx, offs = gen_1d(last, allpad)
                for pad1 in sorted(set(idx.tolist()))[:3] + [None]:
                    pad2 = pad1 if pad1 is not None else num_words
                    words = num_words if pad1 is not None else num_words + 1
                    idx2 = to_2d(idx, offs, last, pad2)
                    w = torch.randn(words, num_features)
                    a = self.b.bag(words, num_features, weight=w, mode=mode,
                                   sparse=sparse, include_last_offset=last,
                                   padding_idx=pad1, dtype=dtype)
                    c = self.b.bag(words, num_features, weight=w, mode=mode,
                                   sparse=sparse, padding_idx=pad2,
                                   dtype=dtype)
                    msg = (dtype, mode, sparse, last, allpad, pad1)
                    out1, out2 = a(idx, offs), c(idx2)
                    _close(self, out1, out2, msg=msg)
                    out1.sum().backward()
                    out2.sum().backward()
                    _close(self, self.b.grad(a), self.b.grad(c), msg=msg)

    def test_embedding_bag_2D_padding_idx(self):
        def reference(ids, w, mode, pad):
            emb = nn.functional.embedding(ids, w, padding_idx=pad)
            if mode in ("sum", "mean"):
                keep = ids.ne(pad).to(w.dtype).unsqueeze(-1)
                res = emb.mul(keep).sum(dim=ids.dim() - 1)
                if mode == "mean":
                    res = res.div(keep.sum(dim=ids.dim() - 1))
            else:
                res = emb.masked_fill(ids.unsqueeze(-1) == pad,
                                      -float("inf")).amax(dim=ids.dim() - 1)
            if mode in ("mean", "max"):
                res = res.masked_fill(ids.eq(pad).all(dim=-1).unsqueeze(-1),
                                      0)
            return res

        for dtype in (torch.float32, torch.float64):
            for mode, sparse, allpad, dim0 in itertools.product(
                    ("max", "mean", "sum"), (False, True), (False, True),
                    (1, 10)):
                if mode == "max" and sparse:
                    continue
                if allpad:
                    ids = torch.ones(dim0, 10, dtype=torch.long)
                else:
                    ids = torch.randint(0, 10, (dim0, 10))
                    if dim0 > 1:
                        r = random.randint(0, dim0 - 1)
                        ids[r] = ids[r][0]
                for pad in sorted(set(ids.flatten().tolist()))[:3]:
                    w = torch.randn(10, 3).to(dtype)
                    wc = w.clone().requires_grad_()
                    m = self.b.bag(10, 3, weight=w, mode=mode, sparse=sparse,
                                   padding_idx=pad, dtype=dtype)
                    msg = (dtype, mode, sparse, allpad, dim0, pad)
                    out, want = m(ids), reference(ids, wc, mode, pad)
                    _close(self, out, want, msg=msg)
                    want.sum().backward()
                    out.sum().backward()
                    _close(self, self.b.grad(m), wc.grad, msg=msg)

    def test_embedding_bag_empty_input(self):
        for sparse in (True, False):
            e = self.b.bag(4, 3, sparse=sparse)
            x = torch.tensor([], dtype=torch.long)
            for offs in ([0], [0, 0]):
                out = e(x, torch.tensor(offs))
                self.assertTrue(torch.equal(out, torch.zeros_like(out)))

    def test_embedding_bag_out_of_bounds_idx(self):
        for mode in ("sum", "mean", "max"):
            e = self.b.bag(10, 2, mode=mode, padding_idx=0)
            for ids in (torch.tensor([[-1, 1]]), torch.tensor([[11, 8]])):
                psws = (None, torch.randn(1, 2)) if mode == "sum" else (None,)
                for psw in psws:
                    with self.assertRaises(RuntimeError):
                        e(ids, per_sample_weights=psw)

    def test_embedding_bag_dimension_errors(self):
        e = self.b.bag(2, 6)
        with self.assertRaisesRegex(ValueError, "1D or 2D"):
            e(torch.full((2, 0, 0, 6, 6), 1, dtype=torch.long),
              torch.zeros(2, 0, 0, 6, 6, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, "offsets has to be a 1D"):
            e(torch.tensor([1, 1]), torch.zeros(2, 0, 0, 6, 6,
                                                dtype=torch.long))

    def test_EmbeddingBag_per_sample_weights_failures(self):
        for dt in (torch.int32, torch.int64):
            es = self.b.bag(5, 2, mode="sum")
            x = torch.tensor([3, 1, 1, 1, 4, 0], dtype=dt)
            offs = torch.tensor([0, 0, 3, 3, 6], dtype=dt)
            with self.assertRaisesRegex(RuntimeError, "same type as"):
                es(x, offs, torch.randn(6, dtype=torch.double))
            with self.assertRaisesRegex(ValueError, "same shape as the input"):
                es(x, offs, torch.randn(5))
            with self.assertRaisesRegex(ValueError, "same shape as the input"):
                es(torch.randint(5, (7, 3), dtype=dt), None,
                   torch.randn(7 * 3))
            for mode in ("max", "mean"):
                es = self.b.bag(5, 2, mode=mode)
                with self.assertRaisesRegex(NotImplementedError,
                                            "only supported for mode='sum'"):
                    es(torch.randint(5, (7, 3), dtype=dt), None,
                       torch.randn(7, 3))

    def _reference_bag(self, x, w, offs, mode="sum", psw=None, last=False):
        if psw is None:
            psw = torch.ones(x.size(), dtype=w.dtype)
        rows = w.index_select(0, x.long()) * psw.unsqueeze(1)
        bounds = offs.tolist() if last else offs.tolist() + [len(x)]
        bags = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = rows.narrow(0, lo, hi - lo)
            if hi == lo:
                bags.append(torch.zeros(w.size(1), dtype=w.dtype))
            elif mode == "sum":
                bags.append(part.sum(0))
            elif mode == "mean":
                bags.append(part.sum(0).div(hi - lo))
            else:
                bags.append(part.max(0)[0])
        return torch.stack(bags)

    def test_EmbeddingBag_empty_per_sample_weights_and_offsets(self):
        for dtype in (torch.float32, torch.float64):
            for trainable in (True, False):
                es = self.b.bag(5, 2, mode="sum", dtype=dtype,
                                weight=torch.arange(1.0, 11.0).view(5, 2))
                x = torch.tensor([], dtype=torch.long)
                offs = torch.tensor([0, 0, 0, 0, 0])
                psw = torch.randn(0, dtype=dtype).requires_grad_(trainable)
                out = es(x, offs, psw)
                self.assertTrue(torch.equal(out, torch.zeros(5, 2,
                                                             dtype=dtype)))
                if out.requires_grad:
                    out.backward(torch.randn_like(out))
                self.assertTrue(torch.equal(self.b.grad(es), torch.zeros(
                    5, 2, dtype=dtype)))

    def test_EmbeddingBag_per_sample_weights_and_offsets(self):
        self._per_sample_weights_cases(((True, "sum"),), (False,))

    def test_EmbeddingBag_per_sample_weights_and_new_offsets(self):
        self._per_sample_weights_cases(
            ((True, "sum"), (False, "sum"), (False, "max"), (False, "mean")),
            (True, False))

    def _per_sample_weights_cases(self, modes, lasts):
        w0 = torch.arange(1.0, 11.0).view(5, 2)
        for dtype in (torch.float32, torch.float64):
            for (has_w, mode), trainable, last in itertools.product(
                    modes, (True, False), lasts):
                es = self.b.bag(5, 2, weight=w0, mode=mode, dtype=dtype,
                                include_last_offset=last)
                x = torch.tensor([3, 1, 1, 1, 4, 0])
                offs = torch.tensor([0, 0, 3, 3, 6] + ([6] if last else []))
                psw = ref_psw = None
                if has_w:
                    psw = torch.randn(6, dtype=dtype).requires_grad_(
                        trainable)
                    ref_psw = psw.detach().clone().requires_grad_(trainable)
                ref_w = w0.to(dtype).clone().requires_grad_()
                want = self._reference_bag(x, ref_w, offs, mode, ref_psw,
                                           last)
                out = es(x, offs, psw)
                msg = (dtype, has_w, mode, trainable, last)
                _close(self, out, want, msg=msg)
                g = torch.randn_like(want)
                out.backward(g)
                want.backward(g)
                _close(self, self.b.grad(es), ref_w.grad, msg=msg)
                if has_w and trainable:
                    _close(self, psw.grad, ref_psw.grad, msg=msg)

    def _bag_vs_embedding(self, N, D, B, L, max_norm=None, mode="mean",
                          psw=False, trainable=False, sparse=False,
                          dtype=torch.float32, backward=True):
        w = torch.randn(N, D)
        es = self.b.bag(N, D, weight=w, mode=mode, sparse=sparse,
                        max_norm=max_norm, dtype=dtype)
        e = nn.Embedding(N, D, max_norm=max_norm).to(dtype)
        with torch.no_grad():
            e.weight.copy_(w)
        x = torch.randint(N, (B, L))
        offs = torch.arange(0, B).mul_(L)
        g = torch.rand(B, D, dtype=dtype)
        if psw:
            p = torch.randn(B, L, dtype=dtype).softmax(dim=-1)
            p_ref = p.clone().requires_grad_(trainable)
            p.requires_grad_(trainable)
            out = es(x.view(-1), offs, p.view(-1))
            ref = (e(x) * p_ref.unsqueeze(-1)).sum(1)
        else:
            out = es(x.view(-1), offs)
            ref = {"sum": lambda t: t.sum(1), "mean": lambda t: t.mean(1),
                   "max": lambda t: t.max(1)[0]}[mode](e(x))
        msg = (N, D, B, L, max_norm, mode, psw, sparse, dtype)
        _close(self, out, ref, atol=1e-5, msg=msg)
        if not backward:
            return
        out.backward(g)
        ref.backward(g)
        _close(self, self.b.grad(es), e.weight.grad, atol=5e-5, msg=msg)
        if psw and trainable:
            _close(self, p.grad, p_ref.grad, atol=1e-5, msg=msg)

    def test_EmbeddingBag_per_sample_weights_and_no_offsets(self):
        for dtype in (torch.float32, torch.float64):
            for sparse, trainable in itertools.product((True, False),
                                                       (True, False)):
                kw = dict(psw=True, mode="sum", sparse=sparse,
                          trainable=trainable, dtype=dtype)
                for shape in ((2, 3, 5, 7), (2, 5, 53, 23), (101, 5, 3, 7),
                              (2, 101, 3, 7)):
                    self._bag_vs_embedding(*shape, **kw)

    def _known_bag(self, mode, sparse, dtype=torch.float64,
                   backward=True):
        es = self.b.bag(5, 2, weight=torch.arange(1.0, 11.0).view(5, 2),
                        mode=mode, sparse=sparse, dtype=dtype)
        x = torch.tensor([3, 1, 1, 1, 4, 0])
        offs = torch.tensor([0, 0, 3, 3, 6])
        g_empty = torch.tensor([99, 99, 1, 2, 99, 99, 3, 4, 99, 99],
                               dtype=dtype).view(5, 2)
        g = torch.tensor([1, 2, 3, 4], dtype=dtype).view(2, 2)
        if mode in ("sum", "mean"):
            d = 1 if mode == "sum" else 3
            want = torch.tensor([[13, 16], [13, 16]], dtype=dtype) / d
            want_empty = torch.tensor([[0, 0], [13, 16], [0, 0], [13, 16],
                                       [0, 0]], dtype=dtype) / d
            want_grad = torch.tensor([[3, 4], [5, 8], [0, 0], [1, 2],
                                      [3, 4]], dtype=dtype) / d
        else:
            want = torch.tensor([[7, 8], [9, 10]], dtype=dtype)
            want_empty = torch.tensor([[0, 0], [7, 8], [0, 0], [9, 10],
                                       [0, 0]], dtype=dtype)
            want_grad = torch.tensor([[0, 0], [0, 0], [0, 0], [1, 2],
                                      [3, 4]], dtype=dtype)
        out = es(x, offs)
        out.backward(g_empty)
        self.assertTrue(torch.equal(out, want_empty))
        _close(self, self.b.grad(es), want_grad)
        es.zero_grad()
        out = es(x.view(2, -1))
        out.backward(g)
        self.assertTrue(torch.equal(out, want))
        _close(self, self.b.grad(es), want_grad)
        es.zero_grad()
        es(torch.tensor([], dtype=torch.long),
           torch.tensor([0, 0, 0, 0])).sum().backward()
        self.assertTrue(torch.equal(self.b.grad(es),
                                    torch.zeros(5, 2, dtype=dtype)))
        N, D, B, L = (random.randint(1, 100), random.randint(1, 100),
                      random.randint(1, 50), random.randint(1, 50))
        kw = dict(mode=mode, sparse=sparse, dtype=dtype, backward=backward)
        self._bag_vs_embedding(N, D, B, L, **kw)
        for max_norm in (None, 3):
            for p in itertools.product((1, 2), repeat=4):
                self._bag_vs_embedding(*p, max_norm=max_norm, **kw)
        es = self.b.bag(10, 20, mode=mode, sparse=sparse)
        x = torch.ones(3, 4, dtype=torch.long)
        off = torch.arange(0, 3)
        self.assertRaises(ValueError, lambda: es(x, off))
        self.assertRaises(ValueError, lambda: es(x.view(-1)))
        off[0] = 1
        self.assertRaises(RuntimeError, lambda: es(x.view(-1), off))
        off[0] = 0
        off[-1] = 100
        self.assertRaises(RuntimeError, lambda: es(x.view(-1), off))

    def test_embedding_bag_device(self):
        for mode in ("sum", "mean", "max"):
            self._known_bag(mode, False)
        for mode in ("sum", "mean"):
            self._known_bag(mode, True)

    def test_embedding_bag_non_contiguous_input(self):
        # the original checks a non-contiguous weight; here the ids
        w = torch.randn(3, 4)
        e = self.b.bag(3, 4, weight=w, mode="sum")
        x = torch.tensor([[0, 9], [1, 9], [2, 9]]).t()[0]  # strided
        self.assertFalse(x.is_contiguous())
        _close(self, e(x, torch.tensor([0, 2])),
               e(x.contiguous(), torch.tensor([0, 2])))

    def test_embedding_bag_half(self):
        es = self.b.bag(5, 2, weight=torch.arange(1.0, 11.0).view(5, 2),
                        mode="sum", dtype=torch.float16)
        out = es(torch.tensor([3, 1, 1, 1, 4, 0]),
                 torch.tensor([0, 0, 3, 3, 6]))
        self.assertEqual(out.dtype, torch.float16)
        self.assertTrue(torch.equal(out.float(), torch.tensor(
            [[0, 0], [13, 16], [0, 0], [13, 16], [0, 0]]).float()))

    def test_embedding_bag_per_sample_weights_grad(self):
        for bag_grad, psw_grad in itertools.product((True, False), repeat=2):
            bag = self.b.bag(256, 256, mode="sum")
            bag.requires_grad_(bag_grad)
            x = torch.arange(1, 5).expand(3, -1)
            w = torch.rand(3, 4, requires_grad=psw_grad)
            out = bag(x, per_sample_weights=nn.functional.softmax(w, dim=-1))
            self.assertEqual(out.requires_grad, bag_grad or psw_grad)

    # ------------------------------------ optimizers and schedulers (added)
    def _train(self, kind, hyper, make_sched=None, steps=12, bag=False):
        rows, dim = 30, 4
        w = torch.randn(rows, dim) * 0.5
        kw = dict(weight=w, sparse=True)
        if self.b.name == "embps":
            kw["_optimizer"] = (kind, hyper)
        m = (self.b.bag(rows, dim, mode="sum", **kw) if bag
             else self.b.embedding(rows, dim, **kw))
        opt = self.b.optimizer(m, kind, **hyper)
        sched = make_sched(opt) if make_sched else None
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            ids = torch.randint(0, rows // 2, (6, 5), generator=gen)
            target = torch.randn(6, 5, dim, generator=gen)
            opt.zero_grad()
            if bag:
                ((m(ids) - target.sum(1)) ** 2).sum().backward()
            else:
                ((m(ids) - target) ** 2).sum().backward()
            opt.step()
            if sched:
                sched.step()
        return self.b.weight(m), w

    def _same_training(self, kind, hyper, make_sched=None, bag=False):
        """The same training through torch on a torch backend, and on the
        embps one, against a local run of torch: equal to 1e-5."""
        torch.manual_seed(3)
        got, w0 = self._train(kind, hyper, make_sched, bag=bag)
        torch.manual_seed(3)
        local = TorchBackend()
        m = (local.bag(30, 4, weight=w0, mode="sum", sparse=True) if bag
             else local.embedding(30, 4, weight=w0, sparse=True))
        opt = local.optimizer(m, kind, **hyper)
        sched = make_sched(opt) if make_sched else None
        gen = torch.Generator().manual_seed(1)
        for _ in range(12):
            ids = torch.randint(0, 15, (6, 5), generator=gen)
            target = torch.randn(6, 5, 4, generator=gen)
            opt.zero_grad()
            if bag:
                ((m(ids) - target.sum(1)) ** 2).sum().backward()
            else:
                ((m(ids) - target) ** 2).sum().backward()
            opt.step()
            if sched:
                sched.step()
        _close(self, got, m.weight.detach(), atol=1e-5)
        self.assertFalse(torch.equal(got, w0))

    def test_optim_sgd(self):
        self._same_training("sgd", {"lr": 0.05})

    def test_optim_adagrad(self):
        self._same_training("adagrad", {"lr": 0.1, "eps": 1e-10})

    def test_optim_sparse_adam(self):
        self._same_training("adam", {"lr": 0.05, "eps": 1e-8})

    def test_optim_bag_adagrad(self):
        self._same_training("adagrad", {"lr": 0.1, "eps": 1e-10}, bag=True)

    def test_scheduler_step_lr(self):
        self._same_training("sgd", {"lr": 0.05}, lambda o: torch.optim.
                            lr_scheduler.StepLR(o, step_size=3, gamma=0.5))

    def test_scheduler_lambda_lr_adam(self):
        self._same_training("adam", {"lr": 0.05, "eps": 1e-8},
                            lambda o: torch.optim.lr_scheduler.LambdaLR(
                                o, lambda s: 0.9 ** s))


class OnTorch(Port, unittest.TestCase):
    backend = TorchBackend


class OnEmbps(Port, unittest.TestCase):
    backend = EmbpsBackend


class DifferencesDocumented(unittest.TestCase):
    """Every difference listed here is in the README's table, and names a
    case that exists."""

    def test_readme_lists_every_difference(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        for case in EMBPS_DIFFERENCES:
            self.assertTrue(hasattr(Port, case), case)
            self.assertTrue("`%s`" % case in readme,
                            "README.md does not list %s" % case)
        listed = set(re.findall(r"`(test_\w+)`", readme))
        port_cases = {n for n in dir(Port) if n.startswith("test_")}
        self.assertEqual(listed & port_cases, set(EMBPS_DIFFERENCES))


if __name__ == "__main__":
    unittest.main(verbosity=2)
