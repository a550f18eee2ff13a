"""What a resume keeps: the one decision of whether a load restores Adam's state, the LR schedule
and the RNG streams, given the checkpoint's parallel layout and this run's and the flags that narrow it
(--finetune, --no-load-optim, --no-load-rng). Pure: no torch. The run plan decides it once, before any
process group (training/run_plan.py); the load applies it (checkpoint/load.py)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ResumeScope:
    """What a load restores besides the weights (which reshard to any layout)."""

    optimizer: bool  # Adam's moments and step (and the BF16 main weights): megatron reshards them
    scheduler: bool
    rng: str  # "per_rank" | "per_model_parallel_rank" | "fresh" | "none"
    note: str  # one line for the log: what was kept, what starts fresh
    finetune: bool = False  # --finetune: a new run from these weights (step 0)

    @property
    def reload_main_weights(self) -> bool:
        """The optimizer's main (FP32) weights were copied from the model when it was built; a load
        that does not restore them must copy them again from the loaded weights, or the first step
        writes the initial ones back (Megatron-LM's ``reload_model_params``)."""
        return not self.optimizer


# How the optimizer's state is laid out in a checkpoint (trainer state "optimizer_format"):
PER_PARAMETER = "per_parameter"  # megatron's plain optimizers: one tensor per model parameter
FULLY_RESHARDABLE = "fully_reshardable"  # the distributed optimizer, gathered into per-parameter tensors
DP_RESHARDABLE = "dp_reshardable"  # the distributed optimizer's own flat buffers
RESHARDS_ACROSS_TP_PP = {PER_PARAMETER, FULLY_RESHARDABLE}


EVERYTHING = ResumeScope(optimizer=True, scheduler=True, rng="per_rank", note="everything kept")


def resume_scope(
    saved_layout: dict,
    layout: dict,
    *,
    finetune: bool = False,
    no_load_optim: bool = False,
    no_load_rng: bool = False,
    rng_by_model_parallel_rank: bool = False,
    saved_optimizer_format: str = PER_PARAMETER,
    distributed_optimizer: bool = False,
) -> ResumeScope:
    """The one decision of what a resume keeps. ``finetune`` keeps the weights only. Otherwise Adam's state and
    the schedule are kept on any layout (Megatron-LM's ``--no-load-optim`` drops both): megatron-core's optimizer
    state is stored per model parameter (plain optimizers, and the distributed optimizer in its fully_reshardable
    format), which reshards across TP, PP and DP; the distributed optimizer's dp_reshardable format reshards
    across DP only, and a TP or PP change with it is refused. The RNG states are per rank (``--no-load-rng``: none
    loaded): kept on the same layout; on another DP size with the same TP and PP every DP rank takes those of DP
    rank 0 of its (PP, TP) rank, as Megatron-LM does; on another TP or PP size no rank's streams correspond, and
    they start fresh. A refusal is a ``ValueError``."""
    if finetune:
        return ResumeScope(
            optimizer=False, scheduler=False, rng="none", note="weights only (--finetune)", finetune=True
        )
    if not no_load_optim:
        _refuse_optimizer_format(saved_layout, layout, saved_optimizer_format, distributed_optimizer)
    rng, why = _rng_scope(saved_layout, layout, rng_by_model_parallel_rank)
    if no_load_rng:
        rng = "none"
    if no_load_optim:
        rng_part = {
            "per_rank": "RNG states kept",
            "per_model_parallel_rank": "the RNG states of data-parallel rank 0 kept",
            "fresh": f"RNG starts fresh ({why})",
            "none": "RNG not loaded (--no-load-rng)",
        }[rng]
        weights = "weights resharded" if saved_layout != layout else "weights kept"
        note = f"{weights}, optimizer state and LR schedule start fresh (--no-load-optim), {rng_part}"
    elif saved_layout == layout:
        note = "everything kept"
    elif rng == "per_model_parallel_rank":
        note = "weights resharded, optimizer state and the RNG states of data-parallel rank 0 kept"
    else:
        note = f"weights and optimizer state resharded, RNG starts fresh ({why})"
    if no_load_rng and not no_load_optim:
        kept = "kept" if saved_layout == layout else "resharded"
        note = f"weights and optimizer state {kept}, RNG not loaded (--no-load-rng)"
    return ResumeScope(optimizer=not no_load_optim, scheduler=not no_load_optim, rng=rng, note=note)


def _rng_scope(saved_layout: dict, layout: dict, rng_by_model_parallel_rank: bool) -> tuple[str, str]:
    if saved_layout == layout:
        return "per_rank", ""
    if _same_model_parallel(saved_layout, layout):
        if rng_by_model_parallel_rank:
            return "per_model_parallel_rank", ""
        return "fresh", "checkpoint saved without per-model-parallel-rank RNG"
    return "fresh", "TP/PP changed"


def _same_model_parallel(saved_layout: dict, layout: dict) -> bool:
    return all(saved_layout[k] == layout[k] for k in ("tp_size", "pp_size"))


def _refuse_optimizer_format(saved_layout, layout, saved_optimizer_format: str, distributed_optimizer: bool) -> None:
    if (saved_optimizer_format != PER_PARAMETER) != distributed_optimizer:
        saved_with = "with" if saved_optimizer_format != PER_PARAMETER else "without"
        raise ValueError(
            f"the checkpoint was saved {saved_with} --use-distributed-optimizer (optimizer state format "
            f"{saved_optimizer_format}) and megatron-core reads it only with the same optimizer: resume "
            f"{saved_with} --use-distributed-optimizer, or give --finetune to keep only the weights (Adam restarts)"
        )
    if saved_optimizer_format == DP_RESHARDABLE and not _same_model_parallel(saved_layout, layout):
        raise ValueError(
            f"the checkpoint's distributed-optimizer state is in the dp_reshardable format (saved with "
            f"--no-dist-ckpt-optim-fully-reshardable), which reshards across data-parallel ranks only: it was saved "
            f"at TP {saved_layout['tp_size']} x PP {saved_layout['pp_size']}, this run is TP {layout['tp_size']} x "
            f"PP {layout['pp_size']}. Resume once on the saved TP and PP without that flag (the next checkpoint is "
            "fully_reshardable), or give --finetune to keep only the weights"
        )
