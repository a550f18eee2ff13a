"""The parts of one run, each built by one function the Trainer calls in this order (and tests, export and
evaluation can call alone): the model chunks in megatron's DDP (TE or local layers decided once), megatron's
optimizer and scheduler, the train and validation datasets, and the resume of a verified checkpoint into them."""

from __future__ import annotations

import logging
import uuid

import torch
import torch.distributed as dist
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer, get_standard_config_overrides
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_fixedcode import checkpoint
from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.checkpoint.resume_source import set_aside
from megatron_fixedcode.checkpoint.save_checks import find_os_error
from megatron_fixedcode.checkpoint.stores import NON_PERSISTENT, Parts, directory_stores
from megatron_fixedcode.compat import parallel_ranks, runtime_device
from megatron_fixedcode.data import build_datasets
from megatron_fixedcode.models import build_transformer_config
from megatron_fixedcode.models.builder import use_transformer_engine
from megatron_fixedcode.models.config import BLOCKS
from megatron_fixedcode.errors import DataError
from megatron_fixedcode.training.forward_backward import loss_config_fields
from megatron_fixedcode.training.gpu_features import fusion_settings, settle_gelu_approximation, te_wgrad_fusion
from megatron_fixedcode.training.model_chunks import build_model_chunks
from megatron_fixedcode.training.lr_schedule import scheduler_settings
from megatron_fixedcode.training.run_plan import RunPlan, check_resume_compatible, stream_identity
from megatron_fixedcode.utils.files import DiskFull, is_disk_full
from megatron_fixedcode.utils.rank_agreement import first_rank_error

logger = logging.getLogger(__name__)


def local_checkpoints(ck):
    """``--non-persistent-ckpt-type local``: this rank's node-local checkpoints (after the process groups)."""
    if ck.non_persistent_ckpt_type != "local":
        return None
    return checkpoint.LocalCheckpoints(ck.non_persistent_local_ckpt_dir, ck.non_persistent_local_ckpt_algo, ck.verify)


def build_chunks(cfg: PretrainConfig, plan: RunPlan, pg) -> tuple[list[torch.nn.Module], dict]:
    """This rank's model chunks in megatron's DDP, and the fusion settings in force. Transformer
    Engine or local layers is decided here, once, and passed to both the fusions and the config."""
    perf, health, model = cfg.performance, cfg.health, plan.model_cfg
    te_layers = use_transformer_engine(model)
    fusions = fusion_settings(
        perf,
        te_layers=te_layers,
        gated_linear_unit=BLOCKS[model.block]["gated_linear_unit"],
        squared_relu=model.squared_relu,
    )
    settle_gelu_approximation(plan.model_cfg, fusions, resumed=plan.load_step is not None)
    te_wgrad = te_wgrad_fusion(perf, te_layers=te_layers)
    config = build_transformer_config(
        plan.model_cfg,
        cfg.layout,
        te_layers=te_layers,
        **fusions,
        **loss_config_fields(cfg.data.dataset_type),
        **({"tp_comm_overlap": True} if perf.tp_comm_overlap else {}),
    )
    chunks = build_model_chunks(
        plan.model_cfg,
        config,
        cfg.layout,
        pg,
        use_distributed_optimizer=cfg.optim.use_distributed_optimizer,
        overlap_grad_reduce=perf.overlap_grad_reduce,
        overlap_param_gather=perf.overlap_param_gather,
        check_for_nan_in_grad=health.check_for_nan_in_loss_and_grad,
        check_for_large_grads=health.check_for_large_grads,
        te_wgrad_fusion=te_wgrad,
    )
    return chunks, {**fusions, "TE fuse_wgrad_accumulation": te_wgrad}


def build_optimizer(cfg: PretrainConfig, chunks, checkpoint_schedule: dict | None = None, timers=None):
    """megatron's optimizer over ``chunks``. Resuming, it is built with the checkpoint's lr/min-lr
    (newer megatron-core keys its param groups by them when loading); --override-opt-param-scheduler
    sets the new ones after the load."""
    o = cfg.optim
    resumed = checkpoint_schedule or {}
    config = OptimizerConfig(
        optimizer="adam",
        lr=resumed.get("max_lr", o.lr),
        min_lr=resumed.get("min_lr", o.min_lr),
        decoupled_lr=resumed.get("decoupled_lr", o.decoupled_lr),
        decoupled_min_lr=resumed.get("decoupled_min_lr", o.decoupled_min_lr),
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=cfg.performance.bf16,
        params_dtype=torch.float32,
        use_distributed_optimizer=o.use_distributed_optimizer,
        timers=timers,
        log_num_zeros_in_grad=cfg.logging.log_num_zeros_in_grad,
        barrier_with_L1_time=True,
    )
    overrides = get_standard_config_overrides(config)  # what get_megatron_optimizer would use
    for override in overrides.values():
        if "max_lr" in override:  # --decoupled-lr's group: megatron-core 0.16 tells groups apart on load by
            override["is_decoupled_lr"] = True  # (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr) only
    return get_megatron_optimizer(config, chunks, config_overrides=overrides)


