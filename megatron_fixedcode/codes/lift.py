"""The tiled lift R = [I_K; I_K; ...] ∈ {0,1}^{d×K}: the K-bit code repeated along the width."""

from __future__ import annotations

import numpy as np


def lift_source_bits(num_bits: int, hidden_size: int) -> np.ndarray:
    """For every output coordinate r, the code bit it copies: ``r mod K``.

    When K does not divide d the last tile is truncated; the first tile is always whole, so R
    keeps full column rank.
    """
    if hidden_size < num_bits:
        raise ValueError(
            f"hidden_size={hidden_size} is smaller than code_bits={num_bits}: the lift would drop "
            "code bits and tokens would collide"
        )
    return np.arange(hidden_size, dtype=np.int64) % num_bits


def lift_matrix(num_bits: int, hidden_size: int) -> np.ndarray:
    """R as a dense uint8 ``[d, K]`` matrix (for analysis and tests; the model never builds it)."""
    source = lift_source_bits(num_bits, hidden_size)
    r = np.zeros((hidden_size, num_bits), dtype=np.uint8)
    r[np.arange(hidden_size), source] = 1
    return r


def num_tiles(num_bits: int, hidden_size: int) -> float:
    """d / K; fractional when the last tile is truncated."""
    lift_source_bits(num_bits, hidden_size)
    return hidden_size / num_bits
