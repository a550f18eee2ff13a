"""Who holds a writer's lock (``utils/locks.py``): what a lock file records of its holder (host, pid and its
start time, boot, user, command, Slurm job), the one line that names it in a refusal, and when a lock file
left by a dead holder may be taken over on a filesystem without flock."""

from __future__ import annotations

import datetime
import getpass
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional


def holder_info() -> dict:
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
        "pid_start": pid_start_time(os.getpid()),
        "boot_id": boot_id(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
    }


EMPTY_LOCK_GRACE_S = 30.0
"""Without flock: a lock file that records no holder (its creator was killed between creating it
and writing itself into it) is taken over once it is older than this."""


def pid_start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22); None where
    there is no /proc or no such process. A pid the kernel gave to another process differs in it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def read_holder(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def processes_holding(lock_file: str) -> list[tuple[int, str]]:
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
    if held and holder.get("host") == socket.gethostname() and not pid_alive(int(holder["pid"])):
        children = processes_holding(lock_file) if lock_file else []
        named = "; ".join(f"pid {pid} on host {holder['host']}, command: {cmd}" for pid, cmd in children)
        text += (
            f" [that pid has exited; a process it started still holds the lock: {named}; end it "
            f"(kill {' '.join(str(pid) for pid, _ in children)}) and run again]"
            if children
            else " [that pid has exited; a child process it started still holds the lock]"
        )
    if holder.get("command"):
        text += f", command: {holder['command']}"
    return text


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    if holder.get("boot_id") and boot_id() and holder["boot_id"] != boot_id():
        return "this host has rebooted since it was written"
    if not pid_alive(pid):
        return f"pid {pid} has exited"
    started = pid_start_time(pid)
    if holder.get("pid_start") is not None and started is not None and started != holder["pid_start"]:
        return f"pid {pid} is now another process (started at tick {started}, the holder at {holder['pid_start']})"
    if holder.get("pid_start") is None and started is not None:  # a lock recorded without it: its time
        try:
            locked_at = datetime.datetime.fromisoformat(holder["started"]).timestamp()
            process_at = boot_time() + started / os.sysconf("SC_CLK_TCK")
        except (KeyError, TypeError, ValueError, OSError):
            return None
        if process_at > locked_at + 2:
            return f"pid {pid} is now another process (it started after the lock was taken)"
    return None


def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def holder_pid(fd: int) -> int:
    try:
        return int(json.loads(os.pread(fd, 4096, 0).decode() or "{}").get("pid", -1))
    except (OSError, ValueError):
        return -1