class ParamScheduler(OptimizerParamScheduler):
    """megatron's scheduler, whose saved state also holds --decoupled-lr/--decoupled-min-lr: they shape the
    optimizer's parameter groups (megatron-core keeps them in no state of its own), which a resume rebuilds."""

    def __init__(self, *args, decoupled_lr: float | None, decoupled_min_lr: float | None, **kwargs) -> None:
        self.decoupled_lr, self.decoupled_min_lr = decoupled_lr, decoupled_min_lr
        super().__init__(*args, **kwargs)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "decoupled_lr": self.decoupled_lr, "decoupled_min_lr": self.decoupled_min_lr}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if not self.override_opt_param_scheduler:  # the groups were built with the checkpoint's values
            self.decoupled_lr, self.decoupled_min_lr = (
                state_dict.get("decoupled_lr"),
                state_dict.get("decoupled_min_lr"),
            )


def canonical_lr(optimizer) -> float:
    """The learning rate Megatron-LM logs: the first group on the default schedule (not --decoupled-lr's)."""
    groups = optimizer.param_groups
    return next((g["lr"] for g in groups if g.get("default_config", True)), groups[0]["lr"])


def decoupled_lr(optimizer) -> float | None:
    """The current learning rate of --decoupled-lr's group (the input table and output layer), if any."""
    return next((g["lr"] for g in optimizer.param_groups if not g.get("default_config", True)), None)


def build_scheduler(cfg: PretrainConfig, optimizer, max_steps: int, global_batch: int = 1) -> OptimizerParamScheduler:
    """megatron's LR/WD scheduler from this run's flags; a resume's mismatches were resolved (or
    refused) in the run plan, so the checkpoint's values load unless overridden."""
    o, ck = cfg.optim, cfg.checkpoint
    sched = scheduler_settings(o, max_steps, global_batch)
    return ParamScheduler(
        optimizer,
        decoupled_lr=sched["decoupled_lr"],
        decoupled_min_lr=sched["decoupled_min_lr"],
        init_lr=o.lr_warmup_init if sched["lr_warmup_steps"] else o.lr,
        max_lr=sched["max_lr"],
        min_lr=sched["min_lr"],
        lr_warmup_steps=sched["lr_warmup_steps"],
        lr_decay_steps=sched["lr_decay_steps"],
        lr_decay_style=sched["lr_decay_style"],
        start_wd=sched["start_wd"],
        end_wd=sched["end_wd"],
        wd_incr_steps=max_steps,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=not ck.override_opt_param_scheduler,
        override_opt_param_scheduler=ck.override_opt_param_scheduler,
    )


