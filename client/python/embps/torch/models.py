"""Helpers over a model's tree of modules: the remote modules in it,
giving them a client after unpickling, and hiding their weights from
DistributedDataParallel."""
from typing import Any, Iterable, List, Union

import torch

from .table import RemoteTable
from .weight import RemoteWeight

__all__ = ["remote_modules", "attach", "ddp_ignore"]


def remote_modules(modules: Union[torch.nn.Module, Iterable[Any]]
                   ) -> List[RemoteTable]:
    """The RemoteEmbedding/RemoteEmbeddingBag modules of a module tree (or
    of an iterable of modules and trees), each once."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    out, seen = [], set()
    for root in modules:
        for m in root.modules():
            if isinstance(m, RemoteTable) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def attach(model: torch.nn.Module, client: Any) -> torch.nn.Module:
    """Gives every remote module of model the client (after torch.load, or
    in a new process); returns model."""
    for m in remote_modules(model):
        m.attach(client)
    return model


def ddp_ignore(model: torch.nn.Module) -> torch.nn.Module:
    """Tells DistributedDataParallel to leave the tables' weights of model
    alone (call before wrapping model): DDP would broadcast and all-reduce
    them, but they hold no values and their gradients go to the servers,
    each worker's push merged there (synchronous tables average the
    workers' pushes as DDP averages gradients). Returns model."""
    names = [n for n, p in model.named_parameters()
             if isinstance(p, RemoteWeight)]
    torch.nn.parallel.DistributedDataParallel.\
        _set_params_and_buffers_to_ignore_for_model(model, names)
    return model
