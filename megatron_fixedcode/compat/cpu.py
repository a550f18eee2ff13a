"""Run megatron-core on CPU with gloo: the only place that patches megatron-core for the CPU
(``compat/torch_adam.py`` patches its distributed optimizer over torch's Adam, on any device).

Every patch below is applied once, only when CUDA is unavailable, and says in one line why.
On a GPU machine :func:`apply_cpu_patches` does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import logging

import torch
from packaging.version import Version

logger = logging.getLogger(__name__)
_APPLIED = False

# Modules that create tensors with a literal device="cuda".
_MODULES_WITH_CUDA_LITERALS = (
    "megatron.core.transformer.utils",  # get_default_causal_mask
    "megatron.core.pipeline_parallel.schedules",  # total_num_tokens counters
    "megatron.core.optimizer.optimizer",  # found_inf / scale scalars
    "megatron.core.optimizer.clip_grads",  # grad-norm scalars
    "megatron.core.optimizer.grad_scaler",  # loss-scale scalars
    "megatron.core.utils",  # local_multi_tensor_l2_norm result
    "megatron.core.dist_checkpointing.exchange_utils",  # empty tensors of the fully parallel load's exchange
)


class _CpuTorch:
    """A view of ``torch`` whose tensor factories put ``device="cuda"`` tensors on the CPU."""

    _FACTORIES = {
        "tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "randn",
        "rand",
    }

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name not in self._FACTORIES:
            return attr

        def factory(*args, **kwargs):
            device = kwargs.get("device")
            if device is not None and "cuda" in str(device):
                kwargs["device"] = "cpu"
            return attr(*args, **kwargs)

        return factory


class _NullStream:
    """Stands in for a CUDA stream on CPU: work is already done when the call returns."""

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        return event

    def synchronize(self):
        pass


def _cuda_with(**overrides):
    """``torch.cuda`` with ``overrides`` in place of some of its functions."""

    class _Cuda:
        def __getattr__(self, name):
            return getattr(torch.cuda, name)

    for name, fn in overrides.items():
        setattr(_Cuda, name, staticmethod(fn))
    return _Cuda()


class _CpuStreamTorch(_CpuTorch):
    """:class:`_CpuTorch` whose ``torch.cuda.current_stream()`` is a :class:`_NullStream`."""

    cuda = _cuda_with(current_stream=lambda *args, **kwargs: _NullStream())


class _CpuRngTorch(_CpuTorch):
    """:class:`_CpuTorch` with no CUDA generator: ``torch.cuda.get_rng_state()`` is None, setting it does nothing."""

    cuda = _cuda_with(get_rng_state=lambda *args, **kwargs: None, set_rng_state=lambda *args, **kwargs: None)


def _mcore_version() -> Version:
    import megatron.core

    return Version(megatron.core.__version__)


class _FusedCpuAdamTorch:
    """A view of ``torch`` whose ``optim.Adam``/``optim.AdamW`` default to ``fused=True``."""

    def __init__(self):
        import functools
        import types

        self.optim = types.SimpleNamespace(
            **{
                **vars(torch.optim),
                "Adam": functools.partial(torch.optim.Adam, fused=True),
                "AdamW": functools.partial(torch.optim.AdamW, fused=True),
            }
        )

    def __getattr__(self, name):
        return getattr(torch, name)


def _cpu_rng_tracker_class():
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class CpuRNGStatesTracker(CudaRNGStatesTracker):
        """Megatron's named RNG streams, kept as CPU generator states."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer_state = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer_state)

    return CpuRNGStatesTracker


def _sequence_parallel_torch_norm(original_new):
    """WrappedTorchNorm.__new__ that accepts sequence parallelism (see apply_cpu_patches)."""

    def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
        sequence_parallel = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original_new(cls, config, hidden_size, eps, **kwargs)
        finally:
            config.sequence_parallel = sequence_parallel
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel
        return norm

    return __new__


def _clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron's clip_grad_by_total_norm_fp32 minus its 'torch.cuda.FloatTensor' assertion."""
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


# megatron methods that treat every tensor as a CUDA tensor: they compare ``Tensor.type()`` with
# 'torch.cuda.*Tensor' names (the optimizers sort parameters by it, and refuse others) or move
# tensors with ``.cuda()`` before a collective (gathers of the distributed optimizer's state, the
# fully parallel load's exchange, local checkpoints' too, the tied table's first all-reduce between pipeline stages). They
# run under :func:`_tensors_act_as_cuda`.
_METHODS_ASSUMING_CUDA_TENSORS = (
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "__init__"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "get_parameter_state_dp_zero"),
    ("megatron.core.optimizer.optimizer", "Float16OptimizerWithFloat16Params", "__init__"),
    ("megatron.core.dist_checkpointing.strategies.fully_parallel", "FullyParallelLoadStrategyWrapper", "load"),
    ("megatron.core.dist_checkpointing.tensor_aware_state_dict", "MCoreTensorAwareStateDict", "to_state_dict"),
    (
        "megatron.core.models.common.language_module.language_module",
        "LanguageModule",
        "setup_embeddings_and_output_layer",
    ),
)


