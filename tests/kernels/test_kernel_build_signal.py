"""The fused CPU kernel's first build is not interrupted by a signal meant for the
trainer. torchrun, Slurm and a terminal signal a worker's whole process group; the compiler ran in
that group and died, so that rank fell back to the torch path while the others compiled on."""

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

TRAINER = """
import os, signal, sys, threading, time
from pathlib import Path
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))  # the trainer's handler (loop.ExitRequest)
root = Path(os.environ["TORCH_EXTENSIONS_DIR"])

def scancel():  # once the compiler runs: SIGTERM to the trainer's process group, as torchrun/Slurm do
    deadline = time.time() + 300
    while not list(root.rglob("build.ninja")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    os.killpg(os.getpgid(0), signal.SIGTERM)

threading.Thread(target=scancel, daemon=True).start()
from megatron_fixedcode.kernels import fixed_code_cpu_kernel
kernel = fixed_code_cpu_kernel()
print("built" if kernel is not None else "not built", "signalled" if got else "not signalled")
"""


@pytest.mark.slow
def test_a_sigterm_to_the_trainers_process_group_does_not_stop_the_kernel_build(tmp_path):
    import shutil

    if shutil.which("ninja") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ninja")):
        pytest.skip("no ninja: the kernel cannot be built here")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["built", "signalled"], proc.stdout + proc.stderr[-3000:]
