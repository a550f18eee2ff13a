"""A run's LR schedule: Megatron-LM's scheduler settings from the flags (in steps), the rules that reconcile
them with a checkpoint's (``--override-opt-param-scheduler``, ``--use-checkpoint-opt-param-scheduler``), and
the one line that says which is in force. Pure functions of the configs and the checkpoint's saved state."""

from __future__ import annotations

from megatron_fixedcode.arguments.checkpoint_flags import CheckpointConfig


# The scheduler's state → the flags that set it.
SCHEDULE_FLAGS = {
    "max_lr": "--lr",
    "min_lr": "--min-lr",
    "lr_warmup_steps": "--lr-warmup-iters",
    "lr_decay_steps": "--lr-decay-iters (default: the run's length from --train-iters/--train-tokens)",
    "lr_decay_style": "--lr-decay-style",
    "start_wd": "--weight-decay",
    "end_wd": "--weight-decay",
    "decoupled_lr": "--decoupled-lr",
    "decoupled_min_lr": "--decoupled-min-lr",
}


def scheduler_settings(o, max_steps: int, global_batch: int = 1) -> dict:
    """In steps. Sample-based flags (--lr-*-samples) become steps of ``global_batch`` samples, and
    --lr-warmup-fraction a fraction of the decay steps, as Megatron-LM's scheduler counts them."""
    warmup = o.lr_warmup_iters or o.lr_warmup_samples // global_batch
    decay = o.lr_decay_iters or (o.lr_decay_samples // global_batch if o.lr_decay_samples else None) or max_steps
    if o.lr_warmup_fraction is not None:
        warmup = int(o.lr_warmup_fraction * decay)
    return {
        "max_lr": o.lr,
        "min_lr": o.min_lr,
        "lr_warmup_steps": warmup,
        "lr_decay_steps": max(decay, warmup + 1),
        "lr_decay_style": o.lr_decay_style,
        "start_wd": o.weight_decay,
        "end_wd": o.weight_decay,
        "decoupled_lr": o.decoupled_lr,
        "decoupled_min_lr": o.decoupled_min_lr,
    }


def reconcile_schedule(ck: CheckpointConfig, schedule: dict, saved_schedule: dict) -> tuple[dict, str]:
    """Megatron-LM's semantics: the checkpoint's schedule and this run's flags must agree, unless
    --override-opt-param-scheduler (the flags win) or --use-checkpoint-opt-param-scheduler (the checkpoint wins).
    The schedule in force and where it comes from; a ``ValueError`` naming the flags that differ."""
    if (saved_schedule["decoupled_lr"] is None) != (schedule["decoupled_lr"] is None):
        had = (
            "no --decoupled-lr"
            if saved_schedule["decoupled_lr"] is None
            else f"--decoupled-lr {saved_schedule['decoupled_lr']}"
        )
        raise ValueError(
            f"--load {ck.load}: the checkpoint's optimizer was built with {had}, this run "
            f"{'with' if saved_schedule['decoupled_lr'] is None else 'without'} it: its parameter groups "
            "differ, so Adam's state cannot be loaded into them; keep it as it was, or give "
            "--no-load-optim to start the optimizer and the schedule afresh"
        )
    differ = {k: (saved_schedule[k], v) for k, v in schedule.items() if k in saved_schedule and saved_schedule[k] != v}
    if not differ:
        return schedule, "checkpoint = command line"
    if ck.override_opt_param_scheduler:
        return schedule, "command line (--override-opt-param-scheduler)"
    if ck.use_checkpoint_opt_param_scheduler:
        return (
            {**schedule, **{k: before for k, (before, _) in differ.items()}},
            "checkpoint (--use-checkpoint-opt-param-scheduler)",
        )
    what = "; ".join(
        f"{k} {before} in the checkpoint, {now} in this run ({SCHEDULE_FLAGS[k]})"
        for k, (before, now) in differ.items()
    )
    raise ValueError(
        f"--load {ck.load}: the LR schedule differs: {what}; give "
        "--override-opt-param-scheduler to use this run's values or "
        "--use-checkpoint-opt-param-scheduler to keep the checkpoint's"
    )


def describe_schedule(schedule: dict, source: str) -> str:
    return (
        f"LR schedule in force (from {source}): lr {schedule['max_lr']:g}, min-lr {schedule['min_lr']:g}, "
        f"warmup {schedule['lr_warmup_steps']} steps, {schedule['lr_decay_style']} decay over "
        f"{schedule['lr_decay_steps']} steps, weight decay {schedule['start_wd']:g}"
        + (
            f"; input table and output layer: lr {schedule['decoupled_lr']:g}, min-lr "
            f"{schedule['min_lr'] if schedule['decoupled_min_lr'] is None else schedule['decoupled_min_lr']:g}"
            if schedule["decoupled_lr"] is not None
            else ""
        )
    )
