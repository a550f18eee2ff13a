"""Megatron-LM flags accepted at Megatron's default value only (:data:`AT_MEGATRON_DEFAULT_ONLY`, one
:class:`~megatron_fixedcode.arguments.inert_flags.Flag` row per flag, whose ``why`` says what is built
here instead): any other value is refused in one line saying so.
"""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.inert_flags import Flag, argparse_kwargs, megatron_default

AT_MEGATRON_DEFAULT_ONLY = (
    Flag(
        ("--optimizer",),
        "optimizer",
        {"choices": ["adam", "sgd", "muon", "dist_muon"], "default": "adam"},
        "AdamW only",
    ),
    Flag(
        ("--cp-comm-type",),
        "cp_comm_type",
        {"nargs": "+", "default": ["p2p"]},
        "context parallelism communicates p2p (ring) only",
    ),
    Flag(
        ("--dataloader-type",),
        "dataloader_type",
        {"choices": ["single", "cyclic", "external"], "default": None},
        "the sampler is Megatron's 'single' (step n reads global samples [n*G, (n+1)*G))",
    ),
    Flag(
        ("--ckpt-format",),
        "ckpt_format",
        {"choices": ["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"], "default": "torch_dist"},
        "checkpoints are megatron-core's dist_checkpointing (torch_dist)",
    ),
    Flag(
        ("--max-seqlen-per-dp-cp-rank",),
        "max_seqlen_per_dp_cp_rank",
        {"type": int, "default": None},
        "sequences are packed to --seq-length here",
    ),
    Flag(("--no-initialization",), "perform_initialization", "false", "parameters are always initialized"),
    Flag(
        ("--softmax-type",),
        "softmax_type",
        {"choices": ["vanilla", "off-by-one", "learnable"], "default": "vanilla"},
        "the attention softmax is the standard one",
    ),
    Flag(
        ("--fp32-residual-connection",),
        "fp32_residual_connection",
        "true",
        "the residual stream is FP32 under --precision fp32-autocast-bf16 (this project's mode)",
    ),
    Flag(
        ("--apply-residual-connection-post-layernorm",),
        "apply_residual_connection_post_layernorm",
        "true",
        "the blocks are pre-norm",
    ),
    Flag(
        ("--glu-linear-offset",), "glu_linear_offset", {"type": float, "default": 0.0}, "the SwiGLU here has no offset"
    ),
    Flag(
        ("--activation-func-clamp-value",),
        "activation_func_clamp_value",
        {"type": float, "default": None},
        "the activations are not clamped",
    ),
    Flag(
        ("--embedding-init-method-std",),
        "embedding_init_method_std",
        {"type": float, "default": None},
        "the learned table is initialized with --init-method-std",
    ),
    Flag(
        ("--distribute-saved-activations",),
        "distribute_saved_activations",
        "true",
        "activations are not distributed over TP ranks",
    ),
    Flag(
        ("--recompute-modules",),
        "recompute_modules",
        {"nargs": "+", "default": None},
        "selective recompute covers the core attention (megatron-core's default)",
    ),
    Flag(("--fp8-margin",), "fp8_margin", {"type": int, "default": 0}, "the FP8 scaling margin is TE's default"),
    Flag(("--fp8-interval",), "fp8_interval", {"type": int, "default": 1}, "the FP8 scaling interval is TE's default"),
    Flag(
        ("--no-fp8-wgrad", "--disable-fp8-wgrad"),
        "fp8_wgrad",
        "false",
        "the weight gradients are FP8 under --fp8-format too",
    ),
    Flag(("--batch-invariant-mode",), "batch_invariant_mode", "true", "no batch-invariant kernels"),
    Flag(
        ("--rotary-seq-len-interpolation-factor",),
        "rotary_seq_len_interpolation_factor",
        {"type": int, "default": None},
        "RoPE is not interpolated",
    ),
    Flag(("--no-rope-freq",), "no_rope_freq", {"default": None}, "RoPE is applied in every layer"),
    Flag(
        ("--no-weight-decay-cond-type",),
        "no_weight_decay_cond_type",
        {"choices": ["apply_wd_to_qk_layernorm"], "default": None},
        "weight decay: matrices only, none on 1-D parameters",
    ),
    Flag(("--decrease-batch-size-if-needed",), "decrease_batch_size_if_needed", "true", "the global batch is fixed"),
    Flag(
        ("--batch-size",),
        "batch_size",
        {"type": int, "default": None},
        "deprecated in Megatron-LM too: give --micro-batch-size",
    ),
    Flag(
        ("--checkpoint-activations",),
        "checkpoint_activations",
        "true",
        "deprecated in Megatron-LM too: give --recompute-activations",
    ),
    Flag(
        ("--rope-type",),
        "rope_type",
        {"choices": ["rope", "yarn"], "default": None},
        "the RoPE of megatron-core's default",
    ),
    Flag(
        ("--data-parallel-random-init",),
        "data_parallel_random_init",
        "true",
        "the DP replicas start from the same weights",
    ),
    Flag(
        ("--init-method-xavier-uniform",),
        "init_method_xavier_uniform",
        "true",
        "the init is normal(0, --init-method-std)",
    ),
    Flag(
        ("--start-weight-decay",),
        "start_weight_decay",
        {"type": float, "default": None},
        "the weight decay is constant (--weight-decay)",
    ),
    Flag(
        ("--end-weight-decay",),
        "end_weight_decay",
        {"type": float, "default": None},
        "the weight decay is constant (--weight-decay)",
    ),
    Flag(
        ("--weight-decay-incr-style",),
        "weight_decay_incr_style",
        {"choices": ["constant", "linear", "cosine"], "default": "constant"},
        "the weight decay is constant (--weight-decay)",
    ),
    Flag(
        ("--warmup",),
        "warmup",
        {"type": int, "default": None},
        "deprecated in Megatron-LM too: give --lr-warmup-fraction",
    ),
    Flag(("--save-wgrads-interval",), "save_wgrads_interval", {"type": int, "default": None}, "no gradient dumps"),
    Flag(("--save-dgrads-interval",), "save_dgrads_interval", {"type": int, "default": None}, "no gradient dumps"),
    Flag(
        ("--load-main-params-from-ckpt",),
        "load_main_params_from_ckpt",
        "true",
        "main parameters load with the checkpoint's weights",
    ),
    Flag(("--pretrained-checkpoint",), "pretrained_checkpoint", {"default": None}, "give --load with --finetune"),
    Flag(
        ("--no-save-optim",),
        "no_save_optim",
        {"action": "store_true", "default": None},
        "checkpoints hold the optimizer's state",
    ),
    Flag(
        ("--no-save-rng",), "no_save_rng", {"action": "store_true", "default": None}, "checkpoints hold the RNG states"
    ),
    Flag(
        ("--model-parallel-size",),
        "model_parallel_size",
        {"type": int, "default": None},
        "deprecated in Megatron-LM too: give --tensor-model-parallel-size",
    ),
    Flag(("--full-validation",), "full_validation", "true", "validation reads the first --eval-iters batches"),
    Flag(("--multiple-validation-sets",), "multiple_validation_sets", "true", "one validation blend"),
    Flag(
        ("--phase-transition-iterations",),
        "phase_transition_iterations",
        {"default": None},
        "one data blend for the whole run",
    ),
    Flag(
        ("--per-split-data-args-path",),
        "per_split_data_args_path",
        {"default": None},
        "give --train-data-path/--valid-data-path/--test-data-path",
    ),
    Flag(
        ("--per-dataset-sequences-path",),
        "per_dataset_sequences_path",
        {"default": None},
        "megatron's indexed datasets read their own index",
    ),
    Flag(("--encoder-seq-length",), "encoder_seq_length", {"type": int, "default": None}, "give --seq-length"),
    Flag(("--decoder-seq-length",), "decoder_seq_length", {"type": int, "default": None}, "give --seq-length"),
    Flag(("--sample-rate",), "sample_rate", {"type": float, "default": 1.0}, "every sample of the stream is used"),
    Flag(
        ("--reset-position-ids",),
        "reset_position_ids",
        "true",
        "positions run across documents in a sample (Megatron-LM's default)",
    ),
    Flag(
        ("--reset-attention-mask",),
        "reset_attention_mask",
        "true",
        "attention runs across documents in a sample (Megatron-LM's default)",
    ),
    Flag(("--eod-mask-loss",), "eod_mask_loss", "true", "the loss covers EOD targets (Megatron-LM's default)"),
    Flag(
        ("--mid-level-dataset-surplus",),
        "mid_level_dataset_surplus",
        {"type": float, "default": 0.005},
        "megatron's default blend surplus",
    ),
    Flag(("--vocab-extra-ids",), "vocab_extra_ids", {"type": int, "default": 0}, "no extra vocabulary ids"),
    Flag(("--enable-experimental",), "enable_experimental", "true", "no experimental features"),
)
_AT_DEFAULT = {flag.dest: flag for flag in AT_MEGATRON_DEFAULT_ONLY}


