"""PyTorch modules over embps tables: RemoteEmbedding (nn.Embedding) and
RemoteEmbeddingBag (nn.EmbeddingBag) whose weights live on the servers, and
RemoteOptimizer, which pushes their gradients in a normal training loop.

    emb = RemoteEmbedding.create(client, "users", 100000, 16,
                                 optimizer="adagrad", lr=0.1)
    opt = RemoteOptimizer(model)        # every Remote* module in model
    for ids, y in batches:
        model.zero_grad()               # or opt.zero_grad()
        loss = loss_fn(model(ids), y)
        loss.backward()
        opt.step()                      # one push per table

How it works. Each table's weight is a RemoteWeight (weight.py): a
Parameter of the table's shape with no values, in model.parameters(), whose
.grad is nn.Embedding(sparse=True)'s sparse gradient. A forward pulls the
distinct ids of its batch once and expands them with torch's F.embedding /
F.embedding_bag (modules.py), so autograd sums repeated ids and backward
accumulates one sparse gradient per table in weight.grad (table.py), which
model.zero_grad() and every optimizer's zero_grad() clear, GradScaler
unscales and clip_grad_norm_ sees. step() pushes it, one push per table
(optim.py); the server sums duplicates and applies one optimizer step, as
torch.optim.Adagrad would after nn.Embedding(sparse=True) was used several
times. requires_grad_(False) freezes a table (nothing recorded or pushed);
torch.no_grad() records nothing.

Overlap (RemoteOptimizer(..., overlap=True)): every pull and push of the
managed modules runs, in order, on one background thread per optimizer;
step() queues its pushes and returns, and module.prefetch(next_ids) queues
the pull of the next batch's rows, so both travel while the current step
computes. Staleness is at most one step: step() first waits for the
previous step's pushes, and a pull is queued behind every push sent before
it, so the rows of batch t+1 prefetched during step t hold every update up
to step t-1 and may miss only step t's. Push errors surface at the next
step() or flush(); module.prefetch_hits and prefetch_misses count the
forwards that found their prefetch and those that did not.

Ids may be on any device (CUDA included): they go to the CPU for the wire
and the output comes back on the ids' device. state_dict() holds the
table's name and spec (not rows, which stay on the servers); pickling a
module (torch.save(model)) drops its Client, and attach(model, client)
gives the loaded modules one again. to_local() and the dense export hand a
fixed-size table to plain torch; from_pretrained() makes a table from a
tensor. README, "PyTorch", lists what still differs from torch, and why.
"""
from .models import attach, ddp_ignore, remote_modules
from .modules import BagIndexError, RemoteEmbedding, RemoteEmbeddingBag
from .optim import (RemoteOptimizer, clip_grad_norm_, push_sparse_grad,
                    sparse_grad_to_slices)
from .table import IdsTypeError, InvalidPaddingIdx, RemoteTable, \
    TableCopyError
from .weight import RemoteWeight, RemoteWeightError

__all__ = ["RemoteEmbedding", "RemoteEmbeddingBag", "RemoteOptimizer",
           "RemoteWeight", "RemoteTable", "attach", "remote_modules",
           "ddp_ignore", "clip_grad_norm_", "sparse_grad_to_slices",
           "push_sparse_grad", "RemoteWeightError", "TableCopyError",
           "InvalidPaddingIdx", "IdsTypeError", "BagIndexError"]
