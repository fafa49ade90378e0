"""RemoteOptimizer, the optimizer-shaped side of embps tables, and
clip_grad_norm_, torch's gradient clipping that also scales sparse
gradients.

RemoteOptimizer has one param group per table, whose only param is the
table's RemoteWeight; step() pushes each weight's pending gradient (its
.grad, accumulated by autograd since the last zero_grad — whoever calls
it: this optimizer, the model, another optimizer) as one push per table,
and the servers apply the table's optimizer. Because the weights are in
param_groups, torch.cuda.amp.GradScaler unscales their gradients (and
skips the step on an inf) as it does any optimizer's.
"""
import concurrent.futures
from typing import (Any, Callable, Dict, Iterable, List, Optional,
                    Tuple, Union)

import numpy as np
import torch

import embps

from .models import remote_modules
from .weight import RemoteWeight

__all__ = ["RemoteOptimizer", "clip_grad_norm_", "sparse_grad_to_slices",
           "push_sparse_grad"]


def sparse_grad_to_slices(grad: torch.Tensor
                          ) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, values) numpy arrays of a sparse gradient of an embedding
    weight (torch.sparse_coo_tensor), coalesced: duplicates summed."""
    g = grad.coalesce()
    return (g.indices()[0].cpu().numpy().astype(np.int64),
            g.values().detach().cpu().numpy().astype(np.float32))


def push_sparse_grad(client: "embps.Client", table: str,
                     grad: torch.Tensor, **kw: Any) -> None:
    """Pushes the sparse gradient of an nn.Embedding(sparse=True) weight."""
    idx, vals = sparse_grad_to_slices(grad)
    client.push(table, idx, vals, **kw)


def _total_norm(grads: List[torch.Tensor], norm_type: float
                ) -> torch.Tensor:
    """The norm of all gradients as one vector, as torch 1.13's
    clip_grad_norm_ computes it: the norm of the per-gradient norms
    (torch.norm coalesces a sparse gradient first), or for inf the largest
    absolute value."""
    device = grads[0].device
    if norm_type == float("inf"):
        peaks = [(g.coalesce()._values() if g.is_sparse else g).detach()
                 .abs().max().to(device) for g in grads]
        return peaks[0] if len(peaks) == 1 else torch.max(torch.stack(peaks))
    return torch.norm(torch.stack([torch.norm(g.detach(), norm_type)
                                   .to(device) for g in grads]), norm_type)


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]],
                    max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ that also scales sparse gradients.

    The total norm and the coefficient max_norm / (norm + 1e-6), clamped
    to 1, are computed as torch computes them, on the same gradients. torch
    1.13 then scales each gradient through g.detach().mul_(), which does
    not write through a sparse tensor: the tables' gradients (and those of
    nn.Embedding(sparse=True)) would keep their size while the dense ones
    shrink. This scales every gradient in place, sparse ones included.
    Returns the total norm."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = _total_norm(grads, float(norm_type))
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError("The total norm of order %s for gradients from "
                           "`parameters` is non-finite, so it cannot be "
                           "clipped" % (norm_type,))
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for g in grads:
            if g.is_sparse:
                g.mul_(coef.to(g.device))
            else:
                g.detach().mul_(coef.to(g.device))
    return total


class RemoteOptimizer(torch.optim.Optimizer):
    """zero_grad() and step() for the tables of the remote modules of a
    model, one param group per table (params: [the table's RemoteWeight]).

    The update rule and its hyperparameters are the table's, applied on the
    servers. param_groups[i] holds "table", "optimizer" and "lr" (the
    table's). A learning-rate schedule (changing "lr", by hand or with a
    torch.optim.lr_scheduler) works for every optimizer: at step(), a
    group whose lr changed since the last step sends the table one alter
    (Client.set_lr) before its push, so the servers apply that push and the
    later ones with the new lr. Every worker running the same schedule
    sends the same value. The servers refuse lr <= 0 (InvalidParameter).

    step() pushes every table whose weight requires grad and has a
    gradient; a frozen table (requires_grad_(False)) is never pushed.
    Synchronous tables (sync_workers > 0) are pushed with the step number,
    counted from the table's step when the optimizer is made; every worker
    pushes at every step (an empty push when it has no gradient).

    overlap=True: every pull and push of the managed modules runs, in
    order, on one background thread; step() queues the pushes and returns
    (errors surface at the next step() or flush()), and module.prefetch()
    pulls the next batch's rows meanwhile (at most one step stale).
    """

    def __init__(self, modules: Union[torch.nn.Module, Iterable[Any]],
                 overlap: bool = False) -> None:
        self._modules = remote_modules(modules)
        if not self._modules:
            raise ValueError("no RemoteEmbedding or RemoteEmbeddingBag given")
        self.defaults: Dict[str, Any] = {}
        self.state: Dict[Any, Any] = {}
        self.param_groups: List[Dict[str, Any]] = []
        self._groups: List[Dict[str, Any]] = []
        by_weight: Dict[int, Dict[str, Any]] = {}
        for m in self._modules:
            w = m.weight
            if id(w) not in by_weight:
                info = m.client.describe(m.table)
                t = {"weight": w, "client": m.client, "lr": info["lr"],
                     "step": info["step"], "sync": info["sync_workers"] > 0}
                by_weight[id(w)] = t
                self._groups.append(t)
                self.param_groups.append({"params": [w], "table": m.table,
                                          "optimizer": info["optimizer"],
                                          "lr": info["lr"]})
                w._managers.add(self)
        self._io: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._inflight: List[Any] = []
        if overlap:
            self._io = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="embps-io")
            for m in self._modules:
                m._io = self._io
        self._hook_for_profile()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the tables' gradients (as model.zero_grad() does)."""
        for t in self._groups:
            w = t["weight"]
            if w.grad is not None:
                if set_to_none:
                    w.grad = None
                else:
                    w.grad.zero_()

    def _send_lr(self, group: Dict[str, Any], t: Dict[str, Any]) -> None:
        """One alter of the table's lr when the group's changed."""
        lr = float(group["lr"])
        if lr != t["lr"]:
            t["client"].set_lr(group["table"], lr)
            t["lr"] = lr

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One push per table with a gradient (one optimizer step on the
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
            w: RemoteWeight = t["weight"]
            if not w.requires_grad:
                continue  # frozen
            g = w.sparse_grad()
            if g is None and not t["sync"]:
                continue
            if g is None:
                g = (np.empty(0, np.int64),
                     np.empty((0, w.shape[1]), np.float32))
            step = None
            if t["sync"]:
                t["step"] += 1
                step = t["step"]
            jobs.append((t["client"], group["table"], g, step))
        for client, table, (ids, grads), step in jobs:
            push = (lambda c=client, n=table, i=ids, g=grads, s=step:
                    c.push(n, i, g, merge=True, step=s))
            if self._io is not None:
                self._inflight.append(self._io.submit(push))
            else:
                push()
        return loss

    def flush(self) -> None:
        """Waits for the pushes in flight (overlap); raises the first
        error. Call before reading the tables, e.g. at the end of training."""
        inflight, self._inflight = self._inflight, []
        for f in inflight:
            f.result()

    def close(self) -> None:
        """Flushes and stops the I/O thread; the modules pull directly
        again."""
        self.flush()
        if self._io is not None:
            for m in self._modules:
                m._io, m._prefetched = None, []
            self._io.shutdown()
            self._io = None

    def __getstate__(self) -> Any:
        raise TypeError("a RemoteOptimizer cannot be pickled; save "
                        "state_dict() instead")
