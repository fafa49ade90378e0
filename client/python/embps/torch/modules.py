"""RemoteEmbedding and RemoteEmbeddingBag: nn.Embedding and
nn.EmbeddingBag whose weight is an embps table (see table.py for what
they share). Each forward looks the distinct ids up once and expands the
rows with torch's own F.embedding / F.embedding_bag, so outputs,
per_sample_weights gradients, padding, scale_grad_by_freq and the
validation of bag offsets are torch's; mode "sqrtn" (TensorFlow's
combiner, which torch lacks) runs libembps's bag kernels instead.
"""
from typing import Any, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

import embps

from .table import RemoteTable, _cpu_ids

__all__ = ["RemoteEmbedding", "RemoteEmbeddingBag"]


class RemoteEmbedding(RemoteTable):
    """nn.Embedding whose weight is the embps table `table`: ids of any
    shape (tensor, list or array) give ids.shape + (embedding_dim,), on the
    ids' device, in the module's dtype (float32 unless .to(dtype),
    .double(), .half()).

    padding_idx: the table's padding id by default; another id (negative:
    counted from the end of a fixed-size table) makes the module leave that
    id's gradient out, as nn.Embedding does. max_norm (sgd tables only),
    norm_type and scale_grad_by_freq are nn.Embedding's. sparse is
    accepted and recorded: the gradient is always sparse (.weight.grad is
    nn.Embedding(sparse=True)'s)."""

    _local_class = torch.nn.Embedding

    @classmethod
    def create(cls, client: "embps.Client", name: str,
               num_embeddings: Optional[int], embedding_dim: int,
               padding_idx: Optional[int] = None, optimizer: str = "sgd",
               init: str = "normal:1", exist_ok: bool = True,
               module_args: Optional[Dict[str, Any]] = None,
               **table_args: Any) -> "RemoteEmbedding":
        """Creates the table (nn.Embedding's defaults: init N(0, 1), no
        padding; num_embeddings=None makes a dynamic table of any int64 id)
        unless it exists with the same spec (exist_ok; a different spec
        raises TableExists naming the differences), then returns a module on
        it. padding_idx becomes the table's padding id (negative: from the
        end). table_args go to Client.create_table (lr, seed, dtype, ...)."""
        return cls._create(client, name, num_embeddings, embedding_dim,
                           padding_idx, optimizer, init, exist_ok,
                           dict(module_args or {}), table_args)

    @classmethod
    def from_pretrained(cls, embeddings: Any, freeze: bool = True,
                        padding_idx: Optional[int] = None,
                        max_norm: Optional[float] = None,
                        norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False,
                        sparse: bool = False, *, client: "embps.Client",
                        name: str, **table_args: Any) -> "RemoteEmbedding":
        """nn.Embedding.from_pretrained on table `name` of client: creates
        it ([rows, dim] of embeddings; table_args as Client.create_table,
        optimizer sgd by default) or, when it exists with that shape and
        spec, overwrites its rows (their optimizer state restarts), writes
        every row, and returns a module on it, frozen (requires_grad False)
        if freeze. padding_idx is the module's: the padding row keeps the
        value given, and gets no gradient."""
        return cls._from_pretrained(
            embeddings, freeze, client, name,
            dict(padding_idx=padding_idx, max_norm=max_norm,
                 norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq,
                 sparse=sparse), table_args)

    def forward(self, input: Any) -> torch.Tensor:
        ids, device = _cpu_ids(input)
        _, inverse, rows, pad_pos = self._lookup(ids.reshape(-1))
        out = F.embedding(inverse, rows, padding_idx=pad_pos,
                          scale_grad_by_freq=self.scale_grad_by_freq)
        return out.reshape(ids.shape + (self.embedding_dim,)).to(device)


