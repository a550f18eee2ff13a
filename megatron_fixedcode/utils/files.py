"""File content identity, shared by dataset verification, checkpoint checksums and the study's data
fingerprint: one streaming sha256 (bounded memory for multi-GB shards)."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def indexed_dataset_fingerprint(prefixes: list[str]) -> str:
    """A cheap identity of megatron ``.bin/.idx`` shards' content: per prefix the sizes of both
    files and a SHA-256 of the ``.idx``'s first and last 64 KiB (its header and first sequence
    lengths, and the end of its document index), combined. Re-indexing another corpus into a prefix
    changes it; moving or copying the files does not (no paths, no times). Reads 128 KiB per shard
    (30 MB for paper 2's 234), so every rank can afford it at start-up."""
    h = hashlib.sha256()
    for prefix in prefixes:
        idx, bin_ = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        size = idx.stat().st_size
        with open(idx, "rb") as f:
            head = f.read(1 << 16)
            f.seek(max(size - (1 << 16), 0))
            tail = f.read()
        h.update(f"{size} {bin_.stat().st_size}\n".encode())
        h.update(hashlib.sha256(head + tail).digest())
    return h.hexdigest()[:16]


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(error: BaseException) -> bool:
    """An OSError with no space left or over quota, or safetensors' own error for it (not an OSError)."""
    if isinstance(error, OSError):
        return error.errno in DISK_FULL_ERRNOS
    return type(error).__name__ == "SafetensorError" and any(f"os error {n})" in str(error) for n in DISK_FULL_ERRNOS)


class DiskFull(Exception):
    """No space left (or over quota) while writing ``what``: one line naming it and the free space
    of its filesystem, exit code 2 (every command line's :func:`user_errors`; the trainer has its own,
    SaveFailed). ``kept`` says what stays as it was."""

    def __init__(
        self,
        what: str | Path,
        error: BaseException,
        kept: str = "its partial outputs stay as .tmp files and nothing complete was changed",
    ):
        reason = getattr(error, "strerror", None) or os.strerror(errno.ENOSPC)
        super().__init__(
            f"no space left on device writing {what} ({free_space_text(what)}; {reason}): {kept}; "
            "free space, then run the same command again"
        )


def free_space_text(path: str | Path) -> str:
    """'N MiB free there' for the filesystem of ``path``'s directory, for messages about a full disk."""
    import shutil

    try:
        return f"{shutil.disk_usage(Path(path).parent).free / 2**20:.1f} MiB free there"
    except OSError:
        return "free space unknown"
