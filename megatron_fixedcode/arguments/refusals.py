"""Every refusal of the command line that does not depend on the machine, applied at parse time so
that ``--dry-run`` refuses what a run refuses (each a one-line error through the parser, exit 2).

:func:`refuse_given` checks the flags as given, before ``derivations.derive``; :func:`refuse` checks
the resolved flags after it. What depends on the machine (a GPU, Transformer Engine) is checked at launch
(``training/runtime_checks.py``); the rules a ``ModelConfig`` built by code must obey too live in
``models/config.py`` and are applied here through the same functions.
"""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.checkpoint_flags import refuse_non_persistent
from megatron_fixedcode.arguments.health_flags import refuse_fault_tolerance
from megatron_fixedcode.arguments.downstream_flags import refuse_downstream
from megatron_fixedcode.arguments.derivations import train_paths, valid_paths
from megatron_fixedcode.arguments.default_only_flags import default_only_error
from megatron_fixedcode.arguments.observe_flags import refuse_observe
from megatron_fixedcode.arguments.out_of_scope import SCOPE_NOTE
from megatron_fixedcode.arguments.tokenizer_flags import OTHER_TOKENIZERS
from megatron_fixedcode.models.config import (
    MATRIX_CODE,
    NO_TABLE_TO_TIE,
    POSITION_EMBEDDINGS,
    fixed_code_conflict,
    fp8_needs,
)

CONTEXT_PARALLEL_UNPROVEN = (
    "--context-parallel-size > 1 is refused until its parity with CP 1 has been measured on a "
    "GPU (the batch split is in place and tested; TE attention under CP is not yet)"
)


