"""The run plan: every decision taken before a process group exists, as pure functions of the
parsed flags and the checkpoint's metadata (testable without torch.distributed).

* :func:`plan_run` — tokenizer, model config, data-parallel size, global batch, token budget
  (``max_steps``), the load step, and the refusals of a resume that would not continue its run;
* :func:`stream_identity` — what fixes the sample stream (a resume must match it);
* the LR schedule, and Megatron-LM's rules for a checkpoint's against the flags: ``lr_schedule.py``;
* what a load restores on another layout (Adam's state, the scheduler, the RNG) is decided in
  :mod:`megatron_fixedcode.checkpoint.resume_scope`, which the checkpoint room applies.

A user error found here is a ``ValueError``: one line on rank 0 and exit code 2, no traceback per rank.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import types
from pathlib import Path

from megatron_fixedcode import checkpoint
from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.checkpoint.resume_scope import PER_PARAMETER, ResumeScope, resume_scope
from megatron_fixedcode.checkpoint.resume_source import ResumeSource, choose_resume_source, same_dir
from megatron_fixedcode.data.config import is_blend_weight
from megatron_fixedcode.tokenizers import checkpoint_tokenizer_files, tokenizer_from_args
from megatron_fixedcode.training.lr_schedule import reconcile_schedule, scheduler_settings
from megatron_fixedcode.training.runtime_checks import check_model_runtime, check_runtime
from megatron_fixedcode.utils.files import indexed_dataset_fingerprint

logger = logging.getLogger(__name__)


def resolve_data_paths(paths: list[str] | None) -> list[str] | None:
    """Prefixes as absolute, symlink-free paths (blend weights kept): the same files given as a
    relative or an absolute path compare equal."""
    if paths is None:
        return None
    return [p if is_blend_weight(p) else os.path.realpath(p) for p in paths]


def data_fingerprint(*blends: list[str] | None) -> str | None:
    """:func:`indexed_dataset_fingerprint` of every existing prefix of the blends (weights
    skipped; a missing shard is reported where the datasets are built)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefixes = [p for blend in blends for p in (blend or []) if not is_blend_weight(p) and IndexedDataset.exists(p)]
    return indexed_dataset_fingerprint(prefixes) if prefixes else None


def stream_identity(cfg: PretrainConfig, global_batch: int, max_steps: int) -> dict:
    """What fixes the sample stream; a resume must match it to continue exactly."""
    data = cfg.data
    ident = {
        "global_batch_size": global_batch,
        "seq_length": data.seq_length,
        "seed": cfg.schedule.seed,
        "dataset_type": data.dataset_type,
        "data_path": resolve_data_paths(data.data_path),
        "valid_data_path": resolve_data_paths(data.valid_data_path),
    }
    if data.mock:  # megatron's mock samples: fixed by the seed, the length and the vocabulary
        return {**ident, "mock_data": True, "num_train_samples": max_steps * global_batch}
    if data.dataset_type != "sft":  # the shards' content: a prefix re-indexed with another corpus is another stream
        ident["data_fingerprint"] = data_fingerprint(data.data_path, data.valid_data_path)
    if data.dataset_type == "document_windows":
        ident["samples_per_shard_visit"] = data.samples_per_shard_visit
    elif data.dataset_type == "sft":  # records are drawn per epoch: the stream does not depend on the run's length
        ident["sft_fields"] = [data.sft_fields.prompt, data.sft_fields.response, data.sft_fields.messages]
    else:  # megatron's GPT shuffle is sized by the total number of samples
        ident["num_train_samples"] = max_steps * global_batch
    return ident


# Fields of the model a checkpoint's weights are shaped by: a resume (or --finetune) must match them.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "block",
    "kv_channels",
    "rotary_percent",
    "rotary_interleaved",
    "add_bias_linear",
    "add_qkv_bias",
    "position_embedding_type",
    "max_position_embeddings",
    "share_embeddings_and_output_weights",
    "qk_layernorm",
    "squared_relu",
    "rope_scaling",
    "rope_scaling_factor",
)  # the input interface: its own check below


def planned_layout(cfg: PretrainConfig, dp_size: int) -> dict:
    """This run's layout as checkpoints record it (``trainer_state["layout"]``)."""
    layout = cfg.layout
    return {
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "tp_size": layout.tensor_model_parallel_size,
        "pp_size": layout.pipeline_model_parallel_size,
        "dp_size": dp_size,
    }


