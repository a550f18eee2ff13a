"""In-job restarts under the real local Slurm cluster (tests/helpers/slurm.py): two nodes, one CPU rank each,
launched as users submit it (sbatch, then srun, then ft_launcher of nvidia-resiliency-ext, the default where
it is installed). A rank killed with SIGKILL, or stopped (SIGSTOP: a hang, found by the collective timeout),
restarts the worker group inside the allocation without a resubmission, and the run ends with the steps of an
uninterrupted run, each recorded once; a restart budget of 1 and two crashes ends FAILED saying so; the same
step crashing twice ends FAILED without using the rest of the budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.pretrain import assert_same_steps
from tests.helpers.slurm import (
    STRAIGHT_LAST,
    STRAIGHT_RUN,
    TWO_NODES,
    assert_nothing_left,
    job_processes,
    launcher_env,
    sbatch,
    shared_straight_run,
    steps,
    wait_done,
    wait_for_step,
    write_shards,
)

pytestmark = pytest.mark.slow
LAST, RUN = STRAIGHT_LAST, STRAIGHT_RUN


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("restarts"))


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory) -> list[dict]:
    """The uninterrupted run: steps 1..LAST on two nodes (shared with the other Slurm files)."""
    return shared_straight_run(tmp_path_factory)


def _rank_pid(run: Path, rank: int) -> int:
    """The trainer process of ``rank`` of this test's job (both Slurm nodes run on this machine)."""
    for pid in subprocess.run(
        ["pgrep", "-f", "megatron_fixedcode.pretrain"], capture_output=True, text=True
    ).stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and str(run).encode() in cmdline and b"--dry-run" not in cmdline:
            return int(pid)
    raise AssertionError(f"no rank {rank} process of {run}")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _attempts(run: Path, job: str) -> list[dict]:
    return json.loads((run / "logs" / "attempts.json").read_text())["attempts"]


def _assert_exact_and_once(run: Path, straight: list[dict]) -> None:
    got = steps(run)
    assert [r["step"] for r in got] == list(range(1, LAST + 1)), [r["step"] for r in got]
    assert_same_steps(straight, got)


def test_a_killed_rank_restarts_the_group_in_the_job_and_ends_as_the_straight_run(slurm, shards, straight, tmp_path):
    """SIGKILL of rank 1 (node 2) once step 6 is logged, with persistent checkpoints every 4 steps and local
    non-persistent ones every 3 (each rank's node-local directory): the group restarts from the newest complete
    checkpoint (the persistent 4, or the local 6 unless the kill came during its write) in the same allocation (no
    requeue: Slurm's restart count stays 0), every step equal to the straight run's and recorded once; the new
    attempt names the failed step and the log has the goodput line."""
    local = tmp_path / "local"
    np_flags = ["--non-persistent-save-interval", "3", "--non-persistent-ckpt-type", "local"]
    np_flags += ["--non-persistent-local-ckpt-dir", str(local)]
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, SAVE_INTERVAL="4"), *RUN, *np_flags, sbatch_opts=TWO_NODES)
    wait_for_step(tmp_path, 6, job)
    os.kill(_rank_pid(tmp_path, 1), signal.SIGKILL)
    info = wait_done(job, tmp_path, 300)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), out[-4000:]
    _assert_exact_and_once(tmp_path, straight)
    attempts = _attempts(tmp_path, job)
    assert [a["attempt"] for a in attempts] == [0, 1] and attempts[1]["resumed_from"] in (4, 6), attempts
    loaded = attempts[1]["loaded"]  # the record names the store the one load came from
    assert loaded["store"] == ("local" if attempts[1]["resumed_from"] == 6 else "persistent"), attempts
    if attempts[1]["resumed_from"] == 6:
        assert "Loading from a non-persistent checkpoint (non-persistent iter 6)" in out, out[-4000:]
    assert sorted(p.name for p in local.glob("*/iter_*")) == [  # 15 the newest local one (16: persistent)
        "iter_0000015_0_local.pt",
        "iter_0000015_0_local.pt.sha256",
        "iter_0000015_1_local.pt",
        "iter_0000015_1_local.pt.sha256",
    ]
    assert f"in-job restart 1: attempt 0 failed at step {attempts[0]['step'] + 1}" in out, out[-4000:]
    assert "goodput: " in out and "1 in-job restart: #1 after step" in out, out[-3000:]
    record = json.loads((tmp_path / "logs" / f"exit-{job}.json").read_text())
    assert record["code"] == 0 and 0 < record["goodput"] <= 1 and len(record["restarts"]) == 1, record
    assert_nothing_left(job)


