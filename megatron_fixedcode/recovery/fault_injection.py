"""Faults on purpose, for the tests of recovery: does nothing unless ``MFC_SIM_FAULT`` is set.

As Megatron-LM's ``FT_SIM_FAULT_DESC`` but at a chosen step, so that a test can compare the recovered run
step by step with an uninterrupted one. Space-separated ``KIND;WHO;STEP[;ATTEMPT]``:

- KIND ``rank_killed`` (SIGKILL before step STEP), ``rank_hung`` (SIGSTOP there: found by a timeout),
  ``rank_killed_saving`` / ``rank_hung_saving`` (as the save after step STEP begins), ``rank_killed_starting`` (SIGKILL in
  start-up, right after the process group exists; STEP is ignored, give 0);
- WHO a global rank, or ``@NODE``: the first rank on that Slurm node (ranks move between attempts);
- ATTEMPT: only in that attempt of the run (0 the first).
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

SIM_FAULT_ENV = "MFC_SIM_FAULT"
KINDS = ("rank_killed", "rank_hung", "rank_killed_saving", "rank_hung_saving", "rank_killed_starting")
START_UP = -1  # the key of a start-up fault


class FaultInjection:
    """This rank's faults in this attempt: ``at_start``, ``before_step``, ``at_save`` fire them."""

    def __init__(self, rank: int, attempt: int, spec: str | None = None):
        self.rank, self.faults = rank, {}
        for desc in (os.environ.get(SIM_FAULT_ENV, "") if spec is None else spec).split():
            kind, who, step, *only = desc.split(";")
            if kind not in KINDS:
                raise ValueError(f"{SIM_FAULT_ENV}: unknown fault {kind!r} ({', '.join(KINDS)})")
            if who.startswith("@"):
                mine = who[1:] == os.environ.get("SLURMD_NODENAME") and os.environ.get("LOCAL_RANK", "0") == "0"
            else:
                mine = int(who) == rank
            if mine and (not only or int(only[0]) == attempt):
                self.faults[START_UP if kind == "rank_killed_starting" else int(step)] = kind

    def at_start(self) -> None:
        if START_UP in self.faults:
            self._fire("rank_killed", "start-up")

    def before_step(self, step: int) -> None:
        if self.faults.get(step) in ("rank_killed", "rank_hung"):
            self._fire(self.faults[step], f"step {step}")

    def at_save(self, step: int) -> None:
        if self.faults.get(step) in ("rank_killed_saving", "rank_hung_saving"):
            self._fire(self.faults[step].removesuffix("_saving"), f"the save of step {step}")

    def _fire(self, kind: str, where: str) -> None:
        logger.warning("%s: simulating %s on rank %d at %s", SIM_FAULT_ENV, kind, self.rank, where)
        for handler in logging.getLogger().handlers:  # the line reaches the log before the signal
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL if kind == "rank_killed" else signal.SIGSTOP)
