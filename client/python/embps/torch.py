"""PyTorch modules over embps tables: RemoteEmbedding (nn.Embedding) and
RemoteEmbeddingBag (nn.EmbeddingBag) whose weights live on the servers, and
RemoteOptimizer, which pushes their gradients in a normal training loop.

    emb = RemoteEmbedding.create(client, "users", 100000, 16,
                                 optimizer="adagrad", lr=0.1)
    opt = RemoteOptimizer(model)        # every Remote* module in model
    for ids, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(ids), y)
        loss.backward()
        opt.step()                      # one push per table

How it works. A forward pulls the distinct ids of its batch once and
expands them locally, so autograd sums the gradient of repeated ids into
one row per distinct id. That gradient is not kept with the rows: an
autograd function hands it, at backward time, to the module, which keeps
only (ids, gradient) pairs until step(). step() concatenates every pair of
every module on a table since zero_grad() and sends one push per table; the
server sums duplicates and applies one optimizer step, as
torch.optim.Adagrad would after nn.Embedding(sparse=True) was used several
times. Forwards with autograd off (torch.no_grad(), inference_mode) or in
eval() mode record nothing and return rows that do not require grad.

Overlap (RemoteOptimizer(..., overlap=True)): every pull and push of the
managed modules runs, in order, on one background thread per optimizer;
step() queues its pushes and returns, and module.prefetch(next_ids) queues
the pull of the next batch's rows, so both travel while the current step
computes. Staleness is at most one step: step() first waits for the
previous step's pushes, and a pull is queued behind every push sent before
it, so the rows of batch t+1 prefetched during step t hold every update up
to step t-1 and may miss only step t's. Push errors surface at the next
step() or flush().

Ids may be on any device (CUDA included): they go to the CPU for the wire
and the output comes back on the ids' device. state_dict() holds the
table's name and spec (not rows, which stay on the servers); pickling a
module (torch.save(model)) drops its Client, and attach(model, client)
gives the loaded modules one again.
"""
import concurrent.futures

import numpy as np
import torch
import torch.nn.functional as F

import embps

__all__ = ["RemoteEmbedding", "RemoteEmbeddingBag", "RemoteOptimizer",
           "attach", "remote_modules", "sparse_grad_to_slices",
           "push_sparse_grad"]

_COUNTERS = ("rows_allocated", "bytes_used", "pushes", "pulls",
             "step") + embps._DYN_COUNTERS


def sparse_grad_to_slices(grad):
    """(indices, values) numpy arrays of a sparse gradient of an embedding
    weight (torch.sparse_coo_tensor), coalesced: duplicates summed."""
    g = grad.coalesce()
    return (g.indices()[0].cpu().numpy().astype(np.int64),
            g.values().detach().cpu().numpy().astype(np.float32))


def push_sparse_grad(client, table, grad, **kw):
    """Pushes the sparse gradient of an nn.Embedding(sparse=True) weight."""
    idx, vals = sparse_grad_to_slices(grad)
    client.push(table, idx, vals, **kw)


class _Pulled(torch.autograd.Function):
    """Identity on the pulled rows whose backward hands the rows' gradient
    to a module (sink) instead of keeping it: the graph holds the ids only
    as long as the caller holds the output."""

    @staticmethod
    def forward(ctx, anchor, rows, uniq, sink):
        ctx.uniq, ctx.sink = uniq, sink
        return rows

    @staticmethod
    def backward(ctx, grad):
        ctx.sink._grads.append((ctx.uniq, grad.detach().to("cpu",
                                                           torch.float32)))
        return None, None, None, None