def data_parallel_size(layout) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model_parallel = (
        layout.tensor_model_parallel_size * layout.pipeline_model_parallel_size * layout.context_parallel_size
    )
    if world % model_parallel:
        raise ValueError(
            f"world size {world} is not divisible by tensor x pipeline x context parallel size = {model_parallel}"
        )
    return world // model_parallel


@dataclasses.dataclass
class RunPlan:
    """Everything decided before the process group exists: a user error found here is one line
    on rank 0 and exit code 2 (no traceback per rank)."""

    tokenizer: object
    model_cfg: object
    identity: dict
    dp_size: int
    global_batch: int
    max_steps: int
    load_step: int | None  # the verified checkpoint to resume from (None: start fresh)
    schedule: dict  # the LR schedule in force
    schedule_source: str
    checkpoint_schedule: dict | None = None  # the scheduler state being resumed (not with --finetune)
    resume: ResumeScope | None = None  # what the load of load_step keeps (checkpoint/resume_scope.py)
    stream_change: str | None = None  # a resume whose sample stream does not continue exactly: what changes
    source: ResumeSource | None = None  # where load_step lives (its store; the fallbacks when its hashes fail)

    @property
    def load_dir(self) -> str | None:
        return self.source.root if self.source else None


def plan_run(cfg: PretrainConfig, check_machine: bool = True) -> RunPlan:
    """``check_machine=False``: skip what depends on the machine (CUDA, TE), for a launcher's batch shell."""
    ck, data = cfg.checkpoint, cfg.data
    rank0 = int(os.environ.get("RANK", "0")) == 0
    source = resume_source(cfg, rank0) if ck.load else None  # the one decision of what a resume loads
    if check_machine:
        check_runtime(cfg)
    if ck.load and not (cfg.tokenizer.names_file() or cfg.tokenizer.vocab_size):
        take_checkpoint_tokenizer(cfg, source)
    # Without a tokenizer (pre-tokenized data, --vocab-size): EOD is taken as id 0 (megatron's
    # GPT index reads it; our datasets never mask on it).
    vocab_size = cfg.tokenizer.vocab_size
    tokenizer = (
        tokenizer_from_args(cfg.tokenizer)
        if cfg.tokenizer.names_file()
        else types.SimpleNamespace(vocab_size=vocab_size, eod=0, bos=None, pad=None, fingerprint=f"vocab{vocab_size}")
    )
    if data.dataset_type == "sft":  # a bad record is one line naming FILE:LINE, before any process group
        from megatron_fixedcode.data.sft import fit_to_window, load_sft_examples

        for flag, paths in (("--data-path", data.data_path), ("--valid-data-path", data.valid_data_path)):
            if paths:
                fit_to_window(load_sft_examples(paths, data.sft_fields, tokenizer), data.seq_length, flag)
    model_cfg = cfg.model_config(tokenizer.vocab_size)
    if check_machine:
        check_model_runtime(model_cfg)
    code = model_cfg.code_spec()
    identity = {
        "input_embedding": model_cfg.input_embedding,
        "code_fingerprint": code.fingerprint if code else "learned",
        "tokenizer_fingerprint": tokenizer.fingerprint,
    }
    dp_size = data_parallel_size(cfg.layout)
    global_batch = cfg.schedule.resolve_global_batch(dp_size)
    max_steps = cfg.schedule.max_steps(global_batch)
    schedule = scheduler_settings(cfg.optim, max_steps, global_batch)
    plan = RunPlan(
        tokenizer=tokenizer,
        model_cfg=model_cfg,
        identity=identity,
        dp_size=dp_size,
        global_batch=global_batch,
        max_steps=max_steps,
        load_step=None,
        schedule=schedule,
        schedule_source="command line",
    )
    if source is not None:
        plan.source, plan.load_step = source, source.step
    check_save_holds_no_other_run(cfg)
    if plan.load_step is not None:
        saved_model = check_resume_compatible(cfg, plan)
        # the function its MLP computed (training/gpu_features.settle_gelu_approximation keeps it)
        plan.model_cfg.gelu_approximation = saved_model.get("gelu_approximation", "none")
    return plan


