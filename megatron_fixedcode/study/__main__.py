r"""Paper 2 as one command: submit (or continue) the study's Slurm job graph.

    bash examples/paper2_study.sh --study-dir /data/study --input '/data/fwe/*.parquet' \
        --tokenizer-model /models/smollm2 [--dry-run]

Re-running the same command continues the study: finished stages (found by their outputs) are not
resubmitted, jobs still queued or running are left alone, failed ones are resubmitted.
Trainer flags for every variant (they override the recipe) go after `--`. See docs/study.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors
from megatron_fixedcode.study.graph import (
    STAGES,
    StudyOptions,
    build_graph,
    check_fixed_options,
    format_graph,
    save_options,
)
from megatron_fixedcode.study.slurm_submit import submit
from megatron_fixedcode.study.layout import VARIANTS


def _parser() -> argparse.ArgumentParser:
    d = StudyOptions(study_dir="", mfc_root="")
    p = ArgumentParser(
        prog="paper2_study.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--study-dir", required=True, help="the one directory holding everything of the study")
    p.add_argument("--input", nargs="+", default=[], help="corpus shards (.parquet/.jsonl[.gz]; quote globs)")
    p.add_argument("--tokenizer-model", default=None, help="tokenizer.json or its directory (SmolLM2's for paper 2)")
    p.add_argument(
        "--index-flags",
        default=" ".join(d.index_flags),
        help=f"tools/preprocess_data.py flags, one string (default: {' '.join(d.index_flags)!r})",
    )
    p.add_argument("--shards-per-task", type=int, default=d.shards_per_task)
    p.add_argument("--index-cpus", type=int, default=d.index_cpus, help="CPUs per indexing array task")
    p.add_argument("--index-time", default=d.index_time)
    p.add_argument("--max-parallel", type=int, default=d.max_parallel, help="array tasks at once")
    p.add_argument("--variants", nargs="+", default=d.variants, help=f"subset of {' '.join(VARIANTS)}")
    p.add_argument("--stages", nargs="+", default=d.stages, help=f"subset of {' '.join(STAGES)}")
    p.add_argument(
        "--recipe",
        default=None,
        help="one recipe for every variant, relative to the repository (default paper2_1p7b_<variant>.yaml)",
    )
    p.add_argument("--train-nodes", type=int, default=d.train_nodes)
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node, help="0: no --gpus-per-node (CPU rehearsal)")
    p.add_argument("--cpus-per-task", type=int, default=d.cpus_per_task, help="per training node")
    p.add_argument("--train-time", default=d.train_time, help="per job; the training requeues itself")
    p.add_argument("--export-time", default=d.export_time)
    p.add_argument("--eval-tasks", default=d.eval_tasks, help="'paper', 'local' or task[:shots],...")
    p.add_argument("--eval-limit", type=float, default=None, help="examples per task (smoke runs only)")
    p.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    p.add_argument("--eval-gpus", type=int, default=d.eval_gpus)
    p.add_argument("--eval-time", default=d.eval_time)
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument(
        "--hold",
        action="store_true",
        help="submit every job held (look at the graph in squeue; `scontrol release JOBID` starts it)",
    )
    p.add_argument(
        "--reference",
        dest="references",
        action="append",
        default=[],
        help="an external model's result JSON (tools/evaluate.py --output), shown as a reference column",
    )
    p.add_argument("--dry-run", action="store_true", help="print the job graph and the commands; submit nothing")
    return p


def _array_plan(submit: str) -> str:
    """The index array's plan (examples/preprocess_shards.sh --dry-run), where the inputs are readable here."""
    cmd = shlex.split(submit)
    cmd.insert(cmd.index("--"), "--dry-run")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["?"])[-1]
        return f"\n## the index array's plan: not available here ({why}); it is made at submission"
    return "\n## the index array's plan (examples/preprocess_shards.sh --dry-run)\n" + res.stdout.rstrip()


@user_errors
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    a = _parser().parse_args(argv)
    root = os.environ.get("MFC_ROOT") or str(Path(__file__).resolve().parents[2])
    opts = StudyOptions(
        study_dir=str(Path(a.study_dir).resolve()),
        mfc_root=str(Path(root).resolve()),
        input=a.input,
        tokenizer_model=str(Path(a.tokenizer_model).resolve()) if a.tokenizer_model else None,
        index_flags=a.index_flags.split(),
        shards_per_task=a.shards_per_task,
        index_cpus=a.index_cpus,
        index_time=a.index_time,
        max_parallel=a.max_parallel,
        variants=a.variants,
        stages=a.stages,
        recipe=a.recipe,
        train_nodes=a.train_nodes,
        gpus_per_node=a.gpus_per_node,
        cpus_per_task=a.cpus_per_task,
        train_time=a.train_time,
        train_flags=train_flags,
        export_time=a.export_time,
        eval_tasks=a.eval_tasks,
        eval_limit=a.eval_limit,
        eval_batch_size=a.eval_batch_size,
        eval_gpus=a.eval_gpus,
        eval_time=a.eval_time,
        partition=a.partition,
        account=a.account,
        hold=a.hold,
        references=[str(Path(r).resolve()) for r in a.references],
    )
    opts.validate()
    check_fixed_options(opts)
    jobs = build_graph(opts)
    if a.dry_run:
        print(format_graph(jobs), end="")
        index = next((j for j in jobs if j.name == "index" and not j.done), None)
        if index is not None:
            print(_array_plan(index.script))
        return 0
    save_options(opts)
    ids = submit(opts, jobs)
    todo = [j.name for j in jobs if not j.done]
    print(
        f"study {opts.study_dir}: {len(jobs) - len(todo)} of {len(jobs)} jobs done; "
        + (f"submitted or in flight: {' '.join(f'{n}={ids[n]}' for n in todo if n in ids)}" if todo else "complete")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
