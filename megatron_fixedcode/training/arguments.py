"""Megatron-LM style command line + YAML recipes → validated component configs.

``--config recipe.yaml`` sets defaults (keys are flag names with underscores, ``${VAR}`` in
strings is expanded from the environment); flags given on the command line override the file.
Every inconsistency is refused here, before any process group, model or data exists.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from megatron_fixedcode.cli.parser import ArgumentParser
from megatron_fixedcode.codes import CODE_IMPLEMENTATIONS, PAPER_CODE_SEED
from megatron_fixedcode.compat.layout import ParallelLayout
from megatron_fixedcode.models.code_matrix_file import CodeMatrixFile, load_code_matrix
from megatron_fixedcode.models.config import (
    BLOCKS,
    CODE_KERNELS,
    FP8_FORMATS,
    FP8_RECIPES,
    INPUT_EMBEDDINGS,
    TRANSFORMER_IMPLS,
    ModelConfig,
)
from megatron_fixedcode.training.config import CheckpointConfig, LoggingConfig, OptimConfig, ScheduleConfig
from megatron_fixedcode.yaml_files import load_yaml


def _add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--num-layers", type=int)
    g.add_argument("--hidden-size", type=int)
    g.add_argument("--num-attention-heads", type=int)
    g.add_argument("--num-query-groups", type=int, default=None)
    g.add_argument("--ffn-hidden-size", type=int)
    g.add_argument("--seq-length", type=int)
    g.add_argument("--block", choices=sorted(BLOCKS), default="llama")
    g.add_argument("--norm-epsilon", type=float, default=1e-5)
    g.add_argument("--rotary-base", type=int, default=10000)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument("--vocab-size", type=int, default=None, help="default: the tokenizer's vocabulary")
    g = p.add_argument_group("input interface")
    g.add_argument("--input-embedding", choices=INPUT_EMBEDDINGS, default="binary")
    g.add_argument("--code-seed", type=int, default=PAPER_CODE_SEED)
    g.add_argument("--code-matrix", default=None, metavar="FILE",
                   help="gf2: the K x K recoding matrix A from a file (.npy, .json, or text rows of 0/1; "
                        "optionally with its offset) instead of the one drawn for --code-seed; see docs/codes.md")
    g.add_argument("--code-offset", type=int, default=0, help="offset b as a K-bit integer mask")
    g.add_argument("--code-impl", choices=CODE_IMPLEMENTATIONS, default="table_free")
    g.add_argument("--code-kernel", choices=CODE_KERNELS, default="auto",
                   help="bit codes on CPU: the compiled one-pass kernel (auto: when it builds) or torch ops")
    g.add_argument("--code-scale", type=float, default=1.0)
    g.add_argument("--code-bits", type=int, default=None)
    g.add_argument("--code-min-weight", type=int, default=4)
    g.add_argument("--code-width", type=int, default=None,
                   help="K' of random/sinusoidal/lowdim (default ceil(log2 V)); binary/gf2 take --code-bits")
    g.add_argument("--code-centered", action="store_true", help="binary/gf2: +-1 inputs (2c-1) instead of 0/1")
    g.add_argument("--code-norm-match", action="store_true",
                   help="scale the code so its input RMS equals the learned table's at init (--init-method-std)")
    g.add_argument("--code-base", type=float, default=None, help="sinusoidal: frequency base (default 10000)")


PRECISIONS = ("fp32", "bf16", "fp32-autocast-bf16")
# recipe keys of Megatron-LM's precision flags -> --precision
_PRECISION_ALIASES = {"bf16": "bf16", "fp16": "fp16"}


def _add_parallel_and_precision(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism and precision")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="megatron's distributed optimizer: Adam state and FP32 main weights sharded over DP ranks")
    g.add_argument("--no-dist-ckpt-optim-fully-reshardable", dest="dist_ckpt_optim_fully_reshardable",
                   action="store_false", default=True,
                   help="save the distributed optimizer's state in megatron's dp_reshardable format (no gather "
                        "at save time, but a resume keeps Adam's state only on the same TP and PP sizes); "
                        "default: fully_reshardable, which resumes on any layout (docs/training.md)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32; bf16 (megatron's BF16 mode: BF16 weights, FP32 master weights in the optimizer); "
                        "fp32-autocast-bf16 (paper 2: FP32 parameters, residual stream and norms, matmuls under "
                        "torch.autocast(bf16)). docs/training.md, 'Precision modes'")
    # Megatron-LM's flags, aliases of --precision (the last one given wins, the command line over the recipe)
    g.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="= --precision bf16")
    g.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                   help="refused: FP16 (with loss scaling) is not supported; use --precision bf16 or fp32-autocast-bf16")
    g.add_argument("--transformer-impl", choices=TRANSFORMER_IMPLS, default="auto")
    g.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    g = p.add_argument_group("transformer engine, FP8, communication overlap (CUDA GPUs)")
    g.add_argument("--fp8-format", choices=FP8_FORMATS, default=None,
                   help="FP8 GEMMs in the TE layers (needs --bf16 and Transformer Engine); the fixed-code "
                        "input stays in the activation dtype, TE quantizes it")
    g.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="delayed", help="TE scaling recipe (mxfp8: Blackwell only)")
    g.add_argument("--fp8-amax-history-len", type=int, default=1)
    g.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"], default="most_recent")
    g.add_argument("--fp8-param-gather", action="store_true",
                   help="keep TE weights in FP8 and all-gather them in FP8 (needs --use-distributed-optimizer)")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="overlap DP gradient reduction with backward (async collectives; on gloo too)")
    g.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false",
                   help="turn it off (the paper-2 recipes turn it on)")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="overlap the distributed optimizer's parameter all-gather with the next forward")
    g.add_argument("--no-overlap-param-gather", dest="overlap_param_gather", action="store_false",
                   help="turn it off (the paper-2 recipes turn it on)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="overlap TP communication with GEMMs (TE userbuffers; needs TP > 1 and --sequence-parallel)")
    g = p.add_argument_group("GPU kernel fusions and TF32 (Megatron-LM's defaults: on where this machine has "
                             "the kernel; ignored on CPU)")
    for flag, dest, what in (
        ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", "weight-gradient GEMM accumulating into main_grad (apex)"),
        ("--no-bias-swiglu-fusion", "bias_swiglu_fusion", "fused SwiGLU (SwiGLU blocks; a bias-free GELU has none)"),
        ("--no-bias-dropout-fusion", "bias_dropout_fusion", "fused bias-dropout-add"),
        ("--no-rope-fusion", "rope_fusion", "fused RoPE (Transformer Engine)"),
        ("--no-masked-softmax-fusion", "masked_softmax_fusion", "fused scale-mask-softmax of the local attention"),
        ("--no-tf32", "tf32", "TF32 tensor cores for FP32 matmuls and convolutions"),
    ):
        g.add_argument(flag, dest=dest, action="store_false", help=f"turn off: {what}")


def _add_training(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch, optimizer, schedule, budget")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--lr", type=float, default=1.5e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-style", choices=["cosine", "linear", "constant"], default="cosine")
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-tokens", type=int, default=None, help="stop at the first step boundary past this many prediction targets")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--override-opt-param-scheduler", action="store_true",
                   help="on resume, use this run's LR schedule flags instead of the checkpoint's")
    g.add_argument("--use-checkpoint-opt-param-scheduler", action="store_true",
                   help="on resume, keep the checkpoint's LR schedule whatever this run's flags say")
    g.add_argument("--check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad", action="store_true",
                   default=True, help="stop training with an error at a non-finite loss or gradient norm (default)")
    g.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad", action="store_false")


def _add_data(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None, help="prefixes, or weight prefix pairs")
    g.add_argument("--valid-data-path", nargs="+", default=None)
    g.add_argument("--data-args-path", default=None, help="file holding the --data-path string (Megatron-LM)")
    g.add_argument("--data-manifest", nargs="+", default=None,
                   help="manifest.json of tools/write_manifest.py: train shards -> --data-path, valid -> --valid-data-path")
    g.add_argument("--data-manifest-weights", nargs="+", type=float, default=None,
                   help="one weight per --data-manifest (a blend, e.g. 0.8 0.2)")
    g.add_argument("--dataset-type", choices=["gpt", "document_windows", "sft"], default="gpt",
                   help="sft: --data-path/--valid-data-path are JSONL files of prompt/response or chat records (docs/sft.md)")
    g.add_argument("--sft-prompt-key", default="prompt", help="SFT: field of the prompt (no loss)")
    g.add_argument("--sft-response-key", default="response", help="SFT: field of the response (the loss)")
    g.add_argument("--sft-messages-key", default="messages",
                   help="SFT: field of a chat record, a list of {role, content}; loss on assistant turns")
    g.add_argument("--split", default="99,1,0")
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--samples-per-shard-visit", type=int, default=16384)
    g.add_argument("--tokenizer-type", choices=["HuggingFaceTokenizer", "SentencePieceTokenizer"], default="HuggingFaceTokenizer")
    g.add_argument("--tokenizer-model", default=None)


def _add_checkpoint_and_logging(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--ckpt-keep-last", type=int, default=2)
    g.add_argument("--ckpt-step", type=int, default=None, help="load this iteration instead of the latest")
    g.add_argument("--no-verify-checkpoint", dest="verify_checkpoint", action="store_false",
                   help="load --load without checking its recorded checksums (a checkpoint whose record is missing "
                        "or incomplete is refused otherwise)")
    g.add_argument("--hf-export-interval", type=int, default=None,
                   help="also write a Hugging Face export of every N-th saved checkpoint (and the last)")
    g.add_argument("--hf-export-dir", default=None, help="where the exports go: DIR/iter_0000N (default SAVE/hf)")
    g.add_argument("--finetune", action="store_true",
                   help="load only the model weights from --load (any layout) and start at step 0")
    g.add_argument("--exit-duration-in-mins", type=float, default=None)
    g.add_argument("--exit-signal-handler", action="store_true", help="save and exit on SIGTERM/SIGUSR1")
    g.add_argument("--exit-interval", type=int, default=None, help="save and exit after this step (testing, preemption drills)")
    g = p.add_argument_group("logging")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--skip-train", action="store_true", help="load, evaluate once, exit")
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--metrics-file", default=None)
    g.add_argument("--wandb-project", default=None)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m megatron_fixedcode.pretrain", description=__doc__,
                                usage="%(prog)s [--config RECIPE.yaml] [--dry-run] [flags]  (see --help)",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML recipe; command-line flags override it")
    p.add_argument("--dry-run", action="store_true", help="validate and print the resolved config as JSON, then exit")
    _add_model(p)
    _add_parallel_and_precision(p)
    _add_training(p)
    _add_data(p)
    _add_checkpoint_and_logging(p)
    return p


def _expand(value: Any) -> Any:
    if isinstance(value, str):
        return os.path.expandvars(value)
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def load_recipe(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """YAML recipe → parser defaults; unknown keys are refused naming the file and key."""
    try:
        data = load_yaml(path) or {}
    except ValueError as e:  # names the file; not YAML, a recursive alias or an alias bomb
        parser.error(f"--config {e}")
    if not isinstance(data, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    for alias, precision in _PRECISION_ALIASES.items():
        if data.get(alias) is True:  # `bf16: true` in a recipe = `precision: bf16`
            if data.get("precision", precision) != precision:
                parser.error(f"--config {path}: both {alias}: true and precision: {data['precision']}; keep one")
            del data[alias]
            data["precision"] = precision
        elif alias in data and data[alias] in (False, None):
            del data[alias]
    known = {a.dest for a in parser._actions}
    for key in data:
        if key.replace("-", "_") not in known or key in ("config", "dry_run"):
            parser.error(f"--config {path}: unknown key {key!r}")
    values = {k.replace("-", "_"): _expand(v) for k, v in data.items()}
    for key in ("data_path", "valid_data_path"):
        if values.get(key) is not None:
            # A string (or an expanded ${VAR}) may hold several whitespace-separated entries.
            items = values[key] if isinstance(values[key], list) else [values[key]]
            values[key] = [word for item in items for word in str(item).split()]
    return values


@dataclasses.dataclass(kw_only=True)
class PretrainConfig:
    """Everything one training run needs, each part owned by its component."""

    args: argparse.Namespace
    layout: ParallelLayout
    optim: OptimConfig
    schedule: ScheduleConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    code_matrix: CodeMatrixFile | None = None  # --code-matrix, read once at parse time

    def model_config(self, vocab_size: int) -> ModelConfig:
        try:
            return self._model_config(vocab_size)
        except ValueError as e:
            if self.code_matrix is not None and "code_matrix" in str(e):
                raise ValueError(f"--code-matrix {self.code_matrix.path}: {e}") from None
            raise

    def _model_config(self, vocab_size: int) -> ModelConfig:
        a = self.args
        return ModelConfig(
            num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
            num_query_groups=a.num_query_groups, ffn_hidden_size=a.ffn_hidden_size, seq_length=a.seq_length,
            vocab_size=a.vocab_size or vocab_size, block=a.block, norm_epsilon=a.norm_epsilon,
            rotary_base=a.rotary_base, init_method_std=a.init_method_std,
            make_vocab_size_divisible_by=a.make_vocab_size_divisible_by, input_embedding=a.input_embedding,
            code_seed=a.code_seed, code_matrix=self.code_matrix and self.code_matrix.matrix,
            code_offset=a.code_offset, code_impl=a.code_impl, code_kernel=a.code_kernel,
            code_scale=a.code_scale,
            code_bits=a.code_bits, code_min_weight=a.code_min_weight, code_width=a.code_width,
            code_centered=a.code_centered, code_norm_match=a.code_norm_match, code_base=a.code_base,
            transformer_impl=a.transformer_impl,
            bf16=a.bf16, autocast_bf16=a.precision == "fp32-autocast-bf16", recompute_granularity=a.recompute_granularity, fp8=a.fp8_format,
            fp8_recipe=a.fp8_recipe, fp8_amax_history_len=a.fp8_amax_history_len,
            fp8_amax_compute_algo=a.fp8_amax_compute_algo, fp8_param=a.fp8_param_gather,
        )

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.args).items() if k not in ("config", "dry_run")}


def _validate(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for flag in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length"):
        if getattr(a, flag) is None:
            p.error(f"--{flag.replace('_', '-')} is required (on the command line or in --config)")
    if a.train_iters is None and a.train_tokens is None:
        p.error("give --train-iters or --train-tokens (or both: the first reached stops training)")
    if not a.dry_run and not a.data_path:
        p.error("--data-path is required")
    if a.data_path and not a.tokenizer_model and not a.vocab_size:
        p.error("--tokenizer-model is required (or --vocab-size for pre-tokenized data without decoding)")
    if a.skip_train and not (a.load and (a.valid_data_path or a.dataset_type == "gpt")):
        p.error("--skip-train evaluates a loaded checkpoint: give --load and validation data")
    if a.dataset_type in ("document_windows", "sft") and a.valid_data_path is None and a.eval_interval:
        p.error(f"--dataset-type {a.dataset_type} evaluates on --valid-data-path: give it, or drop --eval-interval")
    if a.dataset_type == "sft" and not a.dry_run and not a.tokenizer_model:
        p.error("--dataset-type sft tokenises text: give --tokenizer-model")
    if a.pipeline_model_parallel_size > 1 and a.num_layers % a.pipeline_model_parallel_size:
        p.error(f"--num-layers {a.num_layers} is not divisible by --pipeline-model-parallel-size {a.pipeline_model_parallel_size}")
    if a.virtual_pipeline_model_parallel_size and a.pipeline_model_parallel_size < 2:
        p.error("--virtual-pipeline-model-parallel-size needs --pipeline-model-parallel-size >= 2")
    if a.num_attention_heads % a.tensor_model_parallel_size:
        p.error("--num-attention-heads must be divisible by --tensor-model-parallel-size")
    if a.sequence_parallel and a.tensor_model_parallel_size == 1:
        p.error("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if a.seq_length % (a.tensor_model_parallel_size if a.sequence_parallel else 1):
        p.error("--seq-length must be divisible by --tensor-model-parallel-size under --sequence-parallel")
    if a.context_parallel_size > 1 and a.seq_length % (2 * a.context_parallel_size):
        p.error("--seq-length must be divisible by 2 x --context-parallel-size")
    if a.finetune and not a.load:
        p.error("--finetune needs --load")
    if a.hf_export_interval and not a.save:
        p.error("--hf-export-interval exports saved checkpoints: it needs --save")
    if a.save_interval and not a.save:
        p.error("--save-interval needs --save")
    if a.lr_decay_iters is not None and a.lr_decay_iters <= a.lr_warmup_iters:
        p.error(f"--lr-decay-iters {a.lr_decay_iters} must exceed --lr-warmup-iters {a.lr_warmup_iters}")
    if a.override_opt_param_scheduler and a.use_checkpoint_opt_param_scheduler:
        p.error("give at most one of --override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler")
    if a.eval_iters < 0:
        p.error(f"--eval-iters must be >= 0, got {a.eval_iters}")
    if a.eval_iters == 0 and (a.eval_interval or a.skip_train):
        p.error("--eval-iters 0 evaluates nothing: give --eval-iters >= 1 with "
                + ("--skip-train" if a.skip_train else f"--eval-interval {a.eval_interval}") + ", or drop it")
    if a.eval_interval is not None and a.eval_interval < 1:
        p.error(f"--eval-interval must be >= 1, got {a.eval_interval}")
    if a.min_lr > a.lr:
        p.error(f"--min-lr {a.min_lr} is larger than --lr {a.lr}")
    _validate_te_and_overlap(a, p)


def _validate_te_and_overlap(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Flag combinations only; whether this machine has a GPU and TE is checked at launch."""
    if a.fp8_format and a.transformer_impl == "local":
        p.error("--fp8-format needs Transformer Engine layers: drop --transformer-impl local")
    if a.fp8_format and not a.bf16:
        p.error("--fp8-format needs --bf16 / --precision bf16 (FP8 GEMMs, BF16 elsewhere)")
    if a.fp8_param_gather and not a.fp8_format:
        p.error("--fp8-param-gather needs --fp8-format")
    if a.fp8_param_gather and not a.use_distributed_optimizer:
        p.error("--fp8-param-gather needs --use-distributed-optimizer (it gathers FP8 parameter shards)")
    if a.overlap_param_gather and not (a.use_distributed_optimizer and a.overlap_grad_reduce):
        p.error("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce")
    if a.tp_comm_overlap and a.transformer_impl == "local":
        p.error("--tp-comm-overlap needs Transformer Engine layers: drop --transformer-impl local")
    if a.tp_comm_overlap and not a.sequence_parallel:
        p.error("--tp-comm-overlap needs --tensor-model-parallel-size > 1 and --sequence-parallel")


