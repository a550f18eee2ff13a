"""Megatron-LM flags (``arguments.py`` at core_v0.16.1) accepted here with Megatron's spelling, dest
and default but no effect of their own: :data:`INERT_FLAGS`, one :class:`Flag` row per flag (logging, timing,
checkpoint-I/O and communication tuning, and knobs of features built differently here), whose ``why`` says
why it has no effect. A startup line names those a run sets away from Megatron's default
(:func:`inert_in_use`); ``-h`` shows the same reason. Flags accepted at Megatron's default value only are
``default_only_flags.py``, in rows of the same kind.
"""

from __future__ import annotations

import argparse
import os
from typing import NamedTuple


class Flag(NamedTuple):
    """One Megatron-LM flag: its option strings, dest, argparse spec ("true"/"false" for store_true /
    store_false, else keyword arguments with Megatron's default) and why it does not act here."""

    options: tuple[str, ...]
    dest: str
    spec: str | dict
    why: str


# A table: one row per flag, as in docs/flags.md, not one argument per line.
# fmt: off
INERT_FLAGS = (
    Flag(("--attention-backend",), "attention_backend",
         {"choices": ["flash", "fused", "unfused", "local", "auto"], "default": "auto"},
         "TE layers pick their fused attention; local layers use megatron's unfused attention"),
    Flag(("--use-mcore-models",), "deprecated_use_mcore_models", "true", "megatron-core models are the only ones"),
    Flag(("--calculate-per-token-loss",), "calculate_per_token_loss", "true",
         "the loss is always the mean over the global batch's prediction targets"),
    Flag(("--cross-entropy-loss-fusion",), "cross_entropy_loss_fusion", "true",
         "the output layer's cross entropy is megatron-core's unfused one"),
    Flag(("--cross-entropy-fusion-impl",), "cross_entropy_fusion_impl",
         {"choices": ["native", "te"], "default": "native"},
         "the output layer's cross entropy is megatron-core's unfused one"),
    Flag(("--log-throughput",), "log_throughput", "true",
         "the log line always carries throughput (tokens/s, TFLOP/s, MFU)"),
    Flag(("--grad-reduce-in-bf16",), "grad_reduce_in_bf16", "true", "gradients are reduced in FP32"),
    Flag(("--accumulate-allreduce-grads-in-fp32",), "accumulate_allreduce_grads_in_fp32", "true",
         "gradients are accumulated and reduced in FP32 already"),
    Flag(("--log-validation-ppl-to-tensorboard",), "log_validation_ppl_to_tensorboard", "true",
         "validation PPL is always written ('lm loss validation ppl')"),
    Flag(("--log-world-size-to-tensorboard",), "log_world_size_to_tensorboard", "true",
         "the world size is in the startup lines"),
    Flag(("--no-persist-layer-norm",), "no_persist_layer_norm", "true", "no persistent layer norm kernel here"),
    Flag(("--use-cpu-initialization",), "use_cpu_initialization", {"action": "store_true", "default": None},
         "parameters are initialized on the device they train on"),
    Flag(("--no-create-attention-mask-in-dataloader",), "create_attention_mask_in_dataloader", "false",
         "causal attention needs no mask from the data here"),
    Flag(("--distributed-backend",), "distributed_backend", {"choices": ["nccl", "gloo"], "default": "nccl"},
         "NCCL where torch sees a GPU, gloo on CPU (chosen by the device)"),
    Flag(("--num-dataset-builder-threads",), "num_dataset_builder_threads", {"type": int, "default": 1},
         "datasets are built in one thread"),
    Flag(("--wandb-save-dir",), "wandb_save_dir", {"default": None}, "W&B writes to its default directory"),
    Flag(("--wandb-entity",), "wandb_entity", {"default": None}, "W&B's default entity"),
    Flag(("--deterministic-mode",), "deterministic_mode", "true",
         "no deterministic-algorithm switch (the CPU runs are bitwise repeatable)"),
    Flag(("--attention-softmax-in-fp32",), "attention_softmax_in_fp32", "true",
         "the softmax runs as megatron-core's layers run it (FP32 in local attention)"),
    Flag(("--apply-query-key-layer-scaling",), "apply_query_key_layer_scaling", "true",
         "acts under FP16 only, which is refused here"),
    Flag(("--dist-ckpt-strictness",), "dist_ckpt_strictness",
         {"default": "assume_ok_unexpected", "choices": ("assume_ok_unexpected", "log_unexpected", "log_all",
         "raise_unexpected", "raise_all", "return_unexpected", "return_all", "ignore_all")},
         "checkpoints load strictly, checked against their recorded checksums"),
    Flag(("--test-mode",), "test_mode", "true", "Megatron-LM's own test switch"),
    Flag(("--ckpt-fully-parallel-load",), "ckpt_fully_parallel_load", "true",
         "dist_checkpointing's default load strategy"),
    Flag(("--no-ckpt-fully-parallel-save", "--disable-ckpt-fully-parallel-save"), "ckpt_fully_parallel_save", "false",
         "dist_checkpointing's default save strategy"),
    Flag(("--ckpt-fully-parallel-save",), "ckpt_fully_parallel_save_deprecated", "true",
         "deprecated in Megatron-LM too"),
    Flag(("--ckpt-assume-constant-structure",), "ckpt_assume_constant_structure", "true",
         "dist_checkpointing's default save strategy"),
    Flag(("--auto-detect-ckpt-format",), "auto_detect_ckpt_format", "true", "torch_dist only"),
    Flag(("--no-use-tokenizer-model-from-checkpoint-args", "--disable-use-tokenizer-model-from-checkpoint-args"),
         "use_tokenizer_model_from_checkpoint_args", "false",
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--no-async-tensor-model-parallel-allreduce", "--disable-async-tensor-model-parallel-allreduce"),
         "async_tensor_model_parallel_allreduce", "false",
         "deprecated in Megatron-LM too"),
    Flag(("--disable-gloo-process-groups",), "enable_gloo_process_groups", "false",
         "megatron-core's default process groups"),
    Flag(("--no-overlap-p2p-communication",), "overlap_p2p_comm", "false", "megatron-core's default pipeline schedule"),
    Flag(("--overlap-p2p-communication-warmup-flush",), "overlap_p2p_comm_warmup_flush", "true",
         "megatron-core's default pipeline schedule"),
    Flag(("--overlap-param-gather-with-optimizer-step",), "overlap_param_gather_with_optimizer_step", "true",
         "the parameter all-gather overlaps the next forward"),
    Flag(("--microbatch-group-size-per-virtual-pipeline-stage",), "microbatch_group_size_per_vp_stage",
         {"type": int, "default": None},
         "megatron-core's default interleaved schedule"),
    Flag(("--ddp-average-in-collective",), "ddp_average_in_collective", "true",
         "megatron's DDP scales gradients before the reduction"),
    Flag(("--defer-embedding-wgrad-compute",), "defer_embedding_wgrad_compute", "true", "no deferred embedding wgrad"),
    Flag(("--wgrad-deferral-limit",), "wgrad_deferral_limit", {"type": int, "default": 0},
         "no deferred embedding wgrad"),
    Flag(("--num-distributed-optimizer-instances",), "num_distributed_optimizer_instances", {"type": int, "default": 1},
         "one distributed-optimizer instance"),
    Flag(("--no-position-embedding",), "add_position_embedding", "false",
         "deprecated: no effect with RoPE, refused otherwise (as in Megatron-LM)"),
    Flag(("--trust-remote-code",), "trust_remote_code", "true", "tokenizers load from local files"),
    Flag(("--legacy-tokenizer",), "legacy_tokenizer", "true", "this project's tokenizers"),
    Flag(("--tp-comm-overlap-cfg",), "tp_comm_overlap_cfg", {"default": None},
         "TE userbuffers use their default configuration"),
    Flag(("--use-tp-pp-dp-mapping",), "use_tp_pp_dp_mapping", "true", "megatron-core's default rank order"),
    Flag(("--use-flash-attn",), "use_flash_attn", "true", "deprecated in Megatron-LM too"),
    Flag(("--pipeline-model-parallel-comm-backend",), "pipeline_model_parallel_comm_backend",
         {"choices": ["nccl", "ucc"], "default": None},
         "megatron-core's default pipeline communication"),
    Flag(("--no-tp-comm-bulk-wgrad", "--disable-tp-comm-bulk-wgrad"), "tp_comm_bulk_wgrad", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-dgrad"), "tp_comm_bulk_dgrad", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--no-tp-comm-overlap-ag", "--disable-tp-comm-overlap-ag"), "tp_comm_overlap_ag", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--no-tp-comm-overlap-rs", "--disable-tp-comm-overlap-rs"), "tp_comm_overlap_rs", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--tp-comm-overlap-rs-dgrad",), "tp_comm_overlap_rs_dgrad", "true",
         "TE userbuffers use their default configuration"),
    Flag(("--no-tp-comm-split-ag", "--disable-tp-comm-split-ag"), "tp_comm_split_ag", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--no-tp-comm-split-rs", "--disable-tp-comm-split-rs"), "tp_comm_split_rs", "false",
         "TE userbuffers use their default configuration"),
    Flag(("--tp-comm-bootstrap-backend",), "tp_comm_bootstrap_backend",
         {"choices": ["nccl", "mpi", "gloo"], "default": "nccl"},
         "TE userbuffers use their default configuration"),
    Flag(("--delay-wgrad-compute",), "delay_wgrad_compute", "true", "no delayed weight-gradient compute"),
    Flag(("--use-ring-exchange-p2p",), "use_ring_exchange_p2p", "true",
         "megatron-core's default pipeline communication"),
    Flag(("--init-model-with-meta-device",), "init_model_with_meta_device", "true",
         "parameters are initialized on the device they train on"),
    Flag(("--disable-bf16-reduced-precision-matmul",), "disable_bf16_reduced_precision_matmul", "true",
         "torch's default matmul precision"),
    Flag(("--no-clone-scatter-output-in-embedding", "--disable-clone-scatter-output-in-embedding"),
         "clone_scatter_output_in_embedding", "false",
         "megatron-core's default embedding"),
    Flag(("--config-logger-dir",), "config_logger_dir", {"default": ""}, "no config logger"),
    Flag(("--use-te-activation-func",), "use_te_activation_func", "true", "the activation is megatron-core's"),
    Flag(("--symmetric-ar-type",), "symmetric_ar_type",
         {"choices": ["two_shot", "one_shot", "multimem_all_reduce"], "default": None},
         "megatron-core's default all-reduce"),
    Flag(("--onnx-safe",), "onnx_safe", {"type": bool, "default": None}, "no ONNX export"),
    Flag(("--apply-wd-to-qk-layernorm",), "apply_wd_to_qk_layernorm", "true",
         "no weight decay on norms, QK layer norm included"),
    Flag(("--train-sync-interval",), "train_sync_interval", {"type": int, "default": None}, "no CPU-GPU sync tuning"),
    Flag(("--exit-signal-handler-for-dataloader",), "exit_signal_handler_for_dataloader", "true",
         "batches are read in the training process"),
    Flag(("--no-manual-gc-eval", "--disable-manual-gc-eval"), "manual_gc_eval", "false",
         "--manual-gc collects at its interval only"),
    Flag(("--dump-param-to-param-group-map",), "dump_param_to_param_group_map", {"default": None},
         "no parameter-group dump"),
    Flag(("--no-pin-cpu-grads",), "pin_cpu_grads", "false", "no optimizer CPU offload"),
    Flag(("--no-pin-cpu-params",), "pin_cpu_params", "false", "no optimizer CPU offload"),
    Flag(("--high-priority-stream-groups",), "high_priority_stream_groups", {"nargs": "*", "default": []},
         "megatron-core's default streams"),
    Flag(("--disable-jit-fuser",), "disable_jit_fuser", "true", "torch's default fusers"),
    Flag(("--te-rng-tracker",), "te_rng_tracker", "true", "megatron's CUDA RNG tracker"),
    Flag(("--lr-wsd-decay-style",), "lr_wsd_decay_style",
         {"choices": ["exponential", "linear", "cosine", "minus_sqrt"], "default": "exponential"},
         "--lr-decay-style WSD is refused"),
    Flag(("--lr-wsd-decay-iters",), "lr_wsd_decay_iters", {"type": int, "default": None},
         "--lr-decay-style WSD is refused"),
    Flag(("--lr-wsd-decay-samples",), "lr_wsd_decay_samples", {"type": int, "default": None},
         "--lr-decay-style WSD is refused"),
    Flag(("--exit-on-missing-checkpoint",), "exit_on_missing_checkpoint", "true",
         "a missing --load is refused already"),
    Flag(("--dist-ckpt-save-pre-mcore-014",), "dist_ckpt_save_pre_mcore_014", "true",
         "dist_checkpointing's current format"),
    Flag(("--distrib-optim-fully-reshardable-mem-efficient",), "distrib_optim_fully_reshardable_mem_efficient", "true",
         "dist_checkpointing's default save strategy"),
    Flag(("--use-dist-ckpt",), "use_dist_ckpt_deprecated", "true",
         "deprecated in Megatron-LM too: --ckpt-format sets it"),
    Flag(("--dist-ckpt-format",), "dist_ckpt_format_deprecated", {"default": None}, "deprecated in Megatron-LM too"),
    Flag(("--reuse-grad-buf-for-mxfp8-param-ag",), "reuse_grad_buf_for_mxfp8_param_ag", "true",
         "megatron's default MXFP8 buffers"),
    Flag(("--distributed-timeout-seconds-after-init",), "distributed_timeout_seconds_after_init",
         {"type": int, "default": None},
         "the process groups keep --distributed-timeout-minutes after start-up"),
    Flag(("--no-align-grad-reduce",), "align_grad_reduce", "false", "megatron's DDP default"),
    Flag(("--ddp-num-buckets",), "ddp_num_buckets", {"type": int, "default": None}, "megatron's DDP default buckets"),
    Flag(("--ddp-bucket-size",), "ddp_bucket_size", {"type": int, "default": None}, "megatron's DDP default buckets"),
    Flag(("--ddp-pad-buckets-for-high-nccl-busbw",), "ddp_pad_buckets_for_high_nccl_busbw", "true",
         "megatron's DDP default buckets"),
    Flag(("--ddp-reduce-scatter-with-fp32-accumulation",), "ddp_reduce_scatter_with_fp32_accumulation", "true",
         "gradients are reduced in FP32 already"),
    Flag(("--no-align-param-gather",), "align_param_gather", "false", "megatron's DDP default"),
    Flag(("--no-scatter-gather-tensors-in-pipeline",), "scatter_gather_tensors_in_pipeline", "false",
         "megatron-core's default pipeline communication"),
    Flag(("--local-rank",), "local_rank", {"type": int, "default": "LOCAL_RANK"},
         "torchrun's LOCAL_RANK is read from the environment"),
    Flag(("--lazy-mpu-init",), "lazy_mpu_init", {"type": bool, "default": None},
         "the process groups are built at start-up"),
    Flag(("--use-nccl-ub",), "nccl_ub", "true", "megatron's DDP default buffers"),
    Flag(("--disable-symmetric-registration",), "disable_symmetric_registration", "true",
         "megatron's DDP default buffers"),
    Flag(("--use-sharp",), "use_sharp", "true", "NCCL's default collectives"),
    Flag(("--sharp-enabled-group",), "sharp_enabled_group", {"choices": ["dp", "dp_replica"], "default": None},
         "NCCL's default collectives"),
    Flag(("--create-all-gather-group",), "create_all_gather_group", "true", "megatron's DDP default"),
    Flag(("--no-gradient-reduce-div-fusion",), "gradient_reduce_div_fusion", "false", "megatron's DDP default"),
    Flag(("--keep-fp8-transpose-cache",), "keep_fp8_transpose_cache", "true", "TE's default FP8 caches"),
    Flag(("--nccl-communicator-config-path",), "nccl_communicator_config_path", {"default": None},
         "NCCL's default communicators"),
    Flag(("--dataloader-fast-cache-load",), "dataloader_fast_cache_load", "true", "megatron's default dataset cache"),
    Flag(("--dataloader-defer-npy-index-mmap",), "dataloader_defer_npy_index_mmap", "true",
         "megatron's default dataset cache"),
    Flag(("--object-storage-cache-path",), "object_storage_cache_path", {"default": None},
         "data are read from local files"),
    Flag(("--allow-ambiguous-pad-tokens",), "allow_ambiguous_pad_tokens", "true",
         "no pad tokens in pretraining samples"),
    Flag(("--tokenizer-metadata",), "tokenizer_metadata", {"default": None},
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--tokenizer-special-tokens",), "tokenizer_special_tokens", {"nargs": "+", "default": None},
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--tokenizer-sentencepiece-legacy",), "tokenizer_sentencepiece_legacy", "true",
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--tokenizer-hf-use-fast",), "tokenizer_hf_use_fast", "true",
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--tokenizer-hf-include-special-tokens",), "tokenizer_hf_include_special_tokens", "true",
         "the tokenizer is the one --tokenizer-model names"),
    Flag(("--adlr-autoresume",), "adlr_autoresume", "true", "no ADLR autoresume"),
    Flag(("--adlr-autoresume-interval",), "adlr_autoresume_interval", {"type": int, "default": 1000},
         "no ADLR autoresume"),
    Flag(("--tensorboard-queue-size",), "tensorboard_queue_size", {"type": int, "default": 1000},
         "TensorBoard's default queue"),
    Flag(("--no-log-loss-scale-to-tensorboard", "--disable-log-loss-scale-to-tensorboard"),
         "log_loss_scale_to_tensorboard", "false",
         "the loss scale is 1 (no FP16)"),
    Flag(("--log-memory-interval",), "log_memory_interval", {"type": int, "default": None},
         "memory is in the log line"),
    Flag(("--log-device-memory-used",), "log_device_memory_used", "true", "memory is in the log line"),
    Flag(("--log-max-attention-logit",), "log_max_attention_logit", "true", "no attention-logit logging"),
    Flag(("--no-barrier-with-level-1-timing",), "barrier_with_L1_time", "false", "no timers"),
    Flag(("--logging-level",), "logging_level", {"type": int, "default": None}, "the trainer's log level"),
    Flag(("--log-energy",), "log_energy", "true", "no energy monitor"),
    Flag(("--run-workload-inspector-server",), "run_workload_inspector_server", "true", "no workload inspector"),
    Flag(("--no-one-logger",), "enable_one_logger", "false", "no one-logger"),
    Flag(("--one-logger-project",), "one_logger_project", {"default": "megatron-lm"}, "no one-logger"),
    Flag(("--one-logger-run-name",), "one_logger_run_name", {"default": None}, "no one-logger"),
    Flag(("--one-logger-async",), "one_logger_async", "true", "no one-logger"),
    Flag(("--app-tag-run-name",), "app_tag_run_name", {"default": None}, "no one-logger"),
    Flag(("--app-tag-run-version",), "app_tag_run_version", {"default": "0.0.0"}, "no one-logger"),
    Flag(("--disable-msc",), "enable_msc", "false", "data are read from local files"),
)
# fmt: on
INERT = {flag.dest: flag.why for flag in INERT_FLAGS}  # dest -> why it has no effect here


def argparse_kwargs(spec) -> dict:
    if spec in ("true", "false"):
        return {"action": f"store_{spec}"}
    kwargs = dict(spec)
    if kwargs.get("default") == "LOCAL_RANK":  # Megatron-LM's default is the launcher's LOCAL_RANK
        kwargs["default"] = int(os.environ.get("LOCAL_RANK", "0"))
    return kwargs


def megatron_default(spec):
    """Megatron-LM's default of a flag whose :class:`Flag` spec is ``spec``."""
    return {"true": False, "false": True}[spec] if spec in ("true", "false") else spec.get("default")


def add_inert_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("accepted with no effect here (a startup line names the ones set)")
    for flag in INERT_FLAGS:
        g.add_argument(*flag.options, dest=flag.dest, help="accepted; " + flag.why, **argparse_kwargs(flag.spec))


def inert_in_use(a: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The inert flags this run set away from Megatron's default, as 'flag (why)'."""
    out = []
    for action in parser._actions:
        if action.dest in INERT and getattr(a, action.dest) != action.default:
            out.append(f"{action.option_strings[0]} ({INERT[action.dest]})")
    return sorted(set(out))
