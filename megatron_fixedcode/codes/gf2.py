"""Linear algebra over GF(2) and the seeded recoding matrix ``A`` of the GF(2) code.

Matrices are uint8 arrays of 0/1. Everything here is exact integer arithmetic.
"""

from __future__ import annotations

import numpy as np

from megatron_fixedcode.codes.binary import bits_to_ids, canonical_bits

# Rejection sampling finds a valid A for K=16 in a few draws (~29% of random matrices are
# invertible); the cap only stops impossible requests (e.g. min_weight > K) from looping.
_MAX_DRAWS = 10_000


def gf2_rank(matrix: np.ndarray) -> int:
    """Rank over GF(2) by Gaussian elimination."""
    m = (np.asarray(matrix, dtype=np.uint8) & 1).copy()
    rows, cols = m.shape
    rank = 0
    for col in range(cols):
        pivot_rows = np.nonzero(m[rank:, col])[0]
        if pivot_rows.size == 0:
            continue
        pivot = rank + pivot_rows[0]
        m[[rank, pivot]] = m[[pivot, rank]]
        below_or_above = np.nonzero(m[:, col])[0]
        below_or_above = below_or_above[below_or_above != rank]
        m[below_or_above] ^= m[rank]
        rank += 1
        if rank == rows:
            break
    return rank


def gf2_inverse(matrix: np.ndarray) -> np.ndarray:
    """Inverse over GF(2); raises ValueError when the matrix is singular."""
    a = np.asarray(matrix, dtype=np.uint8) & 1
    n = a.shape[0]
    if a.shape != (n, n):
        raise ValueError(f"recoding matrix must be square, got shape {a.shape}")
    aug = np.concatenate([a, np.eye(n, dtype=np.uint8)], axis=1)
    for col in range(n):
        pivot_rows = np.nonzero(aug[col:, col])[0]
        if pivot_rows.size == 0:
            raise ValueError(f"recoding matrix is singular over GF(2) (rank {gf2_rank(a)} < {n})")
        pivot = col + pivot_rows[0]
        aug[[col, pivot]] = aug[[pivot, col]]
        others = np.nonzero(aug[:, col])[0]
        others = others[others != col]
        aug[others] ^= aug[col]
    return aug[:, n:].copy()


def gf2_apply(matrix_KK: np.ndarray, bits_NK: np.ndarray, offset_K: np.ndarray | None = None) -> np.ndarray:
    """``A·c ⊕ b`` for a batch of bit vectors (rows of ``bits_NK``)."""
    out = (np.asarray(bits_NK, dtype=np.int64) @ np.asarray(matrix_KK, dtype=np.int64).T) & 1
    if offset_K is not None:
        out ^= np.asarray(offset_K, dtype=np.int64)
    return out.astype(np.uint8)


def gf2_byte_tables(matrix_KK: np.ndarray) -> np.ndarray:
    """``T[j, v]`` = ``A·c(v · 256^j)`` packed into an integer (bit i = output bit i), int64
    ``[ceil(K/8), 256]``.

    ``A`` is linear over GF(2), so for any K-bit id ``t``: ``A·c(t) = XOR_j T[j, byte_j(t)]`` —
    the recoding of a batch costs ceil(K/8) gathers from 256-entry tables, neither a V-row codebook
    nor K parity folds over every id. Entries for bits above K (never set in a valid id) are 0.
    """
    a = np.asarray(matrix_KK, dtype=np.int64) & 1
    num_bits = a.shape[0]
    byte_values = np.arange(256, dtype=np.int64)
    tables = [
        bits_to_ids(gf2_apply(a, canonical_bits(byte_values << (8 * j), num_bits))) for j in range(-(-num_bits // 8))
    ]  # bits above K of byte_value << 8j fall away
    return np.stack(tables)


def _raw_bits(bit_generator: np.random.BitGenerator, count: int) -> np.ndarray:
    """``count`` bits straight from the bit generator's raw 64-bit output.

    ``Generator.integers`` may change its algorithm between numpy releases; the raw stream of
    PCG64 is fixed by its specification, so the matrix is the same on every machine and version.
    """
    num_words = (count + 63) // 64
    words = np.asarray(bit_generator.random_raw(num_words), dtype=np.uint64)
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    return bits.reshape(-1)[:count].astype(np.uint8)


def sample_recoding_matrix(num_bits: int, seed: int, min_weight: int = 4) -> np.ndarray:
    """A ∈ GL(K, 2) drawn from PCG64(seed): full rank, every row and column weight ≥ min_weight."""
    if min_weight > num_bits:
        raise ValueError(f"min_weight={min_weight} exceeds code_bits={num_bits}: no row can have that many ones")
    bit_generator = np.random.PCG64(seed)
    for _ in range(_MAX_DRAWS):
        a = _raw_bits(bit_generator, num_bits * num_bits).reshape(num_bits, num_bits)
        if a.sum(axis=1).min() < min_weight or a.sum(axis=0).min() < min_weight:
            continue
        if gf2_rank(a) == num_bits:
            return a
    raise ValueError(
        f"no invertible {num_bits}x{num_bits} GF(2) matrix with row/column weight >= {min_weight} "
        f"found in {_MAX_DRAWS} draws for seed {seed}"
    )


def check_recoding_matrix(matrix: np.ndarray, num_bits: int) -> np.ndarray:
    """Validate a user-given A: K×K, entries 0/1, invertible over GF(2)."""
    a = np.asarray(matrix)
    if a.shape != (num_bits, num_bits):
        raise ValueError(f"code_matrix must be {num_bits}x{num_bits}, got shape {a.shape}")
    if not np.isin(a, (0, 1)).all():
        raise ValueError("code_matrix entries must be 0 or 1")
    a = a.astype(np.uint8)
    rank = gf2_rank(a)
    if rank != num_bits:
        raise ValueError(f"code_matrix is singular over GF(2): rank {rank} < {num_bits}")
    return a
