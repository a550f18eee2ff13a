"""``--downstream-eval-*``: lm-eval scores of the run's checkpoints while it trains, each by a job of its own
(:mod:`megatron_fixedcode.training.downstream_evals`), and their refusals (parse time, one line, exit 2)."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import from_dests, renamed
from megatron_fixedcode.arguments.user_errors import is_rank0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DownstreamConfig:
    """The flags below, as the trainer reads them (``tasks`` None: no downstream evaluation)."""

    tasks: str | None = renamed("downstream_eval_tasks", default=None)
    interval: int | None = renamed("downstream_eval_interval", default=None)
    limit: float | None = renamed("downstream_eval_limit", default=None)
    batch_size: int = renamed("downstream_eval_batch_size", default=8)
    sbatch: str | None = renamed("downstream_eval_sbatch", default=None)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "DownstreamConfig":
        return from_dests(cls, a)


def add_downstream_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("downstream evaluation of checkpoints (docs/training.md)")
    g.add_argument(
        "--downstream-eval-tasks",
        default=None,
        metavar="TASKS",
        help="lm-eval tasks scored on every --downstream-eval-interval checkpoint by a job of its own "
        "(sbatch under Slurm, else a background process on the CPU; training goes on): 'local', "
        "'paper' or task[:shots],... as tools/evaluate.py --tasks. Scores: TensorBoard "
        "'downstream/<task>/<metric>' at the checkpoint's step, W&B, and downstream.jsonl beside "
        "--metrics-file (else in --save); a start evaluates checkpoints that lack them",
    )
    g.add_argument(
        "--downstream-eval-interval",
        type=int,
        default=None,
        metavar="N",
        help="evaluate the saved checkpoints whose step is a multiple of N (a multiple of "
        "--save-interval), and the last",
    )
    g.add_argument(
        "--downstream-eval-limit", type=float, default=None, help="examples per task (lm-eval's --limit; default all)"
    )
    g.add_argument("--downstream-eval-batch-size", type=int, default=8, help="requests per forward pass")
    g.add_argument(
        "--downstream-eval-sbatch",
        default=None,
        metavar="OPTIONS",
        help="sbatch options of the evaluation jobs under Slurm, given with '=' (they start with "
        "'--'): --downstream-eval-sbatch='--partition=eval --gres=gpu:1 --time=30' (default: one "
        "task on one node)",
    )


def refuse_downstream(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Everything that can be checked before the first step: the flags together, the tokenizer, the tasks
    (lm-eval installed, the local task files and their data; another name against lm-eval's index, rank 0)."""
    tasks, interval = a.downstream_eval_tasks, a.downstream_eval_interval
    if tasks is None and interval is None:
        for flag, value in (
            ("--downstream-eval-limit", a.downstream_eval_limit),
            ("--downstream-eval-sbatch", a.downstream_eval_sbatch),
        ):
            if value:
                p.error(f"{flag} acts with --downstream-eval-tasks")
        return
    if tasks is None or interval is None:
        p.error("--downstream-eval-tasks and --downstream-eval-interval go together (what to score, and how often)")
    if interval < 1:
        p.error(f"--downstream-eval-interval must be >= 1, got {interval}")
    if not a.save:
        p.error("--downstream-eval-tasks scores saved checkpoints: it needs --save")
    if a.save_interval and interval % a.save_interval:
        p.error(
            f"--downstream-eval-interval {interval} is not a multiple of --save-interval {a.save_interval}: "
            "only saved checkpoints are evaluated"
        )
    if a.downstream_eval_limit is not None and a.downstream_eval_limit <= 0:
        p.error(f"--downstream-eval-limit must be > 0, got {a.downstream_eval_limit}")
    if a.downstream_eval_batch_size < 1:
        p.error(f"--downstream-eval-batch-size must be >= 1, got {a.downstream_eval_batch_size}")
    if a.tokenizer_type == "NullTokenizer" or not (a.tokenizer_model or a.vocab_file or a.load):
        p.error("--downstream-eval-tasks: lm-eval's tasks are text: the run needs its tokenizer (--tokenizer-model)")
    from megatron_fixedcode.eval.task_check import check_tasks

    try:  # lm-eval's own task index takes seconds: rank 0 reads it, and speaks for every rank
        check_tasks(tasks, "--downstream-eval-tasks", index_others=is_rank0())
    except ValueError as e:
        p.error(str(e))
