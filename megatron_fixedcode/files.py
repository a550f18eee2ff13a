"""File content identity, shared by dataset verification, checkpoint checksums and the study's data
fingerprint: one streaming sha256 (bounded memory for multi-GB shards)."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
