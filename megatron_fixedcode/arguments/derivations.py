"""What Megatron-LM's ``validate_args`` derives from the flags, so that the dry run prints what
Megatron-LM's parser gives (tests/arguments/test_megatron_reference.py compares them dest by dest). Nothing here
refuses: the refusals are ``refusals.py``, before and after these derivations."""

from __future__ import annotations

import argparse
import os
import sys

from megatron_fixedcode.arguments.user_errors import is_rank0
from megatron_fixedcode.models.config import block_of


class Default(str):
    """A default that was not given: ``--transformer-impl`` left alone may fall back to local layers."""


def train_paths(a: argparse.Namespace) -> list[str] | None:
    """The training blend: --data-path (split by --split) wins over --train-data-path (Megatron-LM)."""
    return a.data_path or a.train_data_path


def valid_paths(a: argparse.Namespace) -> list[str] | None:
    """A validation blend of its own: --valid-data-path, unless --data-path is given (then --split)."""
    return None if a.data_path else a.valid_data_path


def resolve_tokenizer_type(a: argparse.Namespace) -> None:
    """--vocab-file/--merge-file without --tokenizer-type: GPT2BPETokenizer (Megatron-LM's GPT lists name the
    files, not the type)."""
    if isinstance(a.tokenizer_type, Default) and (a.vocab_file or a.merge_file) and not a.tokenizer_model:
        a.tokenizer_type = "GPT2BPETokenizer"
        if is_rank0():
            print("note: --vocab-file/--merge-file without --tokenizer-type: GPT2BPETokenizer", file=sys.stderr)
    a.tokenizer_type = str(a.tokenizer_type)


def derive(a: argparse.Namespace) -> None:
    """Megatron-LM's derived values, in place (after ``refusals.refuse_given``, before ``refusals.refuse``)."""
    a.bf16 = a.precision == "bf16"  # what the rest of the trainer reads for megatron's BF16 mode
    a.fp16 = False
    a.transformer_impl_given = not isinstance(a.transformer_impl, Default)
    a.transformer_impl = str(a.transformer_impl)
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    if a.data_path and a.split is None:  # Megatron-LM's validate_args, with its warning
        a.split = "969, 30, 1"
        if is_rank0():
            print(
                "note: --split not given with --data-path: using Megatron-LM's legacy default '969, 30, 1'",
                file=sys.stderr,
            )
    if a.sequence_parallel and a.tensor_model_parallel_size == 1:  # Megatron-LM turns it off, with a warning
        a.sequence_parallel = False
        if is_rank0():
            print(
                "note: --sequence-parallel has no effect with --tensor-model-parallel-size 1: turned off "
                "(as Megatron-LM does)",
                file=sys.stderr,
            )
    if a.data_path and (a.train_data_path or a.valid_data_path or a.test_data_path) and is_rank0():
        ignored = [
            f"--{k.replace('_', '-')}"
            for k in ("train_data_path", "valid_data_path", "test_data_path")
            if getattr(a, k)
        ]
        print(
            f"note: --data-path is given, so {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored "
            "and --split carves the validation set (Megatron-LM's rule); to train and validate on separate "
            "blends give --train-data-path and --valid-data-path",
            file=sys.stderr,
        )
    if a.dataloader_type is None:  # Megatron-LM's validate_args
        a.dataloader_type = "single"
    _virtual_pipeline(a)
    _derived_like_megatron(a)
    if a.use_rotary_position_embeddings:
        a.position_embedding_type = "rope"
    a.block = block_of(a.normalization, bool(a.swiglu))
    if a.ffn_hidden_size is None and a.hidden_size:  # Megatron-LM's validate_args derives it
        a.ffn_hidden_size = int((4 * a.hidden_size * 2 / 3) / 64) * 64 if a.swiglu else 4 * a.hidden_size
    if a.kv_channels is None and a.hidden_size and a.num_attention_heads:
        a.kv_channels = a.hidden_size // a.num_attention_heads


def _virtual_pipeline(a: argparse.Namespace) -> None:
    """Megatron-LM's --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank ->
    virtual_pipeline_model_parallel_size (None for one chunk), as its validate_args derives it."""
    if a.num_virtual_stages_per_pipeline_rank is not None:
        a.virtual_pipeline_model_parallel_size = a.num_virtual_stages_per_pipeline_rank
    elif a.num_layers_per_virtual_pipeline_stage is not None and a.num_layers:
        a.virtual_pipeline_model_parallel_size = (
            a.num_layers // a.pipeline_model_parallel_size // a.num_layers_per_virtual_pipeline_stage
        )
    if a.virtual_pipeline_model_parallel_size == 1:
        a.virtual_pipeline_model_parallel_size = None


def _derived_like_megatron(a: argparse.Namespace) -> None:
    """The values Megatron-LM's validate_args derives from the flags and the world size (``WORLD_SIZE``,
    1 when unset, as Megatron-LM reads it)."""
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
        if is_rank0():
            print(
                "note: --async-save without --use-persistent-ckpt-worker: saves are synchronous (Megatron-LM "
                "turns --async-save off without it)",
                file=sys.stderr,
            )
        a.async_save = False
    if a.position_embedding_type != "rope" and not a.use_rotary_position_embeddings:
        a.apply_rope_fusion = False
    if a.apply_query_key_layer_scaling:
        a.attention_softmax_in_fp32 = True