def _read_code_matrix(a: argparse.Namespace) -> CodeMatrixFile | None:
    """Load --code-matrix once; its offset (if any) becomes --code-offset. Reported on rank 0."""
    if a.code_matrix is None:
        return None
    if a.input_embedding != "gf2":
        raise ValueError(f"--code-matrix is the GF(2) recoding matrix: it needs --input-embedding gf2, "
                         f"not {a.input_embedding}")
    loaded = load_code_matrix(a.code_matrix)
    if loaded.offset is not None:
        if a.code_offset not in (0, loaded.offset):
            raise ValueError(f"--code-matrix {a.code_matrix} gives offset {loaded.offset}, --code-offset "
                             f"{a.code_offset}: give one of them")
        a.code_offset = loaded.offset
    if int(os.environ.get("RANK", "0")) == 0:
        print("\n".join(loaded.report()), file=sys.stderr)
    return loaded


def _check_inputs(a: argparse.Namespace) -> None:
    """What the flags name and can be read cheaply, refused at parse time (the dry run included):
    blend weights (megatron asserts them on every rank), damaged or empty shards (their index
    only) and a damaged tokenizer file."""
    from megatron_fixedcode.data.config import parse_blend

    from megatron_fixedcode.data.validate import check_shards

    source = f"--data-args-path {a.data_args_path}" if a.data_args_path else "--data-path"
    for flag, field, paths in ((source, "data_path", a.data_path), ("--valid-data-path", "valid_data_path", a.valid_data_path)):
        if paths:
            prefixes, _ = parse_blend(paths, flag)
            if a.dataset_type != "sft":  # index reads only; a missing shard is named where datasets are built
                check_shards([p for p in prefixes if os.path.isfile(p + ".idx")], None, field)
    if a.tokenizer_model and (not a.dry_run or Path(a.tokenizer_model).exists()):  # a login node may lack it
        from megatron_fixedcode.tokenizers import build_tokenizer

        build_tokenizer(a.tokenizer_type, a.tokenizer_model)


