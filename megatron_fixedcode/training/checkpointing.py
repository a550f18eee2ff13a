"""Distributed checkpoints (megatron-core ``dist_checkpointing``) with a crash-safe ``latest`` marker.

Layout: ``SAVE/iter_0000100/`` per checkpoint, ``SAVE/latest_checkpointed_iteration.txt`` naming
the newest *complete* one — written (atomically) only after every rank finished saving, so a
crash while saving leaves the previous checkpoint as the one that loads. Weights and optimizer
state reshard to any TP/PP/DP layout on load; what a load keeps is decided in
:mod:`megatron_fixedcode.training.resume_scope`. Saves and loads use megatron's fully parallel
strategy wrappers (the data-parallel ranks share the replicated tensors' writes and reads).

Integrity: after every rank finished writing, each rank hashes the files it wrote and rank 0
records the size and SHA-256 of every file in ``iter_N/checksums.json`` — the last file written
before the ``latest`` marker moves, so the marker covers it. Every load (``--load``,
``--skip-train``, the HF converter, ``tools/evaluate.py``) verifies them first (the trainer's ranks
each hash a share) and refuses a checkpoint whose bytes changed, naming the file and the newest
older checkpoint that verifies (``--ckpt-step N``).
"""
from __future__ import annotations

import dataclasses

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject

from megatron_fixedcode.files import file_sha256
from megatron_fixedcode.training.resume_scope import DP_RESHARDABLE, FULLY_RESHARDABLE, PER_PARAMETER, resume_scope

logger = logging.getLogger(__name__)
LATEST_MARKER = "latest_checkpointed_iteration.txt"
CHECKSUMS = "checksums.json"


