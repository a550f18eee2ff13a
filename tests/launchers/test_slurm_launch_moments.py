"""The Slurm launcher (examples/slurm_common.sh ``mfc_launch``) at the moments around the training step,
without a cluster: fake ``srun``/``scancel``/``scontrol`` record what they were asked, and a signal is sent to
the batch shell at a chosen moment. A USR1 before the training started requeues without starting it; one
after sends the trainer's own --exit-signal and writes the stop file that ranks not yet started read; a
cancel that comes between the exit record and the requeue wins; a rank that starts after the stop file
exits at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO

# a run the dry run and the pre-flight accept in seconds, with no data on disk
TRAINER = ["--mock-data", "--vocab-size", "512", "--train-iters", "10", "--exit-interval", "100"]


def _fake(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


def _launch(tmp_path, fakes: dict[str, str], *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run mfc_launch as a batch shell would; the fakes append their calls to calls.log."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("srun", "scancel", "scontrol"):
        _fake(bin_dir, name, f'echo "{name} $*" >> {calls}\n' + fakes.get(name, ""))
    for name in set(fakes) - {"srun", "scancel", "scontrol"}:
        _fake(bin_dir, name, fakes[name])
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "1",
        "GPUS_PER_NODE": "1",
        "CPUS_PER_TASK": "1",
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "LOG_DIR": str(tmp_path / "logs"),
        "TENSORBOARD_DIR": "",
        "MAX_REQUEUES": "3",
        "REAL_PYTHON": sys.executable,
    }
    script = (
        f"export MFC_TEST_SHELL=$$; MFC_ROOT={REPO} RECIPE=examples/recipes/tiny_cpu.yaml RUN_NAME=t; "
        f'source {REPO}/examples/slurm_common.sh; mfc_launch "$@"'
    )
    proc = subprocess.run(
        ["bash", "-c", script, "launcher", *TRAINER, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, "\n".join(line for line in lines if line != "scontrol show config")  # srun's --cpu-bind question


def test_usr1_during_the_checks_before_the_training_requeues_without_starting_it(tmp_path):
    # the batch shell is signalled while its dry run runs (USR1's default action would kill it)
    python = '[[ "$*" == *--dry-run* ]] && kill -USR1 "$MFC_TEST_SHELL"; exec "$REAL_PYTHON" "$@"'
    proc, calls = _launch(tmp_path, {"python": python})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert calls.splitlines() == ["scontrol requeue 7"], calls
    assert "before the training started: nothing to checkpoint; requeueing without starting it" in proc.stderr
    assert (tmp_path / "logs" / "requeues-7").read_text().strip() == "1"


def test_usr1_during_the_training_sends_the_exit_signal_and_writes_the_stop_file(tmp_path):
    record = json.dumps({"code": 0, "step": 4, "max_steps": 10, "error": None})
    srun = (
        f'kill -USR1 "$MFC_TEST_SHELL"; sleep 1; test -f "$MFC_STOP_FILE" && echo stop-file >> {tmp_path}/calls.log; '
        f"echo '{record}' > \"$MFC_EXIT_RECORD\""
    )
    proc, calls = _launch(tmp_path, {"srun": srun}, "--exit-signal", "SIGUSR2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = calls.splitlines()
    assert lines[0].startswith("srun ") and lines[1:] == ["scancel --signal=USR2 7", "stop-file", "scontrol requeue 7"]
    assert "asking the trainer to checkpoint and exit (SIGUSR2 to the job steps)" in proc.stderr


def test_a_cancel_between_the_exit_record_and_the_requeue_wins(tmp_path):
    record = json.dumps({"code": 0, "step": 4, "max_steps": 10, "error": None})
    srun = f'kill -USR1 "$MFC_TEST_SHELL"; sleep 1; echo \'{record}\' > "$MFC_EXIT_RECORD"'
    mv = 'kill -TERM "$MFC_TEST_SHELL"; exec /bin/mv "$@"'  # the requeue counter is moved into place last
    proc, calls = _launch(tmp_path, {"srun": srun, "mv": mv})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scontrol requeue" not in calls, calls
    assert proc.stderr.strip().splitlines()[-1].endswith("training exited with code 0 (cancelled: not requeued)")


def test_a_rank_that_starts_after_the_stop_file_exits_at_once(tmp_path):
    stop = tmp_path / "stop-7"
    stop.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MFC_STOP_FILE": str(stop)}
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_fixedcode.pretrain", "--exit-signal-handler", *TRAINER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr[-3000:]
    assert proc.stderr.strip() == (
        f"the launcher asked the job to stop ({stop}) before this rank started: nothing to checkpoint yet, exiting"
    )