def refuse_given(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The flags as given (Megatron-LM's validate_args refuses them too, or they name what is not built here)."""
    if a.transformer_impl == "inference_optimized":
        p.error("--transformer-impl inference_optimized: inference layers are outside this project's scope")
    if a.lr_decay_style == "WSD":
        p.error("--lr-decay-style WSD is not supported here: constant, linear, cosine or inverse-square-root")
    if a.tokenizer_type == "NullTokenizer" and a.tokenizer_model:
        p.error("--tokenizer-type NullTokenizer reads pre-tokenized data without a tokenizer: drop --tokenizer-model")
    if a.train_iters is not None and a.train_samples is not None:
        p.error("give one of --train-iters and --train-samples (Megatron-LM: iteration- or sample-based training)")
    if a.train_samples is not None and (a.lr_decay_iters is not None or a.lr_warmup_iters):
        p.error(
            "--train-samples takes the sample-based LR flags: --lr-warmup-samples/--lr-decay-samples, "
            "not --lr-warmup-iters/--lr-decay-iters"
        )
    if a.train_samples is None and (a.lr_decay_samples is not None or a.lr_warmup_samples):
        p.error("--lr-warmup-samples/--lr-decay-samples need sample-based training (--train-samples)")
    if a.lr_warmup_fraction is not None and (a.lr_warmup_iters or a.lr_warmup_samples):
        p.error("give one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples")
    if a.tokenizer_type in OTHER_TOKENIZERS:
        p.error(f"--tokenizer-type {a.tokenizer_type}: {OTHER_TOKENIZERS[a.tokenizer_type]}: {SCOPE_NOTE}")
    if a.fp8_recipe == "custom":
        p.error(f"--fp8-recipe custom: custom FP8 quantizers: {SCOPE_NOTE}")
    if (error := default_only_error(a)) is not None:
        p.error(error)
    given = [
        f
        for f, v in (
            ("--num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage),
            ("--num-virtual-stages-per-pipeline-rank", a.num_virtual_stages_per_pipeline_rank),
            ("--virtual-pipeline-model-parallel-size", a.virtual_pipeline_model_parallel_size),
        )
        if v is not None
    ]
    if len(given) > 1:
        p.error(f"give one of {' and '.join(given)}")
    if a.num_layers_per_virtual_pipeline_stage is not None and a.num_layers:
        pp, per_chunk = a.pipeline_model_parallel_size, a.num_layers_per_virtual_pipeline_stage
        if a.num_layers % pp or (a.num_layers // pp) % per_chunk:
            per_stage = a.num_layers // pp if a.num_layers % pp == 0 else a.num_layers / pp
            p.error(
                f"--num-layers-per-virtual-pipeline-stage {per_chunk}: the {per_stage} "
                f"layers of each of the {pp} pipeline stages do not split into chunks of {per_chunk}"
            )


def refuse(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The resolved flags (after ``derivations.derive``)."""
    refuse_observe(a, p)  # the straggler detector, profiler, weight-hash check, --num-workers
    if a.recompute_granularity == "full" and (a.recompute_method is None or a.recompute_num_layers is None):
        p.error(
            "--recompute-granularity full needs --recompute-method (uniform or block) and --recompute-num-layers "
            "(as Megatron-LM's TransformerConfig)"
        )
    if a.recompute_granularity == "selective" and a.recompute_method:  # Megatron-LM's validate_args
        p.error("--recompute-method acts with --recompute-granularity full only (not selective)")
    _refuse_architecture(a, p)
    if a.kv_channels is not None and a.kv_channels < 1:
        p.error(f"--kv-channels must be >= 1, got {a.kv_channels}")
    if not 0 < a.rotary_percent <= 1:
        p.error(f"--rotary-percent must be in (0, 1], got {a.rotary_percent}")
    if a.max_position_embeddings is not None and a.seq_length and a.max_position_embeddings < a.seq_length:
        p.error(f"--max-position-embeddings {a.max_position_embeddings} is below --seq-length {a.seq_length}")
    if a.layernorm_zero_centered_gamma and a.transformer_impl == "local":
        p.error(
            "--apply-layernorm-1p needs Transformer Engine layers (megatron-core's local norms do not "
            "support it): drop --transformer-impl local, or drop the flag"
        )
    for name in ("hidden_dropout", "attention_dropout"):
        if not 0 <= getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(a, name)}")
    _refuse_run(a, p)
    _refuse_out_of_range(a, p)
    if a.code_matrix is not None and a.input_embedding != MATRIX_CODE:
        p.error(
            f"--code-matrix is the GF(2) recoding matrix: it needs --input-embedding {MATRIX_CODE}, "
            f"not {a.input_embedding}"
        )
    if a.context_parallel_size > 1:
        p.error(CONTEXT_PARALLEL_UNPROVEN)
    refuse_downstream(a, p)
    refuse_non_persistent(a, p)
    refuse_fault_tolerance(a, p)


def _refuse_architecture(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """What is not built here: position encodings other than RoPE, learned absolute or none, and a fixed
    code tied to the head or next to a learned position table (``models.config.fixed_code_conflict``)."""
    if not a.add_position_embedding and a.position_embedding_type != "rope":  # as Megatron-LM's validate_args
        p.error(
            "--no-position-embedding is deprecated (Megatron-LM refuses it too without RoPE): "
            "give --position-embedding-type none"
        )
    if a.position_embedding_type not in POSITION_EMBEDDINGS:
        p.error(
            f"--position-embedding-type {a.position_embedding_type} is not built here: give one of "
            f"{', '.join(POSITION_EMBEDDINGS)}"
        )
    why = fixed_code_conflict(
        a.input_embedding,
        tied=not a.untie_embeddings_and_output_weights,
        position_embedding_type=a.position_embedding_type,
    )
    if why == NO_TABLE_TO_TIE:
        p.error(
            f"--input-embedding {a.input_embedding} {why}: give --untie-embeddings-and-output-weights "
            "(Megatron-LM's default ties them), or --block llama"
        )
    if why:
        p.error(
            f"--input-embedding {a.input_embedding} with --position-embedding-type learned_absolute {why}: "
            "give rope or none, or --block llama"
        )


def _refuse_run(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The run as a whole: what it needs, and flags that contradict each other."""
    for flag in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length"):
        if getattr(a, flag) is None:
            p.error(f"--{flag.replace('_', '-')} is required (on the command line or in --config)")
    if a.lr is None:
        p.error("--lr is required (as in Megatron-LM), on the command line or in --config")
    if a.train_iters is None and a.train_samples is None and a.train_tokens is None:
        p.error(
            "give --train-iters, --train-samples or --train-tokens (with several, the first reached stops training)"
        )
    if not a.dry_run and not train_paths(a) and not a.mock_data:
        p.error("--data-path (or --train-data-path, or --mock-data) is required")
    if a.mock_data:
        given = [
            f"--{k.replace('_', '-')}"
            for k in ("data_path", "train_data_path", "valid_data_path", "test_data_path")
            if getattr(a, k, None)
        ]
        if given:  # Megatron-LM's validate_args: "A single data source must be provided"
            p.error(f"--mock-data is a data source of its own: drop {', '.join(given)} (or --mock-data)")
        if a.dataset_type != "gpt":
            p.error(f"--mock-data is megatron's mock GPTDataset: not with --dataset-type {a.dataset_type}")
    if (train_paths(a) or a.mock_data) and not (a.tokenizer_model or a.vocab_file or a.vocab_size or a.load):
        p.error(
            "--tokenizer-model (or GPT2BPETokenizer's --vocab-file/--merge-file) is required (or --vocab-size for "
            "pre-tokenized data without decoding; with --load, the checkpoint's own is used)"
        )
    if a.skip_train and not (a.load and (valid_paths(a) or a.dataset_type == "gpt")):
        p.error("--skip-train evaluates a loaded checkpoint: give --load and validation data")
    if a.dataset_type in ("document_windows", "sft") and valid_paths(a) is None and a.eval_interval:
        p.error(
            f"--dataset-type {a.dataset_type} evaluates on --valid-data-path (with --train-data-path, not "
            "--data-path): give them, or drop --eval-interval"
        )
    if a.dataset_type == "sft" and not a.dry_run and not (a.tokenizer_model or a.vocab_file or a.load):
        p.error("--dataset-type sft tokenises text: give --tokenizer-model")
    if a.pipeline_model_parallel_size > 1 and a.num_layers % a.pipeline_model_parallel_size:
        p.error(
            f"--num-layers {a.num_layers} is not divisible by --pipeline-model-parallel-size {a.pipeline_model_parallel_size}"
        )
    if a.virtual_pipeline_model_parallel_size and a.pipeline_model_parallel_size < 2:
        p.error("--virtual-pipeline-model-parallel-size needs --pipeline-model-parallel-size >= 2")
    if a.num_attention_heads % a.tensor_model_parallel_size:
        p.error("--num-attention-heads must be divisible by --tensor-model-parallel-size")
    if a.seq_length % (a.tensor_model_parallel_size if a.sequence_parallel else 1):
        p.error("--seq-length must be divisible by --tensor-model-parallel-size under --sequence-parallel")
    if a.context_parallel_size > 1 and a.seq_length % (2 * a.context_parallel_size):
        p.error("--seq-length must be divisible by 2 x --context-parallel-size")
    if a.finetune and not a.load:
        p.error("--finetune needs --load")
    if a.hf_export_interval and not a.save:
        p.error("--hf-export-interval exports saved checkpoints: it needs --save")
    if a.lr_decay_iters is not None and a.lr_decay_iters <= a.lr_warmup_iters:
        p.error(f"--lr-decay-iters {a.lr_decay_iters} must exceed --lr-warmup-iters {a.lr_warmup_iters}")
    if a.override_opt_param_scheduler and a.use_checkpoint_opt_param_scheduler:
        p.error("give at most one of --override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler")
    if a.eval_iters < 0:
        p.error(f"--eval-iters must be >= 0, got {a.eval_iters}")
    if a.eval_iters == 0 and a.skip_train:  # with --eval-interval: no evaluation, as in Megatron-LM
        p.error("--eval-iters 0 evaluates nothing: give --eval-iters >= 1 with --skip-train")
    if a.eval_interval is not None and a.eval_interval < 1:
        p.error(f"--eval-interval must be >= 1, got {a.eval_interval}")
    if a.min_lr > a.lr:
        p.error(f"--min-lr {a.min_lr} is larger than --lr {a.lr}")
    if a.padded_vocab_size is not None and (
        a.padded_vocab_size < 1 or a.padded_vocab_size % a.tensor_model_parallel_size
    ):
        p.error(
            f"--padded-vocab-size {a.padded_vocab_size} must be a positive multiple of "
            f"--tensor-model-parallel-size {a.tensor_model_parallel_size} (each TP rank holds an equal share of rows)"
        )
    final = ("--decoupled-min-lr", a.decoupled_min_lr) if a.decoupled_min_lr is not None else ("--min-lr", a.min_lr)
    if a.decoupled_lr is not None and a.decoupled_lr < final[1]:
        p.error(f"--decoupled-lr {a.decoupled_lr} is smaller than its final value {final[0]} {final[1]}")
    _refuse_te_and_overlap(a, p)


def _refuse_te_and_overlap(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Flag combinations only; whether this machine has a GPU and TE is checked at launch."""
    missing = fp8_needs(a.fp8, bf16=a.bf16, transformer_impl=a.transformer_impl)
    if missing == "transformer_engine":
        p.error("--fp8-format needs Transformer Engine layers: drop --transformer-impl local")
    if missing == "bf16":
        p.error("--fp8-format needs --bf16 / --precision bf16 (FP8 GEMMs, BF16 elsewhere)")
    if a.fp8_param_gather and not a.fp8:
        p.error("--fp8-param-gather needs --fp8-format")
    if a.fp8_param_gather and not a.use_distributed_optimizer:
        p.error("--fp8-param-gather needs --use-distributed-optimizer (it gathers FP8 parameter shards)")
    if a.overlap_param_gather and not (a.use_distributed_optimizer and a.overlap_grad_reduce):
        p.error("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce")
    if a.tp_comm_overlap and a.transformer_impl == "local":
        p.error("--tp-comm-overlap needs Transformer Engine layers: drop --transformer-impl local")
    if a.tp_comm_overlap and not a.sequence_parallel:
        p.error("--tp-comm-overlap needs --tensor-model-parallel-size > 1 and --sequence-parallel")


def _refuse_out_of_range(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Values outside their range (the optimizer, batch and budget, checkpoint and logging flags)."""
    for name in ("lr", "adam_eps"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if not (0 <= a.adam_beta1 < 1 and 0 <= a.adam_beta2 < 1):
        p.error("--adam-beta1/--adam-beta2 must be in [0, 1)")
    if a.micro_batch_size < 1:
        p.error(f"--micro-batch-size must be >= 1, got {a.micro_batch_size}")
    if a.global_batch_size is not None and a.global_batch_size < 1:
        p.error(
            f"--global-batch-size must be >= 1, got {a.global_batch_size} "
            "(leave it out for micro batch x data-parallel size)"
        )
    if a.global_batch_size is not None and a.global_batch_size % a.micro_batch_size:
        p.error(
            f"--global-batch-size {a.global_batch_size} is not a multiple of --micro-batch-size {a.micro_batch_size}"
        )
    if a.train_iters is not None and a.train_iters < 1:
        p.error(f"--train-iters must be >= 1, got {a.train_iters}")
    if a.train_samples is not None and a.train_samples < 1:
        p.error(f"--train-samples must be >= 1, got {a.train_samples}")
    if a.train_tokens is not None and a.train_tokens < 1:
        p.error(f"--train-tokens must be >= 1, got {a.train_tokens}")
    if a.ckpt_keep_last is not None and a.ckpt_keep_last < 1:
        p.error(f"--ckpt-keep-last must be >= 1, got {a.ckpt_keep_last}")
    if a.save_retain_interval is not None and a.save_retain_interval < 1:
        p.error(f"--save-retain-interval must be >= 1, got {a.save_retain_interval}")
    if a.exit_interval is not None and a.exit_interval < 1:
        p.error(f"--exit-interval must be >= 1, got {a.exit_interval}")
    if a.log_interval < 1:
        p.error(f"--log-interval must be >= 1, got {a.log_interval}")
