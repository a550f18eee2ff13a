"""A checkpoint's checksums: recorded after every rank wrote (``iter_N/checksums.json``, the last file
before the ``latest`` marker moves), verified before every load, and the way forward when they differ."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import torch.distributed as dist

from megatron_fixedcode.checkpoint.paths import (
    CHECKSUMS,
    LATEST_MARKER,
    CorruptCheckpoint,
    _fsync_write,
    checkpoint_dir,
    read_common_state_of,
    resolve_step,
)
from megatron_fixedcode.checkpoint.state import CHECKSUMS_CLAIM
from megatron_fixedcode.utils.files import file_sha256

logger = logging.getLogger(__name__)
NO_VERIFY_FLAG = "--no-verify-checkpoint"
# CHECKSUMS_CLAIM, the trainer-state record that the checkpoint was saved with checksums: a checkpoint that
# claims them and has no checksums.json is refused (it was not saved before checksums existed).


def _checkpoint_files(target: Path) -> list[Path]:
    return sorted(
        p for p in target.rglob("*") if p.is_file() and p.name not in (CHECKSUMS, Path(CHECKSUMS).stem + ".tmp")
    )


def _write_manifest(target: Path, files: dict, shared: dict | None = None) -> None:
    record = {"algorithm": "sha256", "files": files, **({"shared": shared} if shared else {})}
    _fsync_write(target / CHECKSUMS, json.dumps(record, indent=1, sort_keys=True))


def _shared_records(target: Path, shared) -> dict:
    """``shared``: files of the run outside the checkpoint (its carried tokenizer), relative to the
    checkpoint root; recorded relative to ``target`` (``../tokenizer/<hash>/...``): they move with it."""
    return dict(_file_record(target, target.parent / name) for name in shared) if shared else {}


def _file_record(target: Path, path: Path) -> tuple[str, dict]:
    return os.path.relpath(path, target), {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _recorded(manifest: dict, target: Path) -> dict:
    """Every recorded file: the checkpoint's own, and the shared ones that are there (a checkpoint
    copied without its run's tokenizer folder still loads; its readers say the tokenizer is missing)."""
    shared = manifest.get("shared") or {}
    return {**manifest["files"], **{k: v for k, v in shared.items() if (target / k).is_file()}}


def write_checksums(target: Path, shared=()) -> None:
    """Record size and SHA-256 of every file under ``target`` (one process; call once every rank
    has written)."""
    target = Path(target)
    _write_manifest(
        target, dict(_file_record(target, p) for p in _checkpoint_files(target)), _shared_records(target, shared)
    )


_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp$")  # torch_dist: rank r writes __r_<thread>.distcp


def record_checksums(target: Path, shared=()) -> None:
    """:func:`write_checksums` spread over the ranks: each rank hashes the shard files it wrote
    (``__<rank>_*.distcp``), rank 0 the common files too and anything no rank claimed; rank 0
    merges and writes them, with the ``shared`` files (a collective: every rank calls it)."""
    target, rank, world = Path(target), dist.get_rank(), dist.get_world_size()
    files = _checkpoint_files(target)

    def writer(p: Path) -> int:
        m = _RANK_FILE.search(p.name)
        return int(m.group(1)) if m and int(m.group(1)) < world else 0

    mine = dict(_file_record(target, p) for p in files if writer(p) == rank)
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        _write_manifest(target, {k: v for part in gathered for k, v in part.items()}, _shared_records(target, shared))
    dist.barrier()


def verify_checkpoint_share(target: str | Path, rank: int, world: int) -> str | None:
    """Hash this rank's share (every ``world``-th recorded file, from ``rank``) of a checkpoint;
    the error message, or None. Sizes and presence of every file were checked before."""
    target = Path(target)
    try:
        files = _recorded(json.loads((target / CHECKSUMS).read_text()), target)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # verify_checkpoint reported (or warned about) the record itself
    for name in sorted(files)[rank::world]:
        if file_sha256(target / name) != files[name]["sha256"]:
            return f"{target / name}: SHA-256 differs from the one recorded when it was saved (corrupt bytes)"
    return None


def corrupt_message(root: str | Path, step: int, error: str) -> str:
    return f"checkpoint {checkpoint_dir(root, step)} is corrupt: {error}{_way_forward(root, step)}"


