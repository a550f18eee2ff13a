"""The attempts of one job inside its allocation, and what they cost: goodput.

An elastic launcher (the resiliency package's ``ft_launcher``, or torchrun) restarts the whole worker
group when a rank dies or hangs (``--max-restarts``); each start of the group is an *attempt*, numbered
from this record (every rank reads it before any rank of the new attempt writes it). Rank 0 keeps one JSON
file per run (``$MFC_ATTEMPTS_FILE``, set by the Slurm launchers to ``LOG_DIR/attempts.json``, kept across
requeues and resubmissions; under a plain torchrun ``SAVE/attempts-<rdzv id>.json``), rewritten whole after
every step: the allocation the attempt ran in, when it started (recorded as soon as its process group
exists, before its load: an attempt that fails in start-up counts), the step it resumed from, its last
completed step and the step time it had spent, and how it ended. From it:

- the next attempt names the step that failed (the one after the last completed), what the restart
  cost (time to detect, time to restart, steps recomputed) and the ranks that stopped answering;
- a step that failed in two attempts in a row is not restarted again (a restart cannot fix it);
- the restart budget (the launcher's ``--max-restarts``) is the allocation's, not each node agent's: an
  agent counts only its own workers' failures, so with N nodes the agents together would restart up to
  N times the budget; an attempt past it refuses to start and the failing one asks not to be restarted;
- an exit the user must fix (2) or Megatron's exit 17 is not restarted;
- goodput: the share of the allocations' wall-clock time (summed over the run's allocations, the queue
  waits between them left out) that produced steps that were kept (a step recomputed after a restart
  counts once, in the attempt that kept it).

Pure bookkeeping (JSON and arithmetic): no torch, no process groups; the loop feeds it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "MFC_ATTEMPTS_FILE"
RELAUNCH_ENV = "MFC_RELAUNCH_NOTE"  # set by examples/slurm_relaunch.sh on a launch on fewer nodes
NO_RESTART_CODES = {2: "a user error (exit 2)", 17: "Megatron's exit 17 (the fault reproduced)"}
KEPT_CHECKPOINTS = 8  # per attempt: the cumulative step time at its newest checkpoints


def attempts_path(save_dir: str | None, environ: dict[str, str] | None = None) -> str | None:
    """Where this job's attempts are kept: the launcher's file, else, under an elastic agent that may restart
    (``--max-restarts`` > 0) with ``--save``, beside the checkpoints (one file per rendezvous id: give each
    launch its own ``--rdzv-id``); else nowhere (a single attempt, kept in memory for its goodput)."""
    env = os.environ if environ is None else environ
    if env.get(ENV):
        return env[ENV]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and save_dir and int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
        return os.path.join(save_dir, f"attempts-{run_id}.json")
    return None


def allocation_id(environ: dict[str, str] | None = None) -> str:
    """The allocation an attempt runs in: Slurm's job id and requeue count (a requeue is a new allocation
    under the same id) and relaunch on fewer nodes, else the elastic launch's rendezvous id."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        # a launch on fewer nodes after a node was cut out (examples/slurm_relaunch.sh) has a budget of its own
        relaunch = f".r{env['MFC_RELAUNCHES']}" if env.get("MFC_RELAUNCHES", "0") != "0" else ""
        return f"{env['SLURM_JOB_ID']}.{env.get('SLURM_RESTART_COUNT') or 0}{relaunch}"
    return env.get("TORCHELASTIC_RUN_ID") or "local"


def max_restarts(environ: dict[str, str] | None = None) -> int | None:
    """The launcher's ``--max-restarts`` (torchrun and ft_launcher give it to their workers); None outside one."""
    value = (os.environ if environ is None else environ).get("TORCHELASTIC_MAX_RESTARTS")
    return int(value) if value and value.isdigit() else None


