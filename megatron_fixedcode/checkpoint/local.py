"""Megatron-LM's ``--non-persistent-ckpt-type local``: each rank keeps its own checkpoint file in node-local storage
(``--non-persistent-local-ckpt-dir``), written and found by nvidia-resiliency-ext's ``LocalCheckpointManager`` from
megatron-core's ``MCoreTensorAwareStateDict``, as Megatron-LM's ``checkpointing.py`` does. A restart on the same
nodes loads it when it is newer than the persistent checkpoint; on other nodes (a requeue) the files are not there
and the persistent one loads.

What the package lacks for this project's guarantees, and :class:`ChecksummedLocalManager` adds: each file's
SHA-256 beside it, written once the file is complete, and a file without a matching checksum does not count, so
``find_latest`` (every rank must have the step) takes the newest step every rank still holds intact, or none; the
half-written file of a killed save is removed before that step is saved again (the package opens it exclusively).
The package's own rename of a finished file and its cleanup of older steps only after every rank saved keep the
previous checkpoint until the new one is complete everywhere.

Saves are synchronous here (the package's asynchronous local save waits on CUDA). A local checkpoint resumes the
same run on the same layout only: one from another run (another identity, layout or sample stream) is passed over
with a warning.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch.distributed as dist

from megatron_fixedcode.checkpoint.load import log_loaded, restore
from megatron_fixedcode.checkpoint.resume_scope import DP_RESHARDABLE, EVERYTHING, PER_PARAMETER
from megatron_fixedcode.checkpoint.state import _data_parallel_group, optimizer_format, sharded_state, state_to_save
from megatron_fixedcode.checkpoint.stores import LOCAL, Parts

logger = logging.getLogger(__name__)

CHECKSUM_SUFFIX = ".sha256"
CHECKSUMS_RECORDED = {"algorithm": "sha256", "record": f"<file>{CHECKSUM_SUFFIX}", "covers": "each rank's file"}
MATCHES_THIS_RUN = ("identity", "layout", "global_batch_size", "seq_length", "seed", "dataset_type", "data_path")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _manager_class():
    from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

    class ChecksummedLocalManager(LocalCheckpointManager):
        """The package's manager, each file counted only with its checksum (see the module's docstring)."""

        def __init__(self, root: str, verify: bool = True):
            super().__init__(root)
            self.verify = verify
            self._hashed: dict[Path, tuple] = {}  # a file this process hashed, by (size, mtime): not read again

        def _checksum_path(self, path: Path) -> Path:
            return path.with_name(path.name + CHECKSUM_SUFFIX)

        def _save(self, state_dict, ckpt_id) -> None:
            self._ensure_dir()
            self._local_ckpt_path_from_id(ckpt_id, True).unlink(missing_ok=True)  # a killed save's partial file
            final = self._local_ckpt_path_from_id(ckpt_id, False)
            self._checksum_path(final).unlink(missing_ok=True)
            super()._save(state_dict, ckpt_id)
            digest = _sha256(final)
            tmp = self._checksum_path(final).with_suffix(".tmp")
            tmp.write_text(digest)
            tmp.rename(self._checksum_path(final))
            stat = final.stat()
            self._hashed[final] = (stat.st_size, stat.st_mtime_ns)

        def _intact(self, path: Path) -> bool:
            record = self._checksum_path(path)
            if not record.is_file():
                logger.warning("local checkpoint %s has no checksum (its save was interrupted): not used", path)
                return False
            if not self.verify:
                return True
            stat = path.stat()
            if self._hashed.get(path) == (stat.st_size, stat.st_mtime_ns):
                return True
            if _sha256(path) != record.read_text().strip():
                logger.warning("local checkpoint %s: its bytes changed since it was written (checksum): not used", path)
                return False
            self._hashed[path] = (stat.st_size, stat.st_mtime_ns)
            return True

        def _my_ckpt_ids(self):
            return [i for i in super()._my_ckpt_ids() if self._intact(self._local_ckpt_path_from_id(i))]

        def _drop_orphan_checksums(self) -> None:
            for record in self.local_ckpt_dir.glob(f"*{CHECKSUM_SUFFIX}"):
                if not record.with_name(record.name[: -len(CHECKSUM_SUFFIX)]).exists():
                    record.unlink(missing_ok=True)

        def _cleanup(self, iteration) -> None:
            super()._cleanup(iteration)
            self._drop_orphan_checksums()

        def _cleanup_failed_save(self, iteration) -> None:
            super()._cleanup_failed_save(iteration)
            self._drop_orphan_checksums()

    return ChecksummedLocalManager


def _optimizer_format(optimizer) -> str:
    """Megatron-LM refuses the fully reshardable distributed-optimizer format for local checkpoints: a local one
    loads on its own layout only, so the distributed optimizer saves its own buffers (dp_reshardable)."""
    return PER_PARAMETER if optimizer_format(optimizer) == PER_PARAMETER else DP_RESHARDABLE


class LocalCheckpoints:
    """This rank's local non-persistent checkpoints (created after the process groups): the ``local`` store of
    :mod:`.stores`."""

    kind = LOCAL

    def __init__(self, root: str, algo: str = "fully_parallel", verify: bool = True):
        self.algo = algo
        self.manager = _manager_class()(root, verify=verify)
        self.loaded_step: int | None = None  # the step this run resumed from a local checkpoint

    @property
    def directory(self) -> Path:
        return Path(self.manager.local_ckpt_dir)

    def save(self, step: int, parts: Parts, trainer_state: dict) -> Path:
        """Every rank its file; returns this rank's directory. The package removes older steps once every rank
        has this one."""
        from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict

        trainer_state = {**trainer_state, "optimizer_format": _optimizer_format(parts.optimizer)}
        state = state_to_save(*parts, trainer_state, CHECKSUMS_RECORDED)
        # the shard distribution computed afresh each save (Megatron-LM reuses it only under
        # --ckpt-assume-constant-structure, which is inert here)
        tensor_aware, _ = MCoreTensorAwareStateDict.from_state_dict(
            state, algo=self.algo, parallelization_group=_data_parallel_group()
        )
        self.manager.save(tensor_aware, step, is_async=False)
        return self.directory

    def forget(self) -> None:
        """This rank's local checkpoints removed: the run resumed from elsewhere (a newer persistent checkpoint, an
        explicit --ckpt-step, --finetune) or they are another run's; left in place, a restart could load a step of
        a timeline this run is no longer on."""
        for path in self.directory.glob("iter_*"):
            path.unlink(missing_ok=True)
        self.manager.latest_iteration = -1

    def newest_step(self) -> int | None:
        """The newest step every rank holds intact (a collective), or None."""
        step = self.manager.find_latest()
        return None if step < 0 else step

    def load(self, step: int, parts: Parts, this_run: dict, **_) -> dict | None:
        """Load ``step``, the newest local checkpoint (after :meth:`newest_step`, a collective), into the parts and
        return its trainer state; None (nothing loaded) when it was saved by another run than ``this_run`` (a
        trainer state)."""
        chunks, optimizer, scheduler = parts
        tensor_aware, _ = self.manager.load()
        saved = tensor_aware.common_state_dict["trainer"]
        if saved["step"] != step:
            raise ValueError(f"{self.directory}: holds step {saved['step']}, asked for {step}")
        gathered = [None] * dist.get_world_size()  # every rank decides alike
        dist.all_gather_object(gathered, [k for k in MATCHES_THIS_RUN if saved.get(k) != this_run.get(k)])
        differs = sorted({k for keys in gathered for k in keys})
        if differs:
            if dist.get_rank() == 0:
                logger.warning(
                    "local checkpoint of step %d in %s was saved by another run (differs: %s): not used",
                    saved["step"],
                    self.directory.parent,
                    ", ".join(differs),
                )
            return None
        # the optimizer in the format it was saved in (older local checkpoints: the one this code writes)
        saved_format = saved.get("optimizer_format", _optimizer_format(optimizer))
        template = sharded_state(chunks, optimizer, saved_format, loading=True)  # the rest: the common state
        loaded = tensor_aware.to_state_dict(template, algo=self.algo, parallelization_group=_data_parallel_group())
        restore(loaded, self.directory, saved, chunks, optimizer, scheduler, EVERYTHING)
        self.loaded_step = saved["step"]
        if dist.get_rank() == 0:
            logger.info("resumed from local checkpoint %s (step %d)", self.directory.parent, saved["step"])
            log_loaded(self.directory.parent, saved["step"])
        return saved
