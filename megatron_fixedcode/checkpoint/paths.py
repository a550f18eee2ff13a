"""Where a checkpoint lives (``SAVE/iter_0000100/``, the ``latest`` marker) and its common state,
read without a process group."""

from __future__ import annotations

import os
from pathlib import Path

from megatron.core import dist_checkpointing

LATEST_MARKER = "latest_checkpointed_iteration.txt"
CHECKSUMS = "checksums.json"
RUN_CONFIG = "run_config.json"  # iter_N/run_config.json: the run's resolved flags, as --dry-run prints them


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files do not match the checksums recorded when it was saved."""


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def latest_step(root: str | Path) -> int | None:
    marker = Path(root) / LATEST_MARKER
    if not marker.exists():
        return None
    try:
        text = marker.read_bytes().decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{marker}: expected an iteration number, found binary data (a damaged marker)") from None
    if not text.isdigit():
        raise ValueError(f"{marker}: expected an iteration number, found {text!r}")
    return int(text)


def resolve_step(root: str, step: int | None = None) -> int | None:
    """``step`` if given (it must exist and be complete), else the latest complete checkpoint."""
    if step is None:
        return latest_step(root)
    if not (checkpoint_dir(root, step) / "metadata.json").exists():
        raise ValueError(f"--ckpt-step {step}: no complete checkpoint {checkpoint_dir(root, step)}")
    return step


def read_trainer_state(root: str, step: int | None = None) -> dict | None:
    step = resolve_step(root, step)
    if step is None:
        return None
    return read_common_state(root, step)["trainer"]


def read_common_state(root: str, step: int) -> dict:
    """The checkpoint's non-sharded state (trainer dict, scheduler state), without a process group."""
    return read_common_state_of(checkpoint_dir(root, step))


def read_common_state_of(target: str | Path) -> dict:
    return dist_checkpointing.load_common_state_dict(str(target))


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
