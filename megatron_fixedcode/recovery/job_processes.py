"""What one node's launch leaves running, found and ended (examples/slurm_node.sh runs this after its launcher).

Slurm ends the processes of a step that it tracks; where it tracks them by parent (``proctrack/linuxproc``,
``proctrack/pgid``, as many clusters do), a process re-parented to init escapes: a trainer rank whose launcher
agent was killed, the agent's rank monitors, a rank still retrying its store after its group was torn down,
megatron's async-save helper. Every process of one node's launch inherits ``MFC_LAUNCH_TOKEN`` from the node
script (the elastic launchers pass their environment on to workers and monitors), so they are found by it
in ``/proc/<pid>/environ``, whoever their parent is now.

Two moments: after the launcher exited on its own, whatever is left is a leftover and is ended (TERM, then
KILL after ``--grace``); after the launcher was killed (its agent lost), its trainer ranks may still be
training with their peers on the other nodes, so they are waited for first (``--wait-trainers``), then the
rest is ended. Linux only (``/proc``); elsewhere it finds nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

TOKEN_ENV = "MFC_LAUNCH_TOKEN"
TRAINER_MODULE = b"megatron_fixedcode.pretrain"


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def launch_processes(token: str) -> list[int]:
    """The live processes carrying ``token`` (this process and its parent excluded)."""
    mine, found = {os.getpid(), os.getppid()}, []
    needle = f"{TOKEN_ENV}={token}".encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if needle in _environ(int(entry.name)) and not _is_zombie(int(entry.name)):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return sorted(found)


def _is_zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "Z"


def is_trainer_rank(pid: int) -> bool:
    """A trainer rank started by the elastic agent: the agent sets LOCAL_RANK for its workers only."""
    try:
        cmdline, environ = Path(f"/proc/{pid}/cmdline").read_bytes(), _environ(pid)
    except OSError:
        return False
    return TRAINER_MODULE in cmdline and any(e.startswith(b"LOCAL_RANK=") for e in environ)


def end_processes(pids: list[int], grace: float) -> list[int]:
    """TERM each, KILL what is still alive ``grace`` seconds later; the pids that needed the KILL."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        _signal(pid, signal.SIGKILL)
    return alive


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        return not _is_zombie(pid)
    except OSError:
        return False


def remove_launcher_sockets(pids: list[int]) -> list[str]:
    """ft_launcher's IPC sockets (``<tmp>/_ft_launcher<pid>*.socket``, the launcher's and its rank monitors'),
    which it removes only when it exits on its own."""
    removed = []
    for pid in pids:
        for path in Path(tempfile.gettempdir()).glob(f"_ft_launcher{pid}*.socket"):
            try:
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
                    removed.append(path.name)
            except OSError:
                continue
    return removed


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [w.decode(errors="replace").rsplit("/", 1)[-1] for w in argv[:3] if w]
    return f"{pid} ({' '.join(words)[:60]})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("token", help=f"the launch's {TOKEN_ENV}")
    parser.add_argument("--wait-trainers", action="store_true", help="first wait for its trainer ranks to end")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between TERM and KILL (default 10)")
    parser.add_argument("--label", default="launch", help="names the launch in the lines printed")
    parser.add_argument("--launcher-pid", type=int, help="the launcher's pid: its sockets are removed")
    args = parser.parse_args(argv)
    if args.wait_trainers:
        trainers = [p for p in launch_processes(args.token) if is_trainer_rank(p)]
        if trainers:
            print(
                f"{args.label}: its trainer ranks go on: waiting for {', '.join(map(str, trainers))}", file=sys.stderr
            )
        while any(_alive(p) for p in trainers):
            time.sleep(1.0)
    left = launch_processes(args.token)
    if left:
        names = ", ".join(map(_describe, left))
        killed = end_processes(left, args.grace)
        print(
            f"{args.label}: ended what it left running: {names}"
            + (f" ({len(killed)} needed SIGKILL)" if killed else ""),
            file=sys.stderr,
        )
    if args.launcher_pid:
        remove_launcher_sockets([args.launcher_pid, *left])
    return 0


if __name__ == "__main__":
    sys.exit(main())