def parse_pretrain_args(argv: list[str] | None = None) -> PretrainConfig:
    parser = build_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        parser.set_defaults(**load_recipe(pre.config, parser))
    a = parser.parse_args(argv)
    try:
        from megatron_fixedcode.data.manifest import resolve_data_sources

        recipe_data = {k: parser.get_default(k) for k in ("data_path", "valid_data_path")}
        resolve_data_sources(a, recipe_data)  # --data-args-path / --data-manifest -> --data-path (docs/data.md)
        _check_inputs(a)
    except ValueError as e:
        parser.error(str(e))
    if a.precision == "fp16":
        parser.error("--fp16: FP16 training (loss scaling) is not supported; use --precision bf16 (megatron's BF16 "
                     "mode) or --precision fp32-autocast-bf16 (paper 2's)")
    a.bf16 = a.precision == "bf16"  # what the rest of the trainer reads for megatron's BF16 mode
    _validate(a, parser)
    try:
        layout = ParallelLayout(
            tensor_model_parallel_size=a.tensor_model_parallel_size,
            pipeline_model_parallel_size=a.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=a.virtual_pipeline_model_parallel_size,
            context_parallel_size=a.context_parallel_size,
            sequence_parallel=a.sequence_parallel,
        )
        cfg = PretrainConfig(
            args=a, layout=layout, optim=OptimConfig.from_args(a), schedule=ScheduleConfig.from_args(a),
            checkpoint=CheckpointConfig.from_args(a), logging=LoggingConfig.from_args(a),
            code_matrix=_read_code_matrix(a),
        )
        if a.vocab_size or a.dry_run:
            cfg.model_config(a.vocab_size or 2 ** 16)  # validates model fields and the code early
    except ValueError as e:
        parser.error(str(e))
    return cfg