def _cpu_ids(ids):
    """(int64 contiguous CPU tensor, the device the output goes to)."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(np.asarray(ids))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError("ids must be integers, not %s" % ids.dtype)
    return ids.detach().to("cpu", torch.int64).contiguous(), ids.device


class _RemoteTable(torch.nn.Module):
    """What RemoteEmbedding and RemoteEmbeddingBag share: the table, the
    gradients received since zero_grad(), prefetches and the I/O thread."""

    def __init__(self, client, table):
        super().__init__()
        self.client, self.table = client, table
        self.spec = self._describe()
        self.dim = self.spec["dim"]
        self._grads, self._io, self._prefetched = [], None, []

    @classmethod
    def create(cls, client, name, num_embeddings, embedding_dim,
               padding_idx=None, optimizer="sgd", init="normal:1",
               exist_ok=True, module_args=None, **table_args):
        """Creates the table (nn.Embedding's defaults: init N(0, 1), no
        padding; num_embeddings=None makes a dynamic table of any int64 id)
        unless it exists with the same spec (exist_ok; a different spec
        raises EmbpsError naming the differences), then returns a module on
        it. table_args go to Client.create_table (lr, seed, dtype, ...)."""
        client.create_table(name, embedding_dim, rows=num_embeddings,
                            dynamic=num_embeddings is None,
                            optimizer=optimizer, init=init,
                            padding_id=padding_idx, exist_ok=exist_ok,
                            **table_args)
        return cls(client, name, **(module_args or {}))

    def _describe(self):
        d = self.client.describe(self.table)
        return {k: v for k, v in d.items() if k not in _COUNTERS}

    @property
    def padding_id(self):
        return self.spec["padding_id"] if self.spec["has_padding"] else None

    def extra_repr(self):
        return "table=%r, dim=%d, optimizer=%s" % (
            self.table, self.dim, self.spec["optimizer"])

    # ---- pickling and state dicts: the table's name and spec, no client
    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(client=None, _grads=[], _io=None, _prefetched=[])
        return state

    def get_extra_state(self):
        return {"table": self.table, "spec": dict(self.spec)}

    def set_extra_state(self, state):
        """Points the module at the saved table; with a client attached, the
        table must exist with the saved dim."""
        self.table, self.spec = state["table"], dict(state["spec"])
        self.dim = self.spec["dim"]
        if self.client is not None:
            self._check_table()

    def _check_table(self):
        have = self._describe()
        if have["dim"] != self.dim:
            raise ValueError("table %r has dim %d on the servers, not %d"
                             % (self.table, have["dim"], self.dim))

    def attach(self, client):
        """Gives a module (loaded by torch.load, or made in another process)
        a client; checks that its table exists with its dim."""
        self.client = client
        self._check_table()
        return self

    # ---- pulls
    def _pull_now(self, uniq):
        if self.client is None:
            raise RuntimeError("%s on table %r has no client (it was "
                               "unpickled): call attach(client)"
                               % (type(self).__name__, self.table))
        if uniq.numel() == 0:
            return np.empty((0, self.dim), np.float32)
        return self.client.pull(self.table, uniq.numpy())

    def _pull_job(self, uniq):
        if self._io is not None:
            return self._io.submit(self._pull_now, uniq)
        return None

    def prefetch(self, ids):
        """Queues the pull of ids's rows for a later forward on equal ids
        (RemoteOptimizer(..., overlap=True) only; otherwise nothing happens
        and that forward pulls as usual). The two latest prefetches are
        kept; a forward takes the first that matches its ids."""
        if self._io is None:
            return
        ids, _ = _cpu_ids(ids)
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        self._prefetched = self._prefetched[-1:] + [
            (ids, uniq, inverse, self._pull_job(uniq))]

    def _take_prefetch(self, ids):
        for i, hit in enumerate(self._prefetched):
            if hit[0].shape == ids.shape and torch.equal(hit[0], ids):
                del self._prefetched[i]
                return hit
        return None

    def _rows(self, ids):
        """(uniq, inverse into uniq over ids.reshape(-1), rows of uniq as a
        tensor wired to hand its gradient to this module when recording)."""
        hit = self._take_prefetch(ids)
        if hit is not None:
            _, uniq, inverse, job = hit
            rows = job.result()
        else:
            uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
            job = self._pull_job(uniq)
            rows = job.result() if job is not None else self._pull_now(uniq)
        rows = torch.from_numpy(rows)
        if self.training and torch.is_grad_enabled():
            anchor = torch.empty(0, requires_grad=True)
            rows = _Pulled.apply(anchor, rows, uniq, self)
        return uniq, inverse, rows

    def zero_grad(self, set_to_none=True):
        self._grads = []


class RemoteEmbedding(_RemoteTable):
    """nn.Embedding whose weight is the embps table `table`: output
    ids.shape + (dim,), on the ids' device."""

    def forward(self, ids):
        ids, device = _cpu_ids(ids)
        _, inverse, rows = self._rows(ids)
        return F.embedding(inverse, rows).reshape(
            ids.shape + (self.dim,)).to(device)


