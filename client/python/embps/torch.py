"""PyTorch helpers for embps: a table on the servers used like an
nn.Embedding whose gradient goes back as IndexedSlices.

    emb = RemoteEmbedding(client, "users")
    x = emb(ids)                 # pulls the batch's unique rows once
    loss = model(x).sum(); loss.backward()
    emb.push_gradients()         # one sparse push per forward: rows x dim

Forward pulls each distinct id once and expands on the worker, so the
gradient of the pulled rows is already merged (scatter-add over repeats),
exactly what torch.nn.Embedding(sparse=True) produces after coalesce().
"""
import numpy as np
import torch

__all__ = ["RemoteEmbedding", "sparse_grad_to_slices", "push_sparse_grad"]


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


class RemoteEmbedding(torch.nn.Module):
    """An embedding table that lives on embps servers."""

    def __init__(self, client, table):
        super().__init__()
        self.client, self.table = client, table
        self.dim = client.dim(table)
        self._pulled = []

    def forward(self, ids):
        ids = torch.as_tensor(ids, dtype=torch.int64)
        uniq, inverse = torch.unique(ids, return_inverse=True)
        rows = torch.from_numpy(self.client.pull(self.table, uniq.numpy()))
        rows.requires_grad_(True)
        self._pulled.append((uniq, rows))
        return rows[inverse]

    def push_gradients(self, step=None):
        """Pushes the gradient of every forward since the last call."""
        for uniq, rows in self._pulled:
            if rows.grad is not None:
                self.client.push(self.table, uniq.numpy(),
                                 rows.grad.numpy(), step=step)
        self._pulled = []
