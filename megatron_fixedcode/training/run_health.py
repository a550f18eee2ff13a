"""The run-health numbers Megatron-LM logs on request: ``--log-params-norm`` (``params norm`` in the
iteration line, TensorBoard ``params-norm``), ``--log-num-zeros-in-grad`` (megatron-core's optimizer counts
them when ``OptimizerConfig.log_num_zeros_in_grad`` is set: ``num zeros``, ``num-zeros``) and
``--log-memory-to-tensorboard`` (``mem-reserved-bytes``, ``mem-allocated-bytes``, ``mem-max-allocated-bytes``,
``mem-allocated-count`` from ``torch.cuda.memory_stats()``; on the CPU, where there is no CUDA memory, this
process's resident set size as ``mem-rss-bytes``, said in one startup line).
"""

from __future__ import annotations

import gc
import logging

import psutil
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from megatron_fixedcode.arguments.logging_flags import LoggingConfig
from megatron_fixedcode.compat.distributed import collective_timeout
from megatron_fixedcode.training.timers import log_timers, timed, timers_off, timers_to_log

logger = logging.getLogger(__name__)

CPU_MEMORY_NOTE = (
    "--log-memory-to-tensorboard: no CUDA memory on this machine; TensorBoard gets this process's "
    "resident set size as 'mem-rss-bytes' instead of Megatron-LM's 'mem-*-bytes'"
)


def params_l2_norm(chunks, device: torch.device) -> float:
    """Megatron-LM's ``calc_params_l2_norm``: the L2 norm of all of the model's weights, each counted once —
    tensor-parallel duplicates (layer norms, biases on TP ranks > 0) and the output layer's copy of a tied
    input table skipped, the squares summed over the model-parallel group (TP x PP); data-parallel replicas
    are one model. In FP32 from the model's weights (for BF16 weights, Megatron-LM's FP32-copy path)."""
    total = torch.zeros(1, dtype=torch.float32, device=device)
    for chunk in chunks:
        for param in chunk.parameters():
            if param_is_not_tensor_parallel_duplicate(param) and param_is_not_shared(param):
                total += torch.sum(param.detach().float() ** 2)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_model_parallel_group())
    return float(total.sqrt())


def memory_scalars() -> dict[str, float]:
    """Megatron-LM's memory tags (CUDA), else the resident set size under a tag of its own."""
    if torch.cuda.is_available():
        stats = torch.cuda.memory_stats()
        return {
            "mem-reserved-bytes": stats.get("reserved_bytes.all.current", 0),
            "mem-allocated-bytes": stats.get("allocated_bytes.all.current", 0),
            "mem-max-allocated-bytes": stats.get("allocated_bytes.all.peak", 0),
            "mem-allocated-count": stats.get("allocation.all.current", 0),
        }
    return {"mem-rss-bytes": psutil.Process().memory_info().rss}


class RunHealth:
    """What the loop does for these flags, on every rank (the norms and times are collectives): the parameter
    norm after each step, the evaluation and its timer, the timers' lines every --log-interval, and Megatron-LM's
    garbage collection (--manual-gc)."""

    def __init__(self, trainer, sink, flops_per_token: float):
        # a trainer without them (a test's stand-in) runs with every flag off and no timers
        self.trainer, self.sink = trainer, sink
        self.cfg = trainer.cfg.logging or LoggingConfig(
            log_interval=1, tensorboard_dir=None, metrics_file=None, wandb_project=None
        )
        self.timers = getattr(trainer, "timers", None)
        self.rank0 = trainer.ranks["rank"] == 0
        self._logged_at = trainer.step

    def start(self) -> None:
        health = self.trainer.cfg.health
        if health is not None and health.manual_gc:  # Megatron-LM: no automatic collection, every N steps instead
            gc.disable()
            gc.collect()
        if self.rank0 and self.cfg.log_memory_to_tensorboard and not torch.cuda.is_available():
            logger.info("%s", CPU_MEMORY_NOTE)
        if self.rank0:
            timeouts = {
                str(collective_timeout(g))
                for g in (None, parallel_state.get_data_parallel_group(), parallel_state.get_model_parallel_group())
            }
            logger.info(
                "collectives time out after %s (--distributed-timeout-minutes %d)",
                ", ".join(sorted(timeouts)),
                self.trainer.cfg.health.distributed_timeout_minutes,
            )

    def after_step(self, record: dict) -> None:
        health = self.trainer.cfg.health
        if health is not None:
            step = self.trainer.step
            if health.manual_gc and health.manual_gc_interval and step % health.manual_gc_interval == 0:
                gc.collect()
            if health.empty_unused_memory_level >= 1 and self.trainer.device.type == "cuda":
                torch.cuda.empty_cache()
        if self.cfg.log_params_norm:
            record["params_norm"] = params_l2_norm(self.trainer.chunks, self.trainer.device)

    def evaluate(self, **kwargs) -> dict:
        """Megatron-LM's evaluate(): the step timers off, the whole timed as 'evaluate' (level 0) and logged."""
        if self.timers is None:
            return self.trainer.evaluate(**kwargs)
        with timers_off(self.trainer.chunks[0].config), timed(self.timers, "evaluate", 0, barrier=True):
            out = self.trainer.evaluate(**kwargs)
        log_timers(self.timers, ["evaluate"], rank0=self.rank0)
        return out

    def after_record(self, step: int) -> None:
        """The timers of the steps since the last log line, per step, after the iteration line."""
        if step % self.cfg.log_interval == 0 or step == self.trainer.max_steps:
            log_timers(
                self.timers,
                timers_to_log(self.cfg.timing_log_level),
                rank0=self.rank0,
                normalizer=max(step - self._logged_at, 1),
                step=step,
                sink=self.sink if self.cfg.log_timers_to_tensorboard else None,
            )
            self._logged_at = step
