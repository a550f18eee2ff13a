"""The training loop's side of in-job restarts: the resiliency package's sections, the attempts' record
and goodput, what a rank does when its attempt fails (the tests' faults: recovery/fault_injection.py).

The restart itself is the elastic launcher's (``ft_launcher`` of nvidia-resiliency-ext, or torchrun
``--max-restarts``): it restarts the worker group when a rank exits non-zero or is ended by its rank
monitor, and the new attempt resumes from the newest complete checkpoint (persistent or
non-persistent). This module writes no launcher; it tells the launcher not to restart what a restart
cannot fix (``WorkloadAction.ShutdownWorkload``, where ``ft_launcher`` runs; under torchrun the next
attempt refuses at once), and keeps the record (recovery/attempts.py).

The resiliency package's client and sections: recovery/ft_integration.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

import torch

from megatron_fixedcode.recovery.attempts import (
    Attempts,
    allocation_id,
    attempts_path,
    max_restarts,
    process_start_time,
)
from megatron_fixedcode.recovery.fault_injection import FaultInjection
from megatron_fixedcode.recovery.ft_integration import ResiliencyClient, request_no_restart
from megatron_fixedcode.recovery.attempt_reports import silent_ranks, write_failure_report

logger = logging.getLogger(__name__)


def read_attempts(save_dir: str | None) -> Attempts:
    """This job's attempts so far, read by every rank at start-up, before any rank of this attempt writes."""
    return Attempts.read(attempts_path(save_dir))


def refuse_restart(attempts: Attempts, rank0: bool) -> int | None:
    """Before anything is built: an attempt that must not run (the one before it exited 2 or 17, the two
    before it failed at the same step, or the allocation's restart budget is spent) exits at once with a
    code, its reason on rank 0."""
    allocation = allocation_id()
    refusal = attempts.refusal(attempts.next_attempt, allocation) or attempts.budget_refusal(allocation, max_restarts())
    if refusal is None:
        return None
    code, reason = refusal
    if rank0:
        logger.error("%s (the attempts' record: %s)", reason, attempts.path)
    request_no_restart(reason)
    return code


