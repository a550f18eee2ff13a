"""``--save`` checks that run before the first training step, and readable write failures.

A read-only filesystem, a ``--save`` under a regular file or a full disk were
found only at the first save (after that many steps), the last as
``[enforce fail at inline_container.cc:672] unexpected pos 704 vs 598``.

* :func:`check_save_dir_writable` — create the directory and write/fsync/remove a probe file;
  refuse with ``ValueError("--save PATH: reason (OS error)")``.
* :func:`estimate_checkpoint_bytes` / :func:`free_space_warning` — a checkpoint is
  ``params x`` :data:`CHECKPOINT_BYTES_PER_PARAM` (measured from real saves for each optimizer,
  precision and format); warn when the filesystem has room for fewer than two (the new one is
  written before the old one is pruned).
* :func:`checkpoint_write_error` — turn an exception raised while saving into a one-line
  ``ValueError`` naming the path and the OS error ("no space left on device" for torch's
  ``unexpected pos`` when the disk is full). The last good checkpoint stays as it is: ``latest``
  only moves after a complete save.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)


def _os_reason(e: OSError) -> str:
    return (e.strerror or os.strerror(e.errno or 0) or str(e)).lower() if e.errno else str(e)


def check_save_dir_writable(save_dir: str | os.PathLike, flag: str = "--save") -> Path:
    """Create ``save_dir`` (``flag``'s directory) if needed and prove a file can be written, synced and removed there."""
    path = Path(save_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{flag} {path}: exists and is not a directory") from None
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
        raise ValueError(f"{flag} {path}: cannot create the directory: {_os_reason(e)}{where}") from None
    probe = path / f".mfc_write_probe_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ValueError(f"{flag} {path}: not writable: {_os_reason(e)}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return path


# Bytes per parameter of one checkpoint (torch_dist format), by (optimizer, weights); measured from
# real saves (tests/checkpoint/test_checkpoint_size.py saves each and compares: 16.08, 14.08, 12.07,
# plain BF16 14.08, dp_reshardable FP32 16.08 B/param on disk at 2.36M parameters). The one place
# these numbers live: the start-up free-space warning and docs/study.md's disk figures use them.
#   distributed/fully_reshardable FP32: FP32 weights 4 + Adam moments 8 + its FP32 parameter copy 4
#   (fp32-autocast-bf16, paper 2's recipes, is this case); BF16: BF16 weights 2 + FP32 main 4 + 8;
#   plain Adam FP32: 4 + 8; plain BF16: 2 + FP32 main 4 + 8; weights only: 4 or 2.
CHECKPOINT_BYTES_PER_PARAM = {
    ("distributed", "fp32"): 16.0,
    ("distributed", "bf16"): 14.0,
    ("distributed_dp_reshardable", "fp32"): 16.0,
    ("distributed_dp_reshardable", "bf16"): 14.0,
    ("plain", "fp32"): 12.0,
    ("plain", "bf16"): 14.0,
    ("none", "fp32"): 4.0,
    ("none", "bf16"): 2.0,
}
CHECKPOINT_OVERHEAD = (0.01, 1 << 20)  # metadata, RNG, scheduler: 1% + 1 MiB (measured 0.5-0.6% of 2.36M params)


def estimate_checkpoint_bytes(
    num_parameters: int,
    *,
    bf16: bool = False,
    optimizer: bool = True,
    distributed_optimizer: bool = False,
    fully_reshardable: bool = True,
) -> int:
    """Bytes of one checkpoint of ``num_parameters`` (:data:`CHECKPOINT_BYTES_PER_PARAM`)."""
    kind = (
        "none"
        if not optimizer
        else (
            ("distributed" if fully_reshardable else "distributed_dp_reshardable") if distributed_optimizer else "plain"
        )
    )
    per_param = CHECKPOINT_BYTES_PER_PARAM[(kind, "bf16" if bf16 else "fp32")]
    fraction, fixed = CHECKPOINT_OVERHEAD
    return int(num_parameters * per_param * (1 + fraction)) + fixed


def free_space_warning(save_dir: str | os.PathLike, checkpoint_bytes: int, copies: int = 2) -> Optional[str]:
    """A warning (also logged) when ``save_dir``'s filesystem has room for fewer than ``copies``
    checkpoints of ``checkpoint_bytes``; ``None`` when there is room."""
    free = shutil.disk_usage(save_dir).free
    if free >= copies * checkpoint_bytes:
        return None
    message = (
        f"--save {save_dir}: {free / 2**30:.2f} GiB free, less than {copies} checkpoints of about "
        f"{checkpoint_bytes / 2**30:.2f} GiB each; saving may fail with 'no space left on device'"
    )
    logger.warning("%s", message)
    return message


def find_os_error(exc: BaseException) -> Optional[OSError]:
    """The OSError behind ``exc``: along its cause/context chain and, for torch's
    ``CheckpointException``, in the failures it gathered from the writer ranks."""
    todo, seen = [exc], set()
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno:
            return exc
        # A writer process's OSError reaches rank 0 pickled inside megatron's "Worker failure"
        # RuntimeError (its cause is lost on the way): read it back from the text.
        found = _ERRNO_TEXT.search(str(exc)) if not isinstance(exc, _checkpoint_exceptions()) else None
        if found:
            return OSError(int(found["errno"]), found["strerror"], found["filename"])
        todo += [exc.__cause__, exc.__context__]
        for failure in (getattr(exc, "failures", None) or {}).values():  # {rank: (exception, traceback)}
            todo.append(failure[0] if isinstance(failure, tuple) else failure)
    return None


_ERRNO_TEXT = re.compile(r"\[Errno (?P<errno>\d+)\] (?P<strerror>[^:\n']+)(?:: '(?P<filename>[^'\n]+)')?")


@functools.cache
def _checkpoint_exceptions() -> tuple[type, ...]:
    """Imported at first use, not with this module: the dry run's checkpoint estimate runs without torch."""
    try:  # torch's distributed-checkpoint failure, raised on every rank when a writer failed
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:
        return ()
    return (CheckpointException,)


def _short_write(exc: BaseException) -> bool:
    return "unexpected pos" in str(exc) or "PytorchStreamWriter failed" in str(exc)


def is_write_failure(exc: BaseException) -> bool:
    """Whether an exception raised while saving is the filesystem's (an OS error, torch's
    short-write report, a distributed-checkpoint write failure) rather than a bug, which keeps
    its traceback."""
    return isinstance(exc, _checkpoint_exceptions()) or find_os_error(exc) is not None or _short_write(exc)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def checkpoint_write_error(path: str | os.PathLike, exc: BaseException) -> ValueError:
    """A one-line ``ValueError`` for an exception raised while writing a checkpoint to ``path``."""
    os_error = find_os_error(exc)
    if os_error is not None:
        reason = _os_reason(os_error)
        name = os_error.filename or path
    elif _short_write(exc) or "OSError" in str(exc):  # megatron-core 0.19 passes on only the class
        # torch's zip writer reports a short write without errno; a full disk is the usual cause
        try:
            free = shutil.disk_usage(Path(path) if Path(path).exists() else Path(path).parent).free
        except OSError:
            free = -1
        reason = (
            os.strerror(errno.ENOSPC).lower()
            if 0 <= free < (64 << 20)
            else f"short write or OS error ({_last_line(exc)[:200]})"
        )
        name = path
    elif isinstance(exc, _checkpoint_exceptions()) and not exc.failures:
        reason = "another rank failed to write its part (rank 0 names the file)"
        name = path
    else:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        name = path
    return ValueError(f"cannot write checkpoint {name}: {reason}; the last complete checkpoint is kept")


def check_save_dir(save: str, rank0: bool, flag: str = "--save") -> None:
    """The first rank of every node proves it can write to ``--save`` (each node writes its
    ranks' shards there; ``flag``: --non-persistent-local-ckpt-dir, each node's own storage); rank 0 reports
    for its node, another node's first rank for its own."""
    try:
        check_save_dir_writable(save, flag)
    except ValueError as e:
        if not rank0:
            logger.error("node %s: %s", os.environ.get("GROUP_RANK", "?"), e)
        raise
