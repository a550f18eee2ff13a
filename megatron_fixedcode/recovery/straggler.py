"""``--log-straggler``: megatron-core's ``StragglerDetector``, configured, fed and reported as Megatron-LM's
training.py does: the forward step's model call is timed (``with stimer:``) and its batch read
(``with stimer(bdata=True):``), and every ``--log-interval`` steps each rank's estimated throughput over the
interval is gathered and rank 0 logs the min/max with the rank of each
(``MnRtt/Rnk: 41.20ms/0 | MxRtt/Rnk: 95.73ms/1 | ... | MnEtpt/Rnk: 0.01TF/1 | MxEtpt/Rnk: 0.02TF/0``), then the
``--straggler-minmax-count`` lowest and highest. A request to ``--straggler-ctrlr-port`` on rank 0 toggles it.

megatron-core's detector turns itself off without CUDA (it records CUDA events and reads the GPU's sensors):
on the CPU :class:`CpuStragglerDetector` times with the wall clock alone, which the CUDA detector also takes
(the max of both), and reports the GPU readings as 0; gathering, ranking, logging and toggling are megatron-core's.
"""

from __future__ import annotations

import logging
import queue
import time

import torch
from megatron.core.utils import StragglerDetector

from megatron_fixedcode.arguments.observe_flags import WatchConfig


class CpuStragglerDetector(StragglerDetector):
    """megatron-core's detector with wall-clock timers: the same reports, without CUDA events or GPU readings."""

    def __new__(cls):  # not megatron-core's singleton: that one stays the CUDA detector
        return object.__new__(cls)

    def configure(
        self,
        world: int,
        rank: int,
        mmcnt: int = 1,
        amp: float = 3.0,
        port: int = 65535,
        prefill: int = 1024,
        enabled: bool = False,
    ) -> None:
        if StragglerDetector._configured:
            return
        StragglerDetector._configured = True
        self.world, self.rank, self.mmcnt, self.amp, self.port = world, rank, max(mmcnt, 1), amp, port
        self.toggle, self.bdata, self.dev, self.evt_q = False, False, torch.device("cpu"), queue.LifoQueue()
        self._off = not enabled
        self.reset()
        if self.rank == 0:
            self._controller()
        self.start, self.stop = (self.null_method,) * 2 if self._off else (self.start_method, self.stop_method)

    def start_method(self) -> None:
        kind = "data" if self.bdata else "gemm"
        self.bdata = False
        getattr(self, f"start_{kind}_tm").append(time.perf_counter_ns())
        getattr(self, f"stop_{kind}_tm").append(0)

    def stop_method(self) -> None:  # megatron-core's order: an open batch read first, else the open compute
        for kind in ("data", "gemm"):
            stops = getattr(self, f"stop_{kind}_tm")
            if stops and stops[-1] == 0:
                stops[-1] = time.perf_counter_ns()
                return

    def elapsed(self) -> tuple[float, float, int, int, int, int]:
        if self._off:
            return 0, 0, 0, 0, 0, 0
        delta = sum((e - s) / 1e6 for s, e in zip(self.start_gemm_tm, self.stop_gemm_tm) if e)
        batch = max(((e - s) / 1e6 for s, e in zip(self.start_data_tm, self.stop_data_tm) if e), default=0.0)
        self.reset()
        return delta, batch, 0, 0, 0, 0


stimer = StragglerDetector() if torch.cuda.is_available() else CpuStragglerDetector()


def configure_straggler(watch: WatchConfig, world: int, rank: int) -> None:
    """Megatron-LM's train(): the detector's settings from the flags, once per process."""
    if not watch.log_straggler:
        return
    logging.getLogger("megatron.core.utils").setLevel(logging.INFO)  # its report lines (the loop quiets megatron)
    stimer.configure(
        world,
        rank,
        mmcnt=watch.straggler_minmax_count,
        enabled=not watch.disable_straggler_on_startup,
        port=watch.straggler_ctrlr_port,
    )


def report_straggler(watch: WatchConfig, step: int, flops_since_report: float, interval: int) -> bool:
    """Every rank, every --log-interval: megatron-core's report (a gather and a broadcast); True when it is due."""
    if not watch.log_straggler or step % watch.log_interval:
        return False
    stimer.report(flops_since_report, interval)
    return True
