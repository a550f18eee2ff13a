"""The stores a run's checkpoints live in, behind one small interface: the newest valid step, save, load, forget.

* ``persistent``: ``--save``/``--load``, megatron dist-checkpoint directories ``iter_N`` under a ``latest`` marker;
* ``non-persistent``: ``--non-persistent-ckpt-type global``, the same directories under ``ROOT/non_persistent``,
  only the newest kept;
* ``local``: ``--non-persistent-ckpt-type local``, each rank's file in node-local storage
  (:class:`~.local.LocalCheckpoints`, nvidia-resiliency-ext's manager), for restarts on the same nodes and layout.

The guarantees are each store's save and load, applied alike (:mod:`.save`, :mod:`.load`, :mod:`.local`): one
state builder (:mod:`.state`), checksums recorded before the marker moves and verified before a load, the
identity and layout checks, non-finite weights refused, the precision-change line. Which store a resume takes is
decided once (:mod:`.resume_source`); the :class:`~.checkpointer.Checkpointer` saves into them.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import NamedTuple, Protocol

from megatron_fixedcode.checkpoint.paths import CorruptCheckpoint, LATEST_MARKER, checkpoint_dir, latest_step
from megatron_fixedcode.checkpoint.verify import verify_checkpoint

logger = logging.getLogger(__name__)

PERSISTENT = "persistent"
NON_PERSISTENT = "non-persistent"
LOCAL = "local"


class Parts(NamedTuple):
    """What a checkpoint saves from and loads into."""

    chunks: list
    optimizer: object
    scheduler: object


class Store(Protocol):
    kind: str  # PERSISTENT | NON_PERSISTENT | LOCAL

    def newest_step(self) -> int | None:
        """The newest step this store holds complete and intact, or None."""

    def save(self, step: int, parts: Parts, trainer_state: dict, **how) -> Path:
        """Write ``step``; the previous one stays the newest until this one is complete."""

    def load(self, step: int, parts: Parts, **how) -> dict | None:
        """Load ``step`` into ``parts`` with every resume's checks; its trainer state (None: not this run's)."""

    def forget(self) -> None:
        """Drop what the store holds: a timeline this run left (it resumed from elsewhere)."""


class DirectoryStore:
    """A store of megatron dist-checkpoint directories (persistent, or global non-persistent): every rank writes
    its share of ``ROOT/iter_N``, rank 0 records the checksums and then moves the marker; ``keep_last`` and
    ``retain_interval`` prune older steps after a save."""

    def __init__(self, kind: str, root: str, keep_last: int | None = None, retain_interval: int | None = None):
        self.kind, self.root = kind, root
        self.keep_last, self.retain_interval = keep_last, retain_interval

    def __repr__(self) -> str:
        return f"DirectoryStore({self.kind}, {self.root})"

    def steps(self, rank0: bool = False) -> list[int]:
        """The complete checkpoints, newest first: up to the ``latest`` marker (a newer directory is a save that did
        not finish); with the marker unreadable, every one that has megatron's metadata (said on ``rank0``)."""
        base = Path(self.root)
        if not base.is_dir():
            return []
        try:
            marker = latest_step(base)
        except ValueError as e:
            marker = None
            if rank0:
                logger.warning("%s; taking the newest checkpoint of %s that verifies", e, self.root)
        steps = sorted(
            (int(p.name[5:]) for p in base.glob("iter_*") if p.name[5:].isdigit() and (p / "metadata.json").exists()),
            reverse=True,
        )
        if marker is not None:
            steps = [s for s in steps if s <= marker]
            if marker not in steps:  # the marker names a step whose directory is gone or incomplete: said at its check
                steps.insert(0, marker)
        return steps

    def check(self, step: int) -> str | None:
        """Why ``step`` cannot load here, in files and sizes (hashes are checked by the ranks at load), or None."""
        target = checkpoint_dir(self.root, step)
        if not (target / "metadata.json").exists():
            return f"{target}: not a complete checkpoint (megatron's metadata.json missing)"
        try:
            verify_checkpoint(target, hash_files=False)
        except CorruptCheckpoint as e:
            return str(e)
        return None

    def newest_step(self) -> int | None:
        return next((s for s in self.steps() if self.check(s) is None), None)

    def save(self, step: int, parts: Parts, trainer_state: dict, async_queue=None, keep=None) -> Path:
        """Every rank (checkpoint/save.py); under ``--async-save`` (``async_queue``) the files are written in the
        background and the marker moves when the queue finalizes the save. ``keep(step)``: an older step pruning
        must leave (a downstream evaluation waits on it)."""
        from megatron_fixedcode.checkpoint.save import save_checkpoint

        return save_checkpoint(
            self.root, step, *parts, trainer_state, self.keep_last, self.retain_interval, async_queue, keep
        )

    def load(self, step: int, parts: Parts, scope=None, **_) -> dict | None:
        """Every rank (checkpoint/load.py), resharded to this layout, keeping what ``scope`` allows."""
        from megatron_fixedcode.checkpoint.load import load_checkpoint

        return load_checkpoint(self.root, *parts, step, scope=scope)

    def forget(self) -> None:
        """Rank 0: the directories and the marker removed (non-persistent stores only: persistent checkpoints are
        the user's, never removed but by their retention flags)."""
        if self.kind == PERSISTENT:
            raise ValueError(f"{self.root}: persistent checkpoints are not forgotten")
        for path in Path(self.root).glob("iter_*"):
            shutil.rmtree(path, ignore_errors=True)
        (Path(self.root) / LATEST_MARKER).unlink(missing_ok=True)


def directory_stores(ck, root: str | None = None) -> list[DirectoryStore]:
    """The directory stores of a run's ``CheckpointConfig`` under ``root`` (default: ``--load``): the persistent one,
    and the global non-persistent one with ``--non-persistent-ckpt-type global``."""
    root = ck.load if root is None else root
    stores = [DirectoryStore(PERSISTENT, root)]
    if ck.non_persistent_ckpt_type == "global":
        stores.append(DirectoryStore(NON_PERSISTENT, ck.non_persistent_dir(root), keep_last=1))
    return stores