def take_checkpoint_tokenizer(cfg: PretrainConfig, source: ResumeSource | None) -> None:
    """``--load`` and no tokenizer flag (nor --vocab-size): the checkpoint's own tokenizer, from the copy
    it carries (else the path it recorded), set on the flags, so that this run records and carries it too."""
    load = cfg.checkpoint.load
    step = None if source is None else source.step
    record = (checkpoint.read_trainer_state(source.root, step).get("tokenizer") or {}) if step is not None else {}
    model, merges = checkpoint_tokenizer_files(record, load, f"--load {load}")
    if model is None:
        what = "holds no checkpoint yet" if step is None else "names no tokenizer (trained on pre-tokenized ids)"
        raise ValueError(f"--load {load} {what}: give --tokenizer-model (or --vocab-size for pre-tokenized data)")
    kind = record.get("type") or "HuggingFaceTokenizer"
    files = (
        {"vocab_file": os.path.abspath(model), "merge_file": os.path.abspath(merges)}
        if kind == "GPT2BPETokenizer"
        else {"tokenizer_model": os.path.abspath(model)}
    )
    cfg.tokenizer = dataclasses.replace(cfg.tokenizer, tokenizer_type=kind, **files)
    if int(os.environ.get("RANK", "0")) == 0:
        logger.info("tokenizer: the checkpoint's own, %s (--load %s)", os.path.abspath(model), load)


def check_save_holds_no_other_run(cfg: PretrainConfig) -> None:
    """A --finetune starts another run at step 0: into a --save directory that holds checkpoints
    (the run it starts from, with --load X --save X, or any other) it would write among them and
    move ``latest`` back, leaving two runs in one directory. Refused, naming the way out."""
    ck = cfg.checkpoint
    if not (ck.finetune and ck.save and not cfg.schedule.skip_train):
        return
    try:
        latest = checkpoint.latest_step(ck.save)
    except ValueError:
        latest = None  # an unreadable marker: refused where the checkpoint is read
    if latest is None and not any(Path(ck.save).glob("iter_*")):
        return
    holds = f"checkpoints up to step {latest}" if latest is not None else "checkpoint directories (iter_*)"
    raise ValueError(
        f"--save {ck.save} holds {holds} of another run: a --finetune starts a new run at step 0 and "
        "would write among them (and move its latest marker back). Give --save a new directory; "
        f"to continue a fine-tune saved there, resume it without --finetune: --load {ck.save} --save {ck.save}"
    )


def resume_source(cfg: PretrainConfig, rank0: bool = True) -> ResumeSource | None:
    """The checkpoint to load (checkpoint/resume_source.py); None only for Megatron-LM's auto-resume convention
    ``--load X --save X`` with nothing in X yet."""
    ck = cfg.checkpoint
    # Presence and sizes here; the trainer's ranks hash a share of the files each once the process
    # group exists (checkpoint.verify_checkpoint_share), and pass over one that fails.
    source = choose_resume_source(ck, rank0, evaluation=cfg.schedule.skip_train)
    if source is not None:
        return source
    if ck.finetune:
        raise ValueError(f"--finetune: no complete checkpoint in --load {ck.load}")
    if same_dir(ck.load, ck.save):
        if int(os.environ.get("RANK", "0")) == 0:
            logger.info("--load %s holds no checkpoint yet: starting fresh (it is also --save)", ck.load)
        return None
    what = (
        "does not exist" if not Path(ck.load).exists() else f"holds no checkpoint ({checkpoint.LATEST_MARKER} missing)"
    )
    raise ValueError(
        f"--load {ck.load} {what}; to start fresh drop --load, or give the same directory as --save "
        "(resume when a checkpoint is there, start fresh otherwise)"
    )


