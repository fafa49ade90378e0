"""RemoteTable: what RemoteEmbedding and RemoteEmbeddingBag share — the
client and table, nn.Embedding's attributes, the shared RemoteWeight, the
lookup (pull, prefetch, max_norm, the autograd link to the weight),
dtype and device casts, state dicts, pickling, copies, and the hand-offs
to and from local modules (from_pretrained, to_local).

A lookup pulls the distinct ids of its input once (torch.unique) and
returns (uniq, inverse, rows): rows [n_uniq, dim] in the module's dtype,
wired by _Lookup to the weight when autograd records, so that backward
hands the weight a sparse gradient of those rows (nn.Embedding(sparse=
True)'s). The module expands the rows with torch's own F.embedding or
F.embedding_bag over `inverse`, so outputs and gradients are computed by
torch's kernels.
"""
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

import embps

from .weight import RemoteWeight, shared_weight

__all__ = ["RemoteTable", "TableCopyError", "InvalidPaddingIdx",
           "IdsTypeError", "pull_all"]

_COUNTERS = ("rows_allocated", "bytes_used", "pushes", "pulls",
             "step") + embps._DYN_COUNTERS


class TableCopyError(RuntimeError):
    """copy.deepcopy of a remote module (see RemoteTable.__deepcopy__)."""


class InvalidPaddingIdx(ValueError, AssertionError):
    """padding_idx outside the table (nn.Embedding raises AssertionError,
    hence both)."""


class IdsTypeError(TypeError, RuntimeError):
    """Ids that are not integers (F.embedding raises RuntimeError)."""


