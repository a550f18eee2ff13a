"""``--log-progress``: Megatron-LM's ``progress.txt`` in ``--save`` (``append_to_progress_log`` and its call
sites in ``megatron/training/``, core_v0.16.1), one tab-separated line per event, written by rank 0:

``<date time>\\tJob ID: <SLURM_JOB_ID>\\t# GPUs: <world size>\\tStarting job`` when a job starts, and after
each checkpoint ``...\\tSaved checkpoint\\tIteration: N\\tJob throughput: X TFLOP/s/GPU\\tCumulative
throughput: Y TFLOP/s/GPU\\tFloating-point operations: F\\tTokens (in billions): T``. Job throughput
counts this job's work since it started; cumulative counts from the first job of this world size that
the file records, as Megatron-LM's ``get_start_time_from_progress_log``. Megatron-LM writes no line
when a job ends, nor does this.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path


class ProgressLog:
    """``flops_per_sample``: training FLOPs of one sample (the MFU's model FLOPs per token x sequence)."""

    def __init__(
        self, save: str | None, *, enabled: bool, rank0: bool, world_size: int, flops_per_sample: float, seq_length: int
    ):
        self.path = Path(save) / "progress.txt" if (enabled and save) else None
        self.rank0, self.world_size = rank0, world_size
        self.flops_per_sample, self.seq_length = flops_per_sample, seq_length
        self._start_time, self._start_flops = time.time(), 0.0

    def _append(self, text: str) -> None:
        if self.path is None or not self.rank0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(
                f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}\tJob ID: {os.environ.get('SLURM_JOB_ID', '')}\t"
                f"# GPUs: {self.world_size}\t{text}\n"
            )

    def start(self, samples_so_far: int) -> None:
        """The job starts (its work counts from the checkpoint it resumes)."""
        self._start_time, self._start_flops = time.time(), self.flops_per_sample * samples_so_far
        self._append("Starting job")

    def saved(self, iteration: int, samples_so_far: int, asynchronous: bool = False) -> None:
        """After a save returns: ``Saved checkpoint``, or ``Saving async checkpoint`` when it was only started
        (``--async-save``; :meth:`async_saved` when it is finalized), with the throughputs, as Megatron-LM."""
        if self.path is None or not self.rank0:
            return
        flops = self.flops_per_sample * samples_so_far
        job = (flops - self._start_flops) / (max(time.time() - self._start_time, 1e-9) * 1e12 * self.world_size)
        first_time, first_flops = self._first_job_of_this_world_size()
        elapsed = max((datetime.now() - first_time).total_seconds(), 1e-9)
        cumulative = (flops - first_flops) / (elapsed * 1e12 * self.world_size)
        label = "Saving async checkpoint" if asynchronous else "Saved checkpoint"
        self._append(
            f"{label}\tIteration: {iteration}\tJob throughput: {job:.1f} TFLOP/s/GPU\t"
            f"Cumulative throughput: {cumulative:.1f} TFLOP/s/GPU\t"
            f"Floating-point operations: {flops:.2e}\t"
            f"Tokens (in billions): {samples_so_far * self.seq_length / 10**9:.2f}"
        )

    def async_saved(self, iteration: int) -> None:
        self._append(f"Saved async checkpoint\tIteration: {iteration}")

    def _first_job_of_this_world_size(self) -> tuple[datetime, float]:
        """Megatron-LM's get_start_time_from_progress_log: the start of the earliest job of this world size
        since the world size last changed, and the FLOPs of the last checkpoint saved before it."""
        start_time = start_flops = None
        latest_flops = 0.0
        for line in self.path.read_text().splitlines():
            tokens = line.strip().split("\t")
            if len(tokens) < 4:
                continue
            if tokens[3] in ("Saved checkpoint", "Saving async checkpoint") and len(tokens) > 7:
                latest_flops = float(tokens[7].split(": ")[1])
            if int(tokens[2].split(": ")[1]) != self.world_size:
                start_time = start_flops = None
                continue
            if tokens[3] == "Starting job" and start_time is None:
                start_time, start_flops = tokens[0], latest_flops
        if start_time is None:
            return datetime.fromtimestamp(self._start_time), self._start_flops
        return datetime.strptime(start_time, "%Y-%m-%d %H:%M:%S"), start_flops
