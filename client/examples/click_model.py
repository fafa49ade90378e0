"""A DLRM-style click model trained with embps: the sparse features live in
embps tables, the dense MLPs are replicated with DistributedDataParallel
(gloo), and 2 worker processes train on halves of the data.

    build/embps-server --listen 127.0.0.1:7070 &
    PYTHONPATH=client/python EMBPS_LIBRARY=build/libembps.so \\
        /usr/bin/python3 client/examples/click_model.py --servers 127.0.0.1:7070

Synthetic data with a planted truth: a user (dense table, ids 0..U-1), an
item (int64 hashed ids: a dynamic table), 1-3 tags per example (an
EmbeddingBag, mean), 4 dense features; the click probability is
sigmoid(1.5 <user, item> + tag effect + w.x + b) of hidden vectors.

Each worker pulls rows through RemoteEmbedding/RemoteEmbeddingBag, runs the
bottom MLP, the pairwise-dot interaction and the top MLP (the DDP part),
and RemoteOptimizer pushes the tables' gradients (Adagrad on the servers)
while torch.optim.Adagrad steps the dense part. The tables are synchronous
(sync_workers = workers): the two workers' pushes of a step are averaged
and applied as one step, as DDP does for the dense part, so the run is the
local run's arithmetic. --async makes each worker's push its own step;
--overlap prefetches the next batch's rows and pushes without blocking
(rows up to one step stale). Both change the training trajectory, so
their AUC differs from the local run's by more than rounding.

--compare-local also trains the same model in this process with
nn.Embedding(sparse=True)/nn.EmbeddingBag(sparse=True) and torch's Adagrad,
from the same initial rows, dense weights and global batches, and prints
both held-out AUCs.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import embps
import embps.torch as et

N_DENSE, N_TAGS, TRUE_DIM = 4, 50, 4


def make_data(a):
    """Train and test splits: dict of numpy arrays, plus the true logits."""
    rng = np.random.default_rng(a.seed)
    users = rng.normal(0, 1, (a.users, TRUE_DIM))
    items = rng.normal(0, 1, (a.items, TRUE_DIM))
    tag_effect = rng.normal(0, 1, N_TAGS)
    w = rng.normal(0, 0.7, N_DENSE)
    n = a.train + a.test
    u = rng.integers(0, a.users, n)
    i = np.minimum(rng.zipf(1.3, n) - 1, a.items - 1)  # popular items
    n_tags = rng.integers(1, 4, n)
    offsets = np.concatenate([[0], np.cumsum(n_tags)])
    tags = rng.integers(0, N_TAGS, offsets[-1])
    x = rng.normal(0, 1, (n, N_DENSE)).astype(np.float32)
    tag_mean = np.add.reduceat(tag_effect[tags], offsets[:-1]) / n_tags
    logit = 1.5 * np.sum(users[u] * items[i], 1) / np.sqrt(TRUE_DIM) \
        + tag_mean + x @ w - 0.5
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    item_ids = hash_ids(i)
    data = []
    for lo, hi in ((0, a.train), (a.train, n)):
        data.append({"user": u[lo:hi], "item": item_ids[lo:hi],
                     "tags": tags[offsets[lo]:offsets[hi]],
                     "offsets": offsets[lo:hi] - offsets[lo], "x": x[lo:hi],
                     "y": y[lo:hi], "logit": logit[lo:hi]})
    return data


def hash_ids(i):
    """Item index -> an int64 id spread over the whole range."""
    h = (i.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(1)).astype(np.int64)


def step_rows(a, epoch, rank):
    """The training examples of an epoch in step order: the full global
    batches of a.batch from one shuffle (a partial last one is dropped, so
    every worker takes the same number of steps), of which worker `rank`
    takes every a.workers-th example (rank None: all, for local training)."""
    order = np.random.default_rng([a.seed, epoch]).permutation(a.train)
    order = order[:order.size - order.size % a.batch].reshape(-1, a.batch)
    return (order if rank is None else order[:, rank::a.workers]).reshape(-1)


def batches(d, rows, batch):
    """Batches (dict of tensors) over the examples `rows` of split d."""
    ends = np.append(d["offsets"], d["tags"].size)
    for lo in range(0, rows.size, batch):
        r = rows[lo:lo + batch]
        tag_lists = [d["tags"][ends[k]:ends[k + 1]] for k in r]
        counts = np.array([t.size for t in tag_lists])
        yield {"user": torch.from_numpy(d["user"][r]),
               "item": torch.from_numpy(d["item"][r]),
               "tags": torch.from_numpy(np.concatenate(tag_lists)),
               "offsets": torch.from_numpy(
                   np.concatenate([[0], np.cumsum(counts)[:-1]])),
               "x": torch.from_numpy(d["x"][r]),
               "y": torch.from_numpy(d["y"][r])}


class Dense(nn.Module):
    """Bottom MLP on the dense features, pairwise dots of the four
    vectors, top MLP: the replicated (DDP) part."""

    def __init__(self, dim):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 16), nn.ReLU(),
                                    nn.Linear(16, dim))
        self.top = nn.Sequential(nn.Linear(dim + 6, 16), nn.ReLU(),
                                 nn.Linear(16, 1))

    def forward(self, x, user, item, tags):
        v = torch.stack([self.bottom(x), user, item, tags], 1)  # B x 4 x dim
        dots = torch.bmm(v, v.transpose(1, 2))
        iu = torch.triu_indices(4, 4, 1)
        return self.top(torch.cat([v[:, 0], dots[:, iu[0], iu[1]]], 1))[:, 0]


class ClickModel(nn.Module):
    """The sparse modules (remote or local) around the dense part."""

    def __init__(self, user, item, tags, dense):
        super().__init__()
        self.user, self.item, self.tags, self.dense = user, item, tags, dense

    def forward(self, b, item_index=None):
        item = self.item(b["item"] if item_index is None else item_index)
        return self.dense(b["x"], self.user(b["user"]), item,
                          self.tags(b["tags"], b["offsets"]))


def auc(scores, labels):
    """Area under the ROC curve (Mann-Whitney U, ties as half)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(s.size)
    lo = 0
    while lo < s.size:  # average ranks over ties
        hi = lo
        while hi + 1 < s.size and s[hi + 1] == s[lo]:
            hi += 1
        ranks[lo:hi + 1] = (lo + hi) / 2 + 1
        lo = hi + 1
    r = np.empty(s.size)
    r[order] = ranks
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def evaluate(model, test, batch, item_index=None):
    model.eval()
    scores = []
    rows = np.arange(test["y"].size)
    with torch.no_grad():
        for k, b in enumerate(batches(test, rows, batch)):
            idx = None if item_index is None else item_index(b["item"])
            scores.append(model(b, idx).numpy())
    model.train()
    return auc(np.concatenate(scores), test["y"])


