"""The Megatron-LM flags that act here besides the core ones (``core_flags``): the architecture (with
``--block``, this project's shorthand for them), the sample-based schedule, and runtime, logging and
checkpoint extras; each with Megatron-LM's name, ``dest`` and default (core_v0.16.1).
"""

from __future__ import annotations

import argparse

from megatron_fixedcode.models.config import BLOCKS


def add_accepted_args(p: argparse.ArgumentParser) -> None:
    """Megatron flags besides the core ones: the architecture, LR-by-samples, logging and
    checkpoint extras."""
    g = p.add_argument_group("architecture (Megatron-LM's flags; --block is a shorthand for them)")
    g.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm", help="norm of each block")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP (gated SiLU); GELU MLP without it")
    g.add_argument(
        "--disable-bias-linear", dest="add_bias_linear", action="store_false", help="no biases in the linear layers"
    )
    g.add_argument(
        "--position-embedding-type",
        choices=["learned_absolute", "rope", "mrope", "relative", "none"],
        default="learned_absolute",
        help="position encoding (mrope and relative are not built here)",
    )
    g.add_argument(
        "--use-rotary-position-embeddings",
        action="store_true",
        help="Megatron's older spelling of --position-embedding-type rope",
    )
    g.add_argument("--rotary-percent", type=float, default=1.0, help="fraction of each head's dims RoPE rotates")
    g.add_argument(
        "--rotary-interleaved",
        action="store_true",
        help="RoPE rotates interleaved pairs of dims instead of the two halves",
    )
    g.add_argument(
        "--untie-embeddings-and-output-weights",
        action="store_true",
        help="an output layer of its own (required with a fixed code: it has no table to tie)",
    )
    g.add_argument(
        "--group-query-attention",
        action="store_true",
        help="grouped-query attention with --num-query-groups groups (without it, multi-head attention)",
    )
    g.add_argument(
        "--kv-channels",
        type=int,
        default=None,
        help="per-head projection size (default hidden-size / num-attention-heads)",
    )
    g.add_argument(
        "--max-position-embeddings",
        type=int,
        default=None,
        help="longest sequence the positions cover (RoPE: must be >= --seq-length)",
    )
    g.add_argument(
        "--apply-layernorm-1p",
        dest="layernorm_zero_centered_gamma",
        action="store_true",
        help="norm weights stored zero-centred, applied as 1 + w (TE layers only)",
    )
    g.add_argument(
        "--add-qkv-bias", action="store_true", help="biases in the QKV projection only (on with linear biases)"
    )
    g.add_argument("--qk-layernorm", action="store_true", help="normalize queries and keys per head before attention")
    g.add_argument("--squared-relu", action="store_true", help="squared-ReLU MLP instead of GELU (not with --swiglu)")
    g.add_argument("--use-rope-scaling", action="store_true", help="Llama-3.x RoPE frequency scaling")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0, help="factor of --use-rope-scaling")
    g.add_argument("--attention-dropout", type=float, default=0.1, help="dropout on the attention probabilities")
    g.add_argument("--hidden-dropout", type=float, default=0.1, help="dropout on the block outputs (residual adds)")
    g = p.add_argument_group("runtime, logging and checkpoint extras (Megatron-LM)")
    g.add_argument(
        "--no-mmap-bin-files",
        dest="mmap_bin_files",
        action="store_false",
        help="read the .bin shards with file reads instead of mmap",
    )
    g.add_argument(
        "--padded-vocab-size",
        type=int,
        default=None,
        help="output-layer rows as given (at least the vocabulary, a multiple of TP) instead of "
        "--make-vocab-size-divisible-by's padding",
    )
    g.add_argument(
        "--mock-data",
        action="store_true",
        help="megatron-core's MockGPTDataset instead of data (token ramps; split 1,1,1): throughput and "
        "smoke runs; the only data source, with a tokenizer or --vocab-size",
    )


# --block NAME: the project's shorthand for Megatron's architecture flags, of models.config.BLOCKS' llama and
# gpt_gelu: their norm and MLP, no linear biases, RoPE, an output layer of its own.
BLOCK_FLAGS = {
    name: {
        "normalization": BLOCKS[name]["normalization"],
        "swiglu": BLOCKS[name]["gated_linear_unit"],
        "add_bias_linear": False,
        "position_embedding_type": "rope",
        "untie_embeddings_and_output_weights": True,
    }
    for name in ("llama", "gpt_gelu")
}


class BlockAction(argparse.Action):
    """``--block llama`` = --normalization RMSNorm --swiglu --disable-bias-linear
    --position-embedding-type rope --untie-embeddings-and-output-weights (gpt_gelu: LayerNorm, no --swiglu)."""

    def __call__(self, parser, namespace, values, option_string=None):
        for dest, value in BLOCK_FLAGS[values].items():
            setattr(namespace, dest, value)


def expand_block_key(values: dict) -> None:
    """A recipe's ``block:`` key: its Megatron flags become defaults unless the recipe names them."""
    name = values.pop("block", None)
    if name is None:
        return
    if name not in BLOCK_FLAGS:
        raise ValueError(f"block must be one of {sorted(BLOCK_FLAGS)}, got {name!r}")
    for dest, value in BLOCK_FLAGS[name].items():
        values.setdefault(dest, value)
