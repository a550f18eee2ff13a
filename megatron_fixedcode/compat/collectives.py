"""Count the collective calls (and bytes) a piece of code issues, by wrapping the methods of
torch's ProcessGroup class — every torch.distributed collective, whatever alias called it."""

from __future__ import annotations

import collections
import contextlib

import torch

_ProcessGroup = torch._C._distributed_c10d.ProcessGroup
_COLLECTIVES = (
    "broadcast",
    "allreduce",
    "allreduce_coalesced",
    "reduce",
    "allgather",
    "all_gather_single",
    "_allgather_base",
    "allgather_coalesced",
    "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
)


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


@contextlib.contextmanager
def count_collectives():
    """Yields a Counter of ``{op: calls}``, ``{op + ':bytes': bytes of the first tensor argument}`` and
    ``{'device:' + type: tensors}`` for every tensor argument (see :func:`tensor_devices`)."""
    counts: collections.Counter = collections.Counter()
    # Keep the raw class attributes: getattr() would return unbound builtins that lose `self`.
    originals = {name: _ProcessGroup.__dict__[name] for name in _COLLECTIVES if name in _ProcessGroup.__dict__}

    def wrap(name, method):
        bound = method.__get__  # pybind methods are descriptors

        def counted(self, *args, **kwargs):
            counts[name] += 1
            counts[f"{name}:bytes"] += _tensor_bytes(args[0]) if args else 0
            for tensor in _tensors(list(args)):
                counts[f"device:{tensor.device.type}"] += 1
            return bound(self, type(self))(*args, **kwargs)

        return counted

    for name, method in originals.items():
        setattr(_ProcessGroup, name, wrap(name, method))
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(_ProcessGroup, name, method)


def num_collective_calls(counts: collections.Counter) -> int:
    return sum(v for k, v in counts.items() if not k.endswith(":bytes") and not k.startswith("device:"))


def tensor_devices(counts: collections.Counter) -> dict[str, int]:
    """``{device type: tensors handed to collectives}`` from a :func:`count_collectives` Counter."""
    return {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("device:")}
