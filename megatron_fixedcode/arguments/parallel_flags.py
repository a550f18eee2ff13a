"""Megatron-LM's parallelism and precision flags that act (core_v0.16.1's names, dests and defaults): the
layout (TP, PP with virtual stages, CP, sequence parallel), BF16/FP8, Transformer Engine or local layers,
fusions, communication overlap and recomputation. What they do: ``compat/layout.py``, ``models/``,
``training/gpu_features.py``; read after parsing through ``PerformanceConfig`` and the parallel layout."""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.derivations import Default
from megatron_fixedcode.models.config import FP8_FORMATS, FP8_RECIPES, TRANSFORMER_IMPLS


PRECISIONS = ("fp32", "bf16", "fp32-autocast-bf16")


def add_parallel_and_precision_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism and precision")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel ranks")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    g.add_argument(
        "--virtual-pipeline-model-parallel-size",
        type=int,
        default=None,
        help="model chunks per pipeline rank (interleaved schedule); this project's name for the value "
        "Megatron-LM derives from the two flags below",
    )
    g.add_argument(
        "--num-layers-per-virtual-pipeline-stage",
        type=int,
        default=None,
        help="interleaved schedule: layers per model chunk (Megatron-LM)",
    )
    g.add_argument(
        "--num-virtual-stages-per-pipeline-rank",
        type=int,
        default=None,
        help="interleaved schedule: model chunks per pipeline rank (Megatron-LM)",
    )
    g.add_argument("--context-parallel-size", type=int, default=1, help="context-parallel ranks")
    g.add_argument("--sequence-parallel", action="store_true", help="shard norms/dropout over the sequence (TP > 1)")
    g.add_argument(
        "--use-distributed-optimizer",
        action="store_true",
        help="megatron's distributed optimizer: Adam state and FP32 main weights sharded over DP ranks",
    )
    g.add_argument(
        "--no-dist-ckpt-optim-fully-reshardable",
        dest="dist_ckpt_optim_fully_reshardable",
        action="store_false",
        default=True,
        help="save the distributed optimizer's state in megatron's dp_reshardable format (no gather "
        "at save time, but a resume keeps Adam's state only on the same TP and PP sizes); "
        "default here: fully_reshardable, which resumes on any layout (docs/training.md)",
    )
    g.add_argument(
        "--dist-ckpt-optim-fully-reshardable",
        dest="dist_ckpt_optim_fully_reshardable",
        action="store_true",
        help="Megatron-LM's flag for this project's default",
    )
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32; bf16 (megatron's BF16 mode: BF16 weights, FP32 master weights in the optimizer); "
        "fp32-autocast-bf16 (paper 2: FP32 parameters, residual stream and norms, matmuls under "
        "torch.autocast(bf16)). docs/training.md, 'Precision modes'",
    )
    g.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="= --precision bf16")
    g.add_argument(
        "--transformer-impl",
        choices=[*TRANSFORMER_IMPLS, "inference_optimized"],
        default=Default("transformer_engine"),
        help="transformer_engine (Megatron-LM's default): TE layers; left at its default on a machine "
        "without CUDA + Transformer Engine, local layers are built and a startup line says so; "
        "named explicitly there, refused. local: megatron-core's local layers",
    )
    g.add_argument("--recompute-activations", action="store_true", help="= --recompute-granularity selective")
    g.add_argument(
        "--recompute-granularity",
        choices=["full", "selective"],
        default=None,
        help="activation recompute: full blocks (needs --recompute-method) or the core attention only",
    )
    g.add_argument(
        "--recompute-method",
        choices=["uniform", "block"],
        default=None,
        help="full recompute: uniform (groups of --recompute-num-layers) or block (the first N per stage)",
    )
    g.add_argument(
        "--recompute-num-layers", type=int, default=None, help="full recompute: layers per group / per stage"
    )
    g = p.add_argument_group("transformer engine, FP8, communication overlap (CUDA GPUs)")
    g.add_argument(
        "--fp8-format",
        dest="fp8",
        choices=FP8_FORMATS,
        default=None,
        help="FP8 GEMMs in the TE layers (needs --bf16 and Transformer Engine); the fixed-code "
        "input stays in the activation dtype, TE quantizes it",
    )
    g.add_argument(
        "--fp8-recipe",
        choices=[*FP8_RECIPES, "custom"],
        default="delayed",
        help="TE scaling recipe (mxfp8: Blackwell only; custom quantizers are refused)",
    )
    g.add_argument("--fp8-amax-history-len", type=int, default=1, help="delayed scaling: amax history length")
    g.add_argument(
        "--fp8-amax-compute-algo",
        choices=["most_recent", "max"],
        default="most_recent",
        help="delayed scaling: how the amax is taken from the history",
    )
    g.add_argument(
        "--fp8-param-gather",
        action="store_true",
        help="keep TE weights in FP8 and all-gather them in FP8 (needs --use-distributed-optimizer)",
    )
    g.add_argument(
        "--overlap-grad-reduce",
        action="store_true",
        help="overlap DP gradient reduction with backward (async collectives; on gloo too)",
    )
    g.add_argument(
        "--no-overlap-grad-reduce",
        dest="overlap_grad_reduce",
        action="store_false",
        help="turn it off (the paper-2 recipes turn it on)",
    )
    g.add_argument(
        "--overlap-param-gather",
        action="store_true",
        help="overlap the distributed optimizer's parameter all-gather with the next forward",
    )
    g.add_argument(
        "--no-overlap-param-gather",
        dest="overlap_param_gather",
        action="store_false",
        help="turn it off (the paper-2 recipes turn it on)",
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="overlap TP communication with GEMMs (TE userbuffers; needs TP > 1 and --sequence-parallel)",
    )
    g = p.add_argument_group(
        "GPU kernel fusions (Megatron-LM's defaults: on where this machine has the kernel; ignored on CPU) and TF32"
    )
    for flag, dest, what in (
        (
            "--no-gradient-accumulation-fusion",
            "gradient_accumulation_fusion",
            "weight-gradient GEMM accumulating into main_grad (apex)",
        ),
        ("--no-bias-swiglu-fusion", "bias_swiglu_fusion", "fused SwiGLU (SwiGLU blocks; a bias-free GELU has none)"),
        ("--no-bias-gelu-fusion", "bias_gelu_fusion", "fused bias-GELU (GELU blocks with linear biases)"),
        ("--no-bias-dropout-fusion", "bias_dropout_fusion", "fused bias-dropout-add"),
        ("--no-rope-fusion", "apply_rope_fusion", "fused RoPE (Transformer Engine)"),
        ("--no-masked-softmax-fusion", "masked_softmax_fusion", "fused scale-mask-softmax of the local attention"),
    ):
        g.add_argument(flag, dest=dest, action="store_false", help=f"turn off: {what}")
    g.add_argument(
        "--tf32",
        dest="tf32",
        action="store_true",
        default=False,
        help="TF32 tensor cores for FP32 matmuls and convolutions (off: torch's default, which Megatron-LM keeps)",
    )
    g.add_argument("--no-tf32", dest="tf32", action="store_false", help="TF32 off (the default)")