class _Bag(torch.autograd.Function):
    """sum/mean/sqrtn bags through libembps's embps_bag_forward and
    embps_bag_backward, over positions into the unique rows."""

    @staticmethod
    def forward(ctx, rows, weights, inverse, offsets, combiner, pad_pos):
        pos = inverse.numpy()
        w = None if weights is None else weights.detach().numpy()
        out = embps.bag_forward(rows.detach().numpy()[pos], pos, offsets, w,
                                combiner, pad_pos)
        ctx.save_for_backward(rows, weights)
        ctx.args = (pos, offsets, w, combiner, pad_pos)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        rows, weights = ctx.saved_tensors
        pos, offsets, w, combiner, pad_pos = ctx.args
        g = grad_out.detach().contiguous().numpy()
        grad_rows = grad_w = None
        if ctx.needs_input_grad[0]:
            idx, vals = embps.bag_backward(g, pos, offsets, w, combiner,
                                           pad_pos)
            grad_rows = torch.zeros_like(rows).index_add_(
                0, torch.from_numpy(idx), torch.from_numpy(vals))
        if weights is not None and ctx.needs_input_grad[1]:
            # sum combiner: d out[b] / d w[i] = row(i), i in bag b
            bag = np.repeat(np.arange(offsets.size - 1),
                            np.diff(offsets.astype(np.int64)))
            gw = np.einsum("ij,ij->i", g[bag], rows.detach().numpy()[pos])
            if pad_pos is not None:
                gw[pos == pad_pos] = 0
            grad_w = torch.from_numpy(gw.astype(np.float32))
        return grad_rows, grad_w, None, None, None, None


class RemoteEmbeddingBag(_RemoteTable):
    """nn.EmbeddingBag whose weight is the embps table `table`.

    mode: sum, mean, max (as nn.EmbeddingBag), or sqrtn (TensorFlow's
    combiner: sum / sqrt(number of ids)). Input as nn.EmbeddingBag: a 2-D
    (bags x ids) tensor, or a 1-D tensor with offsets (the start of each
    bag; include_last_offset=True: n_bags + 1 entries ending with the
    number of ids). per_sample_weights: sum mode only, as in PyTorch. The
    table's padding id counts for nothing, like padding_idx. sum, mean and
    sqrtn run libembps's bag kernels; max runs F.embedding_bag.
    """

    def __init__(self, client, table, mode="mean", include_last_offset=False):
        super().__init__(client, table)
        if mode not in ("sum", "mean", "max", "sqrtn"):
            raise ValueError("mode must be sum|mean|max|sqrtn, not %r" % mode)
        self.mode, self.include_last_offset = mode, include_last_offset

    @classmethod
    def create(cls, client, name, num_embeddings, embedding_dim, mode="mean",
               include_last_offset=False, **kw):
        return super().create(client, name, num_embeddings, embedding_dim,
                              module_args={"mode": mode, "include_last_offset":
                                           include_last_offset}, **kw)

    def extra_repr(self):
        return super().extra_repr() + ", mode=%s" % self.mode

    def _offsets(self, ids, offsets):
        """Flat ids and C offsets (n_bags + 1 entries) as nn.EmbeddingBag
        reads its arguments."""
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets must be None for 2-D input")
            n_bags, length = ids.shape
            return ids.reshape(-1), np.arange(n_bags + 1, dtype=np.uintp) * \
                length
        if ids.dim() != 1 or offsets is None:
            raise ValueError("input must be 2-D, or 1-D with offsets")
        offs, _ = _cpu_ids(offsets)
        offs = offs.numpy()
        if offs.ndim != 1:
            raise ValueError("offsets must be 1-D")
        if not self.include_last_offset:
            offs = np.append(offs, ids.numel())
        return ids, offs.astype(np.uintp)

    def forward(self, input, offsets=None, per_sample_weights=None):
        ids, device = _cpu_ids(input)
        flat, offs = self._offsets(ids, offsets)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise NotImplementedError(
                    "per_sample_weights is only supported for mode='sum' "
                    "(as in nn.EmbeddingBag), not %r" % self.mode)
            if per_sample_weights.shape != ids.shape:
                raise ValueError("per_sample_weights must have input's shape")
            per_sample_weights = per_sample_weights.to(
                "cpu", torch.float32).reshape(-1)
        uniq, inverse, rows = self._rows(flat)
        pad = self.padding_id
        pad_pos = None
        if pad is not None:
            hit = (uniq == pad).nonzero()
            pad_pos = int(hit[0, 0]) if hit.numel() else None
        if self.mode == "max":
            out = F.embedding_bag(inverse, rows,
                                  torch.from_numpy(offs.astype(np.int64)),
                                  mode="max", include_last_offset=True,
                                  padding_idx=pad_pos)
        else:
            embps._bag_args(inverse.numpy(), offs, None)  # validates offsets
            out = _Bag.apply(rows, per_sample_weights, inverse, offs,
                             self.mode, pad_pos)
        return out.to(device)


