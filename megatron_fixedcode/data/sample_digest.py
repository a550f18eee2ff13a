"""A step's digest of the samples it trained on: the same at any data-parallel size, so a run relaunched on fewer
nodes with the same global batch (issue 62) can show, step by step, that it reads what the full-size run read.

Each sample of a step contributes a 64-bit term of where it sits (its microbatch: which ``micro_batch_size`` run
of the step's global batch; its row in it), its global stream index and a hash of what the loss reads of it
(tokens, labels, loss mask). Terms add modulo 2**64, so the sum does not depend on which rank read which
microbatch; another sample, other tokens, a sample moved, or another microbatch size change it. A rank's sum rides in the step's loss all-reduce (float64, training/trainer.py) as three 22-bit lanes:
each lane's sum stays exact below 2**53 for up to 2**31 ranks, and the lanes give back the sum modulo 2**64.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable

import torch

DIGEST_KEY = "sample_digest"  # a microbatch's entry: its samples' sum, as a 0-dim int64 tensor (two's complement)
CONTENT_KEYS = ("tokens", "labels", "loss_mask")
MASK = (1 << 64) - 1
LANE_BITS, LANES = 22, 3  # 3 x 22 >= 64


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def sample_term(microbatch: int, row: int, index: int, content: int) -> int:
    """One sample's 64-bit term: its microbatch in the step and row in it, which stream sample it is, what it holds."""
    return _hash64(struct.pack("<qqqQ", microbatch, row, index, content & MASK))


def combine(parts: Iterable[int]) -> int:
    """Terms or partial sums added modulo 2**64: any grouping of the same terms gives the same value."""
    return sum(parts) & MASK


def content_hash(batch: dict[str, torch.Tensor], row: int) -> int:
    """64-bit hash of sample ``row`` of a collated microbatch: the bytes of its tokens, labels and loss mask."""
    h = hashlib.blake2b(digest_size=8)
    for key in CONTENT_KEYS:
        h.update(batch[key][row].contiguous().numpy().tobytes())
    return int.from_bytes(h.digest(), "little")


def microbatch_digest(batch: dict[str, torch.Tensor], indices: list[int], global_batch_size: int) -> int:
    """The sum of the terms of a microbatch read at stream ``indices`` (step n reads [n·G, (n+1)·G), so a
    microbatch's place in its step is its first index modulo G, over the micro batch size)."""
    microbatch = indices[0] % global_batch_size // len(indices)
    return combine(sample_term(microbatch, row, i, content_hash(batch, row)) for row, i in enumerate(indices))


def with_digest(batch: dict[str, torch.Tensor], indices: list[int], global_batch_size: int) -> dict:
    """``batch`` with its :data:`DIGEST_KEY` entry (a tensor, so pinning and moving the dict still work)."""
    value = microbatch_digest(batch, indices, global_batch_size)
    return {**batch, DIGEST_KEY: torch.tensor(value - (1 << 64) if value >> 63 else value, dtype=torch.int64)}


def split_digests(microbatches: list[dict]) -> tuple[list[dict], int | None]:
    """(the microbatches without their digest entries, the sum of those entries; None when none carries one)."""
    parts = [int(b[DIGEST_KEY]) for b in microbatches if DIGEST_KEY in b]
    stripped = [{k: v for k, v in b.items() if k != DIGEST_KEY} for b in microbatches]
    return stripped, (combine(parts) if parts else None)


def to_lanes(value: int) -> list[float]:
    """``value`` (mod 2**64) as 22-bit lanes, to be summed over ranks in float64 exactly."""
    value &= MASK
    return [float((value >> (LANE_BITS * k)) & ((1 << LANE_BITS) - 1)) for k in range(LANES)]


def from_lanes(lanes: Iterable[float]) -> int:
    """The sum modulo 2**64 of the values whose lanes were summed."""
    return combine(int(lane) << (LANE_BITS * k) for k, lane in enumerate(lanes))


def as_hex(value: int) -> str:
    """The metrics.jsonl form: 16 hex digits."""
    return f"{value & MASK:016x}"
