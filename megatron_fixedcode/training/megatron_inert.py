"""Megatron-LM flags (``arguments.py`` at core_v0.16.1) accepted here with Megatron's spelling, dest
and default, but with no effect: logging, timing, checkpoint-I/O and communication tuning, and
knobs of features built differently here. A startup line names those a run sets away from Megatron's
default (:func:`inert_in_use`), each with the reason of :data:`INERT`; ``-h`` shows the same reason.

:data:`DEFAULT_ONLY` are flags accepted at Megatron's default value only: any other value is refused in
one line naming what is built here instead.
"""
from __future__ import annotations

import argparse

# dest -> why it has no effect here (logged once at startup when set away from Megatron's default).
INERT = {
    "deprecated_use_mcore_models": "megatron-core models are the only ones",
    "attention_backend": "TE layers pick their fused attention; local layers use megatron's unfused attention",
    "calculate_per_token_loss": "the loss is always the mean over the global batch's prediction targets",
    "cross_entropy_loss_fusion": "the output layer's cross entropy is megatron-core's unfused one",
    "cross_entropy_fusion_impl": "the output layer's cross entropy is megatron-core's unfused one",
    "log_throughput": "the log line always carries throughput (tokens/s, TFLOP/s, MFU)",
    "distributed_timeout_minutes": "the process group uses torch's default timeout",
    "num_workers": "batches are read in the training process (megatron's indexed datasets, mmap)",
    "create_attention_mask_in_dataloader": "causal attention needs no mask from the data here",
    "grad_reduce_in_bf16": "gradients are reduced in FP32",
    "accumulate_allreduce_grads_in_fp32": "gradients are accumulated and reduced in FP32 already",
    "profile": "no built-in profiler; wrap the run in nsys or torch.profiler",
    "profile_step_start": "no built-in profiler", "profile_step_end": "no built-in profiler",
    "use_pytorch_profiler": "no built-in profiler; wrap the run in nsys or torch.profiler",
    "log_timers_to_tensorboard": "no timers", "log_memory_to_tensorboard": "memory is in the log line",
    "log_validation_ppl_to_tensorboard": "validation PPL is always written ('lm loss validation ppl')",
    "wandb_save_dir": "W&B writes to its default directory", "wandb_entity": "W&B's default entity",
    "no_persist_layer_norm": "no persistent layer norm kernel here",
    "use_cpu_initialization": "parameters are initialized on the device they train on",
    "log_params_norm": "no parameter norm in the log line", "log_num_zeros_in_grad": "no zero count in the log line",
    "timing_log_level": "no timers", "timing_log_option": "no timers",
    "log_progress": "no progress.txt", "straggler_minmax_count": "no straggler detector",
    "log_world_size_to_tensorboard": "the world size is in the startup lines",
    "distributed_backend": "NCCL where torch sees a GPU, gloo on CPU (chosen by the device)",
    "deterministic_mode": "no deterministic-algorithm switch (the CPU runs are bitwise repeatable)",
    "attention_softmax_in_fp32": "the softmax runs as megatron-core's layers run it (FP32 in local attention)",
    "apply_query_key_layer_scaling": "acts under FP16 only, which is refused here",
    "dist_ckpt_strictness": "checkpoints load strictly, checked against their recorded checksums",
    "rerun_mode": "no rerun state machine", "test_mode": "Megatron-LM's own test switch",
    "ckpt_fully_parallel_load": "dist_checkpointing's default load strategy",
    "ckpt_fully_parallel_save": "dist_checkpointing's default save strategy",
    "ckpt_fully_parallel_save_deprecated": "deprecated in Megatron-LM too",
    "ckpt_assume_constant_structure": "dist_checkpointing's default save strategy",
    "use_persistent_ckpt_worker": "saves are synchronous", "auto_detect_ckpt_format": "torch_dist only",
    "use_tokenizer_model_from_checkpoint_args": "the tokenizer is the one --tokenizer-model names",
    "async_tensor_model_parallel_allreduce": "deprecated in Megatron-LM too",
    "check_weight_hash_across_dp_replicas_interval": "no weight-hash check",
    "enable_gloo_process_groups": "megatron-core's default process groups",
    "overlap_p2p_comm": "megatron-core's default pipeline schedule",
    "overlap_p2p_comm_warmup_flush": "megatron-core's default pipeline schedule",
    "overlap_param_gather_with_optimizer_step": "the parameter all-gather overlaps the next forward",
    "microbatch_group_size_per_vp_stage": "megatron-core's default interleaved schedule",
    "ddp_average_in_collective": "megatron's DDP scales gradients before the reduction",
    "defer_embedding_wgrad_compute": "no deferred embedding wgrad", "wgrad_deferral_limit": "no deferred embedding wgrad",
    "num_distributed_optimizer_instances": "one distributed-optimizer instance",
    "add_position_embedding": "positions are RoPE here: there is no position table to leave out",
    "trust_remote_code": "tokenizers load from local files", "legacy_tokenizer": "this project's tokenizers",
    "tp_comm_overlap_cfg": "TE userbuffers use their default configuration",
    "use_tp_pp_dp_mapping": "megatron-core's default rank order", "use_flash_attn": "deprecated in Megatron-LM too",
    "num_dataset_builder_threads": "datasets are built in one thread",
}

