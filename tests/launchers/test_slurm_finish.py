"""The launchers' last word after srun (examples/slurm_common.sh ``mfc_finish``), without a cluster: a fake
``scontrol`` records what it was asked. Exit 16 of Megatron's rerun state machine requeues (within
MAX_REQUEUES); 17 ends the job with that code and the trainer's line."""

from __future__ import annotations

import json
import os
import subprocess

from tests.helpers import REPO


def _finish(
    tmp_path, rc: int, record: dict | None, max_requeues: int = 2, **env: str
) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir(exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "scontrol").chmod(0o755)
    if record is not None:
        (log_dir / "exit-7.json").write_text(json.dumps(record))
    script = (
        f"source {REPO}/examples/slurm_common.sh; MFC_CANCELLED=0 MFC_REQUEUE=0; "
        f"mfc_finish {rc} 7 {tmp_path}/ckpt {log_dir}"
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MAX_REQUEUES": str(max_requeues), **env}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "scontrol.log"
    return proc, log.read_text() if log.exists() else ""


def test_rerun_exit_16_requeues_until_max_requeues(tmp_path):
    record = {"code": 16, "step": 5, "max_steps": 20, "error": None}
    for attempt in (1, 2):
        proc, calls = _finish(tmp_path, 1, record)
        assert proc.returncode == 0, proc.stderr
        assert calls.splitlines() == ["requeue 7"] * attempt and "rerun state machine" in proc.stderr
    proc, calls = _finish(tmp_path, 1, record)  # the third: MAX_REQUEUES=2 used up
    assert proc.returncode == 3 and calls.splitlines() == ["requeue 7"] * 2
    assert proc.stderr.strip().splitlines()[-1].startswith("unfinished: the job stopped at step 5 of 20")


def test_rerun_exit_16_past_max_requeues_says_resume_elsewhere_and_names_the_node(tmp_path):
    """The trainer's record of an exit 16 (step, stopped_by, the nodes where the result reproduced): the last
    line says what the rerun state machine asked for, not 'stopped at step ?'."""
    record = {
        "code": 16,
        "step": 5,
        "max_steps": 20,
        "error": "exiting at step 5 with code 16",
        "stopped_by": "rerun state machine",
        "rerun_nodes": ["node-a (device 0)"],
    }
    proc, calls = _finish(tmp_path, 1, record, max_requeues=0)
    assert proc.returncode == 3 and calls == "", proc.stderr
    assert "exited with code 16 at step 5: the rerun state machine asks to resume" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "unfinished: the rerun state machine stopped the job at step 5 of 20 (exit 16) to re-run "
        "step 6 on another GPU than node-a (device 0)"
    ), last
    assert "--exclude=node-a)" in last and "?" not in last


def test_rerun_exit_17_ends_the_job_with_its_code_and_line(tmp_path):
    line = "step 5: the fault reproduced (rerun state machine); see the result-rejected tracker"
    proc, calls = _finish(tmp_path, 1, {"code": 17, "step": 5, "max_steps": 20, "error": line})
    assert proc.returncode == 17 and calls == ""
    assert proc.stderr.strip().splitlines()[-1] == f"error: {line}"


def test_exit_duration_requeues_as_the_time_limit_does(tmp_path):
    proc, calls = _finish(
        tmp_path, 0, {"code": 0, "step": 5, "max_steps": 20, "error": None, "stopped_by": "--exit-duration-in-mins"}
    )
    assert proc.returncode == 0 and calls.splitlines() == ["requeue 7"], proc.stderr
    assert "stopped at step 5 of 20 by --exit-duration-in-mins: requeueing" in proc.stderr


def test_exit_interval_ends_the_job_as_asked_and_says_so(tmp_path):
    proc, calls = _finish(
        tmp_path, 0, {"code": 0, "step": 5, "max_steps": 20, "error": None, "stopped_by": "--exit-interval"}
    )
    assert proc.returncode == 0 and calls == "", proc.stderr
    assert "stopped at step 5 of 20 by --exit-interval, as asked: not requeued" in proc.stderr


def test_a_signal_to_the_step_alone_ends_the_job_unfinished(tmp_path):
    """A TERM sent to the job step (not to this shell: neither the time-limit USR1 nor a cancel): the
    trainer checkpoints and exits 0, and the job must not end COMPLETED as if the run were done."""
    proc, calls = _finish(tmp_path, 0, {"code": 0, "step": 5, "max_steps": 20, "error": None, "stopped_by": "signal"})
    assert proc.returncode == 3 and calls == "", proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("unfinished: the trainer stopped at step 5 of 20 on a signal")
    )


