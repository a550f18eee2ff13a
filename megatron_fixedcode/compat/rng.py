"""An RNG detour, so that building the learned input table does not shift the backbone's init.

With it, learned and fixed-code models built from the same seed get bit-identical backbone
weights: the input interface is the only difference between the variants.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from megatron.core.tensor_parallel import get_cuda_rng_tracker

_DETOUR_SEED_OFFSET = 7919


@contextlib.contextmanager
def rng_detour(seed_offset: int = _DETOUR_SEED_OFFSET):
    """Run the body on RNG streams derived from the current seed, then restore every stream."""
    tracker = get_cuda_rng_tracker()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    tracker_states = {k: v.clone() for k, v in tracker.get_states().items()}
    tracker_seeds = copy.copy(tracker.seeds_)
    base_seed = torch.initial_seed() + seed_offset
    try:
        torch.manual_seed(base_seed)
        tracker.reset()
        for i, name in enumerate(sorted(tracker_states)):
            tracker.add(name, base_seed + 1 + i)
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        tracker.set_states(tracker_states)
        tracker.seeds_ = tracker_seeds
