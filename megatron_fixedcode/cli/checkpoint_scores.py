"""The evaluation job of one saved checkpoint, as the trainer's ``--downstream-eval-tasks`` starts it (a
background process or an sbatch script; :mod:`megatron_fixedcode.eval.checkpoint_scores` says what it does)::

    python -m megatron_fixedcode.cli.checkpoint_scores --save SAVE --step N --tasks piqa_local --scores F.jsonl
"""

import argparse
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        prog="python -m megatron_fixedcode.cli.checkpoint_scores",
    )
    p.add_argument("--save", required=True, help="the training run's --save")
    p.add_argument("--step", type=int, required=True, help="the checkpoint's step")
    p.add_argument("--tasks", required=True, help="'local', 'paper' or task[:shots],... (tools/evaluate.py --tasks)")
    p.add_argument("--limit", type=float, default=None, help="examples per task")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default=None, help="default: cuda when torch sees a GPU")
    p.add_argument("--scores", required=True, help="the JSONL the scores are appended to")
    p.add_argument("--tensorboard-dir", default=None)
    p.add_argument("--wandb-project", default=None)
    p.add_argument("--wandb-run-id", default=None)
    p.add_argument("--wandb-exp-name", default=None)
    return p


@user_errors
def main(argv=None) -> int:
    from megatron_fixedcode.eval.checkpoint_scores import run

    a = parser().parse_args(argv)
    for r in run(a) or []:
        print(f"step {a.step} {r['task']}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(r["metrics"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
