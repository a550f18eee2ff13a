"""The canonical binary code: K little-endian bits of the token id.

Shapes: ``N`` any batch of ids, ``K`` code bits.
"""

from __future__ import annotations

import numpy as np


def min_code_bits(vocab_size: int) -> int:
    """Shortest injective fixed-length binary code for ``vocab_size`` ids: ceil(log2 V), at least 1."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return max(1, (vocab_size - 1).bit_length())


def resolve_code_bits(vocab_size: int, num_bits: int | None = None) -> int:
    """K for a vocabulary: the minimum by default; a larger K on request, never a smaller one."""
    k_min = min_code_bits(vocab_size)
    if num_bits is None:
        return k_min
    if num_bits < k_min:
        raise ValueError(
            f"code_bits={num_bits} cannot give {vocab_size} tokens distinct codes: "
            f"need at least ceil(log2 {vocab_size}) = {k_min} bits"
        )
    if num_bits > 62:
        raise ValueError(f"code_bits={num_bits} is too large (at most 62 bits fit an int64 id)")
    return num_bits


def canonical_bits(token_ids_N: np.ndarray, num_bits: int) -> np.ndarray:
    """Bits ``c(t)_j = floor(t / 2^j) mod 2`` for j = 0..K-1, as uint8 ``[..., K]`` (j = 0 first)."""
    ids = np.asarray(token_ids_N, dtype=np.int64)
    shifts_K = np.arange(num_bits, dtype=np.int64)
    return ((ids[..., None] >> shifts_K) & 1).astype(np.uint8)


def bits_to_ids(bits_NK: np.ndarray) -> np.ndarray:
    """Inverse of :func:`canonical_bits`: little-endian bit vectors back to integer ids."""
    bits = np.asarray(bits_NK, dtype=np.int64)
    weights_K = np.left_shift(np.int64(1), np.arange(bits.shape[-1], dtype=np.int64))
    return bits @ weights_K
