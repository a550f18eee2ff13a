"""The paper-2 launcher under the real local Slurm cluster (tests/helpers/slurm.py), torchrun included, on what
the fifth fault campaign found: the downstream-evaluation jobs a torchrun rank submits score (they used to inherit
torchrun's agent-store variables and hang); --ckpt-keep-last keeps a checkpoint until it is scored; a time-limit
USR1 and a scancel during an --async-save with the persistent worker end with that checkpoint complete and marked
and no process left; a rerun exit 16 past MAX_REQUEUES says what the rerun state machine asked for."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from megatron_fixedcode.checkpoint.paths import checkpoint_dir, latest_step
from megatron_fixedcode.checkpoint.verify import verify_checkpoint
from megatron_fixedcode.eval import checkpoint_scores as cs
from tests.helpers.slurm import (
    SHRINK,
    job_info,
    launcher_env,
    sacct,
    sbatch,
    steps,
    wait_done,
    wait_for_step,
    wait_until,
    write_shards,
)

pytestmark = pytest.mark.slow
EVAL_SBATCH = "--ntasks=1 --cpus-per-task=1 --mem=2G --oversubscribe --time=10"
ASYNC = ["--async-save", "--use-persistent-ckpt-worker"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("fwe"))


def _processes_of(run: Path) -> list[str]:
    """Command lines of the processes still running that name this test's directory."""
    out = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_evaluations_of_a_torchrun_launch_score_every_checkpoint_none_pruned_first(slurm, shards, tmp_path):
    """SAVE_INTERVAL=2, --ckpt-keep-last 1, an evaluation per checkpoint: each job (submitted by a torchrun rank)
    scores, and no checkpoint is pruned before its score (each job takes longer than two save intervals)."""
    pytest.importorskip("lm_eval")
    job = sbatch(
        tmp_path,
        launcher_env(shards, tmp_path, SAVE_INTERVAL="2", HF_DATASETS_CACHE=str(tmp_path / "hf")),
        *SHRINK,
        "--exit-interval",
        "6",
        "--ckpt-keep-last",
        "1",
        "--downstream-eval-tasks",
        "piqa_local",
        "--downstream-eval-interval",
        "2",
        "--downstream-eval-limit",
        "2",
        f"--downstream-eval-sbatch={EVAL_SBATCH}",
    )
    wait_done(job, tmp_path, 400)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert sacct(job) == ("COMPLETED", "0:0"), out[-4000:]
    save = tmp_path / "ckpt"
    evals = {step: json.loads(cs.job_file(save, step, ".job").read_text())["slurm_job"] for step in (2, 4, 6)}
    for step, eval_job in evals.items():
        wait_done(eval_job, tmp_path, 300)
        log = cs.job_file(save, step, ".log").read_text()
        assert sacct(eval_job) == ("COMPLETED", "0:0"), log[-4000:]
        assert "no such checkpoint" not in log
    records = cs.read_scores(tmp_path / "logs" / cs.JSONL_NAME)
    assert sorted((r["step"], r["task"]) for r in records) == [(2, "piqa_local"), (4, "piqa_local"), (6, "piqa_local")]
    node = (tmp_path / "logs" / "node0.log").read_text()
    assert "keeping checkpoint step 2 beyond the pruning flags" in node, node[-4000:]


def _async_run(tmp_path, shards, **env) -> str:
    """--async-save with the persistent worker, a checkpoint every step: a save is in flight most of the time."""
    return sbatch(
        tmp_path,
        launcher_env(shards, tmp_path, SAVE_INTERVAL="1", **env),
        *SHRINK,
        *ASYNC,
        "--exit-interval",
        "12",
    )


def _stop_checkpoint(run: Path, job: str) -> int:
    """The step the stop saved (the exit record's), checked complete: marked latest, every checksum right."""
    record = json.loads((run / "logs" / f"exit-{job}.json").read_text())
    assert record["code"] == 0 and record["stopped_by"] == "signal", record
    assert latest_step(str(run / "ckpt")) == record["step"]
    verify_checkpoint(checkpoint_dir(run / "ckpt", record["step"]))
    return record["step"]


def test_a_time_limit_during_an_async_save_checkpoints_requeues_and_resumes(slurm, shards, tmp_path):
    job = _async_run(tmp_path, shards)
    wait_for_step(tmp_path, 3, job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_until(lambda: job_info(job).get("Restarts") == "1", 300, "the launcher's requeue", tmp_path)
    saved = _stop_checkpoint(tmp_path, job)
    info = wait_done(job, tmp_path, 400)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), out[-4000:]
    node = (tmp_path / "logs" / "node0.log").read_text()
    assert f"start at step {saved}" in node and "checkpoint worker" not in node, node[-4000:]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 13))  # each step once
    time.sleep(1)
    assert _processes_of(tmp_path) == []


def test_a_scancel_during_an_async_save_cancels_with_that_checkpoint_complete(slurm, shards, tmp_path):
    job = _async_run(tmp_path, shards)
    wait_for_step(tmp_path, 3, job)
    subprocess.run(["scancel", job], check=True)
    info = wait_done(job, tmp_path, 200)
    time.sleep(2)  # a requeue would show as PENDING again within this
    info = job_info(job)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), out[-4000:]
    saved = _stop_checkpoint(tmp_path, job)
    node = (tmp_path / "logs" / "node0.log").read_text()
    assert re.search(rf"saved checkpoint \S+iter_0*{saved} \(written in the background", node), node[-4000:]
    assert _processes_of(tmp_path) == []


def test_a_rerun_exit_past_max_requeues_says_to_resume_on_another_node(slurm, shards, tmp_path):
    """A persistent fault (injected): exit 16 with a checkpoint, resumed in the job, 16 again; with no requeue left
    the last line says the rerun state machine asks for a resume on another GPU, naming the node."""
    job = sbatch(
        tmp_path,
        launcher_env(shards, tmp_path, MAX_REQUEUES="0"),
        *SHRINK,
        "--exit-interval",
        "8",
        "--rerun-mode",
        "validate_results",
        "--error-injection-rate",
        "1",
        "--error-injection-type",
        "persistent_error",
    )
    info = wait_done(job, tmp_path, 300)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "3:0"), out[-4000:]
    record = json.loads((tmp_path / "logs" / f"exit-{job}.json").read_text())
    assert record["code"] == 16 and record["stopped_by"] == "rerun state machine", record
    step, host = record["step"], record["rerun_nodes"][0].split()[0]
    assert latest_step(str(tmp_path / "ckpt")) == step
    last = out.strip().splitlines()[-1]
    assert last.startswith(
        f"unfinished: the rerun state machine stopped the job at step {step} of 1000 (exit 16) to re-run step "
        f"{step + 1} on another GPU than {host} (device"
    ), last
    assert f"--exclude={host})" in last
    # exit 16 resumed in the job first (an in-job restart, without waiting for a requeue); 16 again on the same
    # GPUs is not restarted in the job: the launcher's requeue is the way to other GPUs
    attempts = json.loads((tmp_path / "logs" / "attempts.json").read_text())["attempts"]
    assert [(a["attempt"], a["ended"]["code"]) for a in attempts] == [(0, 16), (1, 16)], attempts
    assert "after an in-job restart on the same GPUs, to re-run step" in out
