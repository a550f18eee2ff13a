import os
import signal
import uuid
from pathlib import Path

import pytest

import megatron_fixedcode  # noqa: F401  first, as the package's users do: it settles megatron-core 0.19 with the
# [ft] extra's release before any test module imports megatron-core (compat/nvrx_release.py)

# The library's study data and the local evaluation tasks read $MFC_SHARED_DATA: in tests, always the
# repository's tests/assets (never a data directory of the machine), also for every subprocess.
os.environ["MFC_SHARED_DATA"] = str(Path(__file__).resolve().parent / "assets")

STRAY_MARKER = "MFC_TEST_OWNER"  # every subprocess a test starts inherits it (tests build env from os.environ)


@pytest.fixture(scope="session")
def single_rank():
    """megatron parallel state on a world of one (gloo), shared by in-process model tests."""
    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed

    return initialize_distributed(ParallelLayout(), seed=1234)


@pytest.fixture(scope="session")
def slurm():
    """The local Slurm cluster of the Slurm tests (tests/helpers/slurm.py)."""
    from tests.helpers.slurm import ensure_cluster

    ensure_cluster()


def _processes_owned_by(marker: str) -> list[int]:
    needle = f"{STRAY_MARKER}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # exited meanwhile, or not ours
                pass
    return pids


@pytest.fixture(autouse=True)
def _no_stray_processes():
    """A test's processes end with it: a trainer left running by a failed or timed-out test (torchrun
    ranks, a quickstart's child) would otherwise slow every later test on a 2-core machine."""
    if not Path("/proc/self/environ").exists():  # not Linux: nothing to scan
        yield
        return
    marker = uuid.uuid4().hex
    os.environ[STRAY_MARKER] = marker
    try:
        yield
    finally:
        del os.environ[STRAY_MARKER]
        for pid in _processes_owned_by(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# The longest test files, longest first: on two xdist workers a long file started last keeps one worker
# busy while the other idles. scripts/test.sh passes --no-loadscope-reorder so that --dist loadfile hands
# out files in this order (by default xdist orders them by their number of tests). Measured on the full
# command (--durations); the rest keep their order.
LONGEST_FIRST = (
    "launchers/test_slurm.py",
    "repository/test_wheel.py",
    "training/test_pretrain.py",
    "training/test_megatron_cli.py",
    "checkpoint/test_checkpoint_integrity.py",
    "training/test_distributed_optimizer.py",
    "repository/test_gpu_check.py",
    "launchers/test_slurm_study.py",
    "checkpoint/test_async_save.py",
    "launchers/test_slurm_saves_and_evals.py",
    "launchers/test_slurm_downstream.py",
    "training/test_megatron_log_checks.py",
    "launchers/test_slurm_restarts.py",
    "recovery/test_in_job_restarts.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first; GPU-marked tests skip on machines without CUDA."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests_root = Path(__file__).resolve().parent

    def file_rank(item) -> int:
        try:
            return rank.get(Path(str(item.fspath)).resolve().relative_to(tests_root).as_posix(), len(rank))
        except ValueError:  # a test outside tests/
            return len(rank)

    items.sort(key=file_rank)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
