"""Checks of the machine against the flags, before anything is built: what this runtime can run (what
does not depend on the machine is refused at parse time: ``arguments/refusals.py``).

Pure decisions on the parsed flags and what torch sees; a refusal is a ``ValueError`` (one line on
rank 0, exit code 2)."""

from __future__ import annotations

import os

import torch

from megatron_fixedcode.models.builder import transformer_engine_available
from megatron_fixedcode.models.config import ModelConfig
from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.training.gpu_features import check_gpu_features
from megatron_fixedcode.training.metrics import require_logging_backends
from megatron_fixedcode.recovery.rerun import check_rerun_flags
from megatron_fixedcode.training.profiling import cuda_refusal

REQUIRE_CUDA_ENV = "MFC_REQUIRE_CUDA"
NO_GPU_UNDER_LAUNCHER = (
    f"{REQUIRE_CUDA_ENV}=1 (set by the Slurm launchers) but torch sees no CUDA GPU on this node "
    "(check the allocation's --gpus and CUDA_VISIBLE_DEVICES, and that torch is a CUDA build); "
    "refusing to train on the CPU"
)


def check_runtime(cfg: PretrainConfig) -> None:
    if os.environ.get(REQUIRE_CUDA_ENV) == "1" and not torch.cuda.is_available():
        raise ValueError(NO_GPU_UNDER_LAUNCHER)
    check_gpu_features(cfg.performance)  # first: its message says what to install
    require_logging_backends(cfg.logging)
    check_rerun_flags(cfg.health)
    if (refusal := cuda_refusal(cfg.watch)) is not None:  # --profile (nsys), --record-memory-history
        raise ValueError(refusal)


def check_model_runtime(model_cfg: ModelConfig) -> None:
    """The model's fields this machine cannot run (after :func:`check_runtime`, once the vocabulary is known)."""
    if model_cfg.layernorm_zero_centered_gamma and not transformer_engine_available():
        raise ValueError(
            "--apply-layernorm-1p needs Transformer Engine layers (megatron-core's local norms do not "
            "support it), and this machine has no CUDA GPU with Transformer Engine: drop the flag here"
        )
    if torch.cuda.is_available() and model_cfg.code_kernel == "fused":
        raise ValueError("--code-kernel fused is the CPU kernel; on GPUs use auto or torch (the ids are on the GPU)")
