"""What a float code looks like at the model's activation dtype (pure numpy).

numpy has no bfloat16, so it is emulated bit-exactly: float32 → bfloat16 is round-to-nearest-even
on the top 16 bits, which is what torch's ``Tensor.to(torch.bfloat16)`` does on CPU and GPU
(``tests/codes/test_codes_families.py`` checks the emulation against torch on every table we build).
"""

from __future__ import annotations

import numpy as np

CODE_DTYPES = ("float32", "bfloat16", "float16")


def quantize(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (via float32, as the model casts its float32 table), as float32."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x32
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        u = x32.view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return rounded.astype(np.uint32).view(np.float32)
    raise ValueError(f"dtype must be one of {CODE_DTYPES}, got {dtype!r}")


def duplicate_rows(table_VK: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (first token, a later token) whose rows are equal value for value."""
    t = np.ascontiguousarray(table_VK) + 0.0  # -0.0 == 0.0: compare values, not sign bits
    rows = t.view(np.dtype((np.void, t.dtype.itemsize * t.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    dup = np.nonzero(first[inverse] != np.arange(t.shape[0]))[0]
    return [(int(first[inverse[i]]), int(i)) for i in dup]


def min_pairwise_distance(table_VK: np.ndarray, chunk: int = 2048) -> tuple[float, tuple[int, int]]:
    """Smallest Euclidean distance between two rows and the pair (float64; O(V²K) in chunks)."""
    t = np.asarray(table_VK, dtype=np.float64)
    num = t.shape[0]
    if num < 2:
        return float("inf"), (0, 0)
    sq = (t * t).sum(axis=1)
    best, pair = np.inf, (0, 1)
    for start in range(0, num, chunk):
        block = t[start : start + chunk]
        d2 = sq[start : start + chunk, None] + sq[None, :] - 2.0 * block @ t.T
        rows = np.arange(block.shape[0])
        d2[rows, start + rows] = np.inf  # a row's distance to itself
        d2[:, :start] = np.inf  # pairs with an earlier row were seen in an earlier chunk
        idx = np.unravel_index(np.argmin(d2), d2.shape)
        if d2[idx] < best:
            best, pair = d2[idx], (start + int(idx[0]), int(idx[1]))
    # The expansion cancels for near-equal rows; report the exact distance of the pair found.
    return float(np.linalg.norm(t[pair[0]] - t[pair[1]])), pair