def optimizer_format(optimizer, fully_reshardable: bool = True) -> str:
    """How ``optimizer`` stores its state in a checkpoint (:mod:`resume_scope`'s formats)."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    if not any(type(p).__name__ == "DistributedOptimizer" for p in parts):
        return PER_PARAMETER
    return FULLY_RESHARDABLE if fully_reshardable else DP_RESHARDABLE


def _optimizer_metadata(fmt: str) -> dict:
    """megatron's sharded_state_dict metadata for the format (the plain optimizers ignore it)."""
    return {"distrib_optim_sharding_type": fmt} if fmt != PER_PARAMETER else {}


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


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def model_sharded_state(chunks: list[torch.nn.Module]) -> dict[str, Any]:
    if len(chunks) == 1:
        return {"model": unwrap(chunks[0]).sharded_state_dict()}
    return {f"model{i}": unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def _rng_object(world_size: int, rank: int, data: Any = None) -> ShardedObject:
    """Each rank's RNG states; keyed by world size since they only restore on the same layout."""
    return ShardedObject(f"rng_state_world{world_size}", data, (world_size,), (rank,), replica_id=0)


RNG_BY_MODEL_PARALLEL_RANK = "rng_by_model_parallel_rank"  # trainer-state flag: the checkpoint has it
# Trainer-state record that the checkpoint was saved with checksums: a checkpoint that claims them
# and has no checksums.json is refused (it was not saved before checksums existed).
CHECKSUMS_CLAIM = "checksums"


def _model_parallel_rng_object(ranks: dict, data: Any = None) -> ShardedObject:
    """The RNG states of data-parallel rank 0 per (pipeline, tensor) rank — Megatron-LM's
    ``rng_state`` object (``replica_id`` = DP rank): what a resume on another DP size restores."""
    return ShardedObject("rng_state_tp_pp", data, (ranks["pp_size"], ranks["tp_size"]),
                         (ranks["pp_rank"], ranks["tp_rank"]), replica_id=ranks["dp_rank"])


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _checkpoint_files(target: Path) -> list[Path]:
    return sorted(p for p in target.rglob("*") if p.is_file() and p.name not in (CHECKSUMS, Path(CHECKSUMS).stem + ".tmp"))


def _file_record(target: Path, path: Path) -> tuple[str, dict]:
    return str(path.relative_to(target)), {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _write_manifest(target: Path, files: dict) -> None:
    _fsync_write(target / CHECKSUMS, json.dumps({"algorithm": "sha256", "files": files}, indent=1, sort_keys=True))


def write_checksums(target: Path) -> None:
    """Record size and SHA-256 of every file under ``target`` (one process; call once every rank
    has written)."""
    target = Path(target)
    _write_manifest(target, dict(_file_record(target, p) for p in _checkpoint_files(target)))


_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp$")  # torch_dist: rank r writes __r_<thread>.distcp


def record_checksums(target: Path) -> None:
    """:func:`write_checksums` spread over the ranks: each rank hashes the shard files it wrote
    (``__<rank>_*.distcp``), rank 0 the common files too and anything no rank claimed; rank 0
    merges and writes them (a collective: every rank calls it)."""
    target, rank, world = Path(target), dist.get_rank(), dist.get_world_size()
    files = _checkpoint_files(target)

    def writer(p: Path) -> int:
        m = _RANK_FILE.search(p.name)
        return int(m.group(1)) if m and int(m.group(1)) < world else 0

    mine = dict(_file_record(target, p) for p in files if writer(p) == rank)
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        _write_manifest(target, {k: v for part in gathered for k, v in part.items()})
    dist.barrier()


def verify_checkpoint_share(target: str | Path, rank: int, world: int) -> str | None:
    """Hash this rank's share (every ``world``-th recorded file, from ``rank``) of a checkpoint;
    the error message, or None. Sizes and presence of every file were checked before."""
    target = Path(target)
    try:
        files = json.loads((target / CHECKSUMS).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # verify_checkpoint reported (or warned about) the record itself
    for name in sorted(files)[rank::world]:
        if file_sha256(target / name) != files[name]["sha256"]:
            return f"{target / name}: SHA-256 differs from the one recorded when it was saved (corrupt bytes)"
    return None


def corrupt_message(root: str | Path, step: int, error: str) -> str:
    return f"checkpoint {checkpoint_dir(root, step)} is corrupt: {error}{_way_forward(root, step)}"


def _data_parallel_group():
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def _save_strategy():
    """Megatron-LM's default: the fully parallel wrapper spreads the writes of replicated tensors
    over the data-parallel ranks (without it DP rank 0 writes every one of them)."""
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), _data_parallel_group())


def _load_strategy(target: Path) -> dict:
    """Each data-parallel rank reads a share of the replicated tensors and they exchange them."""
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    return {"sharded_strategy": FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(target)),
                                                                 _data_parallel_group())}


def verify_checkpoint(target: str | Path, hash_files: bool = True) -> None:
    """Raise :class:`CorruptCheckpoint` naming the first file whose size or SHA-256 differs from
    the record (or that is missing); ``hash_files=False`` checks presence and sizes only (the
    trainer's ranks other than 0: rank 0 reads every byte once, not every rank). Checkpoints saved
    before checksums were recorded load with a warning."""
    target = Path(target)
    manifest_path = target / CHECKSUMS
    if not manifest_path.exists():
        if _claims_checksums(target):
            raise CorruptCheckpoint(f"{manifest_path}: missing, but the checkpoint's metadata says it was saved with "
                                    f"checksums: its bytes cannot be verified ({NO_VERIFY_FLAG} loads it unverified)")
        logger.warning("%s: no %s (saved before checksums were recorded): its bytes are not verified", target, CHECKSUMS)
        return
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{manifest_path}: unreadable checksum record ({e})") from None
    uncovered = sorted({str(p.relative_to(target)) for p in _checkpoint_files(target)} - set(files))
    if uncovered:
        raise CorruptCheckpoint(f"{target / uncovered[0]}: not covered by {CHECKSUMS} (every file of a checkpoint is "
                                f"recorded when it is saved; {NO_VERIFY_FLAG} loads it unverified)")
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
    return sorted((int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit() and (p / "metadata.json").exists()),
                  reverse=True)


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
    return (f"; the newest complete checkpoint that verifies is {checkpoint_dir(root, good)}: "
            f"resume from it with --ckpt-step {good}")


