"""Random streams: megatron's seeding, an RNG detour, and initialisation that does not depend on
the parallel layout.

* :func:`seed_streams` seeds every stream megatron uses, as Megatron-LM's ``_set_random_seed``
  does (torch's CPU and CUDA generators, and the tracker's data-parallel, tensor-parallel and
  expert streams, the tensor-parallel one offset by the TP rank).
* :func:`seeded_streams` runs a block on freshly seeded streams and then restores every stream,
  so what the block draws does not shift what comes after it; it and the checkpoints share one
  snapshot of the streams (:func:`capture_rng_state` / :func:`restore_rng_state`).
* :func:`layer_init_seed` names the seed of one global transformer layer: building each layer
  inside ``seeded_streams(layer_init_seed(seed, n))`` gives global layer ``n`` the same initial
  weights whatever pipeline stage builds it (PP 1, 2, 4 or interleaved), and with
  ``use_cpu_initialization`` (the CPU path) whatever the TP size too — megatron then draws each
  full weight and slices it. On GPUs megatron draws TP-sharded weights on each TP rank's own
  stream, so there init depends on TP (as in Megatron-LM) but not on PP.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import get_cuda_rng_tracker

_DETOUR_SEED_OFFSET = 7919  # the learned input table's streams (prime: no layer seed equals it)
_LAYER_SEED_STRIDE = 1009  # global layer n initialises from seed + 1009·n
PIPELINE_STAGE_SEED_STRIDE = 100  # runtime streams of pipeline stage p: seed + 100·p (Megatron-LM)


def seed_streams(seed: int) -> None:
    """Seed torch's generators and megatron's tracked streams from ``seed``."""
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def seed_host_streams(seed: int) -> None:
    """Python's ``random`` and numpy's global generator, as Megatron-LM's ``_set_random_seed`` seeds them with
    the runtime seed: the rerun state machine's error injection draws from ``random``, so a run's injected
    faults (``--error-injection-rate``) come at the same calls every time."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)


def layer_init_seed(seed: int, global_layer_number: int) -> int:
    """The seed global transformer layer ``global_layer_number`` (1-based) is initialised from."""
    return seed + _LAYER_SEED_STRIDE * global_layer_number


def capture_rng_state() -> dict:
    """The one snapshot of every stream megatron draws from on this rank: torch's CPU generator,
    the CUDA generator of this rank's device, and the RNG tracker's named states with their seeds.
    Checkpoints save it (per rank), :func:`seeded_streams` takes one around its body (model init,
    the learned table's detour); :func:`restore_rng_state` puts it back."""
    tracker = get_cuda_rng_tracker()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in tracker.get_states().items()},
        "tracker_seeds": sorted(tracker.seeds_),
    }


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tracker = get_cuda_rng_tracker()
    tracker.set_states(state["tracker"])
    if "tracker_seeds" in state:  # checkpoints of earlier versions kept the states only
        tracker.seeds_ = set(state["tracker_seeds"])


@contextlib.contextmanager
def seeded_streams(seed: int):
    """Run the body on every stream seeded from ``seed``, then restore every stream as it was.
    (``torch.manual_seed`` also reseeds the generators of other CUDA devices, which this rank never
    draws from.)"""
    saved = capture_rng_state()
    try:
        seed_streams(seed)
        yield
    finally:
        restore_rng_state(saved)


def rng_detour(seed_offset: int = _DETOUR_SEED_OFFSET):
    """Streams derived from the current seed for the body, then every stream restored: building
    the learned input table inside it leaves the backbone's init unchanged, so learned and
    fixed-code models built from one seed get bit-identical backbones."""
    return seeded_streams(torch.initial_seed() + seed_offset)
