"""The sinusoidal code: the transformer's position encoding applied to the token id.

Coordinates 2i and 2i+1 are sin(t·ω_i) and cos(t·ω_i) with ω_i = base^(−2i/K′), i < K′/2. Computed
in float64 from the integer id: computing t·ω in bf16 would round t itself (spacing 256 near
t = 49,152), which is exactly the collision the precision check exists to catch.
"""

from __future__ import annotations

import numpy as np


def sinusoidal_table(vocab_size: int, width: int, base: float) -> np.ndarray:
    """float64 ``[V, K′]``, K′ even."""
    if width % 2:
        raise ValueError(f"code_width={width} must be even for the sinusoidal code (sin/cos pairs)")
    if not base > 1:
        raise ValueError(f"code_base={base} must be > 1")
    omega = base ** (-2.0 * np.arange(width // 2, dtype=np.float64) / width)
    angle = np.arange(vocab_size, dtype=np.float64)[:, None] * omega[None, :]
    return np.stack([np.sin(angle), np.cos(angle)], axis=2).reshape(vocab_size, width)