@contextlib.contextmanager
def _tensors_act_as_cuda():
    """While active, a CPU tensor's ``type()`` answers with its CUDA name ('torch.cuda.FloatTensor')
    and its ``cuda()`` returns it as it is (gloo reduces CPU tensors)."""
    cpu_type, cpu_cuda = torch.Tensor.type, torch.Tensor.cuda

    def cuda_named_type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            return cpu_type(self).replace("torch.", "torch.cuda.", 1)
        return cpu_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = cuda_named_type
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.type, torch.Tensor.cuda = cpu_type, cpu_cuda


def _under_tensors_act_as_cuda(method):
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with _tensors_act_as_cuda():
            return method(*args, **kwargs)

    return wrapped


def _logits_max_without_argmax(vocab_parallel_logits: torch.Tensor):
    """megatron's VocabParallelCrossEntropy.calculate_logits_max with amax for max(dim)[0]."""
    vocab_parallel_logits = vocab_parallel_logits.float()
    return vocab_parallel_logits, torch.amax(vocab_parallel_logits, dim=-1)


def keep_freed_memory_for_reuse() -> bool:
    """Make glibc malloc keep freed blocks in the heap, as CUDA's caching allocator does on GPUs.

    By default glibc serves blocks of >= 32 MiB (activations, logits, a V×H gradient) with a fresh
    mmap and unmaps them on free, so every step page-faults them in again: writing a new 64 MiB
    tensor then costs ~10x writing it into memory the process already holds. Returns True if set
    (False where the C library has no ``mallopt``, e.g. macOS)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def apply_cpu_patches() -> bool:
    """Make megatron-core's CUDA assumptions hold on a CPU-only machine. Returns True if applied."""
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    import megatron.core.optimizer as mcore_optimizer_package
    from megatron.core.optimizer import optimizer as mcore_optimizer
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy
    from megatron.core.transformer import torch_norm

    # Reuse freed activation memory instead of page-faulting it in afresh every step.
    keep_freed_memory_for_reuse()
    # Megatron allocates on torch.cuda.current_device() (rotary, p2p, grad buffers): use the CPU.
    torch.cuda.current_device = lambda: "cpu"
    # p2p communication synchronizes the CUDA stream after batched isend/irecv; nothing to wait for.
    torch.cuda.synchronize = lambda *args, **kwargs: None
    # Literal device="cuda" tensor factories in these modules create CPU tensors instead.
    for name in _MODULES_WITH_CUDA_LITERALS:
        importlib.import_module(name).torch = _CpuTorch()
    # The rerun state machine: validation scalars, and the CUDA generator saved next to the CPU one before a re-run.
    importlib.import_module("megatron.core.rerun_state_machine").torch = _CpuRngTorch()
    if _mcore_version() >= Version("0.19"):
        # 0.19: start_grad_sync waits on torch.cuda.current_stream() for CUDA-graph grads; no streams on CPU.
        importlib.import_module("megatron.core.distributed.param_and_grad_buffer").torch = _CpuStreamTorch()
    # The RNG tracker stores torch.cuda generator states; keep CPU generator states instead.
    mcore_random._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
    mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mcore_random.initialize_rng_tracker = lambda *args, **kwargs: None
    # Activation recompute saves/restores the CUDA generator next to the CPU one; CPU is all there is.
    mcore_random._get_cuda_rng_state = lambda *args, **kwargs: None
    mcore_random._set_cuda_rng_state = lambda *args, **kwargs: None
    # WrappedTorchNorm refuses sequence parallelism; its parameters only need the
    # `sequence_parallel` tag so finalize_model_grads all-reduces their gradients.
    torch_norm.WrappedTorchNorm.__new__ = _sequence_parallel_torch_norm(torch_norm.WrappedTorchNorm.__new__)
    # These methods compare Tensor.type() with CUDA names or call .cuda(): CPU tensors act as CUDA ones there.
    for module, cls, method in _METHODS_ASSUMING_CUDA_TENSORS:
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, method, _under_tensors_act_as_cuda(getattr(owner, method)))
    # Gradient clipping asserts grad.type() == 'torch.cuda.FloatTensor'; clip CPU grads the same way.
    mcore_optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu
    # Without TE/apex megatron builds torch.optim.AdamW with its defaults, the per-parameter for-loop
    # path on CPU; torch's fused CPU kernel is ~4x faster (equal up to rounding, ~1 ulp).
    mcore_optimizer_package.torch = _FusedCpuAdamTorch()
    # The cross entropy's max(dim=-1) also computes an argmax it discards: amax gives the same
    # values ~5x faster on CPU (the logits are the biggest tensor of a small model's step).
    VocabParallelCrossEntropy.calculate_logits_max = staticmethod(_logits_max_without_argmax)
    # --precision fp32-autocast-bf16 on CPU: the linear layers' backward replays the CPU autocast.
    from megatron_fixedcode.compat.autocast import patch_linear_autocast_for_cpu

    patch_linear_autocast_for_cpu()
    _APPLIED = True
    logger.debug("megatron-core CPU patches applied")
    return True


def cpu_transformer_config_overrides() -> dict:
    """TransformerConfig fields that megatron-core needs on CPU (no fused kernels, no streams)."""
    return {
        "use_cpu_initialization": True,
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        # gloo has no grouped p2p: a batched send+recv to the same peer (PP=2, interleaved) can pair
        # the wrong messages; megatron's unbatched path orders them by rank parity instead.
        "batch_p2p_comm": False,
    }
