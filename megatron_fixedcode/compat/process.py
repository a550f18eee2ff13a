"""Helper processes die with their parent.

A process forked as a helper (megatron-core's persistent async checkpoint writer, a
``multiprocessing`` pool worker, ...) is not killed when its parent is SIGKILLed: it is
re-parented to init and lives on, holding data files, logs and the writer lock open.
Linux's ``prctl(PR_SET_PDEATHSIG, sig)`` makes the kernel send ``sig`` to the child when the
thread that created it exits, for whatever reason (including ``kill -9``).

* :func:`die_with_parent` — call first thing in a child (e.g. a pool ``initializer``).
* :func:`install_die_with_parent_for_forks` — call once in the parent: every later
  ``multiprocessing`` child (fork, forkserver and spawn start methods) and ``os.fork`` child
  calls :func:`die_with_parent` when it starts. This covers megatron-core's
  ``AsyncCaller`` / ``PersistentAsyncCaller`` / ``FileSystemWriterAsync`` workers without
  changing megatron.

Elsewhere than Linux these are no-ops (returns ``False``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_installed = False


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    If the parent is already gone (it died before this call, and this process was
    re-parented), exits at once. Returns whether the request was made.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    parent = os.getppid()
    if parent == 1 or (expected_parent is not None and parent != expected_parent):
        os._exit(1)  # the parent died before the request: nobody would ever reap our work
    return True


def _after_fork_in_child(parent_pid: int) -> None:
    die_with_parent(signal.SIGKILL, expected_parent=parent_pid)


def install_die_with_parent_for_forks() -> bool:
    """Make every child process started after this call die with this process.

    ``os.register_at_fork`` covers ``fork`` (and ``multiprocessing``'s fork context, which
    forks); ``spawn``/``forkserver`` children run a fresh interpreter, so they are covered by
    wrapping ``multiprocessing.process.BaseProcess._bootstrap`` (runs in the child first).
    Idempotent; returns whether it is active (Linux only).
    """
    global _installed
    if _prctl() is None:
        return False
    if _installed:
        return True
    parent = {"pid": os.getpid()}

    def before_fork() -> None:
        parent["pid"] = os.getpid()

    os.register_at_fork(before=before_fork, after_in_child=lambda: _after_fork_in_child(parent["pid"]))

    import multiprocessing.process as mp_process

    original = mp_process.BaseProcess._bootstrap
    if not getattr(original, "_mfc_die_with_parent", False):

        def _bootstrap(self, *args, **kwargs):
            die_with_parent(signal.SIGKILL)
            return original(self, *args, **kwargs)

        _bootstrap._mfc_die_with_parent = True
        mp_process.BaseProcess._bootstrap = _bootstrap
    _installed = True
    return True


def helper_manager(start_method: str = "fork"):
    """A started ``multiprocessing`` ``SyncManager`` whose server process dies with this one.

    ``ctx.Manager()`` forks a server that outlives a SIGKILLed parent (it only stops on an
    orderly shutdown); this one is started with :func:`die_with_parent` as its initializer.
    """
    import multiprocessing
    from multiprocessing.managers import SyncManager

    manager = SyncManager(ctx=multiprocessing.get_context(start_method))
    manager.start(initializer=_helper_init, initargs=(os.getpid(),))
    return manager


def _helper_init(parent: int) -> None:
    """A manager server: dies with its parent, and leaves the launcher's signals to it (scancel signals every
    process of the step; a forked server would run the rank's handler, or die, mid-save)."""
    from megatron_fixedcode.utils.exit_signals import ignore_launcher_signals

    die_with_parent(signal.SIGKILL, parent)
    ignore_launcher_signals()


def helper_queue(start_method: str = "fork"):
    """``helper_manager().Queue()``: a manager-backed queue (as megatron-core's async checkpoint
    writer uses for its results) whose server dies with this process. The proxy keeps the
    manager alive."""
    return helper_manager(start_method).Queue()
