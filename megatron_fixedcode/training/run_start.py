"""The run's opening lines on rank 0, before the first step: the parameter report, what was built instead of what
was asked (local layers, inert flags), the layers, optimizer and overlap, the batch geometry, the LR schedule in
force after a load and the room left for checkpoints."""

from __future__ import annotations

import logging

from megatron_fixedcode.checkpoint.save_checks import estimate_checkpoint_bytes, free_space_warning
from megatron_fixedcode.models import format_parameter_report
from megatron_fixedcode.training.lr_schedule import describe_schedule

logger = logging.getLogger(__name__)


def log_run_start(trainer) -> None:
    """Rank 0 only (the caller's test)."""
    cfg, ck, perf, skip_train = (
        trainer.cfg,
        trainer.cfg.checkpoint,
        trainer.cfg.performance,
        trainer.cfg.schedule.skip_train,
    )
    logger.info(format_parameter_report(trainer.report))
    overlap = [
        what
        for what, on in (("grad reduce", perf.overlap_grad_reduce), ("param gather", perf.overlap_param_gather))
        if on
    ]
    impl = trainer.chunks[0].config.transformer_impl
    if impl == "local" and perf.transformer_impl == "transformer_engine":
        logger.info(
            "--transformer-impl transformer_engine (Megatron-LM's default, not named) needs CUDA and "
            "Transformer Engine, absent here: building megatron-core's local layers; name "
            "--transformer-impl local to say so, or install TE on the GPU machine"
        )
    if cfg.inert:
        logger.info("accepted with no effect here: %s", "; ".join(cfg.inert))
    if trainer.plan.stream_change:
        logger.warning("%s", trainer.plan.stream_change)
    if trainer.step >= trainer.max_steps and not skip_train:
        logger.warning(
            "nothing to train: the checkpoint at step %d is the end of this run (%d steps); to train "
            "further give a larger --train-iters, --train-samples or --train-tokens",
            trainer.step,
            trainer.max_steps,
        )
    logger.info(
        "layers: %s%s; optimizer: %s; overlap: %s",
        impl,
        f", FP8 {perf.fp8}/{perf.fp8_recipe}" if perf.fp8 else "",
        trainer.optimizer_kind,
        ", ".join(overlap) or "none",
    )
    if trainer.device.type == "cuda":
        on = [k for k, v in trainer.fusions.items() if v]
        logger.info("GPU fusions: %s; TF32 %s", ", ".join(on) or "none", "on" if trainer.tf32 else "off")
    logger.info(
        "global batch %d = %d micro x %d accumulation x %d data-parallel; %d steps; start at step %d",
        trainer.global_batch,
        cfg.schedule.micro_batch_size,
        trainer.num_microbatches,
        trainer.ranks["dp_size"],
        trainer.max_steps,
        trainer.step,
    )
    sch = trainer.scheduler  # after loading: the values actually in force
    logger.info(
        "%s", describe_schedule({k: getattr(sch, k) for k in trainer.plan.schedule}, trainer.plan.schedule_source)
    )
    if ck.save and not skip_train:  # a warning, logged: room for fewer than two checkpoints
        free_space_warning(
            ck.save,
            estimate_checkpoint_bytes(
                trainer.report["total_params"],
                bf16=perf.bf16,
                distributed_optimizer=cfg.optim.use_distributed_optimizer,
                fully_reshardable=ck.fully_reshardable,
            ),
        )