def build_run_datasets(cfg: PretrainConfig, tokenizer, max_steps: int, global_batch: int):
    """(train, valid) datasets; the shard checks run alike on every rank, before megatron's
    rank-0-first build, and a bad shard is a :class:`DataError`."""
    try:
        return build_datasets(
            cfg.data,
            tokenizer,
            num_train_samples=max_steps * global_batch,
            num_valid_samples=(cfg.schedule.eval_iters * global_batch)
            if (cfg.schedule.eval_interval or cfg.schedule.skip_train)
            else 0,
            seed=cfg.schedule.seed,
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    except Exception as e:  # megatron writes its sample index cache beside the data or in --data-cache-path
        full = find_os_error(e)  # (and wraps the OSError in an Exception of its own)
        if full is None or not is_disk_full(full):
            raise
        raise DataError(
            str(
                DiskFull(
                    getattr(full, "filename", None) or cfg.data.cache_path or "the dataset index cache",
                    full,
                    "the index cache is rebuilt at the next start",
                )
            )
        ) from None


def resume(
    cfg: PretrainConfig, plan: RunPlan, chunks, optimizer, scheduler, local=None
) -> tuple[int, int, dict | None]:
    """Load one checkpoint into the parts, once: with ``--non-persistent-ckpt-type local`` (``local``: the rank's
    :class:`~megatron_fixedcode.checkpoint.local.LocalCheckpoints`) the newest local one when it is newer than the
    plan's choice (Megatron-LM's choice), else ``plan.load_step`` from the plan's store. Returns (step, prediction
    targets, the trainer state resumed from) to continue from: (0, 0, None) for a fresh start or after --finetune."""
    ck, o = cfg.checkpoint, cfg.optim
    state = None
    if local is not None:
        state = _resume_local(cfg, plan, chunks, optimizer, scheduler, local)
    if state is None and plan.load_step is not None:
        _settle_verified_source(cfg, plan)
        if dist.get_rank() == 0 and not cfg.schedule.skip_train:
            set_aside(plan.source.passed_over)
        state = plan.source.directory_store().load(plan.load_step, Parts(chunks, optimizer, scheduler), plan.resume)
        _forget_left_timelines(cfg, plan)
    if state is None or ck.finetune:
        return 0, 0, None
    if ck.override_opt_param_scheduler:
        decoupled = (o.decoupled_lr, o.min_lr if o.decoupled_min_lr is None else o.decoupled_min_lr)
        for group in optimizer.param_groups:  # megatron-core >= 0.17 reads them per group
            peak, final = (o.lr, o.min_lr) if group.get("default_config", True) else decoupled
            group.update({k: v for k, v in (("max_lr", peak), ("min_lr", final)) if k in group})
        scheduler.step(increment=0)  # the LR of the next step from the overridden schedule
    return state["step"], state["tokens"], state


def _settle_verified_source(cfg: PretrainConfig, plan: RunPlan) -> None:
    """The ranks hash a share each of the chosen checkpoint's files. One that fails is refused when the user named
    it; otherwise it is passed over (kept on disk) for the next newest that verifies, re-planned as the first was
    (compatibility, what the load keeps), until one verifies or none is left (refused, exit 2)."""
    ck = cfg.checkpoint
    rank, world = dist.get_rank(), dist.get_world_size()
    while True:
        source = plan.source
        error = checkpoint.verify_checkpoint_share(source.target, rank, world) if ck.verify else None
        error = first_rank_error(error, runtime_device())
        if error is None:
            return
        message = checkpoint.corrupt_message(source.root, source.step, error)
        following = None if source.pinned else source.pass_over(error, rank == 0)
        if following is None:
            raise checkpoint.CorruptCheckpoint(message)
        schedule_before = plan.checkpoint_schedule
        plan.source, plan.load_step = following, following.step
        try:  # pure: the same refusals and resume scope for the older one
            check_resume_compatible(cfg, plan)
        except ValueError as e:
            raise checkpoint.CorruptCheckpoint(f"{message}; the next older checkpoint cannot be resumed: {e}") from None
        if _built_with(plan.checkpoint_schedule) != _built_with(schedule_before):  # the optimizer's groups differ
            raise checkpoint.CorruptCheckpoint(
                f"{message}; the newest older checkpoint that verifies, {following.target}, has another LR "
                f"schedule than the one this run was built for: resume from it with --ckpt-step {following.step}"
            )


def _forget_left_timelines(cfg: PretrainConfig, plan: RunPlan) -> None:
    """A resume the user pinned (--ckpt-step, --finetune) leaves the timeline of a newer global non-persistent
    checkpoint: it is forgotten (rank 0), as a local one is, so that no later resume takes up that timeline."""
    ck = cfg.checkpoint
    if not (ck.load_step is not None or ck.finetune) or dist.get_rank() != 0 or cfg.schedule.skip_train:
        return
    for store in directory_stores(ck):
        newest = store.newest_step() if store.kind == NON_PERSISTENT else None
        if newest is not None and newest > plan.load_step:
            logger.warning(
                "non-persistent checkpoint of step %d in %s forgotten: this run resumes from step %d (%s)",
                newest,
                store.root,
                plan.load_step,
                "--finetune" if ck.finetune else f"--ckpt-step {ck.load_step}",
            )
            store.forget()


def _built_with(schedule: dict | None) -> dict:
    """What :func:`build_optimizer` took from a checkpoint's schedule."""
    return {k: (schedule or {}).get(k) for k in ("max_lr", "min_lr", "decoupled_lr", "decoupled_min_lr")}


def _resume_local(cfg: PretrainConfig, plan: RunPlan, chunks, optimizer, scheduler, local) -> dict | None:
    """The newest local checkpoint, loaded, when it is newer than the plan's choice and the run resumes all of it (no
    --ckpt-step, --finetune, --no-load-optim, --no-load-rng); otherwise None, and the local ones are forgotten (a
    restart must not take up a timeline this run left)."""
    ck = cfg.checkpoint
    newest = local.newest_step()  # every rank: the steps every rank holds intact
    loaded = plan.load_step if plan.load_step is not None else 0
    resumes_all = not (ck.finetune or ck.no_load_optim or ck.no_load_rng)  # a local one resumes everything
    usable = newest is not None and ck.load_step is None and resumes_all and bool(ck.load)
    if usable and newest > loaded:
        if dist.get_rank() == 0:
            logger.info(
                "Loading from a non-persistent checkpoint (non-persistent iter %d): %s", newest, local.directory.parent
            )
        this_run = {
            "identity": plan.identity,
            "layout": checkpoint.layout_of(parallel_ranks()),
            **stream_identity(cfg, plan.global_batch, plan.max_steps),
        }
        state = local.load(newest, Parts(chunks, optimizer, scheduler), this_run=this_run)
        if state is not None:
            return state
    elif newest is not None and usable and dist.get_rank() == 0:
        logger.warning("non-persistent checkpoints are older than persistent checkpoint")  # Megatron-LM's line
    if newest is not None:
        local.forget()
    return None


def wandb_run_id(cfg: PretrainConfig, resumed: dict | None) -> str:
    """The W&B run of this training run: the checkpoint's on a resume (a requeued job continues
    it), a new one otherwise (also for --finetune, a new run)."""
    if not cfg.logging.wandb_project:
        return None
    if resumed and resumed.get("wandb_run_id"):
        return resumed["wandb_run_id"]
    return uuid.uuid4().hex[:8]
