"""Compatibility layer: CPU/gloo runtime and the only access to megatron's parallel_state."""
from megatron_fixedcode.compat.cpu import apply_cpu_patches, cpu_transformer_config_overrides
from megatron_fixedcode.compat.distributed import (
    ParallelLayout,
    describe_runtime,
    destroy_distributed,
    initialize_distributed,
    parallel_ranks,
    runtime_device,
)

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
