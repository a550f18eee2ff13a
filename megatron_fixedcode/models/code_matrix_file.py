"""``--code-matrix FILE``: a user-given GF(2) recoding matrix A (and optionally the offset b).

Exists so that a released matrix (e.g. the authors' own) can be trained, exported and evaluated
exactly, instead of the one this project's generator draws for a seed. The file is read here;
the GF(2) math stays in ``codes/`` (pure numpy, no I/O).

Convention (the one ``CodeSpec`` uses): ``c~(t) = A·c(t) ⊕ b`` with ``c(t)_j = floor(t/2^j) mod 2``
(little-endian, j = 0 the lowest bit); row i of A gives output bit i, column j reads input bit j.
A matrix written for big-endian bits is a different map: reverse its rows and columns first.

Formats, by file suffix:

* ``.npy`` — a K×K integer/bool array (no offset: use ``--code-offset``).
* ``.json`` — ``[[0,1,...], ...]`` or ``{"matrix": [[...], ...], "offset": b}``.
* anything else (text) — K lines of K 0/1 digits, separated by spaces/commas or written together
  (``0110...``); ``#`` starts a comment; an optional line ``offset: b``.

``b`` is a K-bit integer mask (as ``--code-offset``, bit j = 2^j) or a list of K bits (j = 0 first).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from megatron_fixedcode.codes import gf2_rank

PAPER_MIN_WEIGHT = 4  # paper 2's constraint on every row and column of A


@dataclasses.dataclass(frozen=True)
class CodeMatrixFile:
    path: str
    matrix: tuple[tuple[int, ...], ...]
    offset: int | None  # None: the file gives no offset

    @property
    def num_bits(self) -> int:
        return len(self.matrix)

    def weights(self) -> tuple[list[int], list[int]]:
        a = np.asarray(self.matrix, dtype=np.int64)
        return a.sum(axis=1).tolist(), a.sum(axis=0).tolist()

    def report(self) -> list[str]:
        """One line describing A, and a warning line when a weight is below paper 2's 4."""
        rows, cols = self.weights()
        k = self.num_bits
        lines = [
            f"--code-matrix {self.path}: {k}x{k}, full rank over GF(2); row weights {rows} "
            f"(min {min(rows)}), column weights {cols} (min {min(cols)})"
            + ("" if self.offset is None else f"; offset b = {self.offset}")
        ]
        if min(rows) < PAPER_MIN_WEIGHT or min(cols) < PAPER_MIN_WEIGHT:
            lines.append(
                f"warning: --code-matrix {self.path}: a row or column weight is below {PAPER_MIN_WEIGHT} "
                "(paper 2's constraint); the map is still injective, but not of the kind the paper evaluated"
            )
        return lines


def _parse_offset(value, num_bits: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"offset must be an integer mask or a list of {num_bits} bits, got {value!r}")
    if isinstance(value, int):
        mask = value
    elif isinstance(value, str):
        mask = int(value.strip(), 0)
    elif (
        isinstance(value, list)
        and len(value) == num_bits
        and all(v in (0, 1) and not isinstance(v, bool) for v in value)
    ):
        mask = sum(int(v) << j for j, v in enumerate(value))
    else:
        raise ValueError(f"offset must be an integer mask or a list of {num_bits} bits, got {value!r}")
    if not 0 <= mask < (1 << num_bits):
        raise ValueError(f"offset {mask} is not a {num_bits}-bit mask")
    return mask


def _text_rows(text: str) -> tuple[list[list[int]], str | None]:
    rows, offset = [], None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head = re.match(r"offset\s*[:=]?\s*(.+)$", line, re.IGNORECASE)
        if head:
            offset = head.group(1).strip()
            continue
        tokens = [t for t in re.split(r"[\s,;]+", line) if t]
        if len(tokens) == 1 and len(tokens[0]) > 1:
            tokens = list(tokens[0])  # digits written together: 0110...
        if any(t not in ("0", "1") for t in tokens):
            raise ValueError(f"line {number}: expected 0/1 entries, got {raw.strip()!r}")
        rows.append([int(t) for t in tokens])
    return rows, offset


def load_code_matrix(path: str | Path) -> CodeMatrixFile:
    """Read and validate A: square, 0/1 entries, full rank over GF(2). Errors name the file."""
    path = str(path)
    try:
        return _load(path)
    except ValueError as e:
        raise ValueError(f"--code-matrix {path}: {e}") from None


def _load(path: str) -> CodeMatrixFile:
    file = Path(path)
    if not file.is_file():
        raise ValueError("no such file")
    offset_raw = None
    if file.suffix == ".npy":
        try:
            data = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"not a readable .npy array ({e})") from None
        rows = data
    elif file.suffix == ".json":
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not valid JSON ({e})") from None
        if isinstance(data, dict):
            unknown = set(data) - {"matrix", "offset"}
            if "matrix" not in data or unknown:
                raise ValueError(
                    'expected {"matrix": [[...]], "offset": b} or a list of rows'
                    + (f"; unknown keys {sorted(unknown)}" if unknown else "")
                )
            rows, offset_raw = data["matrix"], data.get("offset")
        else:
            rows = data
    else:
        try:
            rows, offset_raw = _text_rows(file.read_text())
        except UnicodeDecodeError:
            raise ValueError("not a text file (use .npy for a binary array)") from None
    try:
        a = np.asarray(rows)
    except ValueError:
        raise ValueError("rows of different lengths: the matrix must be square (K x K)") from None
    if a.dtype == object or a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"the matrix must be square (K x K), got shape {a.shape}")
    if a.dtype.kind not in "biuf" or not np.isin(a, (0, 1)).all():
        raise ValueError("entries must be 0 or 1")
    a = a.astype(np.uint8)
    k = a.shape[0]
    rank = gf2_rank(a)
    if rank != k:
        raise ValueError(f"singular over GF(2): rank {rank} < {k} (two tokens would share a code)")
    offset = None if offset_raw is None else _parse_offset(offset_raw, k)
    return CodeMatrixFile(path=path, matrix=tuple(tuple(int(v) for v in row) for row in a), offset=offset)
