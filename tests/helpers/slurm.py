"""The local Slurm cluster the Slurm tests run against (scripts/slurm_local.sh): the session
fixture that finds or starts it, and job state read from scontrol and sacct."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import REPO as ROOT

LOCAL = ROOT / "scripts" / "slurm_local.sh"
IN_FLIGHT = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}


def ensure_cluster() -> None:
    """The cluster runs: found, or started where CI or MFC_SLURM=1 asks for it (failing if it cannot);
    elsewhere the test skips."""
    if subprocess.run(["bash", str(LOCAL), "status"], capture_output=True, timeout=120).returncode == 0:
        return
    required = os.environ.get("CI") == "true" or os.environ.get("MFC_SLURM") == "1"
    if not required:
        pytest.skip("no local Slurm cluster: run `bash scripts/slurm_local.sh start` (root) or set MFC_SLURM=1")
    res = subprocess.run(["bash", str(LOCAL), "start"], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"scripts/slurm_local.sh start failed: {res.stderr.strip()[-2000:]}")


def job_info(job: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def sacct_now(job: str) -> tuple[str, str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"], capture_output=True, text=True
    ).stdout.split()
    return tuple(out[0].split("|")) if out else ("", "")


def sacct(job: str, timeout: float = 60) -> tuple[str, str]:
    """The job's final (State, ExitCode) in the accounting database. slurmctld sends a job's end to
    slurmdbd asynchronously, so right after scontrol says the job ended sacct may still say RUNNING:
    poll until the record leaves the in-flight states (the last record is returned at the timeout)."""
    deadline = time.monotonic() + timeout
    record = sacct_now(job)
    while (record[0] in IN_FLIGHT or not record[0]) and time.monotonic() < deadline:
        time.sleep(0.5)
        record = sacct_now(job)
    return record


def wait_until(predicate, timeout: float, what: str, run: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    logs = "".join(p.read_text()[-3000:] for p in run.glob("slurm-*.out")) if run else ""
    pytest.fail(f"timed out waiting for {what}\n{logs}")


def wait_done(job: str, run: Path, timeout: float = 400) -> dict:
    def done():
        info = job_info(job)
        return info if info.get("JobState") and info["JobState"] not in IN_FLIGHT else None

    return wait_until(done, timeout, f"job {job} to end", run)
