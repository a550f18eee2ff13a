"""Fixed token codes: pure numpy math, no torch, no distributed state, no file I/O."""

from megatron_fixedcode.codes.families import CODE_FAMILIES, CodeFamily
from megatron_fixedcode.codes.binary import bits_to_ids, canonical_bits, min_code_bits, resolve_code_bits
from megatron_fixedcode.codes.gf2 import gf2_byte_tables, gf2_inverse, gf2_rank, sample_recoding_matrix
from megatron_fixedcode.codes.lift import lift_matrix, lift_source_bits
from megatron_fixedcode.codes.precision import CODE_DTYPES, duplicate_rows, min_pairwise_distance, quantize
from megatron_fixedcode.codes.spec import CODE_IMPLEMENTATIONS, CODE_KINDS, PAPER_CODE_SEED, CodeSpec

__all__ = [
    "CODE_DTYPES",
    "CODE_FAMILIES",
    "CodeFamily",
    "duplicate_rows",
    "min_pairwise_distance",
    "quantize",
    "CODE_IMPLEMENTATIONS",
    "CODE_KINDS",
    "PAPER_CODE_SEED",
    "CodeSpec",
    "bits_to_ids",
    "canonical_bits",
    "gf2_byte_tables",
    "gf2_inverse",
    "gf2_rank",
    "lift_matrix",
    "lift_source_bits",
    "min_code_bits",
    "resolve_code_bits",
    "sample_recoding_matrix",
]