class InJobRestarts:
    """``process_group_ready`` as soon as the process group exists (the attempt counts from there),
    ``start`` after the load, ``before_step``/``after_step`` around each step, ``saving`` around each save,
    ``failed`` when a collective fails (also in start-up), ``end`` at the exit."""

    def __init__(self, client: ResiliencyClient | None, attempts: Attempts, rank: int, world: int):
        self.trainer, self.client = None, client
        self.rank, self.world = rank, world
        self.rank0 = self.rank == 0
        self.attempts = attempts
        self.attempt = self.attempts.next_attempt
        self.allocation = allocation_id()
        self.max_restarts = max_restarts()
        # restarts this allocation had before this attempt (the records every rank read at its start)
        self.restarts_before = self.attempts.started_in(self.allocation)
        self.faults = FaultInjection(self.rank, self.attempt)  # nothing unless MFC_SIM_FAULT is set
        if client is not None:
            client.on_overdue = self._overdue
        self._step_began = None
        self.began = False  # process_group_ready() ran: this attempt is in the record

    def process_group_ready(self) -> None:
        """Every rank, right after the process group exists (each has read the record: the barrier of the
        gather): rank 0 records the attempt, so that one failing in start-up counts toward the budget."""
        if not self.attempts.path:
            return
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # the name sbatch --exclude takes
        hosts = [host] * self.world
        if torch.distributed.is_initialized() and self.world > 1:
            hosts = [None] * self.world
            torch.distributed.all_gather_object(hosts, host)
        self.began = True
        if self.rank0:
            self.attempts.start(self.attempt, process_start_time(), hosts, self.allocation)
        self.faults.at_start()

    def _overdue(self, section: str, waited: float) -> None:
        """From the client's thread: this rank is still in ``section`` near its timeout (waiting on a peer, or
        slow); its report says so, so that a restart line names only the ranks that said nothing."""
        step = None if self.trainer is None else self.trainer.step + 1
        error = f"still in its '{section}' section after {waited:.0f} s"
        write_failure_report(self.attempts.path, self.attempt, self.rank, step, error)

    def start(self, trainer) -> None:
        """After the load: the step this attempt resumed from, and the restart line."""
        self.trainer = trainer
        if self.client is not None:
            local = trainer.local_checkpoints  # a local checkpoint's fast load must not set "setup"'s timeout
            self.client.loaded_persistent = trainer.step > 0 and not (local and local.loaded_step)
        if not self.began:  # no record kept (a single attempt): its goodput still is
            self.attempts.start(self.attempt, process_start_time(), [], self.allocation)
            self.began = True
        if not self.rank0:
            return
        before = [r for r in self.attempts.records if r["attempt"] < self.attempt]
        if self.attempt > 0 and before and before[-1].get("allocation", "local") == self.allocation:
            prev = before[-1]
            silent = silent_ranks(self.attempts, prev["attempt"], self.world)
            failed = Attempts.failed_step(prev)
            logger.warning(
                "in-job restart %d: attempt %d failed %s%s; resuming from step %d (%d steps to recompute)",
                self.attempt,
                prev["attempt"],
                "in start-up" if failed is None else f"at step {failed}",
                f" ({', '.join(silent)} stopped answering: hung or died)" if silent else "",
                trainer.step,
                max((prev["step"] or 0) - trainer.step, 0),
            )
        self.attempts.resumed(trainer.step, getattr(trainer, "loaded_from", None))
        passed = getattr(trainer, "passed_over", None)
        if passed:
            self.attempts.passed_over(passed)

    def before_step(self) -> None:
        self.faults.before_step(self.trainer.step + 1)
        if self.client is not None:
            self.client.step_start()
        self._step_began = time.time()
        if self.rank0:
            self.attempts.step_started(self._step_began)

    def after_step(self, record: dict) -> None:
        if self.client is not None:
            self.client.step_end()
        if self.rank0:
            self.attempts.step_done(record["step"], record.get("step_time_s", 0.0), time.time())
            if len(self.attempts.records) > 1 and self.trainer.step == self.attempts.current["resumed_from"] + 1:
                costs = self.attempts.restart_costs()  # none after a requeue: another allocation is no restart
                if costs and costs[-1].attempt == self.attempt:
                    logger.info("in-job restart %d cost: %s", costs[-1].attempt, costs[-1].text())

    @contextlib.contextmanager
    def evaluation_batch(self):
        """Around each evaluation batch: Megatron-LM's "step" section, after the warmup batches."""
        if self.client is not None:
            self.client.eval_step_start()
        yield
        if self.client is not None:
            self.client.eval_step_end()

    @contextlib.contextmanager
    def saving(self):
        """Around a save (the resiliency package's "checkpointing" section); a complete one is a point an
        attempt can resume from."""
        self.faults.at_save(self.trainer.step)
        with self.client.checkpointing() if self.client is not None else contextlib.nullcontext():
            yield
        if self.rank0:
            self.attempts.checkpoint_saved(self.trainer.step)

    def failed(self, error: BaseException) -> int:
        """A collective failed: a peer died or stopped answering (in a step, a save or the start-up). Report
        it (the next attempt names the ranks that did not), and ask not to restart when the attempt before
        failed at this same step or the allocation's restart budget is spent (the line says which)."""
        step = None if self.trainer is None else self.trainer.step + 1
        where = "start-up" if step is None else f"step {step}"
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        write_failure_report(self.attempts.path, self.attempt, self.rank, step, first)
        if self.rank0:
            logger.error("%s: a collective failed: a rank died or stopped answering (%s)", where, first)
        before = self.attempts.fails_again(self.attempt, step, self.allocation)
        reason = None
        if before is not None:
            reason = Attempts.same_step_text(step, before, self.attempt)
        elif self.max_restarts is not None and self.restarts_before >= self.max_restarts:
            reason = self.attempts.budget_text(self.max_restarts, self.attempt)
        if reason is not None:
            if self.rank0:
                logger.error("%s", reason)
            request_no_restart(reason)
        return 1

    def end(self, code: int, last_word) -> None:
        """The goodput line (log, TensorBoard, W&B through ``sink``), the exit record's fields."""
        now = time.time()
        if (
            code == 16
            and self.trainer
            and self.attempts.fails_again(self.attempt, self.trainer.step + 1, self.allocation) is not None
        ):
            reason = Attempts.rerun_again_text(self.trainer.step + 1)  # the same GPUs again: they cannot decide
            if self.rank0:
                logger.warning("%s", reason)
            request_no_restart(reason)
        if self.rank0 and self.began:
            self.attempts.end(code, getattr(last_word, "error", None) if code else None, now)
            share = self.attempts.goodput(now)
            if share is not None:
                logger.info("%s", self.attempts.goodput_line(now))
                if last_word is not None:
                    last_word.goodput = round(share[0], 6)
                    last_word.restarts = [vars(c) for c in self.attempts.restart_costs()]
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.shutdown()

    def goodput(self) -> float | None:
        share = self.attempts.goodput(time.time()) if self.rank0 else None
        return None if share is None else share[0]