def _claims_checksums(target: Path) -> bool:
    try:
        return bool(read_common_state_of(target).get("trainer", {}).get(CHECKSUMS_CLAIM))
    except Exception:  # an unreadable common state: verification reports the files themselves
        return False


NO_VERIFY_FLAG = "--no-verify-checkpoint"


def verified_step(root: str | Path, step: int | None = None, hash_files: bool = True, verify: bool = True) -> int | None:
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
        raise CorruptCheckpoint(f"{Path(root) / LATEST_MARKER} names step {resolved} but {target} is not a complete "
                                f"checkpoint{_way_forward(root, resolved)}")
    if not verify:
        logger.warning("%s: loading %s without checking its checksums", NO_VERIFY_FLAG, target)
        return resolved
    try:
        verify_checkpoint(target, hash_files)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(corrupt_message(root, resolved, str(e))) from None
    return resolved


def _fork_results_queue() -> None:
    """megatron's async writer collects results through a Manager started with *spawn*, which
    re-imports ``__main__`` (seconds per process, and it needs a main guard); a forked Manager
    serves the same queue without re-importing anything. Its server process dies with this rank,
    even when the rank is SIGKILLed (``compat.process.helper_queue``), instead of living on with
    the rank's files and log open."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from megatron_fixedcode.compat.process import helper_queue

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = helper_queue("fork")


def save_checkpoint(root: str, step: int, chunks, optimizer, scheduler, trainer_state: dict,
                    keep_last: int | None = None, retain_interval: int | None = None) -> Path:
    """Save everything needed for a bit-identical resume, then move the ``latest`` marker."""
    from megatron_fixedcode.compat.rng import capture_rng_state  # one snapshot for checkpoints and seeded_streams

    rank, world = dist.get_rank(), dist.get_world_size()
    target = checkpoint_dir(root, step)
    if rank == 0:
        shutil.rmtree(target, ignore_errors=True)  # a partial save of this step from a crashed run
        target.mkdir(parents=True)
    dist.barrier()
    model_state = model_sharded_state(chunks)
    state = {
        **model_state,
        "optimizer": optimizer.sharded_state_dict(
            model_state, metadata=_optimizer_metadata(trainer_state.get("optimizer_format", PER_PARAMETER))),
        "opt_param_scheduler": scheduler.state_dict(),
        "trainer": {**trainer_state, RNG_BY_MODEL_PARALLEL_RANK: True,
                    CHECKSUMS_CLAIM: {"algorithm": "sha256", "record": CHECKSUMS, "covers": "every file"}},
        "rng": _rng_object(world, rank, capture_rng_state()),
        "rng_tp_pp": _model_parallel_rng_object(_ranks(), capture_rng_state()),
    }
    _fork_results_queue()
    dist_checkpointing.save(state, str(target), sharded_strategy=_save_strategy())
    dist.barrier()
    record_checksums(target)  # last into the checkpoint, before the marker that makes it the latest
    if rank == 0:
        _fsync_write(Path(root) / LATEST_MARKER, str(step))
        _prune(Path(root), keep_last, step, retain_interval)
    dist.barrier()
    return target


def _prune(root: Path, keep_last: int | None, newest: int, retain_interval: int | None = None) -> None:
    """Keep every checkpoint (Megatron-LM) unless told: --save-retain-interval N keeps the steps
    that are multiples of N and the newest; --ckpt-keep-last K keeps the newest K."""
    steps = sorted(int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit())
    older = [s for s in steps if s < newest]
    drop = set()
    if retain_interval:
        drop |= {s for s in older if s % retain_interval}
    if keep_last:
        drop |= set([s for s in steps if s <= newest][:-keep_last])
    for old in sorted(drop):
        shutil.rmtree(checkpoint_dir(root, old), ignore_errors=True)


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


def load_checkpoint(root: str, chunks, optimizer, scheduler, step: int | None = None,
                    weights_only: bool = False, load_optim: bool = True, load_rng: bool = True) -> dict | None:
    """Restore the model (resharded to this layout) and what :func:`resume_scope` keeps: Adam's
    state and the scheduler on any layout, the RNG per rank or per model-parallel rank. A load
    without the optimizer state (``weights_only``: --finetune) copies the loaded weights into the
    optimizer's main weights, so its first step updates them and not the initial ones.

    Returns the trainer state, or None when ``root`` has no complete checkpoint."""
    from megatron_fixedcode.compat.rng import restore_rng_state
    from megatron_fixedcode.training.load_checks import log_precision_change, refuse_non_finite_weights

    step = resolve_step(root, step)
    if step is None:
        return None
    target = checkpoint_dir(root, step)
    trainer_state = read_trainer_state(root, step)
    saved, now = trainer_state["layout"], _current_layout(trainer_state)
    saved_format = trainer_state.get("optimizer_format", PER_PARAMETER)  # earlier versions: plain optimizers only
    scope = resume_scope(saved, now, weights_only=weights_only,
                         rng_by_model_parallel_rank=trainer_state.get(RNG_BY_MODEL_PARALLEL_RANK, False),
                         saved_optimizer_format=saved_format,
                         distributed_optimizer=optimizer_format(optimizer) != PER_PARAMETER) if load_optim else \
        resume_scope(saved, now, weights_only=True, rng_by_model_parallel_rank=False)
    if not load_optim or not load_rng:  # Megatron-LM's --no-load-optim (optimizer and scheduler) / --no-load-rng
        scope = dataclasses.replace(scope, rng="none" if not load_rng else scope.rng if load_optim else _rng_scope(
            saved, now, trainer_state), note=f"{scope.note}; --no-load-optim/--no-load-rng")
    model_state = model_sharded_state(chunks)
    template: dict[str, Any] = dict(model_state)
    if scope.optimizer:
        template["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=True,
                                                             metadata=_optimizer_metadata(saved_format))
    if scope.rng == "per_rank":
        template["rng"] = _rng_object(dist.get_world_size(), dist.get_rank())
    elif scope.rng == "per_model_parallel_rank":  # every DP rank reads the object DP rank 0 saved
        template["rng_tp_pp"] = _model_parallel_rng_object(_ranks())
    loaded = dist_checkpointing.load(template, str(target), **_load_strategy(target))
    for i, chunk in enumerate(chunks):
        unwrap(chunk).load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
    refuse_non_finite_weights(target, chunks, "fine-tune from" if weights_only else "resume from")
    log_precision_change(trainer_state, chunks)
    if scope.optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
    elif optimizer is not None and scope.reload_main_weights:
        optimizer.reload_model_params()
    if scope.rng == "per_rank":
        restore_rng_state(loaded["rng"])
    elif scope.rng == "per_model_parallel_rank":
        restore_rng_state(loaded["rng_tp_pp"])
    if saved != now and not weights_only:
        logger.warning("checkpoint layout %s differs from this run's %s: %s", saved, now, scope.note)
    if scope.scheduler:
        scheduler.load_state_dict(loaded["opt_param_scheduler"])
    logger.info("resumed from %s (step %d)", target, trainer_state["step"])
    return trainer_state


def _rng_scope(saved: dict, now: dict, trainer_state: dict) -> str:
    """The RNG part of a full resume's scope (for --no-load-optim without --no-load-rng)."""
    try:
        return resume_scope(saved, now, weights_only=False,
                            rng_by_model_parallel_rank=trainer_state.get(RNG_BY_MODEL_PARALLEL_RANK, False),
                            saved_optimizer_format=PER_PARAMETER, distributed_optimizer=False).rng
    except ValueError:
        return "none"


def _ranks() -> dict:
    from megatron_fixedcode.compat import parallel_ranks

    return parallel_ranks()


def _current_layout(saved: dict) -> dict:
    ranks = _ranks()
    return {k: ranks[k] for k in saved["layout"]}
