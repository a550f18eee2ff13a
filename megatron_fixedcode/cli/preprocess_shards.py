"""Shard-parallel, resumable indexing (the steps examples/preprocess_shards.sh runs).

    python tools/preprocess_shards.py plan --input /data/fwe/*.parquet --output-dir /data/fwe_idx \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json --shards-per-task 4
    python tools/preprocess_shards.py task --output-dir /data/fwe_idx --task-id 0   # one array task
    python tools/preprocess_shards.py status --output-dir /data/fwe_idx

`plan` writes OUTPUT_DIR/plan.json (sorted shards, settings, task groups; --dry-run only prints
it) and names the tasks that have a shard to (re)index. `task` indexes its group's shards that are not complete (default task id
$SLURM_ARRAY_TASK_ID): one .bin/.idx pair per shard and split, byte-identical to
tools/preprocess_data.py on that shard; exits 1 naming each shard whose input is bad. `status`
lists every shard as done / missing / stale / failed. See docs/data.md.
"""

import argparse
import logging
import os
import sys
import warnings

from megatron_fixedcode.arguments.tokenizer_flags import add_tokenizer_args
from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True, help="shard files, globs or directories")
    p.add_argument("--output-dir", required=True)
    add_tokenizer_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shards-per-task", type=int, default=None)
    g.add_argument("--array-size", type=int, default=None, help="number of array tasks (default: one per shard)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    # preprocess_data.py's flags that shape the outputs
    p.add_argument("--eod-token", default=None)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--id-key", default=None)
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--split-sentences", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--valid-fraction", type=float, default=0.001)
    p.add_argument("--split-seed", type=int, default=1234)
    p.add_argument("--min-doc-tokens", type=int, default=2049)
    p.add_argument("--skip-bad-documents", action="store_true")
    p.add_argument("--max-document-bytes", type=int, default=8 << 20)


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _add_plan_args(sub.add_parser("plan", help="write OUTPUT_DIR/plan.json"))
    t = sub.add_parser("task", help="index one array task's shards")
    t.add_argument("--output-dir", required=True)
    t.add_argument("--task-id", type=int, default=None, help="default: $SLURM_ARRAY_TASK_ID")
    s = sub.add_parser("status", help="every shard's state")
    s.add_argument("--output-dir", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from megatron_fixedcode.data import shards
    from megatron_fixedcode.utils.files import DiskFull

    if args.command == "plan":
        settings = {
            k: v
            for k, v in vars(args).items()
            if k
            not in (
                "command",
                "input",
                "output_dir",
                "tokenizer_type",
                "tokenizer_model",
                "shards_per_task",
                "array_size",
                "dry_run",
            )
        }
        plan = shards.make_plan(
            args.input,
            args.output_dir,
            args.tokenizer_type,
            args.tokenizer_model,
            args.shards_per_task,
            args.array_size,
            **settings,
        )
        print(
            f"# {len(plan['inputs'])} shards, {plan['num_tasks']} array tasks (0-{plan['num_tasks'] - 1}) "
            f"of at most {plan['shards_per_task']} shards, outputs in {plan['output_dir']}"
        )
        for i in range(plan["num_tasks"]):
            print(f"task {i}: " + " ".join(shards.shard_name(f) for f in shards.task_inputs(plan, i)))
        todo = shards.tasks_to_run(plan)
        print(
            f"# tasks to run: {shards.array_spec(todo) or 'none'} ({len(todo)} of {plan['num_tasks']}; "
            "the others' shards are complete)"
        )
        if not args.dry_run:
            print(f"# plan: {shards.write_plan(plan)}")
        return 0
    plan = shards.read_plan(args.output_dir)
    if args.command == "task":
        task_id = args.task_id if args.task_id is not None else os.environ.get("SLURM_ARRAY_TASK_ID")
        if task_id is None:
            p.error("give --task-id (or run as a Slurm array task)")
        try:
            report = shards.run_task(plan, int(task_id))
        except DiskFull as e:
            print(f"error: task {task_id}: {e}", file=sys.stderr)
            return 2
        print(
            f"task {task_id}: {len(report['done'])} indexed, {len(report['skipped'])} already complete, "
            f"{len(report['failed'])} failed"
            + (f", {len(report['busy'])} busy in another task" if report["busy"] else "")
        )
        for name, error in report["failed"].items():
            print(f"error: shard {name}: {error}", file=sys.stderr)
        return 1 if report["failed"] else 0
    fingerprint = shards.plan_tokenizer(plan).fingerprint
    status = shards.plan_status(plan, fingerprint)
    for name, (state, detail) in status.items():
        print(f"{state:8s} {name}" + (f": {detail}" if detail and state != "missing" else ""))
    return 0 if all(state == "done" for state, _ in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
