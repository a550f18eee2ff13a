"""`CodeSpec`: the complete, serializable description of one token→vector input map.

Bit families: x(t) = scale · R · (A·c(t) ⊕ b), with c the canonical K-bit code, A ∈ GL(K,2),
b ∈ {0,1}^K and R the tiled lift to width d (centred: 2·(A·c ⊕ b) − 1). Float families
(``codes/families.py``): x(t) = R · fl(scale · T[t]) for a V×K table T, fl the rounding to the
activation dtype. The fingerprint hashes exactly the fields that define the map.
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
    gf2_byte_tables,
    gf2_inverse,
    sample_recoding_matrix,
)
from megatron_fixedcode.codes.families import CODE_FAMILIES, CodeFamily
from megatron_fixedcode.codes.lift import lift_source_bits
from megatron_fixedcode.codes.precision import CODE_DTYPES, duplicate_rows, quantize

CODE_KINDS = tuple(CODE_FAMILIES)
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
    centered: bool = False  # bit families: ±1 instead of 0/1
    base: float | None = None  # sinusoidal: ω_i = base^(-2i/K)
    dtype: str = "float32"  # activation dtype at which injectivity is checked (not part of the map)

    @property
    def family(self) -> CodeFamily:
        return CODE_FAMILIES[self.kind]

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
        centered: bool = False,
        base: float | None = None,
        dtype: str = "float32",
    ) -> "CodeSpec":
        """Validate and build; fails loudly when two tokens would get the same input at ``dtype``.

        ``code_bits`` is K for the bit families (>= ceil(log2 V)) and the width K′ of the float
        families (default ceil(log2 V), any width <= d)."""
        if kind not in CODE_KINDS:
            raise ValueError(f"input code kind must be one of {CODE_KINDS}, got {kind!r}")
        if implementation not in CODE_IMPLEMENTATIONS:
            raise ValueError(f"code_impl must be one of {CODE_IMPLEMENTATIONS}, got {implementation!r}")
        if dtype not in CODE_DTYPES:
            raise ValueError(f"code dtype must be one of {CODE_DTYPES}, got {dtype!r}")
        if not np.isfinite(scale) or scale == 0:
            raise ValueError(f"code_scale must be finite and non-zero, got {scale}")
        if not CODE_FAMILIES[kind].bits:
            return cls._create_float(
                kind=kind,
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                width=code_bits,
                seed=seed,
                offset=offset,
                matrix=matrix,
                scale=scale,
                centered=centered,
                base=base,
                dtype=dtype,
            )
        if base is not None:
            raise ValueError(f"code_base is only meaningful for kind='sinusoidal', not {kind!r}")
        num_bits = resolve_code_bits(vocab_size, code_bits)
        lift_source_bits(num_bits, hidden_size)  # d >= K
        if kind == "binary":
            if matrix is not None:
                raise ValueError("code_matrix is only meaningful for kind='gf2'")
            a = np.eye(num_bits, dtype=np.uint8)
            seed = None
        elif matrix is not None:
            a = check_recoding_matrix(matrix, num_bits)
            seed = None  # not drawn from a seed; min_weight records the matrix's own least weight
            min_weight = int(min(a.sum(axis=0).min(), a.sum(axis=1).min()))
        else:
            if seed is None:
                raise ValueError("kind='gf2' needs code_seed (or an explicit code_matrix)")
            a = sample_recoding_matrix(num_bits, seed, min_weight)
        if quantize(np.float64(scale), dtype) == 0:
            raise ValueError(f"code_scale={scale} rounds to 0 in {dtype}: every token would get the zero vector")
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
            centered=bool(centered),
            dtype=dtype,
        )

    @classmethod
    def _create_float(
        cls, *, kind, vocab_size, hidden_size, width, seed, offset, matrix, scale, centered, base, dtype
    ) -> "CodeSpec":
        family = CODE_FAMILIES[kind]
        if matrix is not None or offset:
            raise ValueError(f"code_matrix/code_offset are only meaningful for the bit codes, not {kind!r}")
        if centered:
            raise ValueError(f"code_centered is only meaningful for the bit codes (binary, gf2), not {kind!r}")
        if kind == "sinusoidal":
            base = 10000.0 if base is None else float(base)
        elif base is not None:
            raise ValueError(f"code_base is only meaningful for kind='sinusoidal', not {kind!r}")
        if width is None:  # as many coordinates as the binary code has bits (sinusoidal: rounded up to even)
            width = resolve_code_bits(vocab_size) + (resolve_code_bits(vocab_size) % 2 if kind == "sinusoidal" else 0)
        if width < 1:
            raise ValueError(f"code_width must be >= 1, got {width}")
        lift_source_bits(width, hidden_size)  # d >= K′
        if family.needs_seed and seed is None:
            raise ValueError(f"kind={kind!r} needs code_seed")
        spec = cls(
            kind=kind,
            vocab_size=vocab_size,
            num_bits=width,
            hidden_size=hidden_size,
            seed=int(seed) if family.needs_seed else None,
            min_weight=0,
            matrix=(),
            offset=(),
            scale=float(scale),
            implementation="lookup",
            base=base,
            dtype=dtype,
        )
        spec.check_injective()
        return spec

    def check_injective(self) -> None:
        """Refuse a float table that gives two tokens the same input at ``dtype`` (min distance 0)."""
        if self.family.bits:
            return  # A invertible, R full column rank, scale non-zero at dtype: checked in create
        pairs = duplicate_rows(quantize(self.input_table(), self.dtype))
        if pairs:
            a, b = pairs[0]
            raise ValueError(
                f"{self.kind} code (code_width={self.num_bits}, scale {self.scale:g}) is not injective at "
                f"{self.dtype}: tokens {a} and {b} get the same input vector ({len(pairs)} tokens collide); "
                "use a wider code or a wider activation dtype"
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
        """Recoded bits c~(t) = A·c(t) ⊕ b, uint8 ``[..., K]`` (bit families only)."""
        if not self.family.bits:
            raise ValueError(f"kind={self.kind!r} has no bits; use code_table()")
        ids = self.check_token_ids(token_ids)
        return gf2_apply(self.matrix_array, canonical_bits(ids, self.num_bits), self.offset_array)

    def codebook(self) -> np.ndarray:
        """Bit families: the V×K uint8 table of recoded bits (the lookup buffer).
        Float families: the unscaled float64 V×K table."""
        if self.family.bits:
            return self.code_bits(np.arange(self.vocab_size, dtype=np.int64))
        return self.family.table(self.vocab_size, self.num_bits, self.seed, self.base)

    def code_table(self) -> np.ndarray:
        """Unscaled code values, float64 ``[V, K]``: bits (±1 when centred) or the float table."""
        table = self.codebook().astype(np.float64)
        return 2.0 * table - 1.0 if self.centered else table

    def input_table(self) -> np.ndarray:
        """float32 ``[V, K]`` rows the model tiles: ``fl32(scale · table)`` (float families' buffer)."""
        return (self.scale * self.code_table()).astype(np.float32)

    def input_rms(self) -> float:
        """RMS of all V·d input coordinates (a learned table at init has RMS ``init_std``)."""
        counts_K = np.bincount(lift_source_bits(self.num_bits, self.hidden_size), minlength=self.num_bits)
        mean_sq_K = (self.code_table() ** 2).mean(axis=0)
        return abs(self.scale) * float(np.sqrt((counts_K * mean_sq_K).sum() / self.hidden_size))

    def vectors(self, token_ids: np.ndarray) -> np.ndarray:
        """Model inputs ``scale · R · c~(t)`` as float64 ``[..., d]`` (float families: the float32 rows)."""
        ids = self.check_token_ids(token_ids)
        source = lift_source_bits(self.num_bits, self.hidden_size)
        if not self.family.bits:
            return self.input_table()[ids][..., source].astype(np.float64)
        bits = self.code_bits(ids).astype(np.float64)
        return self.scale * (2.0 * bits - 1.0 if self.centered else bits)[..., source]

    def decode(self, bits_NK: np.ndarray) -> np.ndarray:  # bit families
        """Token ids from recoded bits: c = A^{-1}(c~ ⊕ b)."""
        bits = np.asarray(bits_NK, dtype=np.uint8) ^ self.offset_array
        return bits_to_ids(gf2_apply(gf2_inverse(self.matrix_array), bits))

    def row_masks(self) -> list[int]:
        """Output bit i of the recoding is the parity of ``id & row_masks[i]`` (table-free path)."""
        return [sum(bit << j for j, bit in enumerate(row)) for row in self.matrix]

    def id_byte_tables(self) -> np.ndarray:
        """Table-free recoding by bytes of the id (see ``gf2_byte_tables``), int64 ``[ceil(K/8), 256]``."""
        return gf2_byte_tables(self.matrix_array)

    def offset_mask(self) -> int:
        return sum(bit << j for j, bit in enumerate(self.offset))

    # --- identity ------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """Hash of exactly what defines the token→vector map (not kind, seed or implementation:
        equal maps reached differently get equal fingerprints). Bit codes hash A and b, so a
        matrix loaded from a file (``--code-matrix``) and one drawn for a seed compare by content;
        float codes hash their definition (kind, seed,
        base), not the float bytes, which may differ in the last ulp between math libraries."""
        payload: dict[str, Any] = {
            "vocab_size": self.vocab_size,
            "num_bits": self.num_bits,
            "hidden_size": self.hidden_size,
            "scale": repr(float(self.scale)),
        }
        if self.family.bits:
            payload.update(matrix_rows=self.row_masks(), offset=self.offset_mask())
            if self.centered:
                payload["centered"] = True
        else:
            payload.update(kind=self.kind, seed=self.seed, base=None if self.base is None else repr(float(self.base)))
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
        if spec.kind not in CODE_KINDS:
            raise ValueError(f"unknown code kind {spec.kind!r} (this version knows {CODE_KINDS})")
        if spec.family.bits:
            check_recoding_matrix(spec.matrix_array, spec.num_bits)
        if "fingerprint" in data and data["fingerprint"] != spec.fingerprint:
            raise ValueError(
                f"CodeSpec fingerprint mismatch: stored {data['fingerprint']}, recomputed {spec.fingerprint}"
            )
        return spec
