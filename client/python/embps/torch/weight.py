"""RemoteWeight: an embps table's weight as a torch Parameter, so that the
training-loop idioms that go through model.parameters() reach the table's
gradient: model.zero_grad() and any optimizer's zero_grad() clear it,
requires_grad_(False) freezes the table, clip_grad_norm_ and GradScaler
see it, numel() counts the table's parameters.

The parameter has the table's shape, [num_embeddings, dim] (for a dynamic
table, which has no row count, [(2**63 - 1) // dim, dim]), and no values: its data is one zero broadcast
to that shape (no memory), since the rows live on the servers. Its .grad
is what nn.Embedding(sparse=True)'s is: a sparse COO tensor that autograd
accumulates over every lookup since the last zero_grad. Its row indices
are the ids for a table of fixed size; for a dynamic table, whose ids can
be any int64 (negative too), they are slots that _SlotMap maps back to
ids. RemoteOptimizer pushes it (sparse_grad() gives it as ids and rows).

Any torch operation on the parameter itself other than reading its
metadata (shape, dtype, device, requires_grad, grad, ...) raises
RemoteWeightError naming the table and what to do instead: no code reads
zeros where it expected rows, and no torch.optim optimizer updates it in
place.

Modules on the same table and client share one RemoteWeight (as tied
modules share one Parameter): one gradient, one param group.
"""
import weakref
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

__all__ = ["RemoteWeight", "RemoteWeightError"]


def dynamic_rows(dim: int) -> int:
    """shape[0] of a dynamic table's weight: it has no row count, so the
    largest for which the weight's numel() fits an int64 (slots are
    counted from 0)."""
    return (2 ** 63 - 1) // max(int(dim), 1)


# Tensor attributes and methods that read metadata only: allowed on the
# weight. Everything else touches values, which are not here.
_GETTERS = frozenset((
    "grad", "requires_grad", "is_leaf", "grad_fn", "shape", "dtype",
    "device", "layout", "is_sparse", "ndim", "is_cuda", "is_meta",
    "is_quantized", "is_mkldnn", "is_nested", "names", "name", "_base",
    "_version", "output_nr", "_backward_hooks", "_cdata", "_python_dispatch",
    "is_xpu", "is_mps", "is_ort", "is_vulkan", "is_ipu", "is_sparse_csr",
    "_grad", "_grad_fn", "retains_grad", "_post_accumulate_grad_hooks"))
_SETTERS = frozenset(("grad", "requires_grad", "_grad",
                      "_backward_hooks"))
_METHODS = frozenset((
    "size", "dim", "numel", "nelement", "element_size", "is_floating_point",
    "is_complex", "requires_grad_", "register_hook", "retain_grad",
    "__hash__", "__len__", "get_device", "stride", "is_contiguous",
    "is_shared", "__format__", "__repr__", "__reduce_ex__", "__deepcopy__",
    "__setstate__", "_is_view", "is_pinned", "has_names",
    "grad", "backward"))  # torch.autograd.grad/backward(inputs=[weight])


class RemoteWeightError(RuntimeError):
    """An operation that needs a table's values on its RemoteWeight, which
    holds none (the rows live on the embps servers)."""


def _func_name(func: Any) -> Tuple[str, str]:
    """(kind, name) of a function __torch_function__ receives: ("get",
    "grad") for a property read, ("set", ...) for a write, ("call",
    name) otherwise."""
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):
        owner = getattr(getattr(func, "__self__", None), "__name__", "")
        return ("get" if name == "__get__" else "set"), owner
    return "call", name


class _SlotMap:
    """The slots of a dynamic table's gradient rows: each id gets one, in
    order of first use since reset(); ids(slots) maps them back.

    Slots are given at backward time. They may start again from 0 only
    when no gradient holds any (the weight's .grad is None or empty) and
    no backward pass is between its first lookup and the moment autograd
    hands the weight its summed gradient (the weight's hook closes the
    pass): two lookups in one pass must not get the same slots."""

    def __init__(self) -> None:
        self.reset()
        self.pass_open = False

    def reset(self) -> None:
        self._ids = torch.empty(0, dtype=torch.int64)     # slot -> id
        self._sorted = torch.empty(0, dtype=torch.int64)  # ids, sorted
        self._slot = torch.empty(0, dtype=torch.int64)    # their slots

    def __len__(self) -> int:
        return int(self._ids.numel())

    def slots(self, uniq: torch.Tensor) -> torch.Tensor:
        """The slots of distinct ids (new ones for ids not seen yet)."""
        n = self._sorted.numel()
        pos = torch.searchsorted(self._sorted, uniq).clamp_(max=max(n - 1, 0))
        hit = (self._sorted[pos] == uniq) if n else \
            torch.zeros(uniq.shape, dtype=torch.bool)
        out = torch.empty_like(uniq)
        out[hit] = self._slot[pos[hit]]
        new = uniq[~hit]
        base = self._ids.numel()
        out[~hit] = torch.arange(base, base + new.numel())
        if new.numel():
            self._ids = torch.cat([self._ids, new])
            self._sorted, self._slot = torch.sort(self._ids)
        return out

    def ids(self, slots: torch.Tensor) -> torch.Tensor:
        return self._ids[slots]


