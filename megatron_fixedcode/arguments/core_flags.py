"""The parser: model, input interface and data flags here; each other concern in a ``*_flags.py`` of its own
that owns its flags, the typed config built from them and its refusals (parallelism, performance, schedule,
optimizer, run health, checkpoints, logging, downstream evaluations, watching); :func:`build_parser` adds
them all, then the architecture extras (``architecture_flags``) and the accepted-but-inert ones (``inert_flags``).

Megatron-LM's flags, dests, defaults and meanings (core_v0.16.1; docs/training.md, "Megatron-LM's
command line"). ``--config recipe.yaml`` sets defaults (keys are Megatron-LM's argument dests,
``${VAR}`` in strings is expanded from the environment); flags given on the command line override it.
"""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.checkpoint_flags import add_checkpoint_args
from megatron_fixedcode.arguments.downstream_flags import add_downstream_args
from megatron_fixedcode.arguments.health_flags import add_health_args
from megatron_fixedcode.arguments.logging_flags import add_logging_args
from megatron_fixedcode.arguments.optimizer_flags import add_optimizer_args
from megatron_fixedcode.arguments.performance_flags import add_performance_args
from megatron_fixedcode.arguments.schedule_flags import add_schedule_args
from megatron_fixedcode.arguments.architecture_flags import BLOCK_FLAGS, BlockAction, add_accepted_args
from megatron_fixedcode.arguments.derivations import Default
from megatron_fixedcode.arguments.default_only_flags import add_default_only_args
from megatron_fixedcode.arguments.inert_flags import add_inert_args
from megatron_fixedcode.arguments.observe_flags import add_observe_args
from megatron_fixedcode.arguments.parallel_flags import add_parallel_args
from megatron_fixedcode.arguments.tokenizer_flags import add_tokenizer_args
from megatron_fixedcode.arguments.user_errors import ArgumentParser
from megatron_fixedcode.codes import CODE_IMPLEMENTATIONS, PAPER_CODE_SEED
from megatron_fixedcode.models.config import CODE_KERNELS, INPUT_EMBEDDINGS


# `python -m megatron_fixedcode.pretrain -h` opens with this.
DESCRIPTION = """Megatron-LM style command line + YAML recipes → validated component configs.

Megatron-LM's flags, dests, defaults and meanings (core_v0.16.1; docs/training.md, "Megatron-LM's
command line"). ``--config recipe.yaml`` sets defaults (keys are Megatron-LM's argument dests,
``${VAR}`` in strings is expanded from the environment); flags given on the command line override it.
Every inconsistency is refused here, before any process group, model or data exists.
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; every flag's help ends with its default."""


def _add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--num-layers", type=int, help="transformer blocks (required)")
    g.add_argument("--hidden-size", type=int, help="model width (required)")
    g.add_argument("--num-attention-heads", type=int, help="attention heads (required)")
    g.add_argument(
        "--num-query-groups",
        type=int,
        default=1,
        help="key/value groups; acts only with --group-query-attention (Megatron-LM's meaning)",
    )
    g.add_argument("--ffn-hidden-size", type=int, help="MLP width (required)")
    g.add_argument(
        "--block",
        choices=sorted(BLOCK_FLAGS),
        action=BlockAction,
        default=None,
        help="shorthand: llama = --normalization RMSNorm --swiglu --disable-bias-linear "
        "--position-embedding-type rope --untie-embeddings-and-output-weights; gpt_gelu = the same "
        "with LayerNorm and a GELU MLP. Flags after it override it",
    )
    g.add_argument("--norm-epsilon", dest="layernorm_epsilon", type=float, default=1e-5, help="epsilon of the norms")
    g.add_argument("--rotary-base", type=int, default=10000, help="RoPE base")
    g.add_argument("--init-method-std", type=float, default=0.02, help="std of the normal init")
    g.add_argument(
        "--make-vocab-size-divisible-by", type=int, default=128, help="pad the output layer's rows to a multiple"
    )
    g.add_argument("--vocab-size", type=int, default=None, help="vocabulary (default: the tokenizer's)")
    g = p.add_argument_group("input interface (this project)")
    g.add_argument(
        "--input-embedding",
        choices=INPUT_EMBEDDINGS,
        default="learned",
        help="the input layer: Megatron-LM's learned table, or a fixed code family (docs/codes.md)",
    )
    g.add_argument("--code-seed", type=int, default=PAPER_CODE_SEED, help="seed that draws the GF(2) matrix A")
    g.add_argument(
        "--code-matrix",
        default=None,
        metavar="FILE",
        help="gf2: the K x K recoding matrix A from a file (.npy, .json, or text rows of 0/1; "
        "optionally with its offset) instead of the one drawn for --code-seed; see docs/codes.md",
    )
    g.add_argument("--code-offset", type=int, default=0, help="offset b as a K-bit integer mask")
    g.add_argument(
        "--code-impl",
        choices=CODE_IMPLEMENTATIONS,
        default="table_free",
        help="frozen lookup table or table-free bit operations (bit-identical)",
    )
    g.add_argument(
        "--code-kernel",
        choices=CODE_KERNELS,
        default="auto",
        help="bit codes on CPU: the compiled one-pass kernel (auto: when it builds) or torch ops",
    )
    g.add_argument("--code-scale", type=float, default=1.0, help="multiplier of the code")
    g.add_argument("--code-bits", type=int, default=None, help="binary/gf2: K (default ceil(log2 V))")
    g.add_argument("--code-min-weight", type=int, default=4, help="gf2: minimum Hamming weight of A's rows and columns")
    g.add_argument(
        "--code-width",
        type=int,
        default=None,
        help="K' of random/sinusoidal/lowdim (default ceil(log2 V)); binary/gf2 take --code-bits",
    )
    g.add_argument("--code-centered", action="store_true", help="binary/gf2: +-1 inputs (2c-1) instead of 0/1")
    g.add_argument(
        "--code-norm-match",
        action="store_true",
        help="scale the code so its input RMS equals the learned table's at init (--init-method-std)",
    )
    g.add_argument("--code-base", type=float, default=None, help="sinusoidal: frequency base (default 10000)")


