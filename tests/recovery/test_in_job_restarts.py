"""In-job restarts outside Slurm: the attempts' record and its rules (pure), and two real elastic launches on
gloo: ft_launcher with --enable-ft-package (a stopped rank found by its rank monitor's "step" section timeout,
the timeouts computed into SAVE/ft_state.json) and torchrun --max-restarts (a plain launch, documented). The
Slurm launchers' cases are tests/launchers/test_slurm_restarts.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_fixedcode.cli.attempts_summary import main as attempts_main
from megatron_fixedcode.recovery.attempt_reports import silent_ranks, write_failure_report
from megatron_fixedcode.recovery.attempts import Attempts, attempts_path
from megatron_fixedcode.recovery.ft_integration import ResiliencyClient
from megatron_fixedcode.errors import is_collective_failure
from megatron_fixedcode.recovery.in_job_restarts import InJobRestarts, refuse_restart
from tests.helpers import REPO
from tests.helpers.errors import parse_refused
from tests.helpers.pretrain import TINY, assert_same_steps, data_args, pretrain, read_metrics, write_corpus


def _attempt(n, resumed, step, seconds, ended=None, started=0.0, at=None, first=None, marks=None):
    return {
        "attempt": n,
        "started": started,
        "resumed_from": resumed,
        "step": step,
        "at": at,
        "first_step_at": first,
        "step_seconds": seconds,
        "checkpoints": marks or {},
        "hosts": [["n1", 0, 0], ["n2", 1, 1]],
        "ended": ended,
    }


def test_an_exit_a_restart_cannot_fix_is_not_restarted():
    for code in (2, 17):
        a = Attempts(None, [_attempt(0, 0, 3, 1.0, ended={"code": code, "error": "bad --data-path", "at": 5.0})])
        assert a.refusal(a.next_attempt)[0] == code
    crashed = Attempts(None, [_attempt(0, 0, 3, 1.0, ended={"code": 1, "error": "x", "at": 5.0})])
    assert crashed.refusal(1) is None  # a crash is what restarts are for
    assert Attempts(None, [_attempt(0, 0, 3, 1.0, ended={"code": 16, "error": None, "at": 5.0})]).refusal(1) is None


def test_the_same_step_failing_in_two_attempts_in_a_row_is_not_restarted_again():
    killed = [_attempt(0, 0, 11, 1.0), _attempt(1, 8, 11, 1.0)]  # both died during step 12 (no end recorded)
    code, reason = Attempts(None, killed).refusal(2)
    assert code == 1 and reason.startswith("step 12 failed in attempt 0 and again in attempt 1")
    assert Attempts(None, [_attempt(0, 0, 11, 1.0), _attempt(1, 8, 13, 1.0)]).refusal(2) is None
    # the rank that sees the second failure asks at once
    assert Attempts(None, killed[:1]).fails_again(1, 12) == 0 and Attempts(None, killed[:1]).fails_again(1, 13) is None


def test_a_rerun_exit_16_resumes_in_the_job_once_then_goes_to_the_launchers_requeue():
    rerun = {"code": 16, "error": None, "at": 5.0}
    once = Attempts(None, [_attempt(0, 0, 7, 1.0, ended=rerun)])
    assert once.refusal(1) is None  # resumed in the job, without waiting for a requeue
    code, reason = Attempts(None, [_attempt(0, 0, 7, 1.0, ended=rerun), _attempt(1, 7, 7, 0.0, ended=rerun)]).refusal(2)
    assert code == 16 and "re-run step 8 elsewhere (exit 16)" in reason and "the launcher requeues it" in reason


def test_goodput_counts_each_kept_step_once_and_the_restart_costs():
    # attempt 0: steps 1-11 in 11 s, checkpoint at 8 (8 s); killed; attempt 1 resumes from 8, runs 9-20 in 12 s
    a = Attempts(
        None,
        [
            _attempt(0, 0, 11, 11.0, started=100.0, at=130.0, first=110.0, marks={"8": 8.0}),
            _attempt(1, 8, 20, 12.0, started=140.0, at=170.0, first=150.0, ended={"code": 0, "error": None, "at": 171}),
        ],
    )
    assert a.kept_seconds() == 8.0 + 12.0
    share, wall = a.goodput(now=180.0)
    assert (share, wall) == (20.0 / 80.0, 80.0)
    (cost,) = a.restart_costs()
    assert (cost.failed_step, cost.detect_s, cost.restart_s, cost.steps_recomputed) == (12, 10.0, 10.0, 3)
    assert a.goodput_line(180.0) == (
        "goodput: 25.0% of 80 s wall-clock produced steps that were kept; 1 in-job restart: "
        "#1 after step 12 failed (detect 10.0 s, restart 10.0 s, 3 steps recomputed)"
    )
    # a resume point that is not one of the attempt's own checkpoints: its average step time
    b = Attempts(None, [_attempt(0, 0, 10, 10.0, started=0.0), _attempt(1, 5, 5, 0.0, started=20.0)])
    assert b.kept_seconds() == 5.0


def test_the_launchers_summary_says_why_the_job_ended(tmp_path, capsys):
    path = tmp_path / "attempts.json"
    Attempts(
        str(path), [_attempt(0, 0, 5, 5.0, started=0.0, at=10.0), _attempt(1, 4, 7, 3.0, started=20.0, at=30.0)]
    ).write()
    attempts_main([str(path), "--max-restarts", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("goodput: ") and out[1].startswith(
        "failed: the in-job restarts are used up (MAX_RESTARTS=1): attempt 1 failed too (failed steps: 6, 8)"
    )
    attempts_main([str(path), "--max-restarts", "3"])
    assert len(capsys.readouterr().out.splitlines()) == 1  # budget left: the launcher restarted, nothing to add


def test_a_rank_that_left_no_failure_report_is_named_with_its_host(tmp_path):
    path = str(tmp_path / "attempts.json")
    a = Attempts(path, [_attempt(0, 0, 5, 5.0)])
    assert silent_ranks(a, 0, 2) == []  # nobody reported: nothing to tell apart
    write_failure_report(path, 0, 0, 6, "Timed out waiting 60000ms")
    assert silent_ranks(a, 0, 2) == ["rank 1 (n2)"]


def test_an_attempt_after_exit_2_exits_at_once_with_it(tmp_path, caplog):
    path = tmp_path / "attempts.json"
    Attempts(str(path), [_attempt(0, 0, 0, 0.0, ended={"code": 2, "error": "bad flag", "at": 1.0})]).write()
    assert refuse_restart(Attempts.read(str(path)), rank0=True) == 2
    assert "attempt 0 ended with a user error (exit 2): not restarted (bad flag)" in caplog.text


def test_the_restart_budget_is_the_allocations_not_each_node_agents(tmp_path, caplog):
    """Each node's agent counts only its own workers' failures: a crash on node 2, then one on node 1, was two
    restarts under MAX_RESTARTS=1. The record counts the allocation's attempts, an attempt that failed in
    start-up (recorded before its load, resumed_from None) included."""
    crashed = {"code": 1, "error": "Connection reset", "at": 5.0}
    a = Attempts(None, [_attempt(0, 0, 5, 5.0, ended=crashed), _attempt(1, 4, 9, 5.0, ended=crashed)])
    assert a.budget_refusal("local", 2) is None and a.budget_refusal("local", None) is None
    code, line = a.budget_refusal("local", 1)
    assert code == 1 and line.startswith("the in-job restarts are used up (MAX_RESTARTS=1): attempt 1 failed too")
    assert "failed steps: 6, 10" in line and "every node together" in line
    # another allocation of the same run (a requeue) has its own budget
    assert a.budget_refusal("42.1", 1) is None
    startup = _attempt(1, None, None, 0.0, ended=None)  # killed while loading
    b = Attempts(None, [_attempt(0, 0, 5, 5.0, ended=crashed), startup])
    assert b.refusal(2) is None  # not "the same step twice": start-up has no step
    assert "(failed steps: 6, start-up)" in b.budget_refusal("local", 1)[1]
    assert b.kept_seconds() == 5.0  # the start-up attempt ran no step: attempt 0's count until one resumes
    path = tmp_path / "attempts.json"
    b.path = str(path)
    b.write()
    env = {"TORCHELASTIC_MAX_RESTARTS": "1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for k in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
            mp.delenv(k, raising=False)
        assert refuse_restart(Attempts.read(str(path)), rank0=True) == 1
    assert "the in-job restarts are used up (MAX_RESTARTS=1)" in caplog.text


def test_the_record_and_goodput_continue_across_requeues():
    """A requeue is a new allocation of the same run: its attempts join the record; the goodput's wall-clock is the
    allocations' (the queue wait between them is not the run's); a run started afresh at step 0 begins a new record."""
    a = Attempts(None)
    a.begin(0, 100.0, 0, ["n1"], allocation="7.0")
    a.step_done(10, 10.0, 112.0)
    a.checkpoint_saved(10)
    a.end(0, None, 115.0)  # the time limit's checkpoint: requeued
    a.start(a.next_attempt, 1000.0, ["n1"], allocation="7.1")  # 885 s in the queue
    a.resumed(10)
    a.step_done(20, 10.0, 1012.0)
    a.end(0, None, 1015.0)
    assert [r["attempt"] for r in a.records] == [0, 1] and a.restart_costs() == []  # a requeue is no in-job restart
    share, wall = a.goodput(1015.0)
    assert wall == 15.0 + 15.0 and share == 20.0 / 30.0
    assert "(over 2 allocations)" in a.goodput_line(1015.0)
    a.start(a.next_attempt, 2000.0, ["n1"], allocation="8.0")  # the same LOG_DIR, a new run from scratch
    a.resumed(0)
    assert [r["attempt"] for r in a.records] == [2]


def test_the_first_step_after_a_requeue_logs_no_restart_cost(tmp_path, monkeypatch, caplog):
    """The first step of a requeued allocation's attempt is no in-job restart: no cost line (its lookup of the last
    restart's cost raised IndexError on rank 0 there, failing the requeued run)."""
    import types

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    a = Attempts(str(tmp_path / "attempts.json"))
    a.begin(0, 100.0, 0, ["n1"], allocation="7.0")
    a.step_done(10, 10.0, 112.0)
    a.end(0, None, 115.0)
    restarts = InJobRestarts(None, a, rank=0, world=1)
    restarts.process_group_ready()
    restarts.start(types.SimpleNamespace(step=10, local_checkpoints=None))
    restarts.trainer.step = 11
    restarts.after_step({"step": 11, "step_time_s": 1.0})
    assert "in-job restart" not in caplog.text and a.current["step"] == 11


