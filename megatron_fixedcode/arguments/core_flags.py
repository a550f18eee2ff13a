"""The flags that act in every run, grouped by concern: model and input interface, batch/optimizer/schedule,
data here; parallelism and precision (``parallel_flags``), checkpoints and logging (``checkpoint_flags``);
and :func:`build_parser`, which adds the architecture extras (``architecture_flags``) and the
accepted-but-inert ones (``inert_flags``).

Megatron-LM's flags, dests, defaults and meanings (core_v0.16.1; docs/training.md, "Megatron-LM's
command line"). ``--config recipe.yaml`` sets defaults (keys are Megatron-LM's argument dests,
``${VAR}`` in strings is expanded from the environment); flags given on the command line override it.
"""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.checkpoint_flags import add_checkpoint_and_logging_args
from megatron_fixedcode.arguments.architecture_flags import BLOCK_FLAGS, BlockAction, add_accepted_args
from megatron_fixedcode.arguments.derivations import Default
from megatron_fixedcode.arguments.default_only_flags import add_default_only_args
from megatron_fixedcode.arguments.inert_flags import add_inert_args
from megatron_fixedcode.arguments.observe_flags import add_observe_args
from megatron_fixedcode.arguments.parallel_flags import add_parallel_and_precision_args
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
    g.add_argument("--seq-length", type=int, help="tokens per sample (required)")
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


def _add_training(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch, optimizer, schedule, budget")
    g.add_argument("--micro-batch-size", type=int, default=1, help="samples per microbatch per data-parallel rank")
    g.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="samples per optimizer step (default: micro batch x data-parallel size)",
    )
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (required)")
    g.add_argument("--min-lr", type=float, default=0.0, help="learning rate at the end of the decay")
    g.add_argument(
        "--decoupled-lr",
        type=float,
        default=None,
        help="peak learning rate of the input table and the output layer (megatron-core's "
        "is_embedding_or_output_parameter; a fixed code has no table: the output layer)",
    )
    g.add_argument(
        "--decoupled-min-lr",
        type=float,
        default=None,
        help="their learning rate at the end of the decay (default --min-lr); only with --decoupled-lr",
    )
    g.add_argument("--lr-warmup-iters", type=int, default=0, help="linear warmup steps")
    g.add_argument(
        "--lr-decay-style",
        choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
        default="linear",
        help="decay from --lr to --min-lr (WSD is not supported)",
    )
    g.add_argument("--lr-decay-iters", type=int, default=None, help="decay steps (default: the run's length)")
    g.add_argument(
        "--weight-decay", type=float, default=0.01, help="AdamW weight decay (matrices; 0 on 1-D parameters)"
    )
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam beta1")
    g.add_argument("--adam-beta2", type=float, default=0.999, help="Adam beta2")
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0, help="gradient-norm clip")
    g.add_argument("--train-iters", type=int, default=None, help="optimizer steps to train")
    g.add_argument(
        "--train-tokens",
        type=int,
        default=None,
        help="stop at the first step boundary past this many prediction targets",
    )
    g.add_argument("--seed", type=int, default=1234, help="seed of the init, the data order and dropout")
    g.add_argument(
        "--override-opt_param-scheduler",
        "--override-opt-param-scheduler",
        dest="override_opt_param_scheduler",
        action="store_true",
        help="on resume, use this run's LR schedule flags instead of the checkpoint's",
    )
    g.add_argument(
        "--use-checkpoint-opt_param-scheduler",
        "--use-checkpoint-opt-param-scheduler",
        dest="use_checkpoint_opt_param_scheduler",
        action="store_true",
        help="on resume, keep the checkpoint's LR schedule whatever this run's flags say",
    )
    g.add_argument(
        "--check-for-nan-in-loss-and-grad",
        dest="check_for_nan_in_loss_and_grad",
        action="store_true",
        default=True,
        help="validate each rank's loss and gradient buckets for NaN/Inf (--rerun-mode "
        "disabled: stop, exit code 3) and the global loss and gradient norm (stop, exit 3)",
    )
    g.add_argument(
        "--no-check-for-nan-in-loss-and-grad",
        dest="check_for_nan_in_loss_and_grad",
        action="store_false",
        help="train on through a non-finite loss or gradient norm",
    )
    _add_rerun(p)


def _add_rerun(p: argparse.ArgumentParser) -> None:
    """Megatron-LM's rerun state machine (megatron-core's; training/rerun.py wires it)."""
    g = p.add_argument_group("rerun state machine")
    g.add_argument(
        "--rerun-mode",
        choices=["disabled", "validate_results", "report_stats"],
        default="validate_results",
        help="validate_results: a rejected result (NaN/Inf, spike) re-runs the step in place; not reproduced: "
        "a transient fault, exit 17 with a checkpoint; reproduced: checkpoint and exit 16, resume "
        "on another GPU to decide; report_stats: re-run every step and log the results' variability; "
        "disabled: a rejected NaN/Inf stops the run",
    )
    g.add_argument(
        "--check-for-spiky-loss",
        action="store_true",
        help="reject a local loss 10x the largest of the first 100 (kept in the checkpoint); not fatal",
    )
    g.add_argument(
        "--check-for-large-grads",
        action="store_true",
        help="reject a local gradient bucket norm 10x the largest of the first 100 (megatron DDP); not fatal",
    )
    g.add_argument(
        "--result-rejected-tracker-filename",
        default=None,
        help="append each rejected result to this file; its reproduced iterations are added to --iterations-to-skip",
    )
    g.add_argument(
        "--error-injection-rate",
        type=int,
        default=0,
        help="inject a rejected result about once in this many validations (0: never)",
    )
    g.add_argument(
        "--error-injection-type",
        choices=["correct_result", "transient_error", "persistent_error"],
        default="transient_error",
        help="what the injected fault looks like on re-run",
    )
    g.add_argument(
        "--iterations-to-skip",
        type=int,
        nargs="+",
        default=[],
        help="these steps (1-based) read their batch but do not update the model or the LR schedule",
    )


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
    add_parallel_and_precision_args(p)
    _add_training(p)
    _add_data(p)
    add_checkpoint_and_logging_args(p)
    add_observe_args(p)
    add_accepted_args(p)
    add_inert_args(p)
    add_default_only_args(p)
    return p