class RemoteWeight(torch.nn.Parameter):
    """The weight of embps table `table` (see the module docstring).
    Made by the Remote* modules; read its gradient with sparse_grad()."""

    table: str
    dynamic: bool

    def __new__(cls, table: str, rows: Optional[int], dim: int,
                dtype: torch.dtype = torch.float32,
                device: Any = "cpu", requires_grad: bool = True
                ) -> "RemoteWeight":
        shape = (dynamic_rows(dim) if rows is None else int(rows), int(dim))
        data = torch.zeros((), dtype=dtype, device=device).expand(shape)
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.table = table
        self.dynamic = rows is None
        self._slots = _SlotMap() if rows is None else None
        self._managers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._warned_unmanaged = False
        if self.dynamic:
            self.register_hook(self._close_pass)
        return self

    def __init__(self, *args: Any, **kw: Any) -> None:
        pass  # all done in __new__ (Parameter has no __init__ to call)

    # ---- values are not here
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kind, name = _func_name(func)
        allowed = (_GETTERS if kind == "get" else
                   _SETTERS if kind == "set" else _METHODS)
        if name not in allowed:
            table = next((a.table for a in args
                          if isinstance(a, RemoteWeight)), "?")
            raise RemoteWeightError(
                "%s: the weight of embps table %r holds no values (the rows "
                "live on its servers), so it cannot be read or changed "
                "here. Read rows with module.pull(ids), module.to_local() or "
                "an export; train it with embps.torch.RemoteOptimizer (give "
                "the other parameters to torch.optim); wrap a model in "
                "DistributedDataParallel after embps.torch.ddp_ignore(model)"
                % (name or func, table))
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))

    def __repr__(self) -> str:
        return "RemoteWeight(table=%r, shape=%s, dtype=%s%s)" % (
            self.table, tuple(self.shape), self.dtype,
            "" if self.requires_grad else ", frozen")

    def __deepcopy__(self, memo: Dict[int, Any]) -> "RemoteWeight":
        raise RemoteWeightError(
            "copy.deepcopy of the weight of embps table %r: it has no values "
            "to copy (see copy.deepcopy of its module)" % self.table)

    def __reduce_ex__(self, proto: Any) -> Any:
        return (_rebuild, (self.table, None if self.dynamic else
                           int(self.shape[0]), int(self.shape[1]),
                           str(self.dtype).replace("torch.", ""),
                           bool(self.requires_grad)))

    # ---- for the modules and the optimizer
    def retype(self, dtype: torch.dtype, device: Any) -> None:
        """Makes the placeholder data (and the pending gradient) of
        another dtype or device (module.to(), .double(), .cuda(), ...)."""
        grad = self.grad
        with torch._C.DisableTorchFunction():
            self.data = torch.zeros((), dtype=dtype, device=device).expand(
                self.shape)
        if grad is not None:
            self.grad = grad.to(device=device, dtype=dtype)

    def grad_rows(self, uniq: torch.Tensor) -> torch.Tensor:
        """The sparse-gradient row indices of distinct ids: the ids, or a
        dynamic table's slots (see _SlotMap)."""
        if not self.dynamic:
            return uniq
        m = self._slots
        if not m.pass_open:
            g = self.grad
            if g is None or (g.is_sparse and g._nnz() == 0):
                m.reset()
            m.pass_open = True
        return m.slots(uniq)

    def _close_pass(self, grad: torch.Tensor) -> None:
        self._slots.pass_open = False

    def drop_grad_if_unmanaged(self) -> bool:
        """At a recording forward: a weight no RemoteOptimizer manages
        keeps the gradient of one step at most (nothing would ever push
        it). Drops the pending gradient, warning once; True if it did."""
        if len(self._managers) or self.grad is None:
            return False
        self.grad = None
        if not self._warned_unmanaged:
            self._warned_unmanaged = True
            import warnings
            warnings.warn(
                "embps table %r: no RemoteOptimizer manages this module, so "
                "its gradient could never be pushed; it keeps the gradient "
                "of the last backward only (dropped at the next forward). "
                "Give the module to embps.torch.RemoteOptimizer, freeze it "
                "with requires_grad_(False), or run it under torch.no_grad()"
                % self.table, UserWarning, stacklevel=4)
        return True

    def sparse_grad(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The pending gradient as (ids int64 [n], rows float32 [n, dim]),
        duplicates summed, or None when there is none. Copies: the arrays
        do not change when the gradient does."""
        g = self.grad
        if g is None:
            return None
        with torch.no_grad():
            g = (g if g.is_sparse else g.to_sparse(1)).coalesce()
            if g._nnz() == 0:
                return None
            rows = g._indices()[0].cpu()
            ids = self._slots.ids(rows) if self.dynamic else rows
            vals = g._values().to("cpu", torch.float32)
        return (np.array(ids.numpy(), dtype=np.int64),
                np.array(vals.numpy(), dtype=np.float32))


def _rebuild(table: str, rows: Optional[int], dim: int, dtype: str,
             requires_grad: bool) -> RemoteWeight:
    """Unpickling: a RemoteWeight with no client behind it (attach() binds
    its module again)."""
    return RemoteWeight(table, rows, dim, getattr(torch, dtype),
                        requires_grad=requires_grad)


def shared_weight(client: Any, table: str, rows: Optional[int], dim: int,
                  like: Optional[RemoteWeight] = None) -> RemoteWeight:
    """The RemoteWeight every module on (client, table) uses: made on
    first use (with the dtype, device and requires_grad of `like`, a
    module's weight from before, if given), kept as long as a module holds
    it."""
    reg = client.__dict__.setdefault("_embps_torch_weights",
                                     weakref.WeakValueDictionary())
    w = reg.get(table)
    if w is None or w.shape[1] != dim or w.dynamic != (rows is None) or (
            rows is not None and w.shape[0] != rows):
        if like is None:
            w = RemoteWeight(table, rows, dim)
        else:
            w = RemoteWeight(table, rows, dim, like.dtype, like.device,
                             like.requires_grad)
        reg[table] = w
    return w