def test_where_the_attempts_are_kept():
    assert attempts_path("/s", {"MFC_ATTEMPTS_FILE": "/logs/a.json"}) == "/logs/a.json"
    elastic = {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert attempts_path("/s", elastic) == "/s/attempts-r1.json"
    assert attempts_path("/s", {**elastic, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # nothing will restart
    assert attempts_path(None, elastic) is None


def test_failed_collectives_are_told_from_other_errors():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert is_collective_failure(gloo)
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise ValueError("checkpoint write failed") from e
    except ValueError as wrapped:
        assert is_collective_failure(wrapped)
    assert not is_collective_failure(RuntimeError("shape mismatch"))
    from torch.distributed.checkpoint.api import CheckpointException

    # a peer lost during a save: torch gathers each rank's failure into a CheckpointException (a BaseException)
    assert is_collective_failure(CheckpointException("save failed", {0: (gloo, None), 1: (OSError(28, "full"), None)}))
    assert not is_collective_failure(CheckpointException("save failed", {1: (OSError(28, "No space left"), None)}))


def test_the_fault_tolerance_flags_are_refused_apart_in_one_line(capsys):
    assert "it needs --save" in parse_refused(
        [*TINY, "--train-iters", "4", "--mock-data", "--enable-ft-package"], capsys
    )
    assert "--calc-ft-timeouts acts with --enable-ft-package" in parse_refused(
        [*TINY, "--train-iters", "4", "--mock-data", "--calc-ft-timeouts"], capsys
    )


class _RecordingMonitor:
    def __init__(self):
        self.calls = []

    def start_section(self, name):
        self.calls.append(f"+{name}")

    def end_section(self, name):
        self.calls.append(f"-{name}")


def test_a_rank_still_in_its_section_near_the_timeout_says_so_from_a_thread():
    """At 80% of a section's timeout a rank still in it (waiting on a stopped peer, which its own monitor will end
    too) calls on_overdue from a thread; a section closed in time does not."""
    import threading
    import types

    monitor = _RecordingMonitor()
    monitor.section_timeouts = types.SimpleNamespace(section={"step": 0.25, "checkpointing": None})
    client = object.__new__(ResiliencyClient)
    client.client, client.warmup_steps, client.setup_open = monitor, 0, False
    client.steps = client.eval_steps = client.saves = 0
    client.calc_timeouts = False
    said, event = [], threading.Event()
    client.on_overdue, client._watchdog = lambda section, waited: (said.append((section, waited)), event.set()), None
    client.step_start()
    client.step_end()  # closed in time
    client.step_start()
    assert event.wait(2) and said == [("step", 0.2)] and threading.current_thread() is threading.main_thread()
    client.step_end()
    with client.checkpointing():  # no timeout: no watchdog
        assert client._watchdog is None


def test_the_sections_open_as_megatron_lms_ft_integration_opens_them():
    """ "setup" until the first training or evaluation batch; "step" around each training step and each evaluation
    batch after the warmup ones (2 here; an evaluation counts its own, from 0 after each training step)."""
    client = object.__new__(ResiliencyClient)
    client.client, client.warmup_steps, client.setup_open = _RecordingMonitor(), 2, True
    client.steps = client.eval_steps = 0
    client.on_overdue, client._watchdog = None, None
    for _ in range(3):
        client.step_start()
        client.step_end()
    assert client.client.calls == ["-setup", "+step", "-step"]
    client.client.calls.clear()
    for _ in range(3):
        client.eval_step_start()
        client.eval_step_end()
    client.step_start()
    client.step_end()
    for _ in range(3):
        client.eval_step_start()
        client.eval_step_end()
    assert client.client.calls == ["+step", "-step", "+step", "-step", "+step", "-step"]
    evaluation_first = object.__new__(ResiliencyClient)
    evaluation_first.client, evaluation_first.warmup_steps, evaluation_first.setup_open = _RecordingMonitor(), 0, True
    evaluation_first.steps = evaluation_first.eval_steps = 0
    evaluation_first.on_overdue, evaluation_first._watchdog = None, None
    evaluation_first.eval_step_start()
    assert evaluation_first.client.calls == ["-setup", "+step"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _elastic(launcher: list[str], args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    port = _free_port()
    cmd = [
        sys.executable,
        *launcher,
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        f"test{port}",
        "--max-restarts",
        "2",
    ]
    ft = launcher[-1].endswith("launcher")
    if ft:
        cmd += ["--ft-rank-section-timeouts", "setup:600,step:5,checkpointing:20"]
        cmd += ["--ft-rank-out-of-section-timeout", "60", "--ft-enable-nic-monitor", "false"]
    cmd += ["-m", "megatron_fixedcode.pretrain", *TINY, *args]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("restart_corpus"))


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory) -> list[dict]:
    run = tmp_path_factory.mktemp("straight")
    pretrain(*data_args(corpus, "gpt"), "--train-iters", "12", "--metrics-file", str(run / "m.jsonl"), nproc=2)
    return read_metrics(run / "m.jsonl")


def _run_args(corpus, run: Path) -> list[str]:
    save = str(run / "ckpt")
    return [*data_args(corpus, "gpt"), "--train-iters", "12", "--save", save, "--load", save, "--save-interval", "4"]


@pytest.mark.slow
def test_ft_launcher_ends_a_rank_that_overstays_its_step_section_and_the_group_resumes(corpus, straight, tmp_path):
    """--enable-ft-package under ft_launcher: rank 1 stops itself at step 6 of attempt 0; its rank monitor ends it
    after the 5 s "step" section timeout (long before the 10-minute collective timeout), the group restarts from
    the step-4 checkpoint; in attempt 1 rank 1 stops as step 8's save begins: the "checkpointing" section's monitor
    ends the group again. Each restart line names rank 1 (its peer, ended by its own monitor while it waited, said
    so from a thread first); every step equals the straight run's, once; --calc-ft-timeouts keeps the computed
    timeouts in SAVE/ft_state.json."""
    pytest.importorskip("nvidia_resiliency_ext")
    metrics = tmp_path / "m.jsonl"
    args = _run_args(corpus, tmp_path) + ["--metrics-file", str(metrics), "--enable-ft-package", "--calc-ft-timeouts"]
    t0 = time.time()
    proc = _elastic(
        ["-m", "nvidia_resiliency_ext.fault_tolerance.launcher"],
        [*args, "--ft-num-warmup-iters", "2"],
        {"MFC_SIM_FAULT": "rank_hung;1;6;0 rank_hung_saving;1;8;1"},
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "FT: initialized" in log and "simulating rank_hung on rank 1 at step 6" in log, log[-5000:]
    assert "in-job restart 1: attempt 0 failed at step 6 (rank 1 (" in log, log[-5000:]
    assert "in-job restart 2: attempt 1 failed at step 9 (rank 1 (" in log, log[-5000:]
    got = read_metrics(metrics)
    assert [r["step"] for r in got] == list(range(1, 13))
    assert_same_steps(straight, got)
    assert time.time() - t0 < 300  # not the 10-minute collective timeout
    state = json.loads((tmp_path / "ckpt" / "ft_state.json").read_text())
    assert "checkpointing" in state["current_timeouts"]["section"]["calculated_sections"], state


@pytest.mark.slow
def test_a_plain_torchrun_restart_resumes_from_the_newer_non_persistent_checkpoint(corpus, straight, tmp_path):
    """torchrun --max-restarts 2 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as docs/training.md says), persistent saves
    every 4 steps and non-persistent every 3: rank 1 killed as step 8's persistent save begins (rank 0's save
    fails on the lost peer: a restart, not a write failure); attempt 1 resumes from the non-persistent step 6
    (newer than the persistent 4, the 8 incomplete) and ends as the straight run, each step once; the record
    sits beside the checkpoints."""
    metrics = tmp_path / "m.jsonl"
    proc = _elastic(
        ["-m", "torch.distributed.run"],
        [*_run_args(corpus, tmp_path), "--metrics-file", str(metrics)]
        + ["--non-persistent-save-interval", "3", "--non-persistent-ckpt-type", "global"],
        {"MFC_SIM_FAULT": "rank_killed_saving;1;8;0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert f"resumed from {tmp_path / 'ckpt' / 'non_persistent'}" in log, log[-5000:]
    assert "cannot write checkpoint" not in log, log[-5000:]
    got = read_metrics(metrics)
    assert [r["step"] for r in got] == list(range(1, 13))
    assert_same_steps(straight, got)
    (record,) = (tmp_path / "ckpt").glob("attempts-*.json")
    attempts = json.loads(record.read_text())["attempts"]
    assert [(a["attempt"], a["resumed_from"]) for a in attempts] == [(0, 0), (1, 6)], attempts
