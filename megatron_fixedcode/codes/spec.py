"""`CodeSpec`: the complete, serializable description of one fixed token→vector map.

x(t) = scale · R · (A·c(t) ⊕ b), with c the canonical K-bit code, A ∈ GL(K,2), b ∈ {0,1}^K and
R the tiled lift to width d. The fingerprint hashes exactly the fields that define that map.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from megatron_fixedcode.codes.binary import bits_to_ids, canonical_bits, resolve_code_bits
from megatron_fixedcode.codes.gf2 import (
    check_recoding_matrix,
    gf2_apply,
    gf2_inverse,
    sample_recoding_matrix,
)
from megatron_fixedcode.codes.lift import lift_source_bits

CODE_KINDS = ("binary", "gf2")
CODE_IMPLEMENTATIONS = ("table_free", "lookup")
PAPER_CODE_SEED = 12345


def _offset_bits(offset: int | list[int] | tuple[int, ...] | None, num_bits: int) -> tuple[int, ...]:
    if offset is None:
        return (0,) * num_bits
    if isinstance(offset, (int, np.integer)):
        if not 0 <= int(offset) < (1 << num_bits):
            raise ValueError(f"code_offset={offset} must be a {num_bits}-bit mask in [0, 2^{num_bits})")
        return tuple(int(b) for b in canonical_bits(np.int64(offset), num_bits))
    bits = tuple(int(b) for b in offset)
    if len(bits) != num_bits or any(b not in (0, 1) for b in bits):
        raise ValueError(f"code_offset must be {num_bits} bits of 0/1, got {list(offset)}")
    return bits


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeSpec:
    """One fixed code. Build it with :meth:`create`; ``matrix``/``offset`` are stored explicitly so
    a spec read back from a checkpoint needs no RNG to reproduce the map."""

    kind: str
    vocab_size: int
    num_bits: int
    hidden_size: int
    seed: int | None
    min_weight: int
    matrix: tuple[tuple[int, ...], ...]
    offset: tuple[int, ...]
    scale: float = 1.0
    implementation: str = "table_free"

    @classmethod
    def create(
        cls,
        *,
        kind: str,
        vocab_size: int,
        hidden_size: int,
        code_bits: int | None = None,
        seed: int | None = PAPER_CODE_SEED,
        min_weight: int = 4,
        offset: int | list[int] | None = None,
        matrix: np.ndarray | None = None,
        scale: float = 1.0,
        implementation: str = "table_free",
    ) -> "CodeSpec":
        if kind not in CODE_KINDS:
            raise ValueError(f"input code kind must be one of {CODE_KINDS}, got {kind!r}")
        if implementation not in CODE_IMPLEMENTATIONS:
            raise ValueError(f"code_impl must be one of {CODE_IMPLEMENTATIONS}, got {implementation!r}")
        num_bits = resolve_code_bits(vocab_size, code_bits)
        lift_source_bits(num_bits, hidden_size)  # d >= K
        if kind == "binary":
            if matrix is not None:
                raise ValueError("code_matrix is only meaningful for kind='gf2'")
            a = np.eye(num_bits, dtype=np.uint8)
            seed = None
        elif matrix is not None:
            a = check_recoding_matrix(matrix, num_bits)
            seed = None
        else:
            if seed is None:
                raise ValueError("kind='gf2' needs code_seed (or an explicit code_matrix)")
            a = sample_recoding_matrix(num_bits, seed, min_weight)
        if not np.isfinite(scale) or scale == 0:
            raise ValueError(f"code_scale must be finite and non-zero, got {scale}")
        return cls(
            kind=kind,
            vocab_size=vocab_size,
            num_bits=num_bits,
            hidden_size=hidden_size,
            seed=seed,
            min_weight=min_weight,
            matrix=tuple(tuple(int(v) for v in row) for row in a),
            offset=_offset_bits(offset, num_bits),
            scale=float(scale),
            implementation=implementation,
        )

    # --- the map -------------------------------------------------------------------------
    @property
    def matrix_array(self) -> np.ndarray:
        return np.asarray(self.matrix, dtype=np.uint8)

    @property
    def offset_array(self) -> np.ndarray:
        return np.asarray(self.offset, dtype=np.uint8)

    def check_token_ids(self, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"token_ids contain {bad}, outside the vocabulary [0, {self.vocab_size})")
        return ids

    def code_bits(self, token_ids: np.ndarray) -> np.ndarray:
        """Recoded bits c~(t) = A·c(t) ⊕ b, uint8 ``[..., K]``."""
        ids = self.check_token_ids(token_ids)
        return gf2_apply(self.matrix_array, canonical_bits(ids, self.num_bits), self.offset_array)

    def codebook(self) -> np.ndarray:
        """The V×K table of recoded bits (the frozen-lookup implementation's buffer)."""
        return self.code_bits(np.arange(self.vocab_size, dtype=np.int64))

    def vectors(self, token_ids: np.ndarray) -> np.ndarray:
        """Model inputs ``scale · R · c~(t)`` as float64 ``[..., d]``."""
        bits = self.code_bits(token_ids)
        return self.scale * bits[..., lift_source_bits(self.num_bits, self.hidden_size)].astype(np.float64)

    def decode(self, bits_NK: np.ndarray) -> np.ndarray:
        """Token ids from recoded bits: c = A^{-1}(c~ ⊕ b)."""
        bits = np.asarray(bits_NK, dtype=np.uint8) ^ self.offset_array
        return bits_to_ids(gf2_apply(gf2_inverse(self.matrix_array), bits))

    def row_masks(self) -> list[int]:
        """Output bit i of the recoding is the parity of ``id & row_masks[i]`` (table-free path)."""
        return [sum(bit << j for j, bit in enumerate(row)) for row in self.matrix]

    def offset_mask(self) -> int:
        return sum(bit << j for j, bit in enumerate(self.offset))

    # --- identity ------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """Hash of exactly what defines the token→vector map (not kind, seed or implementation:
        equal maps reached differently get equal fingerprints)."""
        payload = {
            "vocab_size": self.vocab_size,
            "num_bits": self.num_bits,
            "hidden_size": self.hidden_size,
            "matrix_rows": self.row_masks(),
            "offset": self.offset_mask(),
            "scale": repr(float(self.scale)),
        }
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        return digest[:16]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["matrix"] = [list(row) for row in self.matrix]
        d["offset"] = list(self.offset)
        d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CodeSpec":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields - {"fingerprint"}
        if unknown:
            raise ValueError(f"unknown CodeSpec fields: {sorted(unknown)}")
        spec = cls(
            **{k: v for k, v in data.items() if k in fields and k not in ("matrix", "offset")},
            matrix=tuple(tuple(int(v) for v in row) for row in data["matrix"]),
            offset=tuple(int(v) for v in data["offset"]),
        )
        check_recoding_matrix(spec.matrix_array, spec.num_bits)
        if "fingerprint" in data and data["fingerprint"] != spec.fingerprint:
            raise ValueError(
                f"CodeSpec fingerprint mismatch: stored {data['fingerprint']}, recomputed {spec.fingerprint}"
            )
        return spec
