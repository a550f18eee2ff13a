"""Properties of a code that a user should see before training on it (pure numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_fixedcode.codes.gf2 import gf2_rank
from megatron_fixedcode.codes.lift import lift_matrix, lift_source_bits
from megatron_fixedcode.codes.precision import duplicate_rows, min_pairwise_distance, quantize
from megatron_fixedcode.codes.spec import CodeSpec


def pack_rows(bits_NK: np.ndarray) -> np.ndarray:
    """Each K-bit row as one integer, so equal codes compare equal."""
    weights_K = np.left_shift(np.int64(1), np.arange(bits_NK.shape[1], dtype=np.int64))
    return bits_NK.astype(np.int64) @ weights_K


def analyze_float_code(spec: CodeSpec, max_listed_tokens: int = 16) -> dict[str, Any]:
    """Collisions and the minimum pairwise distance at the activation dtype, rank, norms."""
    rows_VK = quantize(spec.input_table(), spec.dtype)
    lifted_sq_V = (rows_VK.astype(np.float64) ** 2) @ np.bincount(
        lift_source_bits(spec.num_bits, spec.hidden_size), minlength=spec.num_bits
    )
    min_dist, pair = min_pairwise_distance(rows_VK)
    zero = np.nonzero(lifted_sq_V == 0)[0]
    return {
        "kind": spec.kind,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "K": spec.num_bits,
        "tiles": spec.hidden_size / spec.num_bits,
        "dtype": spec.dtype,
        "collisions": len(duplicate_rows(rows_VK)),
        # distance between the K-wide rows; the lifted inputs are ~sqrt(d/K) times further apart
        "min_pairwise_distance": min_dist,
        "closest_pair": list(pair),
        "input_rank": int(np.linalg.matrix_rank(rows_VK.astype(np.float64))),
        "input_norm_min": float(np.sqrt(lifted_sq_V.min())),
        "input_norm_max": float(np.sqrt(lifted_sq_V.max())),
        "input_rms": float(np.sqrt(lifted_sq_V.mean() / spec.hidden_size)),
        "learned_baseline_row_norm": 0.02 * float(np.sqrt(spec.hidden_size)),
        "zero_code_tokens": [int(t) for t in zero[:max_listed_tokens]],
        "num_zero_code_tokens": int(zero.size),
        "seed": spec.seed,
        "base": spec.base,
        "scale": spec.scale,
        "trainable": spec.family.trainable,
        "fingerprint": spec.fingerprint,
    }


def analyze_code(spec: CodeSpec, max_listed_tokens: int = 16) -> dict[str, Any]:
    """Injectivity, rank, weights and norms of ``spec`` over its whole vocabulary."""
    if not spec.family.bits:
        return analyze_float_code(spec, max_listed_tokens)
    codebook_VK = spec.codebook()
    a = spec.matrix_array
    packed_V = pack_rows(codebook_VK)
    collisions = int(codebook_VK.shape[0] - np.unique(packed_V).size)
    # rank(X) for X = C~ R^T equals rank(C~) because R has full column rank (checked here).
    lift_rank = int(np.linalg.matrix_rank(lift_matrix(spec.num_bits, spec.hidden_size).astype(np.float64)))
    input_rank = int(np.linalg.matrix_rank(codebook_VK.astype(np.float64))) if lift_rank == spec.num_bits else None
    weight_V = codebook_VK.sum(axis=1).astype(np.int64)
    full_tiles, rest = divmod(spec.hidden_size, spec.num_bits)
    # Lifted Hamming weight: every bit appears full_tiles times, bits j < rest once more.
    lifted_weight_V = full_tiles * weight_V + codebook_VK[:, :rest].sum(axis=1)
    # centred: every coordinate is ±scale
    norm_V = abs(spec.scale) * np.sqrt(
        np.full_like(lifted_weight_V, spec.hidden_size) if spec.centered else lifted_weight_V
    )
    zero_tokens = np.nonzero(weight_V == 0)[0] if not spec.centered else np.zeros(0, dtype=np.int64)  # ±1: never 0
    hist = np.bincount(weight_V, minlength=spec.num_bits + 1)
    return {
        "kind": spec.kind,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "K": spec.num_bits,
        "tiles": spec.hidden_size // spec.num_bits if rest == 0 else spec.hidden_size / spec.num_bits,
        "gf2_rank": gf2_rank(a),
        "min_row_weight": int(a.sum(axis=1).min()),
        "min_col_weight": int(a.sum(axis=0).min()),
        "collisions": collisions,
        "lift_rank": lift_rank,
        "input_rank": input_rank,
        "hamming_weight_histogram": {str(w): int(n) for w, n in enumerate(hist)},
        "input_norm_min": float(norm_V.min()),
        "input_norm_max": float(norm_V.max()),
        "learned_baseline_row_norm": 0.02 * float(np.sqrt(spec.hidden_size)),
        "zero_code_tokens": [int(t) for t in zero_tokens[:max_listed_tokens]],
        "num_zero_code_tokens": int(zero_tokens.size),
        "input_rms": spec.input_rms(),
        "dtype": spec.dtype,
        "centered": spec.centered,
        "seed": spec.seed,
        "offset": spec.offset_mask(),
        "scale": spec.scale,
        "fingerprint": spec.fingerprint,
    }


def format_report(report: dict[str, Any]) -> str:
    """Human-readable lines for :func:`analyze_code`'s result."""
    if "min_pairwise_distance" in report:
        return "\n".join(
            [
                f"code            {report['kind']} (seed {report['seed']}, base {report['base']}, scale {report['scale']:g}"
                f"{', trainable init' if report['trainable'] else ''})",
                f"vocabulary      V = {report['vocab_size']}, width K' = {report['K']}, at {report['dtype']}",
                f"lift            d = {report['hidden_size']}, tiles = {report['tiles']:g}",
                f"injectivity     {report['collisions']} collisions; min pairwise distance {report['min_pairwise_distance']:.4g} "
                f"(tokens {report['closest_pair'][0]}, {report['closest_pair'][1]})",
                f"input span      rank {report['input_rank']}",
                f"input norm      {report['input_norm_min']:.3f} .. {report['input_norm_max']:.3f}, RMS {report['input_rms']:.4g} "
                f"(learned table at init ~ {report['learned_baseline_row_norm']:.3f}, RMS 0.02)",
                f"zero vector     tokens {report['zero_code_tokens'] or 'none'}",
                f"fingerprint     {report['fingerprint']}",
            ]
        )
    hist = ", ".join(f"{w}:{n}" for w, n in report["hamming_weight_histogram"].items() if n)
    zero = report["zero_code_tokens"] or "none"
    return "\n".join(
        [
            f"code            {report['kind']} (seed {report['seed']}, offset {report['offset']}, scale {report['scale']})",
            f"vocabulary      V = {report['vocab_size']}, K = {report['K']} bits",
            f"lift            d = {report['hidden_size']}, tiles = {report['tiles']}, rank(R) = {report['lift_rank']}",
            f"recoding A      GF(2) rank {report['gf2_rank']}, min row weight {report['min_row_weight']}, "
            f"min column weight {report['min_col_weight']}",
            f"injectivity     {report['collisions']} collisions",
            f"input span      rank {report['input_rank']}",
            f"Hamming weights {hist}",
            f"input norm      {report['input_norm_min']:.3f} .. {report['input_norm_max']:.3f} "
            f"(learned table at init ~ {report['learned_baseline_row_norm']:.3f})",
            f"zero vector     tokens {zero} ({report['num_zero_code_tokens']} in all)",
            f"fingerprint     {report['fingerprint']}",
        ]
    )
