"""The loop's hooks for Megatron-LM's watchers of a long run, in Megatron-LM's places (train() and
post_training_step_callbacks): the straggler detector's report (``recovery/straggler.py``), the weight-hash
check across data-parallel replicas, the profiler and the memory snapshots (``training/profiling.py``).

``--check-weight-hash-across-dp-replicas-interval N``: megatron-core's ``check_param_hashes_across_dp_replicas``
(``cross_check=True``) before the first step and after every N-th, every rank; a match logs Megatron-LM's
``>>> Weight hashes match after N iterations...``, a mismatch (the same answer on every rank) stops the run,
naming the step, before that step is saved (:class:`~megatron_fixedcode.errors.ReplicasDiverged`).
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.distributed as dist
from megatron.core.utils import check_param_hashes_across_dp_replicas

from megatron_fixedcode.errors import ReplicasDiverged
from megatron_fixedcode.training.gpu_features import params_synced
from megatron_fixedcode.training.profiling import Profiler
from megatron_fixedcode.recovery.straggler import configure_straggler, report_straggler

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _hashes_where_they_are():
    """megatron-core moves the hashes to the GPU for NCCL (``.cuda()``); gloo gathers them on the CPU, where
    there is no GPU to move them to."""
    if torch.cuda.is_available():
        yield
        return
    moves, torch.Tensor.cuda = torch.Tensor.cuda, lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = moves


def check_weight_hashes(chunks, step: int, rank0: bool) -> None:
    with params_synced(chunks), _hashes_where_they_are():
        match = check_param_hashes_across_dp_replicas(chunks, cross_check=True)
    if not match:
        raise ReplicasDiverged(
            f"step {step}: the weights differ between data-parallel replicas "
            "(--check-weight-hash-across-dp-replicas-interval: megatron-core's "
            "check_param_hashes_across_dp_replicas); stopping before anything of this step is saved"
        )
    dist.barrier()
    if rank0:
        logger.info(">>> Weight hashes match after %d iterations...", step)


class RunWatch:
    """``start`` before the first step, ``before_step``/``after_step`` around each, ``close`` at the end."""

    def __init__(self, trainer, flops_per_token: float):
        self.trainer, self.flops_per_token = trainer, flops_per_token
        self.watch, self.rank0 = trainer.cfg.watch, trainer.ranks["rank"] == 0
        self.flops, self.reported_at = 0.0, trainer.step
        self.profiler = Profiler(
            self.watch,
            trainer.ranks["rank"],
            trainer.ranks["world_size"],
            trainer.step,
            trainer.cfg.logging.tensorboard_dir if trainer.cfg.logging else None,
        )

    def start(self) -> None:
        configure_straggler(self.watch, self.trainer.ranks["world_size"], self.trainer.ranks["rank"])
        if self.watch.check_weight_hash_across_dp_replicas_interval is not None:
            logging.getLogger("megatron.core.utils").setLevel(logging.INFO)  # the ranks name the differing weights
            check_weight_hashes(self.trainer.chunks, self.trainer.step, self.rank0)

    def before_step(self) -> None:
        self.profiler.before_step(self.trainer.step)

    def after_step(self, record: dict) -> None:
        """Megatron-LM's post_training_step_callbacks, before the step's checkpoint."""
        step = self.trainer.step
        self.flops += self.flops_per_token * record.get("step_tokens", 0)  # the step's model FLOPs (fwd + bwd)
        if report_straggler(self.watch, step, self.flops, step - self.reported_at):
            self.flops, self.reported_at = 0.0, step
        interval = self.watch.check_weight_hash_across_dp_replicas_interval
        if interval is not None and step % interval == 0:
            check_weight_hashes(self.trainer.chunks, step, self.rank0)
        self.profiler.after_step(step)

    def close(self) -> None:
        self.profiler.close()
