"""``--downstream-eval-tasks``: rank 0 starts a job of its own for each checkpoint due (a multiple of
``--downstream-eval-interval``, and the last), once it is complete; training does not wait for it.

Under Slurm (``SLURM_JOB_ID`` set and ``sbatch`` found) the job is an ``sbatch`` of the script written to
``SAVE/downstream/iter_N.sh`` (no dependency: the checkpoint is complete when it is submitted); elsewhere a
background process in a session of its own on the CPU (a signal to the training job does not reach it, and
it leaves the GPUs to the trainer), which outlives the trainer. What the job does is
:mod:`megatron_fixedcode.eval.checkpoint_scores` (its command: ``megatron_fixedcode.cli.checkpoint_scores``).
``SAVE/downstream/iter_N.job`` records the job started (pid or Slurm job id), ``iter_N.log`` is its output.

Nothing is started twice: at its start and after each save the trainer starts the jobs of the complete
checkpoints due that have no scores in the JSONL, no job holding their lock, and no job still queued or
running from an earlier start; a job that finds the lock held or its scores written exits at once. A resumed
run drops the scores of checkpoints after the one it resumes from (they are trained again).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from megatron_fixedcode.checkpoint.paths import checkpoint_dir, latest_step
from megatron_fixedcode.eval.checkpoint_scores import is_running, job_file, scored_steps, scores_file
from megatron_fixedcode.training.metrics_history import drop_jsonl_after
from megatron_fixedcode.utils.job_env import standalone_env

logger = logging.getLogger(__name__)


def _job_alive(record: dict) -> bool:
    """Whether the job an earlier start recorded is still queued or running."""
    if record.get("slurm_job"):
        out = subprocess.run(
            ["squeue", "-h", "-j", str(record["slurm_job"]), "-o", "%T"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        return out in ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED")
    pid = record.get("pid")
    try:
        return bool(pid) and b"checkpoint_scores" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class DownstreamEvals:
    def __init__(self, trainer):
        cfg = trainer.cfg
        self.enabled = bool(cfg.downstream.tasks) and trainer.ranks["rank"] == 0 and not cfg.schedule.skip_train
        if not self.enabled:
            return
        self.flags, self.logging, self.max_steps = cfg.downstream, cfg.logging, trainer.max_steps
        self.save = cfg.checkpoint.save
        self.scores = scores_file(self.save, self.logging.metrics_file)
        self.wandb_run_id = trainer.wandb_run_id
        self.slurm = bool(os.environ.get("SLURM_JOB_ID")) and shutil.which("sbatch") is not None
        self.started: set[int] = set()  # by this process
        self.held: set[int] = set()  # checkpoints kept past the pruning flags for their evaluation (said once)
        self.procs: list[subprocess.Popen] = []

    def due(self, step: int) -> bool:
        return step % self.flags.interval == 0 or step == self.max_steps

    def start(self, step: int) -> None:
        """A run's start at ``step``: drop the scores of later checkpoints (trained again), start the missing."""
        if not self.enabled:
            return
        dropped = drop_jsonl_after(self.scores, step)
        if dropped:
            logger.info("downstream evaluation: dropped %d scores after step %d from %s", dropped, step, self.scores)
        self.saved(step)

    def saved(self, step: int) -> None:
        """Start the jobs of the complete checkpoints due up to ``step`` (the trainer's) that have no scores and
        no job (a fresh run into a --save of an earlier one: not the earlier checkpoints it overwrites)."""
        if not self.enabled:
            return
        self.procs = [p for p in self.procs if p.poll() is None]  # reap the finished
        latest = min(latest_step(self.save) or 0, step)
        root = Path(self.save)
        steps = sorted(int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit())
        done = scored_steps(self.scores, self.flags.tasks, self.flags.limit)
        for s in steps:
            if s > latest or not self.due(s) or s in done or s in self.started:
                continue
            if not (checkpoint_dir(root, s) / "checksums.json").is_file() or self._has_job(s):
                continue
            self.started.add(s)
            try:
                self._launch(s)
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                logger.error(
                    "downstream evaluation of checkpoint step %d not started: %s (training goes on; the "
                    "next start tries again)",
                    s,
                    e,
                )

    def keep(self, step: int) -> bool:
        """Whether pruning (``--ckpt-keep-last``, ``--save-retain-interval``) must keep checkpoint ``step``: it is
        due and not scored, and its job is still to start, queued or running. One whose job ended without scores
        is let go, said once (the job's log says why)."""
        if not self.due(step) or step in scored_steps(self.scores, self.flags.tasks, self.flags.limit):
            return False
        record = job_file(self.save, step, ".job")
        if not record.is_file() or self._has_job(step):
            if step not in self.held:
                self.held.add(step)
                logger.info(
                    "keeping checkpoint step %d beyond the pruning flags until its downstream evaluation has "
                    "scored it (a later save prunes it)",
                    step,
                )
            return True
        logger.warning(
            "pruning checkpoint step %d unscored: its downstream evaluation job (%s) ended without scores; see %s",
            step,
            record.read_text().strip(),
            job_file(self.save, step, ".log"),
        )
        return False

    def _has_job(self, step: int) -> bool:
        record = job_file(self.save, step, ".job")
        try:
            alive = _job_alive(json.loads(record.read_text())) if record.is_file() else False
        except (OSError, ValueError, subprocess.SubprocessError):
            alive = False
        return alive or is_running(self.save, step)

    def _command(self, step: int) -> list[str]:
        flags, log = self.flags, self.logging
        cmd = [
            sys.executable,
            "-m",
            "megatron_fixedcode.cli.checkpoint_scores",
            "--save",
            str(Path(self.save).resolve()),
            "--step",
            str(step),
            "--tasks",
            flags.tasks,
            "--scores",
            str(self.scores.resolve()),
            "--batch-size",
            str(flags.batch_size),
        ]
        optional = (
            ("--limit", flags.limit),
            ("--tensorboard-dir", log.tensorboard_dir),
            ("--wandb-project", log.wandb_project),
            ("--wandb-run-id", self.wandb_run_id),
            ("--wandb-exp-name", log.wandb_exp_name),
        )
        for flag, value in optional:
            if value is not None:
                cmd += [flag, str(Path(value).resolve()) if flag == "--tensorboard-dir" else str(value)]
        return cmd

    def _launch(self, step: int) -> None:
        env = standalone_env()  # a process of its own: torchrun's agent store and the launcher's files are not its
        log = job_file(self.save, step, ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        if self.slurm:
            script = job_file(self.save, step, ".sh")
            script.write_text(
                f"#!/bin/bash\n# the downstream evaluation of checkpoint step {step} "
                f"(--downstream-eval-tasks)\nexec {shlex.join(self._command(step))}\n"
            )
            env = {k: v for k, v in env.items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
            cmd = [
                "sbatch",
                "--parsable",
                f"--job-name=eval-iter_{step:07d}",
                f"--output={log}",
                "--nodes=1",
                "--ntasks=1",
                *shlex.split(self.flags.sbatch or ""),
                str(script),
            ]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                raise ValueError(f"{shlex.join(cmd)} failed: {res.stderr.strip()}")
            record, how = {"slurm_job": res.stdout.strip().split(";")[0]}, "submitted Slurm job"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # the GPUs are the trainer's
            with open(log, "a") as out:
                proc = subprocess.Popen(
                    self._command(step),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            self.procs.append(proc)
            record, how = {"pid": proc.pid}, "started process"
        job_file(self.save, step, ".job").write_text(json.dumps(record) + "\n")
        logger.info(
            "downstream evaluation of checkpoint step %d: %s %s (log %s; scores to %s)",
            step,
            how,
            next(iter(record.values())),
            log,
            self.scores,
        )
