"""The Slurm launchers' last lines about in-job restarts (examples/slurm_common.sh, after the training):
``python -m megatron_fixedcode.cli.attempts_summary $LOG_DIR/attempts.json --max-restarts N``."""

from __future__ import annotations

import argparse

from megatron_fixedcode.training.attempt_reports import summary_lines
from megatron_fixedcode.training.attempts import Attempts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the goodput and why in-job restarts ended the job")
    p.add_argument("file", help="the job's attempts record (training/attempts.py)")
    p.add_argument("--max-restarts", type=int, required=True, help="the launcher's MAX_RESTARTS")
    a = p.parse_args(argv)
    for line in summary_lines(Attempts.read(a.file), a.max_restarts):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
