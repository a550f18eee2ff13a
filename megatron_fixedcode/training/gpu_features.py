"""The CUDA-only parts of a run: Transformer Engine / FP8 / overlap checks at launch, TE's
userbuffers for TP communication overlap, the fused optimizer, and parameter sync around
evaluation and checkpoints under ``--overlap-param-gather``.

Everything here is a no-op on the CPU path, except :func:`check_gpu_features`, which refuses
GPU-only flags there (exit 2 before any process group, model or data exists).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
from typing import Mapping

import torch

from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.arguments.performance_flags import PerformanceConfig
from megatron_fixedcode.models.builder import TE_INSTALL_HINT
from megatron_fixedcode.models.config import BLOCKS

logger = logging.getLogger(__name__)


def _fp8_support(recipe: str) -> tuple[bool, str]:
    """(supported, reason) from TE for this GPU (mxfp8 needs Blackwell, blockwise Hopper + CUDA 12.9)."""
    name = {"mxfp8": "check_mxfp8_support", "blockwise": "check_fp8_block_scaling_support"}.get(
        recipe, "check_fp8_support"
    )
    for module in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            check = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if check is not None:
            return check()
    return False, f"this Transformer Engine has no {name}()"


def check_gpu_features(a: PerformanceConfig) -> None:
    """Refuse, naming what to install or change, GPU/TE features this machine cannot run."""
    on_gpu = torch.cuda.is_available()
    has_te = importlib.util.find_spec("transformer_engine") is not None
    wants_te = [
        flag
        for flag, on in (
            (
                "--transformer-impl transformer_engine",
                a.transformer_impl == "transformer_engine" and a.transformer_impl_given,
            ),
            (f"--fp8-format {a.fp8}", a.fp8 is not None),
            ("--tp-comm-overlap", a.tp_comm_overlap),
        )
        if on
    ]
    if not on_gpu:  # overlap of grad reduce / param gather runs on gloo too (async collectives, no streams)
        if wants_te:
            raise ValueError(
                f"{', '.join(wants_te)} needs a CUDA GPU (this machine has none); "
                "on CPU drop it (training runs with megatron-core's local layers: --transformer-impl local)"
                f"; on the GPU machine {TE_INSTALL_HINT}"
            )
        return
    if wants_te and not has_te:
        raise ValueError(f"{', '.join(wants_te)} needs Transformer Engine, which is not importable: {TE_INSTALL_HINT}")
    te_layers = bool(wants_te) or (a.transformer_impl in ("auto", "transformer_engine") and has_te)
    refusal = tf32_refusal(tf32=a.tf32, fp32_gemms=a.precision == "fp32", te_layers=te_layers, environ=os.environ)
    if refusal:
        raise ValueError(refusal)
    if a.fp8:
        ok, reason = _fp8_support(a.fp8_recipe)
        if not ok:
            raise ValueError(
                f"--fp8-format {a.fp8} --fp8-recipe {a.fp8_recipe} is not supported on "
                f"{torch.cuda.get_device_name()}: {reason}"
            )


def initialize_tp_comm_overlap(cfg: PretrainConfig, hidden_size: int) -> None:
    """TE userbuffers for overlapping TP all-gather/reduce-scatter with GEMMs (as Megatron-LM does)."""
    if not cfg.performance.tp_comm_overlap:
        return
    from transformer_engine.pytorch import module as te_module

    s, layout = cfg.schedule, cfg.layout
    shape = [s.seq_length * s.micro_batch_size // layout.context_parallel_size, hidden_size]
    te_module.base.initialize_ub(
        shape=shape, tp_size=layout.tensor_model_parallel_size, use_fp8=cfg.performance.fp8 is not None
    )


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    return [p.optimizer for p in parts if getattr(p, "optimizer", None) is not None]


def describe_optimizer(optimizer, inner: str) -> str:
    """``inner`` (the torch optimizer) named with megatron's wrapper when that is more than FP32
    plain Adam: its distributed optimizer, or BF16 weights with FP32 main weights."""
    wrappers = {type(p).__name__ for p in getattr(optimizer, "chained_optimizers", [optimizer])}
    if "DistributedOptimizer" in wrappers:
        return f"megatron DistributedOptimizer (Adam state sharded over data-parallel ranks) over {inner}"
    if "Float16OptimizerWithFloat16Params" in wrappers:
        return f"megatron Float16OptimizerWithFloat16Params (FP32 main weights) over {inner}"
    return inner


def use_fused_adamw(optimizer) -> str:
    """megatron picks TE's FusedAdam, else apex's, else torch's AdamW (foreach). In the last case on
    CUDA, switch torch's AdamW to its fused kernel (before the first step creates any state).
    The CPU path keeps megatron's default so CPU losses stay what they were. Returns the kind used."""
    kinds = set()
    for opt in _torch_optimizers(optimizer):
        if isinstance(opt, torch.optim.AdamW) and torch.cuda.is_available() and not opt.state:
            for group in opt.param_groups:
                group.update(fused=True, foreach=False)
            opt._step_supports_amp_scaling = True
            kinds.add("torch fused AdamW")
        else:
            kinds.add(f"{type(opt).__module__.split('.')[0]} {type(opt).__name__}")
    return ", ".join(sorted(kinds))


