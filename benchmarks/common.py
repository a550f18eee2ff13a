"""Shared helpers for the benchmarks: interleaved timing, tensor-memory accounting, machine facts.

Timing: variants run in a freshly shuffled order every round (seeded), so a burst of load from
other jobs hits all of them alike and each variant follows every other one equally often (a
fixed cyclic rotation would always run a variant right after the same neighbour, whose cache and
TLB debris it would pay for every time); we report medians of wall and of process CPU time (the
CPU figure is the steadier one on a shared machine) and the load average before and after.

Memory: the CPU allocator has no peak counter (``tracemalloc`` does not see torch, and RSS mixes
in allocator caching and other objects of the process). :class:`TensorBytes` counts the bytes of
every tensor storage created by an ATen op while it is active (a ``TorchDispatchMode``, which also
sees the backward pass and optimizer kernels) and subtracts them when the storage is freed; its
peak plus the resident bytes of the state that existed before (:func:`storage_bytes`) is the peak
tensor memory of a step. It does not see scratch buffers a kernel allocates and frees internally,
nor allocator fragmentation, so it is a lower bound on what the process needs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import statistics
import time
import warnings
import weakref
from typing import Callable, Iterable

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
warnings.filterwarnings("ignore", message=".*apex.*")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

MIB = 1 << 20


def machine() -> dict:
    """What the figures ran on: date, CPU count, torch threads, versions, load average."""
    import megatron.core

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "megatron_core": getattr(megatron.core, "__version__", "?"),
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, seed: int = 0) -> dict:
    """Run every function ``warmup + repeats`` times, in a new random order each round.

    Returns ``{name: {"wall_s": median, "cpu_s": median, "wall_min_s": min}}`` plus
    ``"load_average": [before, after]`` (1-minute load average).
    """
    names = list(fns)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    load_before = os.getloadavg()[0]
    order = random.Random(seed)
    for r in range(warmup + repeats):
        for name in order.sample(names, len(names)):
            _sync()
            t, c = time.perf_counter(), time.process_time()
            fns[name]()
            _sync()
            if r >= warmup:
                walls[name].append(time.perf_counter() - t)
                cpus[name].append(time.process_time() - c)
    out = {
        n: {"wall_s": statistics.median(walls[n]), "cpu_s": statistics.median(cpus[n]), "wall_min_s": min(walls[n])}
        for n in names
    }
    out["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return out


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and aliases counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    """State tensors of a torch optimizer or a megatron (chained / FP32) optimizer wrapper."""
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    tensors = []
    for opt in inner:
        torch_opt = getattr(opt, "optimizer", opt)
        for state in torch_opt.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return tensors


def gradient_tensors(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    """``.grad`` and megatron's ``.main_grad`` (views into DDP's contiguous grad buffer)."""
    grads = []
    for m in modules:
        for p in m.parameters():
            grads += [g for g in (p.grad, getattr(p, "main_grad", None)) if g is not None]
    return grads


class TensorBytes(TorchDispatchMode):
    """Live and peak bytes of tensor storages created by ops while active (see module doc)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._live_keys: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, nbytes = st.data_ptr(), st.nbytes()
            if key in inputs or key in self._live_keys or nbytes == 0:
                continue  # a view, an in-place result, or a storage we already count
            self._live_keys.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, key, nbytes)
        return out

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._live_keys:
            self._live_keys.discard(key)
            self.live -= nbytes


def emit(result: dict, as_json: bool, table: Callable[[dict], str]) -> None:
    """One JSON object on stdout (``--json``), else a human-readable table."""
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(table(result))