def verify_checkpoint(target: str | Path, hash_files: bool = True) -> None:
    """Raise :class:`CorruptCheckpoint` naming the first file whose size or SHA-256 differs from
    the record (or that is missing); ``hash_files=False`` checks presence and sizes only (the
    trainer's ranks other than 0: rank 0 reads every byte once, not every rank). Checkpoints saved
    before checksums were recorded load with a warning."""
    target = Path(target)
    manifest_path = target / CHECKSUMS
    if not manifest_path.exists():
        if _claims_checksums(target):
            raise CorruptCheckpoint(
                f"{manifest_path}: missing, but the checkpoint's metadata says it was saved with "
                f"checksums: its bytes cannot be verified ({NO_VERIFY_FLAG} loads it unverified)"
            )
        logger.warning(
            "%s: no %s (saved before checksums were recorded): its bytes are not verified", target, CHECKSUMS
        )
        return
    try:
        manifest = json.loads(manifest_path.read_text())
        files = _recorded(manifest, target)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpoint(f"{manifest_path}: unreadable checksum record ({e})") from None
    uncovered = sorted({str(p.relative_to(target)) for p in _checkpoint_files(target)} - set(files))
    if uncovered:
        raise CorruptCheckpoint(
            f"{target / uncovered[0]}: not covered by {CHECKSUMS} (every file of a checkpoint is "
            f"recorded when it is saved; {NO_VERIFY_FLAG} loads it unverified)"
        )
    for name, rec in sorted(files.items()):
        path = target / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path}: missing (recorded in {CHECKSUMS} when the checkpoint was saved)")
        size = path.stat().st_size
        if size != rec["size"]:
            raise CorruptCheckpoint(f"{path}: {size} bytes, {rec['size']} when saved (truncated or overwritten)")
        if hash_files and file_sha256(path) != rec["sha256"]:
            raise CorruptCheckpoint(f"{path}: SHA-256 differs from the one recorded when it was saved (corrupt bytes)")


def _complete_steps(root: Path) -> list[int]:
    return sorted(
        (int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit() and (p / "metadata.json").exists()),
        reverse=True,
    )


def newest_verified_step(root: str | Path, below: int | None = None) -> int | None:
    """The newest complete checkpoint (older than ``below``) whose checksums verify."""
    for step in _complete_steps(Path(root)):
        if below is not None and step >= below:
            continue
        try:
            verify_checkpoint(checkpoint_dir(root, step))
        except CorruptCheckpoint:
            continue
        return step
    return None


def _way_forward(root: str | Path, below: int | None) -> str:
    good = newest_verified_step(root, below)
    if good is None:
        return f"; no older complete checkpoint in {root} verifies"
    return (
        f"; the newest complete checkpoint that verifies is {checkpoint_dir(root, good)}: "
        f"resume from it with --ckpt-step {good}"
    )


def _claims_checksums(target: Path) -> bool:
    try:
        return bool(read_common_state_of(target).get("trainer", {}).get(CHECKSUMS_CLAIM))
    except Exception:  # an unreadable common state: verification reports the files themselves
        return False


def verified_step(
    root: str | Path, step: int | None = None, hash_files: bool = True, verify: bool = True
) -> int | None:
    """:func:`resolve_step`, then verify that checkpoint's files against their recorded checksums.
    A corrupt or incomplete one is refused naming the file, the newest checkpoint that verifies and
    the flag that resumes from it. None when ``root`` holds no checkpoint."""
    try:
        resolved = resolve_step(str(root), step)
    except ValueError as e:
        if step is not None:
            raise ValueError(f"{e}{_way_forward(root, None)}") from None
        raise CorruptCheckpoint(f"{e}{_way_forward(root, None)}") from None
    if resolved is None:
        return None
    target = checkpoint_dir(root, resolved)
    if not (target / "metadata.json").exists():
        raise CorruptCheckpoint(
            f"{Path(root) / LATEST_MARKER} names step {resolved} but {target} is not a complete "
            f"checkpoint{_way_forward(root, resolved)}"
        )
    if not verify:
        logger.warning("%s: loading %s without checking its checksums", NO_VERIFY_FLAG, target)
        return resolved
    try:
        verify_checkpoint(target, hash_files)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(corrupt_message(root, resolved, str(e))) from None
    return resolved
