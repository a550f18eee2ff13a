"""JSON Lines records with the ``FILE:LINE`` every error message about them names."""

from __future__ import annotations

import json
from typing import Iterator


def jsonl_records(path, lines, error: type[ValueError] = ValueError) -> Iterator[tuple[str, object]]:
    """``(FILE:LINE, value)`` of each non-blank line of ``lines`` read from ``path``; a line that is
    not JSON raises ``error`` naming it."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: not valid JSON ({e.msg})") from None