def test_a_finished_run_and_a_record_without_a_step_end_with_code_0(tmp_path):
    for record in (
        {"code": 0, "step": 20, "max_steps": 20, "error": None, "stopped_by": None},
        {"code": 0, "step": None, "max_steps": 20, "error": None},
    ):
        proc, calls = _finish(tmp_path, 0, record)
        assert proc.returncode == 0 and calls == "" and "unfinished" not in proc.stderr, proc.stderr


def test_the_slurm_output_leaves_out_torchruns_report_and_keeps_every_rank_line(tmp_path):
    """examples/slurm_node.sh's filter of what reaches slurm-*.out (the node log keeps everything)."""
    ranks = ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "x", line 1', "[rank0]: ValueError: boom"]
    torchrun = [
        "Traceback (most recent call last):",
        '  File "/venv/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "megatron_fixedcode.pretrain FAILED",
        "-" * 60,
        "  exitcode  : 2 (pid: 7464)",
        "=" * 60,
    ]
    other = ["Traceback (most recent call last):", '  File "y", line 2', "KeyError: 3"]
    stray = "[W1206 19:20:44] [enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"
    raised = "RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"
    text = "\n".join([*ranks, *torchrun, stray, *other, raised, "srun: error: task 0: Exited with exit code 2"]) + "\n"
    script = f'eval "$(sed -n "/^slurm_output_filter()/,/^}}/p" {REPO}/examples/slurm_node.sh)"; slurm_output_filter " in LOG"'
    out = subprocess.run(["bash", "-c", script], input=text, capture_output=True, text=True, timeout=30).stdout
    assert out.splitlines() == [
        *ranks,
        "torchrun: a worker failed; its report is in LOG",
        *other,
        raised,
        "srun: error: task 0: Exited with exit code 2",
    ]


def test_a_run_that_finished_completes_the_job_whatever_srun_said(tmp_path):
    """A node's launcher agent killed (kill -9) while its ranks went on to the last step with their peers: srun
    says 137, the trainer's exit record says code 0 at the last step. The job's state is what the run did
    (COMPLETED, so that afterok dependants run); an unfinished run keeps srun's code."""
    proc, calls = _finish(tmp_path, 137, {"code": 0, "step": 30, "max_steps": 30, "error": None})
    assert proc.returncode == 0 and calls == "", proc.stderr
    assert "srun exited with code 137, but the training finished at step 30 of 30" in proc.stderr
    proc, _ = _finish(tmp_path, 137, {"code": 0, "step": 12, "max_steps": 30, "stopped_by": "--exit-interval"})
    assert proc.returncode == 0, proc.stderr  # stopped as asked: what the run did
    assert "but the training stopped cleanly at step 12 of 30 (--exit-interval" in proc.stderr
    proc, _ = _finish(tmp_path, 137, {"code": 0, "step": 12, "max_steps": 30, "error": None})
    assert proc.returncode == 137, proc.stderr  # a record that says no why: srun's code stands


def test_rank_0_killed_leaves_an_exit_record_written_by_the_launcher_with_code_1(tmp_path):
    """No exit record (rank 0 was killed in the attempt that ended the job) and srun's 143: the launcher writes the
    record from the attempts' (code 1, the step, the rank that stopped answering) and ends with 1 and that line."""
    from megatron_fixedcode.recovery.attempt_reports import write_failure_report
    from megatron_fixedcode.recovery.attempts import Attempts

    record = tmp_path / "logs" / "attempts.json"
    record.parent.mkdir()
    attempts = Attempts(str(record))
    attempts.start(0, 100.0, ["n1", "n2"], "7.0")
    attempts.resumed(0)
    attempts.step_done(6, 1.0, 110.0)
    write_failure_report(str(record), 0, 1, 7, "Connection closed by peer")
    proc, _ = _finish(tmp_path, 143, None, MFC_ATTEMPTS_FILE=str(record), MAX_RESTARTS="0")
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: rank 0 ended without its last word (killed, or its node lost; the launcher exited 143): the training"
        " failed attempt 0 at step 7 (rank 0 (n1) stopped answering: hung or died)"
    ), last
    written = json.loads((tmp_path / "logs" / "exit-7.json").read_text())
    assert (written["code"], written["step"], written["written_by"]) == (1, 6, "launcher")
