"""Compiled kernels, built on first use by torch's C++ extension loader and cached on disk
(``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``). Each is optional: where it
cannot be built (no C++ compiler or ninja) the caller falls back to its torch implementation.

A first build compiles in a child process in its own session (:func:`_build_in_own_session`): a
SIGTERM or SIGINT meant for the trainer — torchrun, Slurm and a terminal signal the whole process
group — reaches the trainer's handler and not the compiler, so every rank's build finishes (it
used to kill one rank's compiler while another compiled on)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)


@functools.cache
def fixed_code_cpu_kernel() -> ModuleType | None:
    """``fixed_code_cpu.cpp``: the fixed code's one-pass CPU forward, or None if it cannot be built."""
    import torch
    from torch.utils.cpp_extension import load

    # Its stores are the whole cost: build with AVX2 where torch's own kernels use it (twice the
    # store width of the x86-64 baseline, measured 0.91 -> 0.98 of the bound). The name carries
    # the instruction set, so a cache shared by different machines keeps one build of each.
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    source = Path(__file__).with_name("fixed_code_cpu.cpp")
    logger.info("loading the fused CPU fixed-code kernel (compiled once per machine, ~30 s)")
    name = f"megatron_fixedcode_fixed_code_cpu_{'avx2' if avx2 else 'generic'}"
    spec = dict(
        name=name, sources=[str(source)], extra_cflags=["-O3", "-fopenmp", *(["-mavx2", "-mfma"] if avx2 else [])]
    )
    try:
        with _build_directory_guard(name) as build_directory:
            if not (Path(build_directory) / f"{name}.so").exists():
                _build_in_own_session({**spec, "build_directory": build_directory})
            return load(**spec, build_directory=build_directory, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the torch path
        logger.warning(
            "fused CPU fixed-code kernel unavailable (%s: %s); using the torch path",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        return None


_BUILD = """
import ctypes, json, signal, sys
try:  # PR_SET_PDEATHSIG (Linux): the build dies with the process that asked for it
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except AttributeError:
    pass
from torch.utils.cpp_extension import load
load(**json.loads(sys.argv[1]), verbose=False)
"""


def _build_in_own_session(spec: dict) -> None:
    """Compile in a child process in a new session: signals sent to the trainer's process group do
    not reach it, and the trainer waits for it (its signal handler runs meanwhile)."""
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(spec)], start_new_session=True, capture_output=True, text=True
    )
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"the kernel build exited with {proc.returncode}")


class _build_directory_guard:
    """torch's loader takes a ``lock`` file in the build directory on every load (build or not) and
    waits forever for one a killed process left behind. We serialise loads with an ``flock`` (the
    kernel releases it when its holder dies), so whoever holds ours knows any ``lock`` file is stale."""

    def __init__(self, name: str):
        from torch.utils.cpp_extension import get_default_build_root

        import torch

        root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
        # One build directory per torch installation and source path: torch's loader rebuilds whenever
        # the compile command (torch's include paths, the source's path) differs from the last build's,
        # so two environments or checkouts sharing one directory would rebuild each other's kernel (a
        # minute each) on every alternation.
        where = hashlib.sha256(f"{torch.__file__}\n{torch.__version__}\n{Path(__file__).parent}".encode()).hexdigest()[
            :10
        ]
        self.directory = root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / f"{name}-{where}"

    def __enter__(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._flock = open(self.directory.parent / f"{self.directory.name}.flock", "w")
        fcntl.flock(self._flock, fcntl.LOCK_EX)
        stale = self.directory / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a process killed while loading the kernel", stale)
            stale.unlink()
        return str(self.directory)

    def __exit__(self, *exc) -> None:
        self._flock.close()  # releases the flock