def _add_data(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument(
        "--data-path",
        nargs="*",
        default=None,
        help="prefixes, or weight prefix pairs, split into train/valid/test by --split; when given, "
        "--train/--valid/--test-data-path are ignored (Megatron-LM's rule)",
    )
    for split in ("train", "valid", "test"):
        g.add_argument(
            f"--{split}-data-path",
            nargs="*",
            default=None,
            help=f"{split} blend of its own (used when --data-path is not given)",
        )
    g.add_argument("--data-args-path", default=None, help="file holding the --data-path string (Megatron-LM)")
    g.add_argument(
        "--data-manifest",
        nargs="+",
        default=None,
        help="manifest.json of tools/write_manifest.py: train shards -> --train-data-path, valid -> --valid-data-path",
    )
    g.add_argument(
        "--data-manifest-weights",
        nargs="+",
        type=float,
        default=None,
        help="one weight per --data-manifest (a blend, e.g. 0.8 0.2)",
    )
    g.add_argument(
        "--dataset-type",
        choices=["gpt", "document_windows", "sft"],
        default="gpt",
        help="gpt: megatron's GPTDataset; document_windows: paper 2's in-document windows; sft: JSONL "
        "prompt/response or chat records (docs/sft.md)",
    )
    g.add_argument("--sft-prompt-key", default="prompt", help="SFT: field of the prompt (no loss)")
    g.add_argument("--sft-response-key", default="response", help="SFT: field of the response (the loss)")
    g.add_argument(
        "--sft-messages-key",
        default="messages",
        help="SFT: field of a chat record, a list of {role, content}; loss on assistant turns",
    )
    g.add_argument(
        "--split",
        default=None,
        help="train,valid,test weights of --data-path; not given: '969, 30, 1' with a note (Megatron-LM's "
        "legacy value)",
    )
    g.add_argument("--data-cache-path", default=None, help="where megatron's dataset index caches go")
    g.add_argument(
        "--samples-per-shard-visit",
        type=int,
        default=16384,
        help="document_windows: samples drawn from a shard before the sampler moves on",
    )
    add_tokenizer_args(
        g,
        type_default=Default("HuggingFaceTokenizer"),
        trainer=True,
        model_help="tokenizer file or directory",
        type_help="NullTokenizer: pre-tokenized data, give --vocab-size; "
        "the three SentencePiece names read the .model with no extra special tokens (Megatron-LM's "
        "GPTSentencePieceTokenizer; its SentencePieceTokenizer adds <CLS>, <SEP>, ...); GPT2BPETokenizer "
        "reads --vocab-file and --merge-file (the default when they are given); Megatron-LM's other types "
        "are refused in one line",
    )


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m megatron_fixedcode.pretrain",
        description=DESCRIPTION,
        usage="%(prog)s [--config RECIPE.yaml] [--dry-run] [flags]  (see --help)",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--config",
        default=None,
        help="YAML recipe keyed by Megatron-LM's argument dests; command-line flags override it",
    )
    p.add_argument("--dry-run", action="store_true", help="validate and print the resolved config as JSON, then exit")
    _add_model(p)
    add_parallel_args(p)
    add_performance_args(p)
    add_schedule_args(p)
    add_optimizer_args(p)
    add_health_args(p)
    _add_data(p)
    add_checkpoint_args(p)
    add_logging_args(p)
    add_downstream_args(p)
    add_observe_args(p)
    add_accepted_args(p)
    add_inert_args(p)
    add_default_only_args(p)
    return p
