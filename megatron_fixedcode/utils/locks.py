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

import datetime
import errno
import fcntl
import getpass
import json
import logging
import os
import socket
import sys
import time
import weakref
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

SAVE_DIR_LOCK_NAME = ".mfc_save.lock"
"""Lock file inside a ``--save`` directory (see :func:`lock_save_dir`)."""


class LockHeld(ValueError):
    """Another live process holds the lock; ``str()`` is a one-line message naming it."""

    def __init__(self, message: str, holder: Optional[dict] = None, lock_file: str = "") -> None:
        super().__init__(message)
        self.holder = holder or {}
        self.lock_file = lock_file


def _holder_info() -> dict:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": user,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv)[:500],
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        # What the lock without flock needs to tell a live holder from a pid the kernel reused, and
        # a requeue of the same Slurm job (on another node) from another job.
        "pid_start": _pid_start_time(os.getpid()),
        "boot_id": _boot_id(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
    }


EMPTY_LOCK_GRACE_S = 30.0
"""Without flock: a lock file that records no holder (its creator was killed between creating it
and writing itself into it) is taken over once it is older than this."""


def _pid_start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22); None where
    there is no /proc or no such process. A pid the kernel gave to another process differs in it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _read_holder(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _processes_holding(lock_file: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process on this host with ``lock_file`` open: a forked child keeps
    its parent's descriptor, and with it the flock, after the parent is gone."""
    target = os.path.realpath(lock_file)
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(proc.name), cmd or "?"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return [(pid, cmd) for pid, cmd in sorted(found) if pid != os.getpid()]


def describe_holder(holder: dict, held: bool = True, lock_file: str | None = None) -> str:
    """``pid 123 on host h (user u), started T, command: ...`` or ``an unknown process``."""
    if not holder.get("pid"):
        return "an unknown process (it has not recorded itself yet)"
    text = f"pid {holder['pid']} on host {holder.get('host', '?')}"
    if holder.get("user"):
        text += f" (user {holder['user']})"
    if holder.get("started"):
        text += f", started {holder['started']}"
    if held and holder.get("host") == socket.gethostname() and not _pid_alive(int(holder["pid"])):
        children = _processes_holding(lock_file) if lock_file else []
        named = "; ".join(f"pid {pid} on host {holder['host']}, command: {cmd}" for pid, cmd in children)
        text += (f" [that pid has exited; a process it started still holds the lock: {named}; end it "
                 f"(kill {' '.join(str(pid) for pid, _ in children)}) and run again]" if children else
                 " [that pid has exited; a child process it started still holds the lock]")
    if holder.get("command"):
        text += f", command: {holder['command']}"
    return text


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            logger.info("%s: this filesystem has no flock (e.g. Lustre without -o flock): locking by exclusive "
                        "create of %s instead", self.what, self.lock_file)
            fd = self._acquire_exclusive_create()
        previous = _read_holder(self.lock_file) if self.took_over is None else self.took_over
        if previous.get("pid") and previous.get("pid") != os.getpid() and not self._logged_take_over:
            self.took_over = previous
            logger.warning("%s: taking over the lock left by a run that ended without releasing it (%s)",
                           self.what, describe_holder(previous, held=False))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_info()) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _HELD.add(self)
        return self

    def _refusal(self, holder: dict) -> LockHeld:
        return LockHeld(f"{self.what} is in use by another run: {describe_holder(holder, lock_file=self.lock_file)} "
                        f"(lock {self.lock_file}; wait for it to finish or stop it)", holder, self.lock_file)

    def _acquire_flock(self) -> int:
        for _ in range(100):
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ValueError(f"{self.what}: cannot lock {self.lock_file}: {e.strerror}") from e
                raise self._refusal(_read_holder(self.lock_file)) from None
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
            holder = _read_holder(self.lock_file)
            reason = stale_reason(holder, self.lock_file)
            if reason is None:
                raise LockHeld(f"{self._refusal(holder)}; if that run is gone, remove {self.lock_file}",
                               holder, self.lock_file)
            stale = f"{self.lock_file}.stale.{socket.gethostname()}.{os.getpid()}"
            try:  # one taker wins the rename; a loser finds the path gone and retries the create
                os.rename(self.lock_file, stale)
            except FileNotFoundError:
                continue
            if _read_holder(stale) != holder:  # renamed a new holder's file: put it back, refuse
                try:
                    os.link(stale, self.lock_file)
                except FileExistsError:
                    pass
                os.unlink(stale)
                raise self._refusal(_read_holder(self.lock_file))
            os.unlink(stale)
            self.took_over, self.take_over_reason, self._logged_take_over = holder, reason, True
            logger.warning("%s: taking over the lock file %s: %s (%s)", self.what, self.lock_file, reason,
                           describe_holder(holder, held=False))
        raise ValueError(f"{self.what}: could not lock {self.lock_file} (it keeps being replaced)")  # pragma: no cover

    def release(self) -> None:
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is None:
            return
        if os.getpid() != _holder_pid(fd):  # a forked child closing its copy must not unlink
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


def stale_reason(holder: dict, lock_file: str) -> Optional[str]:
    """Why the holder recorded in ``lock_file`` (no flock) cannot be a live run writing the
    directory, or None when it may be one (then the lock is refused):

    * no holder recorded (empty or unparsable file) and the file is older than
      :data:`EMPTY_LOCK_GRACE_S` — its creator died before writing itself into it;
    * the same Slurm job (``SLURM_JOB_ID``) on another node or in another incarnation
      (``SLURM_RESTART_COUNT``): a requeue, and Slurm ends a job's processes before requeuing it;
    * on this host: the machine rebooted since (``boot_id``), the pid has exited, or the pid now
      belongs to another process (its start time differs from the recorded one).
    """
    if not holder.get("pid"):
        try:
            age = time.time() - os.stat(lock_file).st_mtime
        except FileNotFoundError:
            return None  # gone meanwhile: the create is retried
        if age < EMPTY_LOCK_GRACE_S:
            return None
        return f"it records no holder and is {age:.0f} s old (its creator died before recording itself)"
    job = os.environ.get("SLURM_JOB_ID")
    if job and holder.get("slurm_job_id") == job:
        if holder.get("host") != socket.gethostname():
            return f"it was left by this Slurm job ({job}) on node {holder.get('host')} (a requeue)"
        if str(holder.get("slurm_restart_count")) != str(os.environ.get("SLURM_RESTART_COUNT")):
            return f"it was left by an earlier run of this Slurm job ({job}, requeued)"
    if holder.get("host") != socket.gethostname():
        return None  # no kernel here can tell whether that run is alive
    pid = int(holder["pid"])
    if holder.get("boot_id") and _boot_id() and holder["boot_id"] != _boot_id():
        return "this host has rebooted since it was written"
    if not _pid_alive(pid):
        return f"pid {pid} has exited"
    started = _pid_start_time(pid)
    if holder.get("pid_start") is not None and started is not None and started != holder["pid_start"]:
        return f"pid {pid} is now another process (started at tick {started}, the holder at {holder['pid_start']})"
    if holder.get("pid_start") is None and started is not None:  # a lock recorded without it: its time
        try:
            locked_at = datetime.datetime.fromisoformat(holder["started"]).timestamp()
            process_at = _boot_time() + started / os.sysconf("SC_CLK_TCK")
        except (KeyError, TypeError, ValueError, OSError):
            return None
        if process_at > locked_at + 2:
            return f"pid {pid} is now another process (it started after the lock was taken)"
    return None


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def _holder_pid(fd: int) -> int:
    try:
        return int(json.loads(os.pread(fd, 4096, 0).decode() or "{}").get("pid", -1))
    except (OSError, ValueError):
        return -1


def lock_output_prefix(prefix: str | os.PathLike, flag: str = "--output-prefix") -> PathLock:
    """Acquire the lock ``<prefix>.lock`` for a writer of ``<prefix>*`` outputs."""
    return PathLock(f"{prefix}.lock", f"{flag} {prefix}").acquire()


def lock_save_dir(save_dir: str | os.PathLike) -> PathLock:
    """Acquire the lock of a checkpoint directory: ``<save_dir>/.mfc_save.lock`` (the
    directory is created). Hold it for the whole training run on every rank-0 of a job."""
    return PathLock(Path(save_dir) / SAVE_DIR_LOCK_NAME, f"--save {save_dir}").acquire()
