"""megatron-core's distributed optimizer over torch's Adam (neither Transformer Engine nor apex
installed: the CPU runtime, and GPU machines without them), on any device.

megatron keeps Adam's ``step`` in the param groups when TE's or apex's fused Adam runs; torch's
Adam keeps it per parameter, and two of megatron's paths miss that (0.16 and 0.19 alike). Each
patch below says in one line why; :func:`apply_torch_adam_patches` applies them once, and only
when megatron found neither TE nor apex.
"""

from __future__ import annotations

import functools

import torch

_APPLIED = False
# The distributed optimizer's loaders of checkpointed state (one per format).
_STATE_LOADERS = (
    "load_parameter_state_from_fully_reshardable",
    "load_parameter_state_from_dp_reshardable",
    "load_parameter_state_from_fs_model_space",
    "load_parameter_state_from_dp_zero",
)


def _materialize_state_before_first_step(state_dict):
    """state_dict() asserts one ``step`` over torch Adam's per-parameter state, which torch only
    creates at the first step: before it (a resume builds its load template then), create the
    state as torch would, zeros, for the checkpoint's values to overwrite."""

    @functools.wraps(state_dict)
    def wrapped(self):
        inner = self.optimizer
        if isinstance(inner, torch.optim.Optimizer):
            for group in inner.param_groups:
                on_device = group.get("fused") or group.get("capturable")
                for p in group["params"]:
                    if not inner.state[p]:
                        inner.state[p] = {
                            "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                            "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": torch.zeros_like(p),
                        }
        return state_dict(self)

    return wrapped


def _step_set_aside(load):
    """The loaders copy every tensor of a parameter's Adam state from the checkpoint's record of
    it, which holds no ``step`` (megatron restored it from the param groups just before): the
    step is set aside while they run, and put back as one tensor per parameter — megatron gives
    every parameter the same step tensor, which torch's Adam, advancing each parameter's step in
    place, would then advance once per parameter. They run under ``no_grad``: they write into
    the (leaf) main parameters, and the dp_reshardable one does not say so itself."""

    @functools.wraps(load)
    def wrapped(self, *args, **kwargs):
        steps = {p: s.pop("step") for p, s in self.optimizer.state.items() if "step" in s}
        try:
            with torch.no_grad():  # they copy into the main parameters (not all of them say no_grad)
                return load(self, *args, **kwargs)
        finally:
            for p, step in steps.items():
                self.optimizer.state[p]["step"] = step.clone()

    return wrapped


def apply_torch_adam_patches() -> bool:
    """Patch megatron's DistributedOptimizer for torch's Adam; True if applied (now or before)."""
    global _APPLIED
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return False
    if _APPLIED:
        return True
    cls = distrib_optimizer.DistributedOptimizer
    # A load before the first step reads the state of torch's Adam: create it (zeros) first.
    cls.state_dict = _materialize_state_before_first_step(cls.state_dict)
    # Loading copies each state tensor from the checkpoint, whose record has no per-parameter step;
    # and the step megatron restores is one tensor shared by every parameter.
    for name in _STATE_LOADERS:
        if hasattr(cls, name):
            setattr(cls, name, _step_set_aside(getattr(cls, name)))
    _APPLIED = True
    return True
