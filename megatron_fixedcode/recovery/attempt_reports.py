"""What the attempts' record tells after a failure: each rank that saw its attempt fail leaves a report (a rank
that did not, died or hung), and the launcher's last lines say why the in-job restarts ended the job.
Pure bookkeeping, as :mod:`.attempts`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from megatron_fixedcode.recovery.attempts import NO_RESTART_CODES, Attempts


# -- failure reports: each rank that saw its attempt fail says so; a rank that did not, died or hung ----
def report_path(attempts_file: str, attempt: int, rank: int) -> str:
    return f"{attempts_file}.attempt{attempt}.rank{rank}"


def write_failure_report(attempts_file: str | None, attempt: int, rank: int, step: int, error: str) -> None:
    if not attempts_file:
        return
    try:
        Path(report_path(attempts_file, attempt, rank)).write_text(
            json.dumps({"rank": rank, "step": step, "error": error, "at": time.time()}) + "\n"
        )
    except OSError:
        pass


def silent_ranks(attempts: Attempts, attempt: int, world_size: int) -> list[str]:
    """The ranks of ``attempt`` that left no failure report, when at least one rank left one (a rank
    that saw its peers fail reports; one that was killed or stopped cannot)."""
    if not attempts.path:
        return []
    reported = {r for r in range(world_size) if os.path.exists(report_path(attempts.path, attempt, r))}
    if not reported:
        return []
    return [f"rank {r} ({attempts.rank_host(attempt, r)})" for r in range(world_size) if r not in reported]


def summary_lines(attempts: Attempts, max_restarts: int) -> list[str]:
    """The launcher's last lines after the training ended: the goodput and, when the job ends FAILED
    because of it, that the in-job restarts were used up or that a step failed twice."""
    if not attempts.records:
        return []
    last = attempts.current
    lines = [attempts.goodput_line((last["ended"] or {}).get("at") or last["at"] or time.time())]
    if not attempts._failed(last):
        return lines
    code = (last["ended"] or {}).get("code")
    failed = [r for r in attempts.records if attempts._failed(r)]
    if code in NO_RESTART_CODES or code == 16:
        return lines  # the trainer's own line says it (16: the launcher requeues, saying why)
    same_step = len(failed) >= 2 and attempts.failed_step(failed[-1]) is not None
    if same_step and attempts.failed_step(failed[-1]) == attempts.failed_step(failed[-2]):
        prev = failed[-2]
        lines.append(f"failed: {attempts.same_step_text(attempts.failed_step(last), prev['attempt'], last['attempt'])}")
    elif attempts.started_in(last.get("allocation", "local")) > max_restarts:
        lines.append(f"failed: {attempts.budget_text(max_restarts, last['attempt'])}")
    return lines


def lost_last_word(attempts: Attempts, launcher_code: int) -> dict:
    """The exit record the launcher writes when rank 0 left none (it was killed, or its node lost, in the
    attempt that ended the job): code 1 (a rank failed; not the launcher's 128+signal, which reads as a
    cancel), the step reached, and one line saying what the attempts' record knows."""
    last = attempts.current if attempts.records else None
    if last is None:
        where, step = "before any attempt was recorded", None
    else:
        failed = attempts.failed_step(last)
        where = f"attempt {last['attempt']} " + ("in start-up" if failed is None else f"at step {failed}")
        step = last["step"]
        silent = silent_ranks(attempts, last["attempt"], 1 + max((h[2] for h in last.get("hosts") or []), default=0))
        if silent:
            where += f" ({', '.join(silent)} stopped answering: hung or died)"
    error = (
        f"rank 0 ended without its last word (killed, or its node lost; the launcher exited {launcher_code}): "
        f"the training failed {where}; the attempts' record: {attempts.path}"
    )
    return {"code": 1, "error": error, "step": step, "max_steps": None, "stopped_by": None, "written_by": "launcher"}
