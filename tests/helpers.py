"""Shared test helpers: launching torchrun workers and locating the shared test data."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` under ``torchrun --nproc_per_node nproc`` on gloo; fail with its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--standalone", str(script), *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def skip_unless_kernel_builds(kernel: str) -> None:
    """``kernel="fused"`` needs the compiled CPU kernel (a C++ compiler and ninja, built on first
    use); where it cannot be built, the torch path is what runs, and these cases skip."""
    import pytest

    from megatron_fixedcode.kernels import fixed_code_cpu_kernel

    if kernel == "fused" and fixed_code_cpu_kernel() is None:
        pytest.skip("the fused CPU kernel cannot be built here (no C++ compiler or ninja)")
