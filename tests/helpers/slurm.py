"""The local Slurm cluster the Slurm tests run against (scripts/slurm_local.sh): the session
fixture that finds or starts it, job state read from scontrol and sacct, and the paper-2 launcher
submitted with sbatch as its header shows (shrunk to a CPU model by trainer flags)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO as ROOT
from tests.helpers import SMOLLM2
from tests.helpers.data import write_indexed_dataset

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


LAUNCHER = ROOT / "examples" / "pretrain_1p7b_fixedcode.sh"
TOKENIZER = SMOLLM2
# trainer flags that only shrink the paper-2 model (and run it on CPU); --exit-interval ends every run
SHRINK = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--num-query-groups",
    "4",
    "--ffn-hidden-size",
    "128",
    "--seq-length",
    "64",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "4",
    "--transformer-impl",
    "local",
    "--precision",
    "fp32",
    "--samples-per-shard-visit",
    "8",
    "--train-iters",
    "1000",
    "--lr-warmup-iters",
    "2",
    "--lr-decay-iters",
    "1000",
    "--log-interval",
    "1",
    "--eval-interval",
    "1000",
    "--eval-iters",
    "1",
]
# one node, one CPU "GPU" rank, few CPUs: the #SBATCH header's 2 x 8 GPUs, 64 CPUs, exclusive, overridden
SMALL = ["--nodes=1", "--gpus-per-node=1", "--cpus-per-task=2", "--mem=2G", "--oversubscribe", "--time=10"]


def launcher_env(shards: Path, run: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    # exactly as the launcher's header builds it: one prefix per line
    data_path = subprocess.run(
        f"ls {shards}/*_train_text_document.idx | sed 's/.idx$//'",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env.update(
        DATA_PATH=data_path,
        VALID_DATA_PATH=str(shards / "00000_valid_text_document"),
        TOKENIZER=str(TOKENIZER),
        CKPT_DIR=str(run / "ckpt"),
        LOG_DIR=str(run / "logs"),
        TENSORBOARD_DIR="",
        SAVE_INTERVAL="100000",
        MFC_REQUIRE_CUDA="0",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        PYTHONPATH=str(ROOT),
        VIRTUAL_ENV=sys.prefix,
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    env.update(extra)
    return env


def sbatch(run: Path, env: dict, *flags: str, sbatch_opts=SMALL, script=LAUNCHER) -> str:
    run.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["sbatch", "--parsable", *sbatch_opts, f"--output={run}/slurm-%j.out", str(script), *flags],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def job_processes(job: str) -> dict[int, str]:
    """The live processes of Slurm job ``job`` on this machine (both test nodes run here): pid -> command line.
    Every process a step starts inherits SLURM_JOB_ID, re-parented or not."""
    needle, found = f"SLURM_JOB_ID={job}".encode(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
    return found


def assert_nothing_left(job: str, within: float = 15) -> None:
    """No process of the ended job alive ``within`` seconds after scontrol says it ended."""
    deadline = time.monotonic() + within
    while (left := job_processes(job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"job {job} ended {within:.0f} s ago and left running: {left}"


def steps(run: Path) -> list[dict]:
    path = run / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_for_step(run: Path, step: int, job: str):
    def reached():
        assert job_info(job).get("JobState") in IN_FLIGHT, (run / f"slurm-{job}.out").read_text()[-3000:]
        return len(steps(run)) >= step

    wait_until(reached, 400, f"step {step}", run)


def write_shards(root: Path) -> Path:
    """Three train shards and a valid shard, token ids of the SmolLM2 vocabulary."""
    rng = np.random.default_rng(0)
    for i in range(3):
        docs = [rng.integers(1, 49000, size=int(rng.integers(80, 200))) for _ in range(40)]
        write_indexed_dataset(root / f"{i:05d}_train_text_document", docs, dtype=np.uint16)
    write_indexed_dataset(
        root / "00000_valid_text_document", [rng.integers(1, 49000, size=120) for _ in range(10)], dtype=np.uint16
    )
    return root


# The uninterrupted two-node run the restart and node-loss tests compare with (12 samples a step: 3 microbatches
# of 2 on each of two ranks, 2 on each of three), run once per test session and shared by the files and xdist
# workers that ask for it.
STRAIGHT_LAST = 16
STRAIGHT_RUN = [*SHRINK, "--global-batch-size", "12", "--exit-interval", str(STRAIGHT_LAST)]
STRAIGHT_RUN += ["--distributed-timeout-minutes", "1"]
TWO_NODES = ["--nodes=2", *SMALL[1:]]


def shared_straight_run(tmp_path_factory) -> list[dict]:
    """The steps of :data:`STRAIGHT_RUN` on two nodes, persistent checkpoints every 4 steps; the first caller of
    the session runs it (under a lock in the session's base directory, which every xdist worker shares)."""
    base = tmp_path_factory.getbasetemp()  # an xdist worker's is popen-gwN in the session's own directory
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-straight-run"
    (root / "shards").mkdir(parents=True, exist_ok=True)
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "steps.json"
        if not done.exists():
            run = root / "run"
            shards = write_shards(root / "shards")
            job = sbatch(run, launcher_env(shards, run, SAVE_INTERVAL="4"), *STRAIGHT_RUN, sbatch_opts=TWO_NODES)
            info = wait_done(job, run, 300)
            assert info["JobState"] == "COMPLETED", (run / f"slurm-{job}.out").read_text()[-3000:]
            done.write_text(json.dumps(steps(run)))
    return json.loads(done.read_text())
