"""The multi-node launch rehearsal (examples/rehearse_multinode.sh): 2 "nodes" x 1 process through
slurm_common.sh -> slurm_node.sh -> torchrun (c10d on 127.0.0.1) -> the trainer, USR1 -> checkpoint
-> requeue -> resume, compared step by step with an uninterrupted run of the same job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.pretrain_helpers import write_corpus

SCRIPT = REPO / "examples" / "rehearse_multinode.sh"


def test_help_and_argument_refusals():
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--stop-after" in out.stdout and "scontrol" in out.stdout
    out = subprocess.run(["bash", str(SCRIPT), "--nodes", "1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--nodes >= 2" in out.stderr


@pytest.mark.slow
def test_two_node_rehearsal_trains_logs_per_node_and_resumes_identically(tmp_path):
    (tmp_path / "data").mkdir()
    train, valid = write_corpus(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env.update(DATA_PATH=train, VALID_DATA_PATH=valid, TOKENIZER="",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    work = tmp_path / "work"
    out = subprocess.run(["bash", str(SCRIPT), "--work-dir", str(work), "--stop-after", "2", "--resume-steps", "3",
                          "--", "--vocab-size", "1024"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert "identical: " in out.stdout

    interrupted = work / "interrupted"
    # the launcher's own path: node list -> MASTER_ADDR, job id -> port, one torchrun per node
    config = json.loads(next((interrupted / "logs").glob("config-*.json")).read_text())
    assert config["vocab_size"] == 1024 and config["load"] == str(interrupted / "checkpoints")
    for node in (0, 1):
        log = (interrupted / "logs" / f"node{node}.log").read_text()
        assert f"node {node} of 2" in log and "--rdzv_endpoint 127.0.0.1:" in log
        assert "restart 0" in log and "restart 1" in log  # appended across the requeue
    assert "requeue" in (interrupted / "requeue.log").read_text()
    assert (interrupted / "scancel.log").read_text().split()[1] == "--signal=TERM"
    # the resumed job started from the checkpoint, not from step 0
    steps = [json.loads(line)["step"] for line in (interrupted / "logs" / "metrics.jsonl").read_text().splitlines()]
    saved = steps[-1] - 3
    assert saved >= 2 and steps == list(range(1, saved + 4))
    slurm_out = next(interrupted.glob("slurm-*.out")).read_text()
    assert "requeueing job" in slurm_out and "start at step 0" in slurm_out and f"start at step {saved}" in slurm_out
