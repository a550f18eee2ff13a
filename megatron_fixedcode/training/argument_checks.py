"""What Megatron-LM's ``validate_args`` derives from the flags, and the flag combinations refused
before anything is built (each a one-line error through the parser, exit 2). The parser itself is
``arguments.py``; the flag tables are ``megatron_args.py`` and ``megatron_inert.py``.
"""
from __future__ import annotations

import argparse
import os
import sys

from megatron_fixedcode.training.megatron_args import OTHER_TOKENIZERS, SCOPE_NOTE, architecture_block
from megatron_fixedcode.training.megatron_inert import default_only_error


class Default(str):
    """A default that was not given: ``--transformer-impl`` left alone may fall back to local layers."""


def validate(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for flag in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length"):
        if getattr(a, flag) is None:
            p.error(f"--{flag.replace('_', '-')} is required (on the command line or in --config)")
    if a.lr is None:
        p.error("--lr is required (as in Megatron-LM), on the command line or in --config")
    if a.train_iters is None and a.train_samples is None and a.train_tokens is None:
        p.error("give --train-iters, --train-samples or --train-tokens (with several, the first reached stops training)")
    if not a.dry_run and not train_paths(a) and not a.mock_data:
        p.error("--data-path (or --train-data-path, or --mock-data) is required")
    if a.mock_data:
        given = [f"--{k.replace('_', '-')}" for k in ("data_path", "train_data_path", "valid_data_path", "test_data_path")
                 if getattr(a, k, None)]
        if given:  # Megatron-LM's validate_args: "A single data source must be provided"
            p.error(f"--mock-data is a data source of its own: drop {', '.join(given)} (or --mock-data)")
        if a.dataset_type != "gpt":
            p.error(f"--mock-data is megatron's mock GPTDataset: not with --dataset-type {a.dataset_type}")
    if (train_paths(a) or a.mock_data) and not (a.tokenizer_model or a.vocab_file) and not a.vocab_size:
        p.error("--tokenizer-model (or GPT2BPETokenizer's --vocab-file/--merge-file) is required (or --vocab-size for "
                "pre-tokenized data without decoding)")
    if a.skip_train and not (a.load and (valid_paths(a) or a.dataset_type == "gpt")):
        p.error("--skip-train evaluates a loaded checkpoint: give --load and validation data")
    if a.dataset_type in ("document_windows", "sft") and valid_paths(a) is None and a.eval_interval:
        p.error(f"--dataset-type {a.dataset_type} evaluates on --valid-data-path (with --train-data-path, not "
                "--data-path): give them, or drop --eval-interval")
    if a.dataset_type == "sft" and not a.dry_run and not (a.tokenizer_model or a.vocab_file):
        p.error("--dataset-type sft tokenises text: give --tokenizer-model")
    if a.pipeline_model_parallel_size > 1 and a.num_layers % a.pipeline_model_parallel_size:
        p.error(f"--num-layers {a.num_layers} is not divisible by --pipeline-model-parallel-size {a.pipeline_model_parallel_size}")
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
    if a.padded_vocab_size is not None and (a.padded_vocab_size < 1 or a.padded_vocab_size % a.tensor_model_parallel_size):
        p.error(f"--padded-vocab-size {a.padded_vocab_size} must be a positive multiple of "
                f"--tensor-model-parallel-size {a.tensor_model_parallel_size} (each TP rank holds an equal share of rows)")
    final = ("--decoupled-min-lr", a.decoupled_min_lr) if a.decoupled_min_lr is not None else ("--min-lr", a.min_lr)
    if a.decoupled_lr is not None and a.decoupled_lr < final[1]:
        p.error(f"--decoupled-lr {a.decoupled_lr} is smaller than its final value {final[0]} {final[1]}")
    _validate_te_and_overlap(a, p)


def _validate_te_and_overlap(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Flag combinations only; whether this machine has a GPU and TE is checked at launch."""
    if a.fp8 and a.transformer_impl == "local":
        p.error("--fp8-format needs Transformer Engine layers: drop --transformer-impl local")
    if a.fp8 and not a.bf16:
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


def train_paths(a: argparse.Namespace) -> list[str] | None:
    """The training blend: --data-path (split by --split) wins over --train-data-path (Megatron-LM)."""
    return a.data_path or a.train_data_path


def valid_paths(a: argparse.Namespace) -> list[str] | None:
    """A validation blend of its own: --valid-data-path, unless --data-path is given (then --split)."""
    return None if a.data_path else a.valid_data_path


def megatron_semantics(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """What Megatron-LM's validate_args derives from the flags, and the combinations refused here."""
    a.transformer_impl_given = not isinstance(a.transformer_impl, Default)
    a.transformer_impl = str(a.transformer_impl)
    if a.transformer_impl == "inference_optimized":
        p.error("--transformer-impl inference_optimized: inference layers are outside this project's scope")
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    if a.data_path and a.split is None:  # Megatron-LM's validate_args, with its warning
        a.split = "969, 30, 1"
        if _is_rank0():
            print("note: --split not given with --data-path: using Megatron-LM's legacy default '969, 30, 1'",
                  file=sys.stderr)
    if a.sequence_parallel and a.tensor_model_parallel_size == 1:  # Megatron-LM turns it off, with a warning
        a.sequence_parallel = False
        if _is_rank0():
            print("note: --sequence-parallel has no effect with --tensor-model-parallel-size 1: turned off "
                  "(as Megatron-LM does)", file=sys.stderr)
    if a.recompute_granularity == "full" and (a.recompute_method is None or a.recompute_num_layers is None):
        p.error("--recompute-granularity full needs --recompute-method (uniform or block) and --recompute-num-layers "
                "(as Megatron-LM's TransformerConfig)")
    if a.recompute_granularity == "selective" and a.recompute_method:  # Megatron-LM's validate_args
        p.error("--recompute-method acts with --recompute-granularity full only (not selective)")
    if a.lr_decay_style == "WSD":
        p.error("--lr-decay-style WSD is not supported here: constant, linear, cosine or inverse-square-root")
    if a.tokenizer_type == "NullTokenizer" and a.tokenizer_model:
        p.error("--tokenizer-type NullTokenizer reads pre-tokenized data without a tokenizer: drop --tokenizer-model")
    if a.train_iters is not None and a.train_samples is not None:
        p.error("give one of --train-iters and --train-samples (Megatron-LM: iteration- or sample-based training)")
    if a.train_samples is not None and (a.lr_decay_iters is not None or a.lr_warmup_iters):
        p.error("--train-samples takes the sample-based LR flags: --lr-warmup-samples/--lr-decay-samples, "
                "not --lr-warmup-iters/--lr-decay-iters")
    if a.train_samples is None and (a.lr_decay_samples is not None or a.lr_warmup_samples):
        p.error("--lr-warmup-samples/--lr-decay-samples need sample-based training (--train-samples)")
    if a.lr_warmup_fraction is not None and (a.lr_warmup_iters or a.lr_warmup_samples):
        p.error("give one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples")
    if a.data_path and (a.train_data_path or a.valid_data_path or a.test_data_path) and _is_rank0():
        ignored = [f"--{k.replace('_', '-')}" for k in ("train_data_path", "valid_data_path", "test_data_path")
                   if getattr(a, k)]
        print(f"note: --data-path is given, so {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored "
              "and --split carves the validation set (Megatron-LM's rule); to train and validate on separate "
              "blends give --train-data-path and --valid-data-path", file=sys.stderr)
    if a.tokenizer_type in OTHER_TOKENIZERS:
        p.error(f"--tokenizer-type {a.tokenizer_type}: {OTHER_TOKENIZERS[a.tokenizer_type]}: {SCOPE_NOTE}")
    if a.fp8_recipe == "custom":
        p.error(f"--fp8-recipe custom: custom FP8 quantizers: {SCOPE_NOTE}")
    if (error := default_only_error(a)) is not None:
        p.error(error)
    if a.dataloader_type is None:  # Megatron-LM's validate_args
        a.dataloader_type = "single"
    _virtual_pipeline(a, p)
    _derived_like_megatron(a)
    try:
        a.block = architecture_block(a)
    except ValueError as e:
        p.error(str(e))
    if a.ffn_hidden_size is None and a.hidden_size:  # Megatron-LM's validate_args derives it
        a.ffn_hidden_size = int((4 * a.hidden_size * 2 / 3) / 64) * 64 if a.swiglu else 4 * a.hidden_size
    if a.kv_channels is None and a.hidden_size and a.num_attention_heads:
        a.kv_channels = a.hidden_size // a.num_attention_heads
    if a.kv_channels is not None and a.kv_channels < 1:
        p.error(f"--kv-channels must be >= 1, got {a.kv_channels}")
    if not 0 < a.rotary_percent <= 1:
        p.error(f"--rotary-percent must be in (0, 1], got {a.rotary_percent}")
    if a.max_position_embeddings is not None and a.seq_length and a.max_position_embeddings < a.seq_length:
        p.error(f"--max-position-embeddings {a.max_position_embeddings} is below --seq-length {a.seq_length}")
    if a.layernorm_zero_centered_gamma and a.transformer_impl == "local":
        p.error("--apply-layernorm-1p needs Transformer Engine layers (megatron-core's local norms do not "
                "support it): drop --transformer-impl local, or drop the flag")
    for name in ("hidden_dropout", "attention_dropout"):
        if not 0 <= getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(a, name)}")


def _virtual_pipeline(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Megatron-LM's --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank ->
    virtual_pipeline_model_parallel_size (None for one chunk), as its validate_args derives it."""
    given = [f for f, v in (("--num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage),
                            ("--num-virtual-stages-per-pipeline-rank", a.num_virtual_stages_per_pipeline_rank),
                            ("--virtual-pipeline-model-parallel-size", a.virtual_pipeline_model_parallel_size))
             if v is not None]
    if len(given) > 1:
        p.error(f"give one of {' and '.join(given)}")
    if a.num_virtual_stages_per_pipeline_rank is not None:
        a.virtual_pipeline_model_parallel_size = a.num_virtual_stages_per_pipeline_rank
    elif a.num_layers_per_virtual_pipeline_stage is not None and a.num_layers:
        pp, per_chunk = a.pipeline_model_parallel_size, a.num_layers_per_virtual_pipeline_stage
        if a.num_layers % pp or (a.num_layers // pp) % per_chunk:
            p.error(f"--num-layers-per-virtual-pipeline-stage {per_chunk}: the {a.num_layers // pp if a.num_layers % pp == 0 else a.num_layers / pp} "
                    f"layers of each of the {pp} pipeline stages do not split into chunks of {per_chunk}")
        a.virtual_pipeline_model_parallel_size = a.num_layers // pp // per_chunk
    if a.virtual_pipeline_model_parallel_size == 1:
        a.virtual_pipeline_model_parallel_size = None


def _derived_like_megatron(a: argparse.Namespace) -> None:
    """The values Megatron-LM's validate_args derives from the flags and the world size (``WORLD_SIZE``,
    1 when unset, as Megatron-LM reads it), so that the dry run prints what Megatron-LM's parser gives."""
    a.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    model_parallel = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    a.data_parallel_size = a.world_size // model_parallel if a.world_size % model_parallel == 0 else None
    if a.global_batch_size is None and a.data_parallel_size:
        a.global_batch_size = a.micro_batch_size * a.data_parallel_size
    a.encoder_num_layers, a.encoder_seq_length = a.num_layers, a.seq_length
    a.start_weight_decay = a.end_weight_decay = a.weight_decay  # --weight-decay-incr-style constant
    if not a.add_bias_linear:
        a.bias_gelu_fusion = False
    if a.bf16:  # BF16 grads are accumulated and reduced in FP32 unless --grad-reduce-in-bf16
        a.accumulate_allreduce_grads_in_fp32 = not a.grad_reduce_in_bf16
    if a.virtual_pipeline_model_parallel_size is None:  # p2p overlap and aligned gathers: interleaved schedule
        a.overlap_p2p_comm = a.align_param_gather = False
    if a.add_bias_linear:  # the 'add bias' flags kept in sync
        a.add_qkv_bias = True
    if a.async_save and not a.use_persistent_ckpt_worker:
        a.async_save = False
    if a.position_embedding_type != "rope" and not a.use_rotary_position_embeddings:
        a.apply_rope_fusion = False
    if a.apply_query_key_layer_scaling:
        a.attention_softmax_in_fp32 = True


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0
