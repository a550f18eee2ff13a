"""Which checkpoint a resume loads: one decision, before any process group, across the stores a run writes
(``--load``'s persistent checkpoints and, with ``--non-persistent-ckpt-type global``, its non-persistent
directory). Nothing rewrites the flags: the run plan carries the chosen :class:`ResumeSource`.

A resume the user did not pin takes the newest complete checkpoint that verifies; one that does not (a file
missing or of another size here, its SHA-256 differing when the ranks hash their shares after the process
group exists) is passed over with a warning naming it and why, and kept on disk for inspection. A
checkpoint the user named (``--ckpt-step N``, ``--finetune``'s) that fails stays a one-line refusal, as
does a resume where nothing verifies. Megatron-LM's order: a non-persistent checkpoint at the same step
as the newest persistent one or newer wins.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from megatron_fixedcode.checkpoint.paths import CorruptCheckpoint, checkpoint_dir
from megatron_fixedcode.checkpoint.stores import NON_PERSISTENT, PERSISTENT, DirectoryStore, directory_stores
from megatron_fixedcode.checkpoint.verify import corrupt_message, verified_step

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ResumeSource:
    """The checkpoint a resume loads: its store, directory and step; the older ones that verify in sizes
    (taken in order when the chosen one fails its hashes); those passed over, each with why."""

    store: str  # PERSISTENT | NON_PERSISTENT
    root: str
    step: int
    pinned: bool  # named by the user (--ckpt-step, --finetune): a failure is a refusal, never a fallback
    fallbacks: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)  # (store, root, step)
    passed_over: list[dict] = dataclasses.field(default_factory=list)  # {"checkpoint", "store", "why"}

    @property
    def target(self) -> Path:
        return checkpoint_dir(self.root, self.step)

    def directory_store(self) -> DirectoryStore:
        """The store it lives in, which loads it."""
        return DirectoryStore(self.store, self.root)

    def pass_over(self, why: str, rank0: bool) -> "ResumeSource | None":
        """This one failed (``why``): the next candidate that verifies in sizes, or None."""
        self.passed_over.append({"checkpoint": str(self.target), "store": self.store, "why": why})
        if rank0:
            logger.warning("checkpoint passed over (kept on disk for inspection): %s", why)
        while self.fallbacks:
            store, root, step = self.fallbacks.pop(0)
            error = _size_check(root, step)
            if error is None:
                return dataclasses.replace(self, store=store, root=root, step=step)
            self.passed_over.append({"checkpoint": str(checkpoint_dir(root, step)), "store": store, "why": error})
            if rank0:
                logger.warning("checkpoint passed over (kept on disk for inspection): %s", error)
        return None


def _size_check(root: str, step: int) -> str | None:
    return DirectoryStore(PERSISTENT, root).check(step)  # the same files and sizes in either store


def choose_resume_source(ck, rank0: bool = True, evaluation: bool = False) -> ResumeSource | None:
    """The checkpoint a run with ``--load`` resumes from, or None when the stores hold none. ``ck``: the
    run's CheckpointConfig; ``evaluation`` (--skip-train): the newest persistent one, as named, never an older
    one in its place. A ``ValueError``/``CorruptCheckpoint`` (one line, exit 2) when a pinned one fails or
    none verifies."""
    if ck.load_step is not None or ck.finetune:  # named: no other is taken in its place
        step = verified_step(ck.load, ck.load_step, hash_files=False, verify=ck.verify)
        return None if step is None else ResumeSource(PERSISTENT, ck.load, step, pinned=True)
    stores = directory_stores(ck)
    # newest first; at the same step the non-persistent one first (Megatron-LM: "same step or newer wins")
    candidates = sorted(
        ((s.kind, s.root, step) for s in stores for step in s.steps(rank0 and s.kind == PERSISTENT)),
        key=lambda c: (c[2], c[0] == NON_PERSISTENT),
        reverse=True,
    )
    if not candidates:
        return None
    if not ck.verify:
        store, root, step = candidates[0]
        verified_step(root, step, verify=False)  # its warning: loaded without checking checksums
        return ResumeSource(store, root, step, pinned=False)
    passed: list[dict] = []
    for i, (store, root, step) in enumerate(candidates):
        error = _size_check(root, step)
        if error is None:
            source = ResumeSource(
                store, root, step, pinned=evaluation, fallbacks=candidates[i + 1 :], passed_over=passed
            )
            _log_choice(source, stores, rank0)
            return source
        if evaluation:  # what is evaluated is the newest checkpoint, or nothing
            raise CorruptCheckpoint(corrupt_message(root, step, error))
        passed.append({"checkpoint": str(checkpoint_dir(root, step)), "store": store, "why": error})
        if rank0:
            logger.warning("checkpoint passed over (kept on disk for inspection): %s", error)
    store, root, step = candidates[0]
    raise CorruptCheckpoint(
        f"no checkpoint verifies in --load {ck.load}"
        + (f" nor {stores[1].root}" if len(stores) > 1 else "")
        + f": {corrupt_message(root, step, passed[0]['why'])}"
    )


def _log_choice(source: ResumeSource, stores, rank0: bool) -> None:
    if not rank0:
        return
    if source.store == NON_PERSISTENT:  # Megatron-LM's line
        logger.info("Loading from a non-persistent checkpoint (non-persistent iter %d): %s", source.step, source.root)
    elif len(stores) > 1 and any(s == NON_PERSISTENT for s, _, _ in source.fallbacks):
        logger.warning("non-persistent checkpoints are older than persistent checkpoint")  # Megatron-LM's line


def set_aside(passed_over: list[dict]) -> None:
    """Move each passed-over checkpoint out of the way of this run's saves (which would write the same step
    again), kept for inspection as ``ROOT/passed_over-iter_N-<time>`` (no ``iter_*`` name: no reader takes it
    for a checkpoint, no retention deletes it). One process (rank 0), before any save."""
    for entry in passed_over:
        target = Path(entry["checkpoint"])
        if not target.is_dir():
            continue
        kept = target.with_name(f"passed_over-{target.name}-{int(time.time())}")
        try:
            target.rename(kept)
        except OSError as e:
            logger.warning("could not set %s aside (%s): a save of its step will overwrite it", target, e)
            continue
        entry["kept_as"] = str(kept)
        logger.warning("passed-over checkpoint %s kept for inspection as %s", target, kept)


def same_dir(x: str | None, y: str | None) -> bool:
    return x is not None and y is not None and os.path.realpath(x) == os.path.realpath(y)
