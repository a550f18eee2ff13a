"""The registry of code families: what each ``--input-embedding`` kind is, one entry per family.

* bit families (``binary``, ``gf2``) produce 0/1 codes (±1 when centred) with the exact
  table-free path and its bit-identical lookup;
* float families (``random``, ``sinusoidal``) produce a V×K′ float table, used by lookup only;
* ``lowdim`` is the one trainable family: its table is the *initialization* of learned
  K-dimensional coordinates, lifted by the same fixed R.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from megatron_fixedcode.codes.random_code import gaussian_table
from megatron_fixedcode.codes.sinusoidal import sinusoidal_table


@dataclasses.dataclass(frozen=True)
class CodeFamily:
    name: str
    bits: bool  # 0/1 code with a table-free path; the spec holds A and b
    trainable: bool  # the table initializes trained coordinates (the only family with parameters)
    # (vocab_size, width, seed, base) -> unscaled float64 [V, K]; None for bit families
    table: Callable[[int, int, int | None, float | None], np.ndarray] | None = None
    needs_seed: bool = False


def _gaussian(vocab_size: int, width: int, seed: int | None, base: float | None) -> np.ndarray:
    return gaussian_table(vocab_size, width, seed)


def _sinusoidal(vocab_size: int, width: int, seed: int | None, base: float | None) -> np.ndarray:
    return sinusoidal_table(vocab_size, width, base)


CODE_FAMILIES = {
    "binary": CodeFamily("binary", bits=True, trainable=False),
    "gf2": CodeFamily("gf2", bits=True, trainable=False, needs_seed=True),
    "random": CodeFamily("random", bits=False, trainable=False, table=_gaussian, needs_seed=True),
    "sinusoidal": CodeFamily("sinusoidal", bits=False, trainable=False, table=_sinusoidal),
    "lowdim": CodeFamily("lowdim", bits=False, trainable=True, table=_gaussian, needs_seed=True),
}
