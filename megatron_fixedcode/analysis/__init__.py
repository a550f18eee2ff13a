"""Analysis of trained models on CPU: activation statistics by token across depth, layer ablation,
activation patching and linear probes (``tools/analyze_model.py``; docs/analysis.md)."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "hidden_states": "hooks",
    "next_token_nll": "hooks",
    "patch_site": "hooks",
    "skip_block": "hooks",
    "activation_patching": "interventions",
    "layer_ablation": "interventions",
    "probe_accuracy": "probes",
    "ridge_fit": "probes",
    "activation_stats": "stats",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "activation_patching",
    "activation_stats",
    "hidden_states",
    "layer_ablation",
    "next_token_nll",
    "patch_site",
    "probe_accuracy",
    "ridge_fit",
    "skip_block",
]
