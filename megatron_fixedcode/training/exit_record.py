"""The trainer's last word for its launcher: at exit, rank 0 writes one JSON object to
``$MFC_EXIT_RECORD`` (set by the Slurm launchers): the exit code, the one-line error if there was
one, the step reached, the run's last step and what stopped it before that step.

torchrun exits 1 whenever a rank fails, whatever the rank returned, and prints its own traceback
after the trainer's line; with this record the launcher ends the job with the trainer's code (2 for
a user error) and its line last, and tells a finished run from one stopped by a time limit."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

ENV = "MFC_EXIT_RECORD"


class ExitRecord(logging.Handler):
    """Keeps the last ERROR logged on this process (the trainer logs its one-line refusals at ERROR)."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.error: str | None = None
        self.step: int | None = None
        self.max_steps: int | None = None
        # before the last step: "signal", "--exit-interval", "--exit-duration-in-mins" or "rerun state machine"
        self.stopped_by: str | None = None
        self.rerun_nodes: list[str] = []  # exit 16: where the unexpected result reproduced ("host (device N)")
        self.goodput: float | None = None  # share of the allocation's wall-clock time that produced kept steps
        self.restarts: list[dict] = []  # each in-job restart's cost (recovery/attempts.py, RestartCost)

    def emit(self, record: logging.LogRecord) -> None:
        self.error = record.getMessage().splitlines()[0] if record.getMessage() else None

    def __enter__(self) -> "ExitRecord":
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self)

    def write(self, code: int) -> None:
        """Rank 0 only, and only where the launcher asked for it; written whole or not at all."""
        path = os.environ.get(ENV)
        if not path or int(os.environ.get("RANK", "0")) != 0:
            return
        record = {
            "code": code,
            "error": self.error if code else None,
            "step": self.step,
            "max_steps": self.max_steps,
            "stopped_by": self.stopped_by,
            "rerun_nodes": self.rerun_nodes,
            "goodput": self.goodput,
            "restarts": self.restarts,
        }
        try:
            tmp = Path(f"{path}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record) + "\n")
            os.replace(tmp, path)
        except OSError as e:  # a full disk must not hide the trainer's own exit code
            logging.getLogger(__name__).warning("could not write the exit record %s: %s", path, e)
