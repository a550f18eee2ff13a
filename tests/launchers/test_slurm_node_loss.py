"""A node that fails is cut out, not waited for (examples/slurm_relaunch.sh), on the real local Slurm cluster's
partition of three nodes (tests/helpers/slurm.py), one CPU rank each, launched as users submit it: a node set DOWN
mid-run leaves the job (``#SBATCH --no-kill``), and the launcher runs the step again on the two nodes left, in the
same job, at the same global batch: every step once, each step's samples (metrics.jsonl's digest) those of the
uninterrupted run's, its loss equal within the reduction order."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.slurm import (
    SMALL,
    STRAIGHT_LAST,
    STRAIGHT_RUN,
    assert_nothing_left,
    job_info,
    launcher_env,
    sbatch,
    shared_straight_run,
    steps,
    wait_done,
    wait_for_step,
    wait_until,
    write_shards,
)

pytestmark = pytest.mark.slow
THREE_NODES = ["--partition=three", "--nodes=3", *SMALL[1:]]
LAST, RUN = STRAIGHT_LAST, STRAIGHT_RUN


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("node_loss"))


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory) -> list[dict]:
    """The uninterrupted run on two nodes (shared with the other Slurm files): the same samples each step at any
    data-parallel size, the loss equal up to the reduction order."""
    return shared_straight_run(tmp_path_factory)


def _same_samples_and_loss(straight: list[dict], got: list[dict]) -> None:
    assert [r["step"] for r in got] == list(range(1, LAST + 1)), [r["step"] for r in got]
    for a, b in zip(straight, got):
        assert a["samples"] == b["samples"] and a["tokens"] == b["tokens"] and a["lr"] == b["lr"], b["step"]
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (b["step"], a["loss"], b["loss"])


def test_a_node_set_down_is_cut_out_and_the_run_goes_on_with_the_two_left(slurm, shards, straight, tmp_path):
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, SAVE_INTERVAL="4"), *RUN, sbatch_opts=THREE_NODES)
    wait_for_step(tmp_path, 6, job)
    info = job_info(job)
    nodes = subprocess.run(["scontrol", "show", "hostnames", info["NodeList"]], capture_output=True, text=True)
    lost = next(n for n in nodes.stdout.split() if n != info["BatchHost"])
    down = time.time()
    subprocess.run(["scontrol", "update", f"nodename={lost}", "state=down", "reason=mfc-test"], check=True)
    try:
        info = wait_done(job, tmp_path, 400)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"], capture_output=True)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), out[-5000:]
    assert f"cut out: {lost}" in out and "continuing on 2 of 3 nodes" in out, out[-5000:]
    assert "data-parallel size 2, 3 microbatches per rank" in out, out[-5000:]
    _same_samples_and_loss(straight, steps(tmp_path))
    attempts = json.loads((tmp_path / "logs" / "attempts.json").read_text())["attempts"]
    assert attempts[-1]["first_step_at"] - down < 90, attempts
    assert {h for h, _, _ in attempts[-1]["hosts"]} == set(nodes.stdout.split()) - {lost}, attempts
    note = attempts[-1]["relaunch"]
    assert note.startswith(f"cut out: {lost}: ") and "3 -> 2 nodes" in note and "data-parallel size 3 -> 2" in note
    assert "reduced size: 2 of 3 nodes (data-parallel 2)" in out, out[-5000:]
    assert_nothing_left(job)


def test_a_node_whose_rank_fails_at_two_attempts_in_a_row_is_cut_out(slurm, shards, straight, tmp_path):
    """Slurm keeps calling the node up; its rank is killed at step 5 and, after the in-job restart, at step 7: the
    launcher cuts it out (the attempts record names it) and the run goes on on the two nodes left."""
    faults = "rank_killed;@mfc-node3;5;0 rank_killed;@mfc-node3;7;1"
    env = launcher_env(shards, tmp_path, SAVE_INTERVAL="4", MAX_RESTARTS="1", MFC_SIM_FAULT=faults)
    job = sbatch(tmp_path, env, *RUN, sbatch_opts=THREE_NODES)
    info = wait_done(job, tmp_path, 500)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), out[-5000:]
    assert "cut out: mfc-node3: its ranks failed at attempts 0 and 1" in out, out[-5000:]
    _same_samples_and_loss(straight, steps(tmp_path))
    attempts = json.loads((tmp_path / "logs" / "attempts.json").read_text())["attempts"]
    assert [a["attempt"] for a in attempts] == [0, 1, 2] and "mfc-node3" in attempts[2]["relaunch"], attempts
    assert "mfc-node3" not in {h for h, _, _ in attempts[2]["hosts"]}, attempts
    assert_nothing_left(job)


def test_a_requeue_after_a_shrink_grows_back_to_full_size_and_continues_exactly(slurm, shards, straight, tmp_path):
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, SAVE_INTERVAL="4"), *RUN, sbatch_opts=THREE_NODES)
    wait_for_step(tmp_path, 4, job)
    info = job_info(job)
    lost = next(
        n
        for n in subprocess.run(
            ["scontrol", "show", "hostnames", info["NodeList"]], capture_output=True, text=True
        ).stdout.split()
        if n != info["BatchHost"]
    )
    subprocess.run(["scontrol", "update", f"nodename={lost}", "state=down", "reason=mfc-test"], check=True)
    try:
        wait_until(lambda: "reduced size" in (tmp_path / f"slurm-{job}.out").read_text(), 200, "the shrink", tmp_path)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"], capture_output=True)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)  # the time limit near: requeue
    info = wait_done(job, tmp_path, 500)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), out[-5000:]
    _same_samples_and_loss(straight, steps(tmp_path))
    attempts = json.loads((tmp_path / "logs" / "attempts.json").read_text())["attempts"]
    assert len({h for h, _, _ in attempts[-1]["hosts"]}) == 3 and "relaunch" not in attempts[-1], attempts
    assert_nothing_left(job)


def test_under_min_nodes_the_job_requeues_saying_why_and_comes_back_at_full_size(slurm, shards, straight, tmp_path):
    env = launcher_env(shards, tmp_path, SAVE_INTERVAL="4", MIN_NODES="3")
    job = sbatch(tmp_path, env, *RUN, sbatch_opts=THREE_NODES)
    wait_for_step(tmp_path, 5, job)
    lost = "mfc-node3" if job_info(job)["BatchHost"] != "mfc-node3" else "mfc-node2"
    subprocess.run(["scontrol", "update", f"nodename={lost}", "state=down", "reason=mfc-test"], check=True)
    try:
        wait_until(lambda: job_info(job).get("Restarts") == "1", 200, "the requeue", tmp_path)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"], capture_output=True)
    info = wait_done(job, tmp_path, 500)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out[-5000:]
    assert f"not continuing on fewer nodes: 1 node(s) cut out ({lost}: " in out, out[-5000:]
    assert "2 usable node(s), fewer than MIN_NODES=3: no relaunch on fewer nodes" in out, out[-5000:]
    assert f"requeueing job {job} without the step's failed nodes ({lost};" in out, out[-5000:]
    _same_samples_and_loss(straight, steps(tmp_path))