def check_resume_compatible(cfg: PretrainConfig, plan: RunPlan) -> dict:
    """Refuse a resume that would not continue the checkpoint's run, naming what differs; the checkpoint's
    model config."""
    load, tok = plan.load_dir, cfg.tokenizer
    saved = checkpoint.read_trainer_state(load, plan.load_step)
    where = f"--load {checkpoint.checkpoint_dir(load, plan.load_step)}"
    now_model = dataclasses.asdict(plan.model_cfg)
    # a field a checkpoint does not record is older than the field: it was trained at the field's default
    defaults = {
        f.name: now_model[f.name] if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(plan.model_cfg)
    }
    for field in ARCHITECTURE_FIELDS:
        before = saved.get("model_config", {}).get(field, defaults[field])
        if before != now_model[field]:
            raise ValueError(
                f"{where}: checkpoint has {field}={before}, this run {field}={now_model[field]}; "
                f"refusing to load weights of another shape (--{field.replace('_', '-')})"
            )
    saved_padded = saved.get("model_config", {}).get("padded_vocab")
    if (saved_padded or plan.model_cfg.padded_vocab) and saved_padded != plan.model_cfg.padded_vocab:
        raise ValueError(
            f"{where}: checkpoint has --padded-vocab-size {saved_padded}, this run "
            f"{plan.model_cfg.padded_vocab}; refusing to load an output layer of another shape"
        )
    ident = saved["identity"]
    if (ident["input_embedding"], ident["code_fingerprint"]) != (
        plan.identity["input_embedding"],
        plan.identity["code_fingerprint"],
    ):
        raise ValueError(
            f"{where}: checkpoint was trained with input {ident['input_embedding']} "
            f"(code {ident['code_fingerprint']}) but this run uses {plan.identity['input_embedding']} "
            f"(code {plan.identity['code_fingerprint']}); refusing to resume with a different input interface"
        )
    ck = cfg.checkpoint
    try:  # what the load will keep: decided once, here; refused here, before any process group, when it cannot
        plan.resume = resume_scope(
            saved["layout"],
            planned_layout(cfg, plan.dp_size),
            finetune=ck.finetune,
            no_load_optim=ck.no_load_optim,
            no_load_rng=ck.no_load_rng,
            rng_by_model_parallel_rank=saved.get(checkpoint.RNG_BY_MODEL_PARALLEL_RANK, False),
            saved_optimizer_format=saved.get("optimizer_format", PER_PARAMETER),
            distributed_optimizer=cfg.optim.use_distributed_optimizer,
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if ck.finetune:  # weights only: a new stream (and tokenizer, schedule) may start at step 0
        return saved.get("model_config") or {}
    if "tokenizer_fingerprint" in ident and ident["tokenizer_fingerprint"] != plan.identity["tokenizer_fingerprint"]:
        rec = saved.get("tokenizer") or {}
        raise ValueError(
            f"{where}: checkpoint was trained with tokenizer {rec.get('model') or '(none, --vocab-size)'} "
            f"(fingerprint {ident['tokenizer_fingerprint']}), this run has {tok.tokenizer_model or tok.vocab_file or '(none, --vocab-size)'} "
            f"(fingerprint {plan.identity['tokenizer_fingerprint']}); refusing to resume with another tokenizer "
            "(to start from these weights with it, give --finetune)"
        )
    for key, now in stream_identity(cfg, plan.global_batch, plan.max_steps).items():
        before = saved.get(key)
        if key in ("data_path", "valid_data_path"):
            before = resolve_data_paths(before)  # checkpoints that recorded them as given
        if key == "data_fingerprint" and key not in saved:
            continue  # saved before the fingerprint was recorded
        if key == "data_fingerprint" and before != now:
            raise ValueError(
                f"{where}: the shards under --data-path / --valid-data-path are not the ones this "
                f"checkpoint trained on (data_fingerprint {before} when saved, {now} now: re-indexed "
                "with another corpus?); the data stream would not continue exactly"
            )
        if key == "num_train_samples" and before is not None and before != now:
            # A longer (or shorter) run: megatron's GPT shuffle is sized by the total, so from the
            # resumed step on the samples come from the shuffle of the new total (Megatron-LM does the same).
            ended = (
                f"the checkpoint at step {plan.load_step} is where its run ended; this run continues it past that "
                f"end, to step {plan.max_steps}: "
                if plan.load_step * plan.global_batch >= before
                else ""
            )
            plan.stream_change = (
                f"{ended}the run now has {now} train samples (the checkpoint's run had {before}): from step "
                f"{plan.load_step + 1} on, samples are drawn from megatron's GPT shuffle of {now} "
                "samples, not the checkpoint's; steps up to the checkpoint are unchanged"
            )
            continue
        if before != now:
            raise ValueError(
                f"{where}: checkpoint has {key}={before}, this run {key}={now}; "
                "the data stream would not continue exactly"
            )
    if plan.resume.scheduler:  # --no-load-optim: the scheduler starts fresh too (Megatron-LM)
        saved_schedule = checkpoint.read_common_state(load, plan.load_step).get("opt_param_scheduler")
        if saved_schedule:  # a checkpoint from before --decoupled-lr was accepted had none
            plan.checkpoint_schedule = {"decoupled_lr": None, "decoupled_min_lr": None, **saved_schedule}
            plan.schedule, plan.schedule_source = reconcile_schedule(
                cfg.checkpoint, plan.schedule, plan.checkpoint_schedule
            )
    return saved.get("model_config") or {}
