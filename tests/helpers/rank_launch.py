"""Training ranks forked from a process that has already imported the trainer.

Each ``torchrun`` launch costs every rank (and torchrun's agent) the import of torch and megatron-core:
about 5 s of CPU per process on these 2-core machines, more than the tiny training most tests run. A
``forkserver`` that imported :mod:`megatron_fixedcode.training.loop` once forks the ranks instead; each
rank is a fresh process (no state of the test process: the fork server is started clean, single-threaded)
running the same entry point (``megatron_fixedcode.pretrain.main``) with torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). What torchrun itself does
(its agent, signal forwarding, exit-code summary) is tested through real launches in tests/launchers/ and
the signal tests; :func:`tests.helpers.pretrain.pretrain` uses this for runs expected to succeed.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STRAY_MARKER = "MFC_TEST_OWNER"  # tests/conftest.py
PRELOAD = ["megatron_fixedcode.pretrain", "megatron_fixedcode.training.loop"]
_context = None


def _forkserver():
    """The context whose server outlives each test: started without the test's owner marker, so that
    tests/conftest.py's stray-process sweep does not take it for a test's leftover."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        marker = os.environ.pop(STRAY_MARKER, None)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if marker is not None:
                os.environ[STRAY_MARKER] = marker
    return _context


def forked_ranks_wanted() -> bool:
    """MFC_TEST_TORCHRUN=1 launches every test run through torchrun (a slower, more literal run)."""
    return os.environ.get("MFC_TEST_TORCHRUN", "0") != "1"


def _rank(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str, script: str | None) -> None:
    """One rank, in the forked child: torchrun's environment, the output to the run's files; the trainer's
    entry point, or ``script`` run as ``__main__``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), fd)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [script or "megatron_fixedcode.pretrain", *argv]
    try:
        if script:
            import runpy

            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script`
            runpy.run_path(script, run_name="__main__")
            code = 0
        else:
            from megatron_fixedcode.pretrain import main

            code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # as python would: the traceback on stderr, exit code 1
        import traceback

        traceback.print_exc()
        code = 1
    # As the interpreter at exit: the atexit handlers (megatron's spawned results Manager, ...). The SystemExit
    # then lets multiprocessing run its finalizers and exit with the code; os._exit would skip both and
    # leave such helper processes running.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code or 0)


def run_ranks(
    argv: list[str], *, nproc: int, env: dict[str, str], cwd: Path, timeout: float, script: Path | None = None
) -> subprocess.CompletedProcess:
    """``megatron_fixedcode.pretrain`` (or ``script``) on ``nproc`` forked ranks; stdout and stderr of all
    ranks, and the first non-zero rank exit code (0 when all succeeded), as a CompletedProcess."""
    from megatron_fixedcode.compat.distributed import free_port  # torch and megatron-core: not at collection

    ctx = _forkserver()
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        if nproc > 1:
            env = {
                **env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
            }
        ranks = [
            ctx.Process(
                target=_rank,
                args=(
                    argv,
                    {**env, **({"RANK": str(r), "LOCAL_RANK": str(r)} if nproc > 1 else {})},
                    str(cwd),
                    out,
                    err,
                    str(script) if script else None,
                ),
            )
            for r in range(nproc)
        ]
        for p in ranks:
            p.start()
        try:
            for p in ranks:
                p.join(timeout)
                if p.exitcode is None:
                    raise subprocess.TimeoutExpired(argv, timeout)
        finally:
            for p in ranks:
                if p.exitcode is None:
                    p.kill()
                    p.join()
        code = next((p.exitcode for p in ranks if p.exitcode), 0)
        return subprocess.CompletedProcess(argv, code, Path(out).read_text(), Path(err).read_text())