# (option strings, dest, argparse kwargs): store_true / store_false flags give their kind as "true" / "false".
_FLAGS = (
    (("--use-mcore-models",), "deprecated_use_mcore_models", "true"),
    (("--calculate-per-token-loss",), "calculate_per_token_loss", "true"),
    (("--cross-entropy-loss-fusion",), "cross_entropy_loss_fusion", "true"),
    (("--cross-entropy-fusion-impl",), "cross_entropy_fusion_impl", {"choices": ["native", "te"], "default": "native"}),
    (("--log-throughput",), "log_throughput", "true"),
    (("--grad-reduce-in-bf16",), "grad_reduce_in_bf16", "true"),
    (("--accumulate-allreduce-grads-in-fp32",), "accumulate_allreduce_grads_in_fp32", "true"),
    (("--profile",), "profile", "true"), (("--use-pytorch-profiler",), "use_pytorch_profiler", "true"),
    (("--profile-step-start",), "profile_step_start", {"type": int, "default": 10}),
    (("--profile-step-end",), "profile_step_end", {"type": int, "default": 12}),
    (("--log-timers-to-tensorboard",), "log_timers_to_tensorboard", "true"),
    (("--log-memory-to-tensorboard",), "log_memory_to_tensorboard", "true"),
    (("--log-validation-ppl-to-tensorboard",), "log_validation_ppl_to_tensorboard", "true"),
    (("--log-world-size-to-tensorboard",), "log_world_size_to_tensorboard", "true"),
    (("--log-params-norm",), "log_params_norm", "true"), (("--log-num-zeros-in-grad",), "log_num_zeros_in_grad", "true"),
    (("--timing-log-level",), "timing_log_level", {"type": int, "choices": (0, 1, 2), "default": 0}),
    (("--timing-log-option",), "timing_log_option", {"choices": ("max", "minmax", "all"), "default": "minmax"}),
    (("--log-progress",), "log_progress", "true"),
    (("--straggler-minmax-count",), "straggler_minmax_count", {"type": int, "default": 1}),
    (("--no-persist-layer-norm",), "no_persist_layer_norm", "true"),
    (("--use-cpu-initialization",), "use_cpu_initialization", {"action": "store_true", "default": None}),
    (("--no-create-attention-mask-in-dataloader",), "create_attention_mask_in_dataloader", "false"),
    (("--distributed-timeout-minutes",), "distributed_timeout_minutes", {"type": int, "default": 10}),
    (("--distributed-backend",), "distributed_backend", {"choices": ["nccl", "gloo"], "default": "nccl"}),
    (("--num-workers",), "num_workers", {"type": int, "default": 2}),
    (("--num-dataset-builder-threads",), "num_dataset_builder_threads", {"type": int, "default": 1}),
    (("--wandb-save-dir",), "wandb_save_dir", {"default": None}),
    (("--wandb-entity",), "wandb_entity", {"default": None}),
    (("--deterministic-mode",), "deterministic_mode", "true"),
    (("--attention-softmax-in-fp32",), "attention_softmax_in_fp32", "true"),
    (("--apply-query-key-layer-scaling",), "apply_query_key_layer_scaling", "true"),
    (("--dist-ckpt-strictness",), "dist_ckpt_strictness", {"default": "assume_ok_unexpected", "choices": (
        "assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all", "return_unexpected",
        "return_all", "ignore_all")}),
    (("--rerun-mode",), "rerun_mode", {"choices": ("disabled", "validate_results", "report_stats"),
                                       "default": "validate_results"}),
    (("--test-mode",), "test_mode", "true"),
    (("--ckpt-fully-parallel-load",), "ckpt_fully_parallel_load", "true"),
    (("--no-ckpt-fully-parallel-save", "--disable-ckpt-fully-parallel-save"), "ckpt_fully_parallel_save", "false"),
    (("--ckpt-fully-parallel-save",), "ckpt_fully_parallel_save_deprecated", "true"),
    (("--ckpt-assume-constant-structure",), "ckpt_assume_constant_structure", "true"),
    (("--use-persistent-ckpt-worker",), "use_persistent_ckpt_worker", "true"),
    (("--auto-detect-ckpt-format",), "auto_detect_ckpt_format", "true"),
    (("--no-use-tokenizer-model-from-checkpoint-args", "--disable-use-tokenizer-model-from-checkpoint-args"),
     "use_tokenizer_model_from_checkpoint_args", "false"),
    (("--no-async-tensor-model-parallel-allreduce", "--disable-async-tensor-model-parallel-allreduce"),
     "async_tensor_model_parallel_allreduce", "false"),
    (("--check-weight-hash-across-dp-replicas-interval",), "check_weight_hash_across_dp_replicas_interval",
     {"type": int, "default": None}),
    (("--disable-gloo-process-groups",), "enable_gloo_process_groups", "false"),
    (("--no-overlap-p2p-communication",), "overlap_p2p_comm", "false"),
    (("--overlap-p2p-communication-warmup-flush",), "overlap_p2p_comm_warmup_flush", "true"),
    (("--overlap-param-gather-with-optimizer-step",), "overlap_param_gather_with_optimizer_step", "true"),
    (("--microbatch-group-size-per-virtual-pipeline-stage",), "microbatch_group_size_per_vp_stage",
     {"type": int, "default": None}),
    (("--ddp-average-in-collective",), "ddp_average_in_collective", "true"),
    (("--defer-embedding-wgrad-compute",), "defer_embedding_wgrad_compute", "true"),
    (("--wgrad-deferral-limit",), "wgrad_deferral_limit", {"type": int, "default": 0}),
    (("--num-distributed-optimizer-instances",), "num_distributed_optimizer_instances", {"type": int, "default": 1}),
    (("--no-position-embedding",), "add_position_embedding", "false"),
    (("--trust-remote-code",), "trust_remote_code", "true"),
    (("--legacy-tokenizer",), "legacy_tokenizer", "true"),
    (("--tp-comm-overlap-cfg",), "tp_comm_overlap_cfg", {"default": None}),
    (("--use-tp-pp-dp-mapping",), "use_tp_pp_dp_mapping", "true"),
    (("--use-flash-attn",), "use_flash_attn", "true"),
)

