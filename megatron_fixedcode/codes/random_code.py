"""The random code: a fixed seeded Gaussian table of width K′ (and the init of ``lowdim``).

Entries are N(0, 1) by Box–Muller from PCG64(seed)'s raw 64-bit stream (``random_raw``, fixed by
PCG64's specification; ``Generator.normal`` may change between numpy releases), row-major over
(token, coordinate), so the table for V tokens is a prefix of the table for more tokens.
"""

from __future__ import annotations

import numpy as np


def gaussian_table(vocab_size: int, width: int, seed: int) -> np.ndarray:
    """float64 ``[V, K′]`` of independent standard normals."""
    count = vocab_size * width
    num_pairs = (count + 1) // 2
    words = np.asarray(np.random.PCG64(seed).random_raw(2 * num_pairs), dtype=np.uint64)
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # uniform in (0, 1)
    radius = np.sqrt(-2.0 * np.log(u[0::2]))
    angle = 2.0 * np.pi * u[1::2]
    z = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)
    return z[:count].reshape(vocab_size, width)
