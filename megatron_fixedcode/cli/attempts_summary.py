"""The Slurm launchers' last lines about in-job restarts (examples/slurm_common.sh, after the training):
``python -m megatron_fixedcode.cli.attempts_summary $LOG_DIR/attempts.json --max-restarts N``; with
``--lost-exit-record PATH --launcher-code RC`` it first writes the exit record rank 0 could not (killed)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from megatron_fixedcode.recovery.attempt_reports import lost_last_word, summary_lines
from megatron_fixedcode.recovery.attempts import Attempts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the goodput and why in-job restarts ended the job")
    p.add_argument("file", help="the job's attempts record (recovery/attempts.py)")
    p.add_argument("--max-restarts", type=int, required=True, help="the launcher's MAX_RESTARTS")
    p.add_argument("--lost-exit-record", help="the exit record rank 0 left none at: write it from the attempts")
    p.add_argument("--launcher-code", type=int, default=1, help="what srun exited with")
    a = p.parse_args(argv)
    attempts = Attempts.read(a.file)
    if a.lost_exit_record and not os.path.exists(a.lost_exit_record):
        tmp = Path(f"{a.lost_exit_record}.tmp")
        tmp.write_text(json.dumps(lost_last_word(attempts, a.launcher_code)) + "\n")
        os.replace(tmp, a.lost_exit_record)
    for line in summary_lines(attempts, a.max_restarts):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
