"""Exclusive per-path locks for writers (preprocess / merge outputs, the trainer's ``--save``).

A lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a lock file next to (or inside) the path it
guards. On a filesystem without flock (Lustre mounted without ``-o flock``: ``ENOSYS``), chosen
automatically and logged, the lock is the lock file's exclusive creation instead; see
:meth:`PathLock._acquire_exclusive_create` for its take-over rule. The kernel releases it when the holder's last file descriptor on it closes, which
includes the holder being killed (``kill -9``), so a lock file left behind by a killed run is
simply taken over: there is no "stale lock" to clean up by hand and no pid guessing. The lock
file records who holds it (host, pid, user, command, start time), so a refused second writer
can name the holder in one line.

Notes:

* ``flock`` works on local filesystems and, on Linux, on NFS (emulated with byte-range locks
  since 2.6.12). A forked child inherits the lock (same open file description): while a helper
  forked by the holder is alive the lock stays held — on purpose, as that helper may still be
  writing. Helpers should die with their parent (``megatron_fixedcode.compat.process``).
* Two locks on one path in one process also exclude each other (each acquisition opens the
  file anew), so in-process tests behave like separate runs.
* On release the lock file is removed while still locked; acquirers check after locking that
  the file they locked is still the one at the path (else retry), so removal cannot let two
  holders in.

Usage::

    with PathLock(prefix + ".lock", f"--output-prefix {prefix}"):
        ...write outputs...

A refusal raises :class:`LockHeld` (a ``ValueError``, so tools turn it into ``error: ...`` and
exit code 2).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import weakref
from pathlib import Path
from typing import Optional

from megatron_fixedcode.utils.lock_holders import describe_holder, holder_info, holder_pid, read_holder, stale_reason

logger = logging.getLogger(__name__)

SAVE_DIR_LOCK_NAME = ".mfc_save.lock"
"""Lock file inside a ``--save`` directory (see :func:`lock_save_dir`)."""


class LockHeld(ValueError):
    """Another live process holds the lock; ``str()`` is a one-line message naming it."""

    def __init__(self, message: str, holder: Optional[dict] = None, lock_file: str = "") -> None:
        super().__init__(message)
        self.holder = holder or {}
        self.lock_file = lock_file


class PathLock:
    """An exclusive, non-blocking lock held through ``lock_file``; a context manager.

    ``what`` names the guarded thing in the refusal message, e.g. ``"--output-prefix /d/x"``.
    """

    def __init__(self, lock_file: str | os.PathLike, what: str = "") -> None:
        self.lock_file = str(lock_file)
        self.what = what or self.lock_file
        self._fd: Optional[int] = None
        self.took_over: Optional[dict] = None
        """Holder recorded by a previous run that died holding the lock (if any)."""
        self.take_over_reason: Optional[str] = None
        """Without flock: why the lock file found there was taken over (logged)."""
        self._logged_take_over = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "PathLock":
        if self._fd is not None:
            return self
        Path(self.lock_file).parent.mkdir(parents=True, exist_ok=True)
        if _flock_works(Path(self.lock_file).parent):
            fd = self._acquire_flock()
        else:
            logger.info(
                "%s: this filesystem has no flock (e.g. Lustre without -o flock): locking by exclusive "
                "create of %s instead",
                self.what,
                self.lock_file,
            )
            fd = self._acquire_exclusive_create()
        previous = read_holder(self.lock_file) if self.took_over is None else self.took_over
        if previous.get("pid") and previous.get("pid") != os.getpid() and not self._logged_take_over:
            self.took_over = previous
            logger.warning(
                "%s: taking over the lock left by a run that ended without releasing it (%s)",
                self.what,
                describe_holder(previous, held=False),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_info()) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _HELD.add(self)
        return self

    def _refusal(self, holder: dict) -> LockHeld:
        return LockHeld(
            f"{self.what} is in use by another run: {describe_holder(holder, lock_file=self.lock_file)} "
            f"(lock {self.lock_file}; wait for it to finish or stop it)",
            holder,
            self.lock_file,
        )

    def _acquire_flock(self) -> int:
        for _ in range(100):
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ValueError(f"{self.what}: cannot lock {self.lock_file}: {e.strerror}") from e
                raise self._refusal(read_holder(self.lock_file)) from None
            try:  # the file we locked must still be the one at the path (see module notes)
                same = os.stat(self.lock_file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)
        raise ValueError(f"{self.what}: could not lock {self.lock_file} (it keeps being replaced)")  # pragma: no cover

    def _acquire_exclusive_create(self) -> int:
        """Without flock: the lock is the file's existence (``O_CREAT | O_EXCL``). A lock file found
        there is taken over (logged, with the reason) only when its holder provably is no live
        run writing this directory (:func:`stale_reason`); otherwise the refusal names the holder
        and the file to remove if that run is gone."""
        for _ in range(100):
            try:
                return os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                pass
            holder = read_holder(self.lock_file)
            reason = stale_reason(holder, self.lock_file)
            if reason is None:
                raise LockHeld(
                    f"{self._refusal(holder)}; if that run is gone, remove {self.lock_file}", holder, self.lock_file
                )
            stale = f"{self.lock_file}.stale.{socket.gethostname()}.{os.getpid()}"
            try:  # one taker wins the rename; a loser finds the path gone and retries the create
                os.rename(self.lock_file, stale)
            except FileNotFoundError:
                continue
            if read_holder(stale) != holder:  # renamed a new holder's file: put it back, refuse
                try:
                    os.link(stale, self.lock_file)
                except FileExistsError:
                    pass
                os.unlink(stale)
                raise self._refusal(read_holder(self.lock_file))
            os.unlink(stale)
            self.took_over, self.take_over_reason, self._logged_take_over = holder, reason, True
            logger.warning(
                "%s: taking over the lock file %s: %s (%s)",
                self.what,
                self.lock_file,
                reason,
                describe_holder(holder, held=False),
            )
        raise ValueError(f"{self.what}: could not lock {self.lock_file} (it keeps being replaced)")  # pragma: no cover

    def release(self) -> None:
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is None:
            return
        if os.getpid() != holder_pid(fd):  # a forked child closing its copy must not unlink
            os.close(fd)
            return
        try:
            os.unlink(self.lock_file)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # releases the flock

    def __enter__(self) -> "PathLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - best effort
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


_HELD: "weakref.WeakSet[PathLock]" = weakref.WeakSet()


def _close_in_forked_child() -> None:
    """A forked child (DataLoader worker, checkpoint worker, pool process) gets a copy of every
    descriptor, and a copy keeps the flock after its parent died: a killed run's orphaned worker would
    lock its directory for good. Children do not hold their parent's locks (O_CLOEXEC covers exec)."""
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_forked_child)

_NO_FLOCK = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def _flock_works(directory: Path) -> bool:
    """Whether ``flock`` works on the filesystem of ``directory`` (a probe file, removed)."""
    probe = directory / f".mfc_flock_probe.{socket.gethostname()}.{os.getpid()}"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as e:
        if e.errno in _NO_FLOCK:
            return False
        return True  # held by someone (cannot be: the name is ours) or transient: flock exists
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except FileNotFoundError:
            pass


def lock_output_prefix(prefix: str | os.PathLike, flag: str = "--output-prefix") -> PathLock:
    """Acquire the lock ``<prefix>.lock`` for a writer of ``<prefix>*`` outputs."""
    return PathLock(f"{prefix}.lock", f"{flag} {prefix}").acquire()


def lock_save_dir(save_dir: str | os.PathLike) -> PathLock:
    """Acquire the lock of a checkpoint directory: ``<save_dir>/.mfc_save.lock`` (the
    directory is created). Hold it for the whole training run on every rank-0 of a job."""
    return PathLock(Path(save_dir) / SAVE_DIR_LOCK_NAME, f"--save {save_dir}").acquire()