def remote_modules(modules):
    """The RemoteEmbedding/RemoteEmbeddingBag modules of a module tree (or
    of an iterable of modules and trees), each once."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    out, seen = [], set()
    for root in modules:
        for m in root.modules():
            if isinstance(m, _RemoteTable) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def attach(model, client):
    """Gives every remote module of model the client (after torch.load, or
    in a new process); returns model."""
    for m in remote_modules(model):
        m.attach(client)
    return model


class RemoteOptimizer(torch.optim.Optimizer):
    """The optimizer-shaped side of embps tables: zero_grad() and step()
    for the remote modules of a model, one param group per table.

    The update rule and its hyperparameters are the table's, applied on the
    servers. param_groups[i] holds "table", "optimizer" and "lr" (the
    table's). A learning-rate schedule (changing "lr", by hand or with a
    torch.optim.lr_scheduler) works for every optimizer: at step(), a
    group whose lr changed since the last step sends the table one alter
    (Client.set_lr) before its push, so the servers apply that push and the
    later ones with the new lr. Every worker running the same schedule
    sends the same value. The servers refuse lr <= 0 (EmbpsError EPARAM).

    Synchronous tables (sync_workers > 0) are pushed with the step number,
    counted from the table's step when the optimizer is made; every worker
    pushes at every step (an empty push when it has no gradient).
    """

    def __init__(self, modules, overlap=False):
        self._modules = remote_modules(modules)
        if not self._modules:
            raise ValueError("no RemoteEmbedding or RemoteEmbeddingBag given")
        self.defaults = {}
        self.state = {}
        self.param_groups = []
        self._tables = {}
        for m in self._modules:
            key = (id(m.client), m.table)
            if key not in self._tables:
                info = m.client.describe(m.table)
                self._tables[key] = {"modules": [], "client": m.client,
                                     "lr": info["lr"], "step": info["step"],
                                     "sync": info["sync_workers"] > 0}
                self.param_groups.append({"params": [], "table": m.table,
                                          "optimizer": info["optimizer"],
                                          "lr": info["lr"]})
            self._tables[key]["modules"].append(m)
        self._groups = list(self._tables.values())
        self._io = None
        self._inflight = []
        if overlap:
            self._io = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="embps-io")
            for m in self._modules:
                m._io = self._io
        self._hook_for_profile()

    def zero_grad(self, set_to_none=True):
        """Forgets the gradients received since the last step()."""
        for m in self._modules:
            m._grads = []

    def _send_lr(self, group, t):
        """One alter of the table's lr when the group's changed."""
        lr = float(group["lr"])
        if lr != t["lr"]:
            t["client"].set_lr(group["table"], lr)
            t["lr"] = lr

    def _batch(self, group, t):
        """(ids, grads) of one push: every gradient of every module on the
        table since zero_grad(), concatenated (the server sums repeats)."""
        pairs = [p for m in t["modules"] for p in m._grads]
        if not pairs and not t["sync"]:
            return None
        dim = t["modules"][0].dim
        ids = torch.cat([p[0] for p in pairs]) if pairs else \
            torch.empty(0, dtype=torch.int64)
        grads = torch.cat([p[1] for p in pairs]) if pairs else \
            torch.empty(0, dim)
        return ids.numpy(), grads.numpy()

    def step(self, closure=None):
        """One push per table with gradients (one optimizer step on the
        servers each). With overlap, waits for the previous step's pushes,
        queues this step's and returns."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.flush()
        jobs = []
        for group, t in zip(self.param_groups, self._groups):
            self._send_lr(group, t)
            batch = self._batch(group, t)
            if batch is None:
                continue
            step = None
            if t["sync"]:
                t["step"] += 1
                step = t["step"]
            jobs.append((t["client"], group["table"], batch, step))
        for client, table, (ids, grads), step in jobs:
            push = (lambda c=client, n=table, i=ids, g=grads, s=step:
                    c.push(n, i, g, merge=True, step=s))
            if self._io is not None:
                self._inflight.append(self._io.submit(push))
            else:
                push()
        return loss

    def flush(self):
        """Waits for the pushes in flight (overlap); raises the first
        error. Call before reading the tables, e.g. at the end of training."""
        inflight, self._inflight = self._inflight, []
        for f in inflight:
            f.result()

    def close(self):
        """Flushes and stops the I/O thread; the modules pull directly
        again."""
        self.flush()
        if self._io is not None:
            for m in self._modules:
                m._io, m._prefetched = None, []
            self._io.shutdown()
            self._io = None

    def __getstate__(self):
        raise TypeError("a RemoteOptimizer cannot be pickled; save "
                        "state_dict() instead")