def test_a_stopped_rank_is_found_by_the_collective_timeout_and_the_group_restarts(slurm, shards, straight, tmp_path):
    """SIGSTOP of rank 1 at step 6 with --distributed-timeout-minutes 1: rank 0's collective times out, the group
    restarts within a couple of minutes and finishes as the straight run; the log names the rank that stopped
    answering and its host, and the step."""
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, SAVE_INTERVAL="4"), *RUN, sbatch_opts=TWO_NODES)
    wait_for_step(tmp_path, 6, job)
    pid = _rank_pid(tmp_path, 1)  # ranks follow the rendezvous' order of arrival: rank 1 is on either node
    node = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    stopped = time.time()
    os.kill(pid, signal.SIGSTOP)
    info = wait_done(job, tmp_path, 400)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out[-4000:]
    _assert_exact_and_once(tmp_path, straight)
    attempts = _attempts(tmp_path, job)
    assert len(attempts) == 2 and attempts[1]["first_step_at"] - stopped < 180, attempts
    failed = attempts[0]["step"] + 1
    assert f"step {failed}: a collective failed" in out, out[-4000:]
    host = node[b"SLURMD_NODENAME"].decode()
    assert f"attempt 0 failed at step {failed} (rank 1 ({host}) stopped answering" in out, out[-4000:]
    assert_nothing_left(job)  # the stopped rank too


def test_a_restart_budget_of_one_spent_in_start_up_ends_failed_saying_so_and_leaves_nothing(slurm, shards, tmp_path):
    """MAX_RESTARTS=1: a rank on node 2 dies at step 5 (attempt 0), then one on node 1 while attempt 1 is still
    starting (right after its process group exists): the job ends FAILED within the collective timeout, its
    output saying the in-job restarts are used up, the record holding both attempts, and no process of the job
    alive 15 s after it ended. (Each node's agent counts only its own workers' failures: before the budget was
    the allocation's, two crashes on two nodes restarted twice and COMPLETED.)"""
    env = launcher_env(
        shards,
        tmp_path,
        SAVE_INTERVAL="4",
        MAX_RESTARTS="1",
        MFC_SIM_FAULT="rank_killed;@mfc-node2;5;0 rank_killed_starting;@mfc-node1;0;1",
    )
    job = sbatch(tmp_path, env, *RUN, sbatch_opts=TWO_NODES)
    info = wait_done(job, tmp_path, 300)
    ended, ended_at = time.monotonic(), time.time()
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", out[-4000:]
    assert "failed: the in-job restarts are used up (MAX_RESTARTS=1): attempt 1 failed too" in out, out[-4000:]
    attempts = _attempts(tmp_path, job)
    assert [a["attempt"] for a in attempts] == [0, 1] and attempts[1]["resumed_from"] is None, attempts
    assert ended_at - attempts[1]["started"] < 90, attempts  # the collective timeout is 60 s
    assert_nothing_left(job, within=15 - (time.monotonic() - ended))


def test_a_killed_launcher_agent_ends_the_job_as_the_run_did_and_leaves_nothing(slurm, shards, straight, tmp_path):
    """SIGKILL of node 2's ft_launcher at step 6: its trainer rank goes on with its peer to the last step; the
    node script waits for it, then ends what the agent left (its rank monitor); the job COMPLETED (the exit
    record's code 0), every step once and as the straight run's, nothing of the job running 15 s after."""
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, SAVE_INTERVAL="4"), *RUN, sbatch_opts=TWO_NODES)
    wait_for_step(tmp_path, 6, job)
    processes = job_processes(job)
    agent = next(  # the agent (python .../ft_launcher) the node script started, not its forked rank monitor server
        pid
        for pid, cmd in processes.items()
        if cmd.split()[1].endswith("/ft_launcher")
        and "slurm_node.sh" in processes.get(_parent(pid), "")
        and b"SLURMD_NODENAME=mfc-node2" in Path(f"/proc/{pid}/environ").read_bytes()
    )
    os.kill(agent, signal.SIGKILL)
    info = wait_done(job, tmp_path, 300)
    ended = time.monotonic()
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out[-4000:]
    _assert_exact_and_once(tmp_path, straight)
    assert "the launcher ft_launcher was killed (signal 9): its trainer ranks go on without it" in out, out[-4000:]
    assert_nothing_left(job, within=15 - (time.monotonic() - ended))
    assert not list(Path(tempfile.gettempdir()).glob(f"_ft_launcher{agent}*.socket")), "the agent's sockets were left"


def test_the_same_step_crashing_twice_ends_failed_without_using_the_budget(slurm, shards, tmp_path):
    """Rank 1 dies at step 6 in every attempt: after the second time the job ends FAILED saying that a restart
    cannot fix it, with 3 of MAX_RESTARTS=5 restarts unused."""
    env = launcher_env(shards, tmp_path, SAVE_INTERVAL="4", MAX_RESTARTS="5", MFC_SIM_FAULT="rank_killed;1;6")
    job = sbatch(tmp_path, env, *RUN, sbatch_opts=TWO_NODES)
    info = wait_done(job, tmp_path, 300)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "FAILED", out[-4000:]
    assert "step 6 failed in attempt 0 and again in attempt 1 after an in-job restart" in out, out[-4000:]
    assert [a["attempt"] for a in _attempts(tmp_path, job)] == [0, 1]