def process_start_time() -> float:
    """This process's start (Unix time): the restart cost includes the interpreter's start-up. Its age is
    read against the boot clock (``btime`` of /proc/stat is rounded and drifts on virtual machines)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


@dataclass
class RestartCost:
    attempt: int  # the attempt that restarted (1 = the first restart)
    failed_step: int | None  # the step the attempt before it did not complete (None: it failed in start-up)
    detect_s: float  # from that attempt's last completed step to its failure being seen
    restart_s: float | None  # from then to this attempt's first step (start-up, rendezvous, load)
    steps_recomputed: int
    silent_ranks: list[str]  # "rank R (host)" that reported nothing: died or hung

    @property
    def what_failed(self) -> str:
        return "start-up" if self.failed_step is None else f"step {self.failed_step}"

    def text(self) -> str:
        detect = f"{self.detect_s:.1f} s"
        restart = "?" if self.restart_s is None else f"{self.restart_s:.1f} s"
        return f"detect {detect}, restart {restart}, {self.steps_recomputed} steps recomputed"


class Attempts:
    """The job's attempts (rank 0 writes, every rank may read)."""

    def __init__(self, path: str | None, records: list[dict] | None = None):
        self.path = path
        self.records: list[dict] = records or []

    @classmethod
    def read(cls, path: str | None) -> "Attempts":
        if path and os.path.exists(path):
            try:
                return cls(path, json.loads(Path(path).read_text())["attempts"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a torn file of a killed writer: start over rather than fail the run
        return cls(path)

    # -- writing (rank 0) -------------------------------------------------------------------------------
    def start(self, attempt: int, started: float, hosts: list[str], allocation: str = "local") -> None:
        """A new attempt whose process group exists, before its load: from here it counts toward the budget.
        An earlier record with the same number (a launch restarted by hand under the same id) is replaced,
        with everything after it."""
        self.records = [r for r in self.records if r["attempt"] < attempt]
        self.records.append(
            {
                "attempt": attempt,
                "allocation": allocation,
                "started": started,
                "resumed_from": None,  # None until its load is done (an attempt that failed in start-up)
                "step": None,
                "at": None,
                "first_step_at": None,
                "step_seconds": 0.0,
                "checkpoints": {},
                "hosts": _runs(hosts),
                "ended": None,
                "passed_over": [],
            }
        )
        if os.environ.get(RELAUNCH_ENV):  # the launcher's line: the nodes cut out, the size before and after
            self.records[-1]["relaunch"] = os.environ[RELAUNCH_ENV]
        self.write()

    def resumed(self, step: int, loaded: dict | None = None) -> None:
        """The current attempt loaded (``loaded``: its store and directory) or started fresh at ``step``. The first
        attempt of an allocation that starts a run at step 0 begins the run's record: earlier allocations'
        attempts were another run's."""
        cur = self.current
        cur["resumed_from"] = cur["step"] = step
        cur["loaded"] = loaded
        if step == 0 and not any(r.get("allocation") == cur.get("allocation") for r in self.records[:-1]):
            self.records = [cur]
        self.write()

    def passed_over(self, entries: list[dict]) -> None:
        """Checkpoints the resume passed over (damaged, or of another run), with why: kept in the record."""
        if self.records:
            self.current.setdefault("passed_over", []).extend(entries)
            self.write()

    def begin(
        self, attempt: int, started: float, resumed_from: int, hosts: list[str], allocation: str = "local"
    ) -> None:
        """:meth:`start` and :meth:`resumed` at once."""
        self.start(attempt, started, hosts, allocation)
        self.resumed(resumed_from)

    @property
    def next_attempt(self) -> int:
        """The number of the attempt that starts now: one more than the last recorded. (The elastic agents'
        TORCHELASTIC_RESTART_COUNT differ between nodes: an agent whose ranks were healthy restarts them for
        the others' new round without counting it.)"""
        return self.records[-1]["attempt"] + 1 if self.records else 0

    @property
    def current(self) -> dict:
        return self.records[-1]

    def step_started(self, now: float) -> None:
        if self.current["first_step_at"] is None:
            self.current["first_step_at"] = now

    def step_done(self, step: int, step_seconds: float, now: float) -> None:
        cur = self.current
        cur["step"], cur["at"] = step, now
        cur["step_seconds"] = round(cur["step_seconds"] + step_seconds, 6)
        self.write()

    def checkpoint_saved(self, step: int) -> None:
        marks = self.current["checkpoints"]
        marks[str(step)] = self.current["step_seconds"]
        for old in sorted(marks, key=int)[:-KEPT_CHECKPOINTS]:
            del marks[old]
        self.write()

    def end(self, code: int, error: str | None, now: float) -> None:
        if not self.records or self.current["ended"] is not None:
            return  # no attempt began here (an evaluation-only run), or it already ended
        self.current["ended"] = {"code": code, "error": error, "at": now}
        self.write()

    def write(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        try:
            Path(tmp).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp).write_text(json.dumps({"attempts": self.records}) + "\n")
            os.replace(tmp, self.path)
        except OSError:
            pass  # bookkeeping only: a full disk must not end the training

    # -- reading -------------------------------------------------------------------------------------
    @staticmethod
    def failed_step(record: dict) -> int | None:
        """The step an attempt did not complete; None when it failed in start-up (before its load was done)."""
        return None if record["step"] is None else record["step"] + 1

    def started_in(self, allocation: str) -> int:
        """How many attempts have started in ``allocation``: the one starting now is restart number that many."""
        return sum(r.get("allocation", "local") == allocation for r in self.records)

    def budget_refusal(self, allocation: str, max_restarts: int | None) -> tuple[int, str] | None:
        """An attempt starting now would be one restart more than the allocation's budget: (exit 1, the line)."""
        started = self.started_in(allocation)
        if max_restarts is None or started <= max_restarts:
            return None
        return 1, self.budget_text(max_restarts, started - 1)

    def budget_text(self, max_restarts: int, attempt: int) -> str:
        failed = [r for r in self.records if self._failed(r) and r["attempt"] <= attempt]
        steps = ", ".join(str(self.failed_step(r) or "start-up") for r in failed[-(max_restarts + 1) :])
        return (
            f"the in-job restarts are used up (MAX_RESTARTS={max_restarts}): attempt {attempt} failed too (failed "
            f"steps: {steps}); the budget is the allocation's, every node together; not restarting again: the "
            "newest complete checkpoint loads when the same command is submitted again"
        )

    def _failed(self, record: dict) -> bool:
        return record["ended"] is None or record["ended"]["code"] != 0

    def _before(self, attempt: int, allocation: str | None) -> list[dict]:
        """The attempts before ``attempt``, of ``allocation`` only (None: all): the rules are the in-job restarts'."""
        return [
            r
            for r in self.records
            if r["attempt"] < attempt and (allocation is None or r.get("allocation", "local") == allocation)
        ]

    def refusal(self, attempt: int, allocation: str | None = None) -> tuple[int, str] | None:
        """Why attempt ``attempt`` must not run (exit code, one line), or None: the attempt before it (in this
        allocation: a resubmission after a user error is the fix) ended with an exit a restart cannot fix, or
        the two before it failed at the same step."""
        before = self._before(attempt, allocation)
        if not before:
            return None
        last = before[-1]
        code = (last["ended"] or {}).get("code")
        if code in NO_RESTART_CODES:
            error = last["ended"].get("error")
            return code, (
                f"attempt {last['attempt']} ended with {NO_RESTART_CODES[code]}: not restarted"
                + (f" ({error})" if error else "")
            )
        if len(before) >= 2 and all(self._failed(r) for r in before[-2:]):
            a, b = before[-2:]
            if self.failed_step(a) is not None and self.failed_step(a) == self.failed_step(b):
                if all((r["ended"] or {}).get("code") == 16 for r in (a, b)):
                    return 16, self.rerun_again_text(self.failed_step(b))
                return 1, self.same_step_text(self.failed_step(b), a["attempt"], b["attempt"])
        return None

    @staticmethod
    def rerun_again_text(step: int) -> str:
        return (
            f"the rerun state machine asked again, after an in-job restart on the same GPUs, to re-run step {step} "
            "elsewhere (exit 16): not restarting in the job; the launcher requeues it"
        )

    @staticmethod
    def same_step_text(step: int, first: int, second: int) -> str:
        return (
            f"step {step} failed in attempt {first} and again in attempt {second} after an in-job restart: "
            "a restart cannot fix it, not restarting again (the job ends FAILED; its newest checkpoint "
            "stays the one that loads)"
        )

    def fails_again(self, attempt: int, step: int | None, allocation: str | None = None) -> int | None:
        """Attempt ``attempt`` failing at ``step``: the attempt before it, if it failed at that step too."""
        before = self._before(attempt, allocation)
        if before and self._failed(before[-1]) and step is not None and self.failed_step(before[-1]) == step:
            return before[-1]["attempt"]
        return None

    def restart_costs(self, silent: dict[int, list[str]] | None = None) -> list[RestartCost]:
        costs = []
        for prev, cur in zip(self.records, self.records[1:]):
            if cur.get("allocation") != prev.get("allocation"):
                continue  # a requeue or a resubmission: not an in-job restart
            last = prev["at"] or prev["started"]
            # the failure seen: a rank's report of it, else the new attempt's start (teardown included)
            seen = (prev["ended"] or {}).get("at") or cur["started"]
            detect = max(seen - last, 0.0)
            restart = None if cur["first_step_at"] is None else max(cur["first_step_at"] - seen, 0.0)
            costs.append(
                RestartCost(
                    attempt=cur["attempt"],
                    failed_step=self.failed_step(prev),
                    detect_s=detect,
                    restart_s=restart,
                    steps_recomputed=max((prev["step"] or 0) - (cur["resumed_from"] or 0), 0),
                    silent_ranks=(silent or {}).get(prev["attempt"], []),
                )
            )
        return costs

    def kept_seconds(self) -> float:
        """Step time of the steps that were kept: an attempt's steps after the checkpoint the next one
        resumed from were recomputed, and count in the next one only."""
        total = 0.0
        loaded = [r for r in self.records if r["resumed_from"] is not None]  # those failed in start-up ran no step
        for rec, nxt in zip(loaded, loaded[1:] + [None]):
            if nxt is None:
                total += rec["step_seconds"]
                continue
            keep_to, base = nxt["resumed_from"], rec["resumed_from"]
            if keep_to <= base:
                continue
            mark = rec["checkpoints"].get(str(keep_to))
            if mark is None:  # not one of its own checkpoints: the average step time
                done = rec["step"] - base
                mark = rec["step_seconds"] * min((keep_to - base) / done, 1.0) if done > 0 else 0.0
            total += mark
        return total

    def wall_seconds(self, now: float) -> float:
        """The allocations' wall-clock time: each from its first attempt's start to its last attempt's end
        (``now`` for the last allocation); the time a requeued job waited in the queue is not the run's."""
        spans: dict[str, list[float]] = {}
        for r in self.records:
            end = (r["ended"] or {}).get("at") or r["at"] or r["started"]
            span = spans.setdefault(r.get("allocation", "local"), [r["started"], end])
            span[0], span[1] = min(span[0], r["started"]), max(span[1], end)
        if spans:
            spans[self.current.get("allocation", "local")][1] = max(
                now, spans[self.current.get("allocation", "local")][1]
            )
        return sum(end - start for start, end in spans.values())

    def goodput(self, now: float) -> tuple[float, float] | None:
        """(share of the wall-clock time that produced kept steps, that wall-clock time in seconds)."""
        if not self.records:
            return None
        wall = max(self.wall_seconds(now), 1e-9)
        return min(self.kept_seconds() / wall, 1.0), wall

    def goodput_line(self, now: float) -> str:
        share, wall = self.goodput(now) or (0.0, 0.0)
        costs = self.restart_costs()
        line = f"goodput: {100 * share:.1f}% of {wall:.0f} s wall-clock produced steps that were kept"
        allocations = len({r.get("allocation", "local") for r in self.records})
        if allocations > 1:
            line += f" (over {allocations} allocations)"
        if costs:
            line += f"; {len(costs)} in-job restart{'s' if len(costs) > 1 else ''}: " + "; ".join(
                f"#{c.attempt} after {c.what_failed} failed ({c.text()})" for c in costs
            )
        return line

    def rank_host(self, attempt: int, rank: int) -> str:
        rec = next((r for r in self.records if r["attempt"] == attempt), None)
        for host, first, last in (rec or {}).get("hosts", []):
            if first <= rank <= last:
                return host
        return "?"


def _runs(hosts: list[str]) -> list[list]:
    """Hosts per rank as [host, first rank, last rank] runs (ranks fill a node before the next)."""
    runs: list[list] = []
    for rank, host in enumerate(hosts):
        if runs and runs[-1][0] == host and runs[-1][2] == rank - 1:
            runs[-1][2] = rank
        else:
            runs.append([host, rank, rank])
    return runs