def _cpu_ids(ids: Any) -> Tuple[torch.Tensor, torch.device]:
    """(int64 contiguous CPU tensor, the device the output goes to)."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(np.asarray(ids))
    if ids.dtype.is_floating_point or ids.dtype.is_complex or \
            ids.dtype == torch.bool:
        raise IdsTypeError("ids must be integers (Long or Int), not %s"
                           % ids.dtype)
    return ids.detach().to("cpu", torch.int64).contiguous(), ids.device


def pull_all(client: Any, table: str, rows: int, dim: int) -> np.ndarray:
    """Every row of a fixed-size table, [rows, dim] float32, by id: pulls
    of about 4 MiB, a few in flight, into the result."""
    out = np.empty((rows, dim), np.float32)
    chunk = max(1, (4 << 20) // (4 * dim))
    inflight: List[Any] = []
    for a in range(0, rows, chunk):
        b = min(rows, a + chunk)
        inflight.append(client.pull_async(table, np.arange(a, b),
                                          out=out[a:b]))
        if len(inflight) > 3:
            inflight.pop(0).wait()
    for t in inflight:
        t.wait()
    return out


class _Lookup(torch.autograd.Function):
    """Identity on the pulled rows of distinct ids `uniq`, whose backward
    gives the weight its gradient: a sparse COO tensor of the weight's
    shape holding the rows' gradient (padding id left out), as
    nn.Embedding(sparse=True) makes."""

    @staticmethod
    def forward(ctx: Any, weight: RemoteWeight, rows: torch.Tensor,
                uniq: torch.Tensor, padding_id: Optional[int]
                ) -> torch.Tensor:
        ctx.weight, ctx.uniq, ctx.padding_id = weight, uniq, padding_id
        return rows

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        w, uniq = ctx.weight, ctx.uniq
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad = grad.detach()
        if ctx.padding_id is not None:
            keep = uniq != ctx.padding_id
            uniq, grad = uniq[keep], grad[keep]
        rows = w.grad_rows(uniq).to(w.device)
        g = torch.sparse_coo_tensor(rows.unsqueeze(0),
                                    grad.to(w.device, w.dtype), w.shape)
        return g, None, None, None


class RemoteTable(torch.nn.Module):
    """The base of RemoteEmbedding and RemoteEmbeddingBag (see their
    docstrings): a module over embps table `table` of `client`."""

    _local_class: Any = None  # the torch module to_local() makes

    def __init__(self, client: "embps.Client", table: str,
                 padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = True
                 ) -> None:
        name = type(self).__name__
        if not isinstance(client, embps.Client) or not isinstance(table, str):
            raise TypeError(
                "%s(client, table, ...) takes an embps.Client and the name of "
                "a table on its servers, not %r, %r; to create the table, use "
                "%s.create(client, name, num_embeddings, embedding_dim, ...) "
                "or %s.from_pretrained(tensor, client=..., name=...)"
                % (name, client, table, name, name))
        super().__init__()
        self.client: Optional[embps.Client] = client
        self.table = table
        self.spec = self._describe()
        self._set_shape()
        self.padding_idx = self._padding(padding_idx)
        if max_norm is not None and self.spec["optimizer"] != "sgd":
            raise ValueError(
                "max_norm renormalises rows of the table in place at each "
                "lookup; a row written that way restarts its optimizer "
                "state, so embps supports it on sgd tables only, not on "
                "table %r (%s)" % (table, self.spec["optimizer"]))
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)
        self.weight = shared_weight(client, table, self.num_embeddings,
                                    self.embedding_dim)
        self._io: Any = None
        self._prefetched: List[Tuple[Any, ...]] = []
        self.prefetch_hits = 0
        self.prefetch_misses = 0

    # ---- nn.Embedding's attributes
    def _set_shape(self) -> None:
        self.num_embeddings: Optional[int] = \
            None if self.spec["dynamic"] else int(self.spec["rows"])
        self.embedding_dim: int = int(self.spec["dim"])

    @property
    def dim(self) -> int:
        """embedding_dim (the table's dim)."""
        return self.embedding_dim

    @property
    def padding_id(self) -> Optional[int]:
        """The padding id: the table's, or the module's padding_idx."""
        return self.padding_idx

    def _padding(self, padding_idx: Optional[int]) -> Optional[int]:
        """The module's padding id: padding_idx as nn.Embedding reads it
        (negative counts from the end of a fixed-size table), else the
        table's own padding id."""
        table_pad = self.spec["padding_id"] if self.spec["has_padding"] \
            else None
        if padding_idx is None:
            return table_pad
        p = int(padding_idx)
        n = self.num_embeddings
        if n is not None:
            if not -n <= p < n:
                raise InvalidPaddingIdx(
                    "padding_idx must be within num_embeddings: %d is "
                    "outside [-%d, %d) of table %r" % (p, n, n, self.table))
            p = p + n if p < 0 else p
        if table_pad is not None and table_pad != p:
            raise ValueError("table %r has padding id %d; padding_idx=%d "
                             "differs" % (self.table, table_pad, p))
        return p

    def extra_repr(self) -> str:
        s = "table=%r, num_embeddings=%s, embedding_dim=%d, optimizer=%s" % (
            self.table, self.num_embeddings, self.embedding_dim,
            self.spec["optimizer"])
        if self.padding_idx is not None:
            s += ", padding_idx=%d" % self.padding_idx
        if self.max_norm is not None:
            s += ", max_norm=%g" % self.max_norm
        return s

    # ---- making tables
    @classmethod
    def _create(cls, client: "embps.Client", name: str,
                num_embeddings: Optional[int], embedding_dim: int,
                padding_idx: Optional[int], optimizer: str, init: str,
                exist_ok: bool, module_args: Dict[str, Any],
                table_args: Dict[str, Any]) -> "RemoteTable":
        if padding_idx is not None and num_embeddings is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise InvalidPaddingIdx(
                    "padding_idx must be within num_embeddings: %d is "
                    "outside [-%d, %d)" % (padding_idx, num_embeddings,
                                          num_embeddings))
            padding_idx %= num_embeddings
        client.create_table(name, embedding_dim, rows=num_embeddings,
                            dynamic=num_embeddings is None,
                            optimizer=optimizer, init=init,
                            padding_id=padding_idx, exist_ok=exist_ok,
                            **table_args)
        return cls(client, name, **module_args)

    @classmethod
    def _from_pretrained(cls, embeddings: Any, freeze: bool,
                         client: "embps.Client", name: str,
                         module_args: Dict[str, Any],
                         table_args: Dict[str, Any]) -> "RemoteTable":
        """Creates table `name` of embeddings.shape (or, when it exists with
        that shape, overwrites its rows; optimizer state restarts), writes
        the rows, returns a module on it, frozen if freeze."""
        w = torch.as_tensor(embeddings)
        if w.dim() != 2:
            raise ValueError("Embeddings parameter is expected to be "
                             "2-dimensional, not of shape %s"
                             % (tuple(w.shape),))
        rows, dim, dtype = int(w.shape[0]), int(w.shape[1]), w.dtype
        w = np.ascontiguousarray(w.detach().to("cpu", torch.float32).numpy())
        try:
            have: Optional[Dict[str, Any]] = client.describe(name)
        except embps.TableNotFound:
            have = None
        if have is None:
            client.create_table(name, dim, rows=rows, **table_args)
        else:
            if have["dynamic"] or have["rows"] != rows or have["dim"] != dim:
                raise ValueError(
                    "from_pretrained: table %r exists as %s, not [%d, %d]"
                    % (name, "a dynamic table of dim %d" % have["dim"]
                       if have["dynamic"] else "[%d, %d]" % (have["rows"],
                                                             have["dim"]),
                       rows, dim))
            want = dict(table_args, rows=rows, dim=dim)
            if "init" in want:
                want["init"], want["init_value"] = embps.parse_init(
                    want["init"], want.pop("init_value", None))
            diff = embps.spec_differences(want, have)
            if diff:
                raise embps.TableExists(
                    embps.EMBPS_EEXIST, "from_pretrained: table %r exists "
                    "with another spec: %s" % (name, "; ".join(diff)))
        client.write_rows(name, np.arange(rows), w)
        m = cls(client, name, **module_args)
        m.weight.requires_grad_(not freeze)
        if dtype.is_floating_point and dtype != torch.float32:
            m.to(dtype)  # outputs as the tensor given (storage: float32)
        return m

    def to_local(self) -> torch.nn.Module:
        """A plain torch module (nn.Embedding or nn.EmbeddingBag, with this
        module's options) holding every row of the table as a pull returns
        it now: for serving, or a local copy. Fixed-size tables only (a
        dynamic table has no row count: export it; README, "Export and
        import")."""
        if self.num_embeddings is None:
            raise ValueError(
                "to_local(): table %r is dynamic (any int64 id), so it has "
                "no [rows, dim] matrix; export it (Client.export: ids.npy and "
                "weights.npy) and build the lookup as the README's \"Export "
                "and import\" shows" % self.table)
        w = torch.from_numpy(pull_all(self._client(), self.table,
                                      self.num_embeddings,
                                      self.embedding_dim))
        local = self._local_class.from_pretrained(
            w.to(self.weight.dtype), freeze=not self.weight.requires_grad,
            **self._local_args())
        return local.to(self.weight.device)

    def _local_args(self) -> Dict[str, Any]:
        return dict(padding_idx=self.padding_idx, max_norm=self.max_norm,
                    norm_type=self.norm_type,
                    scale_grad_by_freq=self.scale_grad_by_freq,
                    sparse=self.sparse)

    def _module_args(self) -> Dict[str, Any]:
        """The constructor arguments that make another module like this
        one (on another table)."""
        return dict(max_norm=self.max_norm, norm_type=self.norm_type,
                    scale_grad_by_freq=self.scale_grad_by_freq,
                    sparse=self.sparse)

    # ---- copies
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        raise TableCopyError(
            "copy.deepcopy of %s on embps table %r (which AveragedModel and "
            "EMA helpers do): its rows live on the servers, so a deep copy "
            "would either share them (an 'average' or 'best' model that "
            "silently follows training) or copy the whole table. Choose: "
            "module.copy_table(new_name) for a module on a copy of the table "
            "(rows and optimizer state, copied on the servers' side), "
            "module.to_local() for a local module with the current rows "
            "(fixed-size tables), or %s(client, %r) for another module on "
            "the same table" % (type(self).__name__, self.table,
                                type(self).__name__, self.table))

    def copy_table(self, name: str) -> "RemoteTable":
        """A module like this one on a new table `name` holding a copy of
        this table: spec, every row and the optimizer state (an export
        with state imported under the new name; rows never pushed read the
        same, from the same seed). Refuses an existing `name`."""
        client = self._client()
        try:
            client.describe(name)
            raise embps.TableExists(embps.EMBPS_EEXIST,
                                    "copy_table: table %r exists" % name)
        except embps.TableNotFound:
            pass
        tmp = tempfile.mkdtemp(prefix="embps-copy-")
        try:
            client.export(self.table, os.path.join(tmp, "t"),
                          with_state=True)
            client.import_(name, os.path.join(tmp, "t"), with_state=True,
                           create=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        other = type(self)(client, name, padding_idx=self.padding_idx,
                           **self._module_args())
        w = self.weight
        other.weight.requires_grad_(w.requires_grad)
        other._apply(lambda t: t.to(w.device, w.dtype))
        return other.train(self.training)

    # ---- pickling, state dicts: the table's name and spec, no rows
    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(client=None, _io=None, _prefetched=[])
        return state

    def get_extra_state(self) -> Dict[str, Any]:
        state = {"table": self.table, "spec": dict(self.spec)}
        if self.client is not None:
            state["step"] = self.client.describe(self.table)["step"]
        return state

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        """Points the module at the saved table; with a client attached,
        the table must exist with the saved dim, and a table whose step
        moved on since the save gets a warning: a state dict names a table,
        it does not hold its rows."""
        self.table, self.spec = state["table"], dict(state["spec"])
        self._set_shape()
        if self.client is not None:
            have = self._check_table()
            step = state.get("step")
            if step is not None and have["step"] != step:
                warnings.warn(
                    "embps table %r was at step %d when this state dict was "
                    "saved and is at step %d now: loading points the module "
                    "at the table, whose rows are those of now (a state dict "
                    "holds no rows; for a copy of them use copy_table() or "
                    "to_local())" % (self.table, step, have["step"]),
                    UserWarning, stacklevel=4)
            self._bind_weight()

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        destination[prefix + "_extra_state"] = self.get_extra_state()

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str,
                              local_metadata: Any, strict: bool,
                              missing_keys: List[str],
                              unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        """Our own state dict (_extra_state: the table), or a local
        module's (weight: [rows, dim], written into the table, rows and
        optimizer state restarting as after an import)."""
        extra, wkey = prefix + "_extra_state", prefix + "weight"
        if extra in state_dict:
            self.set_extra_state(state_dict[extra])
        if wkey in state_dict:
            self._load_local_weight(state_dict[wkey], wkey, error_msgs)
        elif extra not in state_dict and strict:
            missing_keys.append(extra)
        for k in state_dict:
            rest = k[len(prefix):]
            if k.startswith(prefix) and "." not in rest and \
                    rest not in ("weight", "_extra_state"):
                unexpected_keys.append(k)

    def _load_local_weight(self, w: Any, key: str,
                           error_msgs: List[str]) -> None:
        want = (self.num_embeddings, self.embedding_dim)
        if self.num_embeddings is None:
            error_msgs.append("%s: table %r is dynamic: a [rows, dim] weight "
                              "has no ids (import ids.npy and weights.npy "
                              "instead)" % (key, self.table))
        elif tuple(w.shape) != want:
            error_msgs.append("size mismatch for %s: copying a param with "
                              "shape %s, the table %r has %s"
                              % (key, tuple(w.shape), self.table, want))
        else:
            self._client().write_rows(
                self.table, np.arange(self.num_embeddings),
                w.detach().to("cpu", torch.float32).numpy())

    def _describe(self) -> Dict[str, Any]:
        d = self._client().describe(self.table)
        return {k: v for k, v in d.items() if k not in _COUNTERS}

    def _check_table(self) -> Dict[str, Any]:
        have = self._client().describe(self.table)
        if have["dim"] != self.embedding_dim:
            raise ValueError("table %r has dim %d on the servers, not %d"
                             % (self.table, have["dim"], self.embedding_dim))
        return have

    def _bind_weight(self) -> None:
        old = self._parameters.get("weight")
        w = shared_weight(self._client(), self.table, self.num_embeddings,
                          self.embedding_dim, like=old)
        if w is not old:
            self.weight = w

    def attach(self, client: "embps.Client") -> "RemoteTable":
        """Gives a module (loaded by torch.load, or made in another process)
        a client; checks that its table exists with its dim."""
        self.client = client
        self._check_table()
        self._bind_weight()
        return self

    def _client(self) -> "embps.Client":
        if self.client is None:
            raise RuntimeError("%s on table %r has no client (it was "
                               "unpickled): call attach(client)"
                               % (type(self).__name__, self.table))
        return self.client

    # ---- dtype and device: of the outputs (storage is the server's)
    def _apply(self, fn: Any) -> "RemoteTable":
        w = self.weight
        with torch.no_grad():
            probe = fn(torch.zeros((), dtype=w.dtype, device=w.device))
        if probe.dtype != w.dtype or probe.device != w.device:
            w.retype(probe.dtype, probe.device)
        return self

    # ---- scripting
    def __prepare_scriptable__(self) -> Any:
        raise RuntimeError(self._jit_message("torch.jit.script"))

    def _jit_message(self, what: str) -> str:
        return ("%s of %s on embps table %r: its forward pulls rows over the "
                "network (Python and libembps), which TorchScript cannot "
                "compile or trace. Script the rest of the model, or use "
                "to_local() (fixed-size tables) for a plain torch module that "
                "scripts" % (what, type(self).__name__, self.table))

    # ---- lookups
    def pull(self, ids: Any) -> torch.Tensor:
        """The rows of ids (any shape) as the table holds them now:
        ids.shape + (dim,), in the module's dtype, recording nothing."""
        ids_t, device = _cpu_ids(ids)
        rows = self._pull_now(ids_t.reshape(-1))
        return torch.from_numpy(rows).to(self.weight.dtype).reshape(
            ids_t.shape + (self.embedding_dim,)).to(device)

    def _pull_now(self, uniq: torch.Tensor) -> np.ndarray:
        if uniq.numel() == 0:
            self._client()
            return np.empty((0, self.embedding_dim), np.float32)
        return self._client().pull(self.table, uniq.numpy())

    def _pull_job(self, uniq: torch.Tensor) -> Any:
        if self._io is not None:
            return self._io.submit(self._pull_now, uniq)
        return None

    def prefetch(self, ids: Any, offsets: Any = None) -> None:
        """Queues the pull of the rows of ids for a later forward on equal
        ids (RemoteOptimizer(..., overlap=True) only; otherwise nothing
        happens and that forward pulls as usual). The two latest
        prefetches are kept; a forward takes the first whose ids equal its
        own (1-D or 2-D alike: offsets play no part) and counts a hit in
        prefetch_hits, else a miss in prefetch_misses."""
        if self._io is None:
            return
        flat = _cpu_ids(ids)[0].reshape(-1)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        self._prefetched = self._prefetched[-1:] + [
            (flat, uniq, inverse, self._pull_job(uniq))]

    def _take_prefetch(self, flat: torch.Tensor) -> Optional[Tuple[Any, ...]]:
        for i, hit in enumerate(self._prefetched):
            if hit[0].shape == flat.shape and torch.equal(hit[0], flat):
                del self._prefetched[i]
                return hit
        return None

    def _lookup(self, flat: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                           Optional[int]]:
        """(uniq, inverse into uniq over flat, rows of uniq in the
        module's dtype — wired to the weight when autograd records —, the
        padding id's position in uniq or None)."""
        if torch.jit.is_tracing():
            raise RuntimeError(self._jit_message("torch.jit.trace"))
        hit = self._take_prefetch(flat) if self._prefetched else None
        if hit is not None:
            _, uniq, inverse, job = hit
            rows_np = job.result()
            self.prefetch_hits += 1
        else:
            if self._io is not None:
                self.prefetch_misses += 1
            uniq, inverse = torch.unique(flat, return_inverse=True)
            job = self._pull_job(uniq)
            rows_np = job.result() if job is not None else \
                self._pull_now(uniq)
        w = self.weight
        rows = torch.from_numpy(rows_np).to(w.dtype)
        if self.max_norm is not None:
            rows = self._renorm(uniq, rows)
        pad = self.padding_idx
        if torch.is_grad_enabled() and w.requires_grad:
            w.drop_grad_if_unmanaged()
            rows = _Lookup.apply(w, rows, uniq, pad)
        pad_pos = None
        if pad is not None:
            at = (uniq == pad).nonzero()
            pad_pos = int(at[0, 0]) if at.numel() else None
        return uniq, inverse, rows, pad_pos

    def _renorm(self, uniq: torch.Tensor, rows: torch.Tensor
                ) -> torch.Tensor:
        """max_norm as torch.embedding_renorm_ does it, in the module's
        dtype: each looked-up row of norm above max_norm is scaled to it
        (by max_norm / (norm + 1e-7)), in the table too (written back as
        float32, in order with pushes). A row that float32 rounding would
        take back above max_norm (a float64 module's) is shrunk by one
        float32 step per element, so the table keeps the bound; the output
        is the row as stored."""
        with torch.no_grad():
            norms = [float(r.norm(self.norm_type)) for r in rows]
            over = [i for i, n in enumerate(norms) if n > self.max_norm]
            if not over:
                return rows
            rows = rows.clone()
            for i in over:
                rows[i] *= self.max_norm / (norms[i] + 1e-7)
                if rows.dtype != torch.float32:
                    r = rows[i].to(torch.float32)
                    if float(r.to(rows.dtype).norm(self.norm_type)) > \
                            self.max_norm:
                        r = torch.nextafter(r, torch.zeros_like(r))
                    rows[i] = r.to(rows.dtype)
            idx = torch.tensor(over, dtype=torch.long)
            ids = uniq[idx].numpy()
            vals = rows[idx].to(torch.float32).numpy()
            write = (lambda: self._client().write_rows(self.table, ids,
                                                       vals))
            if self._io is not None:
                self._io.submit(write).result()
            else:
                write()
        return rows
