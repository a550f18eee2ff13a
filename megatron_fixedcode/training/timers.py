"""Megatron-LM's timers (``megatron.core.timers.Timers``, the class Megatron-LM's ``get_timers()`` returns),
at Megatron's levels and names: ``--timing-log-level`` 0 (the default) keeps the level-0 regions
(``save-checkpoint``, ``evaluate``); 1 adds the step's regions that megatron-core times itself once
``config.timers`` is set (``forward-backward``, ``all-grads-sync``, the ``optimizer-*`` phases, ...) and
``optimizer``; 2 adds ``batch-generator``, ``forward-compute``, ``backward-compute`` and the pipeline's
send/recv. Every ``--log-interval`` the ``(min, max) time across ranks (ms):`` lines follow the
iteration line (``--timing-log-option``), and with ``--log-timers-to-tensorboard`` each timer goes to
TensorBoard as ``<name>-time`` (the max over ranks), as Megatron-LM's ``training_log`` writes them.
"""

from __future__ import annotations

import contextlib
import logging

from megatron.core.timers import Timers

from megatron_fixedcode.arguments.logging_flags import LoggingConfig

logger = logging.getLogger(__name__)

# Megatron-LM's training_log (core_v0.16.1): the timers logged at each level, in its order.
LEVEL1_TIMERS = (
    "forward-backward",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "all-grads-sync",
    "params-all-gather",
    "optimizer-copy-to-main-grad",
    "optimizer-unscale-and-check-inf",
    "optimizer-clip-main-grad",
    "optimizer-count-zeros",
    "optimizer-inner-step",
    "optimizer-copy-main-to-model-params",
    "optimizer",
)
LEVEL2_TIMERS = (
    "batch-generator",
    "forward-compute",
    "backward-compute",
    "forward-recv",
    "forward-send",
    "backward-recv",
    "backward-send",
    "forward-send-forward-recv",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
    "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
)


def build_timers(logging_cfg: LoggingConfig) -> Timers:
    return Timers(logging_cfg.timing_log_level, logging_cfg.timing_log_option)


def timers_to_log(level: int) -> list[str]:
    return [*(LEVEL1_TIMERS if level >= 1 else ()), *(LEVEL2_TIMERS if level >= 2 else ())]


def log_timers(
    timers: Timers | None,
    names: list[str],
    *,
    rank0: bool,
    normalizer: float = 1.0,
    sink=None,
    step: int | None = None,
    barrier: bool = False,
) -> None:
    """On every rank (the times are gathered): to TensorBoard/W&B as ``<name>-time`` (max over ranks; when
    ``sink`` is given, as Megatron-LM's ``timers.write``), then the log lines on rank 0, resetting them."""
    if timers is None or not names:
        return
    if sink is not None:
        times = timers._get_global_min_max_time(names, reset=False, barrier=barrier, normalizer=normalizer / 1000.0)
        if rank0:
            sink.scalars({f"{name}-time": hi for name, (_, hi) in times.items()}, step)
    text = timers.get_all_timers_string(names, normalizer=normalizer, reset=True, barrier=barrier)
    if rank0 and text:
        logger.info("%s", text)


@contextlib.contextmanager
def timers_off(config):
    """Megatron-LM's evaluate(): no step timers while the validation batches run."""
    saved, config.timers = config.timers, None
    try:
        yield
    finally:
        config.timers = saved


@contextlib.contextmanager
def timed(timers: Timers | None, name: str, log_level: int, barrier: bool = False):
    if timers is None:
        yield
        return
    timers(name, log_level=log_level).start(barrier=barrier)
    try:
        yield
    except BaseException:
        timers(name).stop()  # no barrier: the other ranks may not get here
        raise
    timers(name).stop(barrier=barrier)
