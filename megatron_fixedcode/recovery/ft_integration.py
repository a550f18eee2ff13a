"""Megatron-LM's ``ft_integration`` on nvidia-resiliency-ext: the rank monitor client of ``ft_launcher`` and its
sections, and the one request this project sends its launcher (do not restart).

``--enable-ft-package`` is Megatron-LM's ``ft_integration``: a "setup" section from start-up to the first
step, a "step" section around each step after ``--ft-num-warmup-iters``, a "checkpointing" section around
each save; ``--calc-ft-timeouts`` updates the timeouts from what was observed and keeps them in
``SAVE/ft_state.json`` for the next attempt.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading

logger = logging.getLogger(__name__)

_MIN_STEPS_FOR_STEP_TIMEOUT = 16  # Megatron-LM's _MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE
OVERDUE_SHARE = 0.8  # of a section's timeout: when a rank still in it says so (see ResiliencyClient.on_overdue)


def request_no_restart(reason: str) -> None:
    """Ask ``ft_launcher`` not to restart the worker group (its next rendezvous is closed); nothing to
    ask elsewhere: under torchrun the next attempt refuses to start (:meth:`Attempts.refusal`)."""
    if not os.environ.get("FT_LAUNCHER_IPC_SOCKET"):
        return
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, WorkloadAction, WorkloadControlRequest
        from nvidia_resiliency_ext.fault_tolerance.data import RankInfo

        client = RankMonitorClient()
        client.rank_info = RankInfo.get_for_current_rank()  # what init_workload_monitoring would set
        client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ShutdownWorkload, reason))
    except Exception as e:  # the launcher may already be gone; the next attempt refuses anyway
        logger.warning("could not ask ft_launcher not to restart (%s): the next attempt refuses to start instead", e)


class ResiliencyClient:
    """Megatron-LM's ft_integration on nvidia-resiliency-ext's RankMonitorClient (under ft_launcher).

    ``on_overdue(section, waited_s)``: called from a thread when this rank is still in its ``step`` or
    ``checkpointing`` section at 80% of the section's timeout. A rank waiting on a stopped peer is ended by its own
    monitor too, before any collective fails and so before it could report; said from a thread (which runs while the
    rank waits in a collective, and not in a stopped process), it lets the next attempt name the rank that said
    nothing."""

    def __init__(self, save_dir: str, warmup_steps: int, calc_timeouts: bool, asynchronous_saves: bool, rank0: bool):
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        self.client = RankMonitorClient()
        self.state_path = os.path.join(save_dir, "ft_state.json")
        self.warmup_steps, self.calc_timeouts = warmup_steps, calc_timeouts
        self.asynchronous_saves, self.rank0 = asynchronous_saves, rank0
        self.steps = self.saves = self.eval_steps = 0
        self.loaded_persistent = False
        self.on_overdue = None
        self._watchdog: threading.Timer | None = None
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.client.load_state_dict(json.load(f))
        self.client.init_workload_monitoring()
        if rank0:
            logger.info("FT: initialized. Timeouts=%s", self.client.section_timeouts)
        self.client.start_section("setup")
        self.setup_open = True

    def step_start(self) -> None:
        self._batch_start(self.steps)

    def step_end(self) -> None:
        self._batch_end(self.steps)
        self.steps += 1
        self.eval_steps = 0  # Megatron-LM: each evaluation counts its own warmup batches

    def eval_step_start(self) -> None:
        self._batch_start(self.eval_steps)

    def eval_step_end(self) -> None:
        self._batch_end(self.eval_steps)
        self.eval_steps += 1

    def _batch_start(self, seen: int) -> None:
        """A training step or evaluation batch begins: "setup" ends at the first; "step" opens after the warmup."""
        if self.setup_open:
            self.client.end_section("setup")
            self.setup_open = False
        if seen >= self.warmup_steps:
            self._open("step")

    def _batch_end(self, seen: int) -> None:
        if seen >= self.warmup_steps:
            self._close("step")

    @contextlib.contextmanager
    def checkpointing(self):
        self._open("checkpointing")
        try:
            yield
        finally:
            self._close("checkpointing")
        self.saves += 1
        self._update_timeouts(closing=False)

    def _open(self, section: str) -> None:
        self.client.start_section(section)
        timeouts = getattr(self.client, "section_timeouts", None)  # set once monitoring is initialized
        timeout = (timeouts.section or {}).get(section) if timeouts is not None else None
        if self.on_overdue is not None and timeout:
            waited = OVERDUE_SHARE * timeout
            self._watchdog = threading.Timer(waited, self.on_overdue, (section, waited))
            self._watchdog.daemon = True
            self._watchdog.start()

    def _close(self, section: str) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self.client.end_section(section)

    def shutdown(self) -> None:
        self._update_timeouts(closing=True)
        self.client.shutdown_workload_monitoring()

    def _update_timeouts(self, closing: bool) -> None:
        """Megatron-LM's _maybe_update_timeouts: each section once it has been seen enough."""
        if not self.calc_timeouts:
            return
        sections = ["setup"] if self.loaded_persistent else []
        if self.steps >= _MIN_STEPS_FOR_STEP_TIMEOUT:
            sections.append("step")
        if self.saves and not self.asynchronous_saves:
            sections.append("checkpointing")
        out_of_section = closing and {"setup", "step"} <= set(sections) and self.saves > 0
        if not sections and not out_of_section:
            return
        self.client.calculate_and_set_section_timeouts(selected_sections=sections, calc_out_of_section=out_of_section)
        if self.rank0:
            tmp = f"{self.state_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.client.state_dict(), f)
            os.replace(tmp, self.state_path)
            logger.info("FT: updated timeouts saved to %s. %s", self.state_path, self.client.section_timeouts)


def start_resiliency_client(cfg) -> ResiliencyClient | None:
    """``--enable-ft-package``: the rank's client, its "setup" section open; ``ValueError`` (one line, exit 2)
    outside ft_launcher."""
    health = cfg.health
    if not health.enable_ft_package:
        return None
    if not os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
        raise ValueError(
            "--enable-ft-package: this rank was not started by ft_launcher (nvidia-resiliency-ext's launcher, "
            "a drop-in for torchrun; examples/slurm_common.sh uses it when the package is installed)"
        )
    return ResiliencyClient(
        cfg.checkpoint.save,
        health.ft_num_warmup_iters,
        health.calc_ft_timeouts,
        bool(cfg.checkpoint.async_save),
        int(os.environ.get("RANK", "0")) == 0,
    )
