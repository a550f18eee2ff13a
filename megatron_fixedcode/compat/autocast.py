"""FP32 parameters under BF16 autocast (``--precision fp32-autocast-bf16``, paper 2's mode).

megatron-core has the switch (``TransformerConfig.enable_autocast`` / ``autocast_dtype``: its
pipeline schedules wrap the forward step in ``torch.autocast("cuda")``) but two gaps, closed here:

* activation recompute (``tensor_parallel.checkpoint``) re-runs the forward in backward outside
  any autocast context, so the recomputed activations would be FP32 where the forward's were
  BF16; :func:`patch_recompute_replays_autocast` makes the recompute re-enter the forward's state;
* its linear layers' autograd Functions replay autocast for device type "cuda" only, so on the
  CPU their backward multiplies a BF16 gradient by an FP32 weight; :func:`patch_linear_autocast_for_cpu`
  re-decorates them for "cpu" (CPU runs only; on GPUs megatron's own decorators are right).
"""

from __future__ import annotations

import contextlib
import functools

import torch

_DEVICE_TYPES = ("cpu", "cuda")


def forward_autocast(config, device: torch.device):
    """The autocast context of one forward step: the model config's ``enable_autocast``, on the
    device the batch lives on (megatron's schedule enters the "cuda" one itself; nesting is a no-op)."""
    if not getattr(config, "enable_autocast", False):
        return contextlib.nullcontext()
    patch_recompute_replays_autocast()
    return torch.autocast(device.type, dtype=config.autocast_dtype)


def _replaying_autocast(function):
    states = [(dev, torch.get_autocast_dtype(dev)) for dev in _DEVICE_TYPES if torch.is_autocast_enabled(dev)]
    if not states:
        return function

    @functools.wraps(function)
    def run(*args):
        with contextlib.ExitStack() as stack:
            for dev, dtype in states:
                stack.enter_context(torch.autocast(dev, dtype=dtype))
            return function(*args)

    return run


def patch_recompute_replays_autocast() -> None:
    """megatron's CheckpointFunction re-runs ``run_function`` under the autocast state of its forward."""
    from megatron.core.tensor_parallel.random import CheckpointFunction

    if getattr(CheckpointFunction, "_fixedcode_replays_autocast", False):
        return
    original = CheckpointFunction.forward

    def forward(ctx, run_function, distribute_saved_activations, *args):
        return original(ctx, _replaying_autocast(run_function), distribute_saved_activations, *args)

    CheckpointFunction.forward = staticmethod(forward)
    CheckpointFunction._fixedcode_replays_autocast = True


def patch_linear_autocast_for_cpu() -> None:
    """On CPU: megatron's linear autograd Functions record and replay the CPU autocast state."""
    from megatron.core.tensor_parallel import layers

    for name in ("LinearWithGradAccumulationAndAsyncCommunication", "LinearWithFrozenWeight"):
        cls = getattr(layers, name, None)
        if cls is None or getattr(cls, "_fixedcode_cpu_autocast", False):
            continue
        fwd, bwd = cls.forward, cls.backward
        fwd, bwd = getattr(fwd, "__wrapped__", fwd), getattr(bwd, "__wrapped__", bwd)  # drop the "cuda" decorators
        cls.forward = staticmethod(torch.amp.custom_fwd(fwd, device_type="cpu"))
        cls.backward = staticmethod(torch.amp.custom_bwd(bwd, device_type="cpu"))
        cls._fixedcode_cpu_autocast = True


def _residual_dtype_bda(bda):
    """megatron's bias-dropout-add casts the residual to the sublayer output's dtype (BF16 under
    autocast, "to keep pipeline communication in one dtype"); PyTorch's own rule, which the paper
    follows, promotes: FP32 residual + BF16 output = FP32. Cast the output up instead."""

    @functools.wraps(bda)
    def factory(training, fused):
        add = bda(training, fused)

        def run(x_with_bias, residual, prob):
            x, bias = x_with_bias
            if x.dtype != residual.dtype:
                x = x.to(residual.dtype)
                bias = None if bias is None else bias.to(residual.dtype)
            return add((x, bias), residual, prob)

        return run

    return factory


def keep_residual_stream_fp32(model: torch.nn.Module) -> None:
    """Under autocast: every transformer layer adds its sublayer outputs to the FP32 residual in FP32."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    for module in model.modules():
        if isinstance(module, TransformerLayer):
            for name in ("self_attn_bda", "mlp_bda"):
                bda = getattr(module, name, None)
                if callable(bda) and not getattr(bda, "_fixedcode_fp32_residual", False):
                    wrapped = _residual_dtype_bda(bda)
                    wrapped._fixedcode_fp32_residual = True
                    setattr(module, name, wrapped)