@contextlib.contextmanager
def params_synced(chunks: list[torch.nn.Module]):
    """Under --overlap-param-gather the updated parameters are gathered lazily by forward pre-hooks;
    evaluation and checkpoints need them now (Megatron-LM disables the hooks around both)."""
    overlapped = [c for c in chunks if getattr(getattr(c, "ddp_config", None), "overlap_param_gather", False)]
    for chunk in overlapped:
        chunk.disable_forward_pre_hook()  # param_sync=True: gathers and waits
    try:
        yield
    finally:
        for chunk in overlapped:
            chunk.enable_forward_pre_hook()


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def fusion_settings(
    a: PerformanceConfig, *, te_layers: bool, gated_linear_unit: bool, squared_relu: bool
) -> dict[str, bool]:
    """TransformerConfig fusion fields as Megatron-LM sets them on GPUs: each on unless its
    ``--no-...`` flag is given or this machine lacks the kernel (then off, and the log says so).
    Empty on CPU, where ``cpu_transformer_config_overrides`` turns them all off."""
    if not torch.cuda.is_available():
        return {}
    wanted_and_available = {
        # megatron's output layer (a ColumnParallelLinear even with TE layers) needs apex's kernel
        "gradient_accumulation_fusion": (a.gradient_accumulation_fusion, _importable("fused_weight_gradient_mlp_cuda")),
        # as Megatron-LM: SwiGLU's fused kernel, or bias-GELU's (off without linear biases, validate_args);
        # megatron-core fuses no other activation (squared ReLU)
        "bias_activation_fusion": (
            a.bias_swiglu_fusion if gated_linear_unit else a.bias_gelu_fusion,
            gated_linear_unit or not squared_relu,
        ),
        "bias_dropout_fusion": (a.bias_dropout_fusion, True),
        "apply_rope_fusion": (a.apply_rope_fusion, _importable("transformer_engine")),
        # only the local attention uses it; TE attention (flash / cuDNN fused) always fuses
        "masked_softmax_fusion": (a.masked_softmax_fusion, te_layers or _importable("scaled_masked_softmax_cuda")),
    }
    settings = {}
    for field, (wanted, available) in wanted_and_available.items():
        settings[field] = wanted and available
        if wanted and not available:
            logger.info("%s off: this machine lacks its kernel", field)
    return settings


