"""Analysis of trained models on CPU: activation statistics by token across depth, layer ablation,
activation patching and linear probes (``tools/analyze_model.py``; docs/analysis.md)."""
from megatron_fixedcode.analysis.hooks import hidden_states, next_token_nll, patch_site, skip_block
from megatron_fixedcode.analysis.interventions import activation_patching, layer_ablation
from megatron_fixedcode.analysis.probes import probe_accuracy, ridge_fit
from megatron_fixedcode.analysis.stats import activation_stats

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
