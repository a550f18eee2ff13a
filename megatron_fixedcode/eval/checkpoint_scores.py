"""The evaluation job of one saved checkpoint (the trainer's ``--downstream-eval-tasks``; started by
:mod:`megatron_fixedcode.training.downstream_evals` as ``python -m megatron_fixedcode.cli.checkpoint_scores``).

It holds ``SAVE/downstream/iter_N.lock`` (:mod:`megatron_fixedcode.utils.locks`) while it runs, so a second
job of the same checkpoint exits at once; one whose scores are in the JSONL exits too. The checkpoint is
exported to ``SAVE/downstream/iter_N.hf`` (the converter of ``tools/convert_checkpoint_to_hf.py``, removed
afterwards) and scored by the LM Evaluation Harness as ``tools/evaluate.py --tasks`` scores it. The scores go to
TensorBoard (an event file of this checkpoint's own, tags ``downstream/<task>/<metric>`` at step N), W&B (the
training run's id, x axis ``downstream/step``) and, last, the JSONL: one line per task, its presence marks the
checkpoint scored. A killed job leaves no line: the next training start starts it again.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import shutil
import sys
import time
from pathlib import Path

JSONL_NAME = "downstream.jsonl"
TB_SUFFIX = ".downstream-iter_{step:07d}"


def scores_file(save: str, metrics_file: str | None) -> Path:
    """Beside the run's ``--metrics-file``, else in ``--save``."""
    return (Path(metrics_file).parent if metrics_file else Path(save)) / JSONL_NAME


def job_dir(save: str | Path) -> Path:
    return Path(save) / "downstream"


def job_file(save: str | Path, step: int, suffix: str) -> Path:
    return job_dir(save) / f"iter_{step:07d}{suffix}"


def protocol(tasks: str, limit: float | None) -> dict:
    return {"tasks": tasks, "limit": limit}


def read_scores(path: str | Path) -> list[dict]:
    """The JSONL's records (a torn last line of a killed writer skipped)."""
    path = Path(path)
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and "step" in record:
                out.append(record)
    return out


def scored_steps(path: str | Path, tasks: str, limit: float | None) -> set[int]:
    """Steps with scores under this protocol (a checkpoint scored with other tasks is scored again)."""
    want = protocol(tasks, limit)
    return {r["step"] for r in read_scores(path) if r.get("protocol") == want}


def task_tag(key: str) -> str:
    """``piqa_local@0shot`` -> ``piqa_local``; a few-shot run keeps its shots (``mmlu@5shot``)."""
    return key[: -len("@0shot")] if key.endswith("@0shot") else key


def acquire(save: str | Path, step: int, wait_s: float = 5.0):
    """The checkpoint's evaluation lock, or None when another job holds it. Retried for ``wait_s``: the
    trainer probes it (acquire, release) to see whether a job runs."""
    from megatron_fixedcode.utils.locks import LockHeld, PathLock

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return PathLock(job_file(save, step, ".lock"), f"the evaluation of checkpoint step {step}").acquire()
        except LockHeld:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)


def is_running(save: str | Path, step: int) -> bool:
    """Whether a job holds the checkpoint's evaluation lock now."""
    lock = acquire(save, step, wait_s=0)
    if lock is None:
        return True
    lock.release()
    return False


def write_tensorboard(directory: str, step: int, scalars: dict[str, float]) -> None:
    """An event file of this checkpoint's own (a rerun of a killed job replaces it, no duplicate events)."""
    from torch.utils.tensorboard import SummaryWriter

    suffix = TB_SUFFIX.format(step=step)
    for old in Path(directory).glob(f"events.out.tfevents.*{suffix}"):
        old.unlink()
    writer = SummaryWriter(directory, filename_suffix=suffix)
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    writer.close()


def write_wandb(project: str, run_id: str, name: str | None, step: int, scalars: dict[str, float]) -> None:
    """Into the training run (its id, recorded in the checkpoint), on an x axis of its own: the trainer's
    steps have moved past ``step``, and W&B drops values logged at an earlier ``step=``."""
    import wandb

    run = wandb.init(project=project, id=run_id, name=name, resume="allow")
    run.define_metric("downstream/step")
    run.define_metric("downstream/*", step_metric="downstream/step")
    run.log({**scalars, "downstream/step": step})
    run.finish()


def append_scores(path: Path, records: list[dict]) -> None:
    """One write under an exclusive lock of the file: jobs of several checkpoints append to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        f.flush()


def score(a: argparse.Namespace) -> list[dict]:
    """Export, run the harness, write TensorBoard, W&B, then the JSONL; returns the JSONL records."""
    from megatron_fixedcode.checkpoint import checkpoint_dir
    from megatron_fixedcode.eval.harness import run_harness
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    if not (checkpoint_dir(a.save, a.step) / "metadata.json").exists():
        raise ValueError(
            f"{checkpoint_dir(a.save, a.step)}: no such checkpoint (removed by --ckpt-keep-last or "
            f"--save-retain-interval before its evaluation started?)"
        )
    hf = job_file(a.save, a.step, ".hf")
    t0 = time.time()
    try:
        convert_checkpoint_to_hf(a.save, hf, step=a.step, overwrite=True)
        limit = int(a.limit) if a.limit and a.limit >= 1 else a.limit
        with contextlib.redirect_stdout(sys.stderr):
            result = run_harness(hf, a.tasks, limit=limit, batch_size=a.batch_size, device=a.device)
    finally:
        shutil.rmtree(hf, ignore_errors=True)
    scalars = {
        f"downstream/{task_tag(task)}/{metric}": value
        for task, metrics in result["results"].items()
        for metric, value in metrics.items()
    }
    if a.tensorboard_dir:
        write_tensorboard(a.tensorboard_dir, a.step, scalars)
    if a.wandb_project and a.wandb_run_id:
        write_wandb(a.wandb_project, a.wandb_run_id, a.wandb_exp_name, a.step, scalars)
    records = [
        {
            "step": a.step,
            "task": task_tag(task),
            "metrics": metrics,
            "protocol": protocol(a.tasks, a.limit),
            "requests": result["requests"].get(task),
            "seconds": round(time.time() - t0, 1),
        }
        for task, metrics in sorted(result["results"].items())
    ]
    append_scores(Path(a.scores), records)
    return records


def run(a: argparse.Namespace) -> list[dict] | None:
    """The job: None when another job holds the checkpoint's lock or its scores are there already."""
    job_dir(a.save).mkdir(parents=True, exist_ok=True)
    lock = acquire(a.save, a.step)
    if lock is None:
        print(f"checkpoint step {a.step} is being evaluated by another job ({job_file(a.save, a.step, '.lock')})")
        return None
    try:
        if a.step in scored_steps(a.scores, a.tasks, a.limit):
            print(f"checkpoint step {a.step} already has its scores in {a.scores}")
            return None
        return score(a)
    finally:
        lock.release()
