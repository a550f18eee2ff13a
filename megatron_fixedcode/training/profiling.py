"""``--profile`` and ``--record-memory-history``, as Megatron-LM's training.py and model_provider.py do them.

On the ranks of ``--profile-ranks``: with ``--use-pytorch-profiler`` a ``torch.profiler`` with Megatron-LM's
schedule (wait ``start - 1``, warm up 1, record ``end - start`` steps, once), the trace written by
``tensorboard_trace_handler`` into ``--tensorboard-dir``; the steps it records are ``--profile-step-start``
to ``--profile-step-end - 1`` (``ProfilerStep#N`` in the trace is step N). Without it, the CUDA profiler
range (``cudaProfilerStart``/``Stop`` with NVTX ranges) from step ``--profile-step-start`` to
``--profile-step-end``, for ``nsys --capture-range=cudaProfilerApi``. A resumed run counts from its
checkpoint's step, so the same steps are profiled as in the straight run (Megatron-LM's schedule counts
from the process's first step); one that resumes inside the window (a requeue) does not profile it again.

``--record-memory-history``: CUDA allocations recorded from before the model is built; the last rank writes
``torch.cuda.memory._snapshot()`` to ``--memory-snapshot-path`` every ``--log-interval`` (and on an OOM,
``oom_rank-R_PATH``). Both CUDA-only combinations are refused at launch on a machine without CUDA.
"""

from __future__ import annotations

import logging
import pickle

import torch
import torch.distributed as dist

from megatron_fixedcode.arguments.observe_flags import WatchConfig

logger = logging.getLogger(__name__)

NEEDS_CUDA = {
    "nsys": "--profile without --use-pytorch-profiler is the CUDA profiler range for nsys, and this machine has no "
    "CUDA: add --use-pytorch-profiler for torch.profiler traces",
    "memory": "--record-memory-history records CUDA allocations, and this machine has no CUDA: drop it here",
}


def cuda_refusal(watch: WatchConfig) -> str | None:
    """The one-line refusal of a flag that needs CUDA on a machine without it."""
    if torch.cuda.is_available():
        return None
    if watch.profile and not watch.use_pytorch_profiler:
        return NEEDS_CUDA["nsys"]
    return NEEDS_CUDA["memory"] if watch.record_memory_history else None


def start_memory_history(watch: WatchConfig) -> None:
    """Megatron-LM's model_provider: before the model is built, so its allocations are in the snapshots."""
    if not (watch.record_memory_history and torch.cuda.is_available()):
        return
    torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100000, trace_alloc_record_context=True)

    def oom_observer(device, alloc, device_alloc, device_free):
        with open(f"oom_rank-{dist.get_rank()}_{watch.memory_snapshot_path}", "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)

    torch._C._cuda_attach_out_of_memory_observer(oom_observer)


class Profiler:
    """Megatron-LM's profiling hooks of the loop: ``before_step`` at the top of each iteration, ``after_step``
    after it, ``close`` at the end (a run that ends inside the window still writes its trace)."""

    def __init__(self, watch: WatchConfig, rank: int, world_size: int, start_step: int, tensorboard_dir: str | None):
        self.watch, self.start_step = watch, start_step
        # a resume inside the window (a requeue's): an earlier run of the job entered it and wrote its trace
        self.resumed_inside = watch.profile and watch.profile_step_start <= start_step < watch.profile_step_end
        self.on = watch.profile and rank in watch.profile_ranks and start_step < watch.profile_step_start
        if self.resumed_inside and rank == min(watch.profile_ranks, default=0):
            logger.info(
                "--profile: resumed at step %d, inside the window of steps %d-%d that an earlier run entered "
                "(its trace is written): not profiled again",
                start_step,
                watch.profile_step_start,
                watch.profile_step_end - 1,
            )
        self.snapshot = watch.record_memory_history and torch.cuda.is_available() and rank == world_size - 1
        self.prof, self.nvtx = None, None
        if self.on and watch.use_pytorch_profiler:
            # Megatron-LM's schedule, on the global step count: ProfilerStep#N is step N, also after a resume
            self.prof = torch.profiler.profile(
                schedule=torch.profiler.schedule(
                    wait=max(watch.profile_step_start - 1, 0),
                    warmup=1 if watch.profile_step_start > 0 else 0,
                    active=watch.profile_step_end - watch.profile_step_start,
                    repeat=1,
                ),
                on_trace_ready=torch.profiler.tensorboard_trace_handler(tensorboard_dir),
                record_shapes=True,
                with_stack=True,
            )
            self.prof.step_num, self.prof.current_action = start_step, self.prof.schedule(start_step)
            self.prof.start()

    def before_step(self, step: int) -> None:
        """``step``: the steps done so far (Megatron-LM's ``iteration`` at the top of its loop)."""
        if not self.on:
            return
        if self.prof is not None:
            self.prof.step()
        elif step == self.watch.profile_step_start:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStart())
            self.nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True)
            self.nvtx.__enter__()

    def after_step(self, step: int) -> None:
        if self.snapshot and step % self.watch.log_interval == 0:
            with open(self.watch.memory_snapshot_path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
        if self.on and step == self.watch.profile_step_end:
            self.close()

    def close(self) -> None:
        if not self.on:
            return
        self.on = False
        if self.prof is not None:
            self.prof.stop()
        elif self.nvtx is not None:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop())
            self.nvtx.__exit__(None, None, None)
