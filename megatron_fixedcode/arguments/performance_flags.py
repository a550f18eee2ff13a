"""How a step runs on the hardware (core_v0.16.1's names, dests and defaults): precision, Transformer Engine or
local layers, FP8, the GPU kernel fusions and communication overlap. Read after parsing as
:class:`PerformanceConfig`, checked against the machine at launch (training/gpu_features.py)."""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import derived, from_dests
from megatron_fixedcode.arguments.derivations import Default
from megatron_fixedcode.models.config import FP8_FORMATS, FP8_RECIPES, TRANSFORMER_IMPLS


PRECISIONS = ("fp32", "bf16", "fp32-autocast-bf16")


def add_performance_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("precision, Transformer Engine, fusions, overlap")
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerformanceConfig:
    """How a step runs on the hardware: precision, Transformer Engine or local layers, fused kernels and
    communication overlap (checked against the machine at launch: training/gpu_features.py)."""

    precision: str
    bf16: bool = derived("derivations: --precision bf16")
    fp8: str | None
    fp8_recipe: str
    tf32: bool
    transformer_impl: str
    tp_comm_overlap: bool
    gradient_accumulation_fusion: bool
    bias_gelu_fusion: bool
    bias_swiglu_fusion: bool
    bias_dropout_fusion: bool
    apply_rope_fusion: bool
    masked_softmax_fusion: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    fp8_amax_history_len: int = 1  # delayed scaling (the model config reads them too)
    fp8_amax_compute_algo: str = "most_recent"
    fp8_param_gather: bool = False
    # False: Megatron-LM's default, which may fall back to local layers
    transformer_impl_given: bool = derived("derivations.resolve", default=True)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "PerformanceConfig":
        return from_dests(cls, a)