def settle_gelu_approximation(model_cfg, fusions: dict[str, bool], *, resumed: bool) -> None:
    """megatron's fused bias-GELU kernel computes GELU's tanh approximation, its unfused MLP erf GELU.
    A fresh run records which one it computes (``model_cfg.gelu_approximation``: the export and a CPU
    evaluation follow it); a resumed run keeps its checkpoint's, turning the fusion off (one line) where
    the checkpoint computed erf."""
    block = BLOCKS[model_cfg.block]
    if block["activation"] != "gelu" or block["gated_linear_unit"] or model_cfg.squared_relu:
        return
    fused = fusions.get("bias_activation_fusion", False)
    if not resumed:
        model_cfg.gelu_approximation = "tanh" if fused else "none"
    elif fused and model_cfg.gelu_approximation == "none":
        fusions["bias_activation_fusion"] = False
        logger.info(
            "bias_activation_fusion off: the checkpoint's MLP computed erf GELU, the fused kernel computes "
            "its tanh approximation"
        )


def te_wgrad_fusion(a: PerformanceConfig, *, te_layers: bool) -> bool:
    """TE's ``fuse_wgrad_accumulation`` for the TE layers: their weight-gradient GEMM writes into
    megatron's FP32 ``main_grad`` (no apex needed, BF16 or FP32 inputs, so under autocast too).
    ``fusion_settings``' ``gradient_accumulation_fusion`` stays apex's, for megatron's own linear
    layers (the local layers and the output layer, which refuse it without apex's kernel)."""
    return torch.cuda.is_available() and te_layers and a.gradient_accumulation_fusion


# cuBLAS's and cuDNN's process-wide switch: "0" keeps every FP32 GEMM off TF32, whatever the caller
# asks for (TE's cuBLASLt compute type included). Read by the libraries, so it belongs in the
# environment the process starts with.
NVIDIA_TF32_OVERRIDE = "NVIDIA_TF32_OVERRIDE"
# Set by NGC PyTorch containers: torch's cuBLAS matmuls use TF32 whatever torch.backends says.
TORCH_TF32_OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def tf32_refusal(*, tf32: bool, fp32_gemms: bool, te_layers: bool, environ: Mapping[str, str]) -> str | None:
    """Why ``--no-tf32`` would not be honoured here, or None. Transformer Engine's GEMM
    (``common/gemm/cublaslt_gemm.cu``, 2.9 to 2.17) picks ``CUBLAS_COMPUTE_32F_FAST_TF32`` for every
    FP32 GEMM and reads neither torch's flag nor any NVTE_ variable; only cuBLAS's own
    ``NVIDIA_TF32_OVERRIDE=0`` turns it off. Under BF16 (``--bf16``, autocast) TE's GEMMs are not FP32."""
    if tf32 or not fp32_gemms or environ.get(NVIDIA_TF32_OVERRIDE) == "0":
        return None
    if te_layers:
        return (
            "--no-tf32 with Transformer Engine layers: TE's cuBLASLt GEMMs run FP32 in TF32 whatever torch's "
            "flag (TE has no switch); use --transformer-impl local (megatron-core's layers honour --no-tf32), "
            f"or launch with {NVIDIA_TF32_OVERRIDE}=0 in the environment (cuBLAS's process-wide TF32 off switch)"
        )
    if environ.get(TORCH_TF32_OVERRIDE, "0").lower() not in ("0", "", "false", "off", "no"):
        return (
            f"--no-tf32 but {TORCH_TF32_OVERRIDE}={environ[TORCH_TF32_OVERRIDE]} (NGC containers set it) turns "
            f"TF32 back on for torch's matmuls: unset it, or launch with {NVIDIA_TF32_OVERRIDE}=0"
        )
    return None


def configure_tf32(a: PerformanceConfig) -> bool:
    """Let FP32 matmuls and convolutions use TF32 tensor cores when ``--tf32`` is given (off by default,
    torch's matmul default; Megatron-LM has no TF32 flag). Returns it; False without CUDA."""
    if not torch.cuda.is_available():
        return False
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    return a.tf32