# dest -> (flag, Megatron's default, argparse kwargs, what is built here instead of another value)
DEFAULT_ONLY = {
    "optimizer": ("--optimizer", "adam", {"choices": ["adam", "sgd", "muon", "dist_muon"]}, "AdamW only"),
    "cp_comm_type": ("--cp-comm-type", ["p2p"], {"nargs": "+"}, "context parallelism communicates p2p (ring) only"),
    "dataloader_type": ("--dataloader-type", None, {"choices": ["single", "cyclic", "external"]},
                        "the sampler is Megatron's 'single' (step n reads global samples [n*G, (n+1)*G))"),
    "padded_vocab_size": ("--padded-vocab-size", None, {"type": int},
                          "the output layer is padded by --make-vocab-size-divisible-by"),
    "ckpt_format": ("--ckpt-format", "torch_dist", {"choices": ["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"]},
                    "checkpoints are megatron-core's dist_checkpointing (torch_dist)"),
}


def add_inert_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("accepted with no effect here (a startup line names the ones set)")
    for flags, dest, kind in _FLAGS:
        kwargs = ({"action": "store_true"} if kind == "true" else {"action": "store_false"} if kind == "false"
                  else dict(kind))
        g.add_argument(*flags, dest=dest, help="accepted; " + INERT[dest], **kwargs)
    g = p.add_argument_group("accepted at Megatron-LM's default only")
    for dest, (flag, default, kwargs, why) in DEFAULT_ONLY.items():
        g.add_argument(flag, dest=dest, default=default, help=f"only {default!r}: {why}", **kwargs)


def refused_value(flag: str, values: list[str]) -> str | None:
    """Why ``flag values`` (as typed) is refused, for a :data:`DEFAULT_ONLY` flag given another value."""
    for dest, (name, default, kwargs, why) in DEFAULT_ONLY.items():
        if name == flag:
            given = values if kwargs.get("nargs") else (values[0] if values else None)
            converted = [kwargs.get("type", str)(v) for v in given] if isinstance(given, list) else \
                (kwargs.get("type", str)(given) if given is not None else None)
            if converted != default and not (dest == "dataloader_type" and converted == "single"):
                return why
    return None


def default_only_error(a: argparse.Namespace) -> str | None:
    """One line for a :data:`DEFAULT_ONLY` flag given another value than Megatron's default."""
    for dest, (flag, default, _, why) in DEFAULT_ONLY.items():
        value = getattr(a, dest)
        if value != default and not (dest == "dataloader_type" and value == "single"):
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            return f"{flag} {shown}: {why}"
    return None


def inert_in_use(a: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The inert flags this run set away from Megatron's default, as 'flag (why)'."""
    out = []
    for action in parser._actions:
        if action.dest in INERT and getattr(a, action.dest) != action.default:
            out.append(f"{action.option_strings[0]} ({INERT[action.dest]})")
    return sorted(set(out))