class _SqrtnBag(torch.autograd.Function):
    """mode "sqrtn" (sum / sqrt(number of ids), TensorFlow's combiner)
    through libembps's embps_bag_forward and embps_bag_backward, over
    positions into the unique rows, in float32."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, inverse: torch.Tensor,
                offsets: np.ndarray, pad_pos: Optional[int]) -> torch.Tensor:
        pos = inverse.numpy()
        r = rows.detach().to(torch.float32).numpy()
        out = embps.bag_forward(r[pos], pos, offsets, None, "sqrtn", pad_pos)
        ctx.save_for_backward(rows)
        ctx.args = (pos, offsets, pad_pos)
        return torch.from_numpy(out).to(rows.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        rows, = ctx.saved_tensors
        pos, offsets, pad_pos = ctx.args
        g = grad_out.detach().to(torch.float32).contiguous().numpy()
        idx, vals = embps.bag_backward(g, pos, offsets, None, "sqrtn",
                                       pad_pos)
        grad_rows = torch.zeros(rows.shape, dtype=torch.float32).index_add_(
            0, torch.from_numpy(idx), torch.from_numpy(vals))
        return grad_rows.to(rows.dtype), None, None, None


class BagIndexError(embps.OutOfRange, RuntimeError):
    """An id outside the table in a bag (nn.EmbeddingBag raises
    RuntimeError, nn.Embedding IndexError: this is both)."""


class RemoteEmbeddingBag(RemoteTable):
    """nn.EmbeddingBag whose weight is the embps table `table`.

    mode: sum, mean, max (as nn.EmbeddingBag: torch's F.embedding_bag on
    the pulled rows), or sqrtn (TensorFlow's combiner: sum / sqrt(number of
    ids), libembps's kernels). Input as nn.EmbeddingBag: a 2-D (bags x ids)
    tensor, or a 1-D tensor with offsets (the start of each bag;
    include_last_offset=True: n_bags + 1 entries). per_sample_weights: sum
    mode only, of the input's shape and the module's dtype, as in PyTorch.
    padding_idx, max_norm (sgd tables only), norm_type,
    scale_grad_by_freq, sparse: as RemoteEmbedding."""

    _local_class = torch.nn.EmbeddingBag

    def __init__(self, client: "embps.Client", table: str,
                 mode: str = "mean", include_last_offset: bool = False,
                 padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = True
                 ) -> None:
        if mode not in ("sum", "mean", "max", "sqrtn"):
            raise ValueError("mode has to be one of sum, mean, max or sqrtn, "
                             "not %r" % (mode,))
        super().__init__(client, table, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse)
        self.mode, self.include_last_offset = mode, include_last_offset

    @classmethod
    def create(cls, client: "embps.Client", name: str,
               num_embeddings: Optional[int], embedding_dim: int,
               mode: str = "mean", include_last_offset: bool = False,
               padding_idx: Optional[int] = None, optimizer: str = "sgd",
               init: str = "normal:1", exist_ok: bool = True,
               module_args: Optional[Dict[str, Any]] = None,
               **table_args: Any) -> "RemoteEmbeddingBag":
        """RemoteEmbedding.create for bags (mode, include_last_offset)."""
        args = dict(module_args or {}, mode=mode,
                    include_last_offset=include_last_offset)
        return cls._create(client, name, num_embeddings, embedding_dim,
                           padding_idx, optimizer, init, exist_ok, args,
                           table_args)

    @classmethod
    def from_pretrained(cls, embeddings: Any, freeze: bool = True,
                        max_norm: Optional[float] = None,
                        norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, mode: str = "mean",
                        sparse: bool = False,
                        include_last_offset: bool = False,
                        padding_idx: Optional[int] = None, *,
                        client: "embps.Client", name: str,
                        **table_args: Any) -> "RemoteEmbeddingBag":
        """nn.EmbeddingBag.from_pretrained on table `name` (as
        RemoteEmbedding.from_pretrained)."""
        return cls._from_pretrained(
            embeddings, freeze, client, name,
            dict(mode=mode, include_last_offset=include_last_offset,
                 padding_idx=padding_idx, max_norm=max_norm,
                 norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq,
                 sparse=sparse), table_args)

    def _module_args(self) -> Dict[str, Any]:
        return dict(super()._module_args(), mode=self.mode,
                    include_last_offset=self.include_last_offset)

    def _local_args(self) -> Dict[str, Any]:
        if self.mode == "sqrtn":
            raise ValueError("to_local(): nn.EmbeddingBag has no mode "
                             "'sqrtn'")
        return dict(super()._local_args(), mode=self.mode,
                    include_last_offset=self.include_last_offset)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", mode=%s" % self.mode

    def _check(self, ids: torch.Tensor, offsets: Any,
               psw: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The checks nn.EmbeddingBag makes before touching rows (so a bad
        call pulls nothing), with its exception types; offsets as an int64
        CPU tensor or None."""
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError("if input is 2D, then offsets has to be "
                                 "None, as input is treated is a mini-batch "
                                 "of fixed length sequences")
        elif ids.dim() == 1:
            if offsets is None:
                raise ValueError("offsets has to be a 1D Tensor but got None")
            offsets = _cpu_ids(offsets)[0]
            if offsets.dim() != 1:
                raise ValueError("offsets has to be a 1D Tensor")
        else:
            raise ValueError("input has to be 1D or 2D Tensor, but got "
                             "Tensor of dimension %d" % ids.dim())
        if psw is not None:
            if self.mode != "sum":
                raise NotImplementedError(
                    "embedding_bag: per_sample_weights was not None. "
                    "per_sample_weights is only supported for mode='sum' "
                    "(got mode=%r)" % self.mode)
            if psw.shape != ids.shape:
                raise ValueError("embedding_bag: If per_sample_weights (%s) "
                                 "is not None, then it must have the same "
                                 "shape as the input (%s)"
                                 % (tuple(psw.shape), tuple(ids.shape)))
            if psw.dtype != self.weight.dtype:
                raise RuntimeError(
                    "embedding_bag: expected per_sample_weights to have the "
                    "same type as the weight (%s), got %s: cast them, or "
                    "cast the module (.to(dtype))"
                    % (self.weight.dtype, psw.dtype))
        return offsets

    @staticmethod
    def _sqrtn_offsets(ids: torch.Tensor,
                       offsets: Optional[torch.Tensor]) -> np.ndarray:
        """C offsets (n_bags + 1 entries) for libembps's bag kernels, from
        the starts of the bags (None: 2-D input)."""
        if offsets is None:
            n_bags, length = ids.shape
            return np.arange(n_bags + 1, dtype=np.uintp) * length
        offs = np.append(offsets.numpy(), ids.numel()).astype(np.int64)
        if offs[0] != 0 or np.any(offs[1:] < offs[:-1]):
            raise RuntimeError("offsets must start at 0, not decrease and "
                               "not pass the number of ids (%d)" % ids.numel())
        return offs.astype(np.uintp)

    def forward(self, input: Any, offsets: Any = None,
                per_sample_weights: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        ids, device = _cpu_ids(input)
        offsets = self._check(ids, offsets, per_sample_weights)
        if offsets is not None and self.include_last_offset:
            # n_bags + 1 entries: the last bag runs to the end of the input
            # (what later torch versions do; torch 1.13 with padding_idx
            # reads past the offsets, pytorch/pytorch#89677)
            if offsets.numel() < 1:
                raise ValueError("include_last_offset: offsets needs at "
                                 "least one entry")
            offsets = offsets[:-1]
        try:
            _, inverse, rows, pad_pos = self._lookup(ids.reshape(-1))
        except embps.OutOfRange as e:
            raise BagIndexError(e.code, e.message) from None
        if offsets is not None and offsets.numel() == 0:
            out = rows.new_zeros((0, self.embedding_dim))
        elif self.mode == "sqrtn":
            out = _SqrtnBag.apply(rows, inverse,
                                  self._sqrtn_offsets(ids, offsets), pad_pos)
        else:
            psw = None if per_sample_weights is None else \
                per_sample_weights.to("cpu")
            if psw is not None and psw.requires_grad and \
                    not rows.requires_grad:
                # torch 1.13's embedding_bag fails an internal assert when
                # only per_sample_weights need a gradient
                rows = rows.detach().requires_grad_()
            out = F.embedding_bag(
                inverse.reshape(ids.shape), rows, offsets,
                mode=self.mode, per_sample_weights=psw,
                padding_idx=pad_pos,
                scale_grad_by_freq=self.scale_grad_by_freq)
        return out.to(device)