def add_default_only_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("accepted at Megatron-LM's default only")
    for flag in AT_MEGATRON_DEFAULT_ONLY:
        g.add_argument(
            *flag.options,
            dest=flag.dest,
            help=f"only at Megatron-LM's default: {flag.why}",
            **argparse_kwargs(flag.spec),
        )


def _other_than_default(dest: str, value) -> bool:
    return value != megatron_default(_AT_DEFAULT[dest].spec) and not (dest == "dataloader_type" and value == "single")


def refused_value(flag: str, values: list[str]) -> str | None:
    """Why ``flag values`` (as typed) is refused: a :data:`AT_MEGATRON_DEFAULT_ONLY` flag away from Megatron's
    default."""
    for flags, dest, spec, why in AT_MEGATRON_DEFAULT_ONLY:
        if flag in flags:
            if spec in ("true", "false") or "action" in spec:
                return why
            convert = spec.get("type", str)
            value = [convert(v) for v in values] if spec.get("nargs") else convert(values[0]) if values else None
            return why if _other_than_default(dest, value) else None
    return None


def default_only_error(a: argparse.Namespace) -> str | None:
    """One line for a :data:`AT_MEGATRON_DEFAULT_ONLY` flag given another value than Megatron's default."""
    for flags, dest, spec, why in AT_MEGATRON_DEFAULT_ONLY:
        value = getattr(a, dest)
        if _other_than_default(dest, value):
            shown = (
                ""
                if spec in ("true", "false") or "action" in spec
                else " " + (" ".join(map(str, value)) if isinstance(value, list) else str(value))
            )
            return f"{flags[0]}{shown}: {why}"
    return None
