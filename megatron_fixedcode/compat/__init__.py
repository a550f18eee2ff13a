"""Compatibility layer: CPU/gloo runtime and the only access to megatron's parallel_state."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "apply_cpu_patches": "cpu",
    "cpu_transformer_config_overrides": "cpu",
    "ParallelLayout": "layout",
    "describe_runtime": "distributed",
    "destroy_distributed": "distributed",
    "initialize_distributed": "distributed",
    "parallel_ranks": "distributed",
    "runtime_device": "distributed",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ParallelLayout",
    "apply_cpu_patches",
    "cpu_transformer_config_overrides",
    "describe_runtime",
    "destroy_distributed",
    "initialize_distributed",
    "parallel_ranks",
    "runtime_device",
]