def table_names(a):
    return {k: a.prefix + k for k in ("user", "item", "tags")}


def create_tables(client, a):
    """The three tables (exist_ok: a second run continues training them)."""
    t = table_names(a)
    common = dict(optimizer="adagrad", lr=a.lr, init="normal:%g" % a.init_std,
                  seed=5, sync_workers=a.workers if a.sync else 0)
    et.RemoteEmbedding.create(client, t["user"], a.users, a.dim, **common)
    et.RemoteEmbedding.create(client, t["item"], None, a.dim, **common)
    et.RemoteEmbeddingBag.create(client, t["tags"], N_TAGS, a.dim, **common)


def worker(rank, a, store_dir):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(
        store_dir, "store"), rank=rank, world_size=a.workers)
    client = embps.Client(a.servers)  # one per process, made after spawn
    t = table_names(a)
    model = ClickModel(et.RemoteEmbedding(client, t["user"]),
                       et.RemoteEmbedding(client, t["item"]),
                       et.RemoteEmbeddingBag(client, t["tags"], mode="mean"),
                       nn.parallel.DistributedDataParallel(Dense(a.dim)))
    sparse_opt = et.RemoteOptimizer(model, overlap=a.overlap)
    dense_opt = torch.optim.Adagrad(model.dense.parameters(), lr=a.lr)
    train, test = make_data(a)
    t0 = time.time()
    for epoch in range(a.epochs):
        it = batches(train, step_rows(a, epoch, rank), a.batch // a.workers)
        nxt = next(it)
        total = n = 0
        while nxt is not None:
            b, nxt = nxt, next(it, None)
            if nxt is not None:  # the next batch's rows travel meanwhile
                model.user.prefetch(nxt["user"])
                model.item.prefetch(nxt["item"])
                model.tags.prefetch(nxt["tags"])
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(model(b),
                                                                  b["y"])
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
            total, n = total + float(loss), n + 1
        if rank == 0 and not a.quiet:
            print("epoch %d  train loss %.4f  (%.1f s)"
                  % (epoch + 1, total / n, time.time() - t0), flush=True)
    sparse_opt.close()  # every push applied
    dist.barrier()      # ... by every worker
    if rank == 0:
        with open(os.path.join(store_dir, "auc"), "w") as f:
            f.write(repr(evaluate(model, test, 1024)))
    dist.destroy_process_group()


def train_local(a, init):
    """The same model and optimizer in this process with local sparse
    embeddings, from the same initial rows and dense init."""
    torch.manual_seed(0)
    dense = Dense(a.dim)  # the workers' initial dense weights
    train, test = make_data(a)
    item_ids = np.unique(np.concatenate([train["item"], test["item"]]))
    user = nn.Embedding(a.users, a.dim, sparse=True)
    item = nn.Embedding(item_ids.size, a.dim, sparse=True)
    tags = nn.EmbeddingBag(N_TAGS, a.dim, mode="mean", sparse=True)
    with torch.no_grad():
        user.weight.copy_(torch.from_numpy(init["user"]))
        item.weight.copy_(torch.from_numpy(init["item"](item_ids)))
        tags.weight.copy_(torch.from_numpy(init["tags"]))
    model = ClickModel(user, item, tags, dense)
    sparse_opt = torch.optim.Adagrad(
        [user.weight, item.weight, tags.weight], lr=a.lr, eps=1e-10)
    dense_opt = torch.optim.Adagrad(model.dense.parameters(), lr=a.lr)

    def index(ids):
        return torch.from_numpy(np.searchsorted(item_ids, ids.numpy()))
    for epoch in range(a.epochs):
        for b in batches(train, step_rows(a, epoch, None), a.batch):
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(
                model(b, index(b["item"])), b["y"])
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
    return evaluate(model, test, 1024, index)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default=os.environ.get("EMBPS_SERVERS",
                                                       "127.0.0.1:7070"))
    p.add_argument("--prefix", default="click.", help="table name prefix")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--users", type=int, default=300)
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--train", type=int, default=60000)
    p.add_argument("--test", type=int, default=20000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=256,
                   help="global batch (each worker takes batch/workers)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--init-std", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1, help="of the data")
    p.add_argument("--async", dest="sync", action="store_false",
                   help="asynchronous tables: each worker's push is a step")
    p.add_argument("--overlap", action="store_true",
                   help="prefetch rows, push without blocking (1-step stale)")
    p.add_argument("--compare-local", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    client = embps.Client(a.servers)
    create_tables(client, a)
    t = table_names(a)
    init = None
    if a.compare_local:  # the rows the run starts from
        init = {"user": client.pull(t["user"], np.arange(a.users)),
                "tags": client.pull(t["tags"], np.arange(N_TAGS))}
        items = np.unique(hash_ids(np.arange(a.items)))
        item_rows = client.pull(t["item"], items)
        init["item"] = lambda ids: item_rows[np.searchsorted(items, ids)]
    client.close()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="embps-click-") as d:
        mp.spawn(worker, args=(a, d), nprocs=a.workers, join=True)
        with open(os.path.join(d, "auc")) as f:
            result = {"auc_embps": float(f.read())}
    result["seconds_embps"] = round(time.time() - t0, 2)
    test = make_data(a)[1]
    result["auc_oracle"] = auc(test["logit"], test["y"])
    if a.compare_local:
        result["auc_local"] = train_local(a, init)
    if a.json:
        print(json.dumps(result))
    else:
        print("held-out AUC: embps %.4f%s (true model %.4f)"
              % (result["auc_embps"], "" if "auc_local" not in result else
                 ", local nn.Embedding %.4f" % result["auc_local"],
                 result["auc_oracle"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
