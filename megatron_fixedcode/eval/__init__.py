"""Evaluation: validation loss/perplexity of checkpoints and exports, the LM Evaluation Harness,
and per-model / across-seed reports."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "document_nll": "perplexity",
    "indexed_documents": "perplexity",
    "text_documents": "perplexity",
    "compare": "tables",
    "comparison_markdown": "tables",
    "model_markdown": "tables",
    "seed_summary": "tables",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "compare",
    "comparison_markdown",
    "document_nll",
    "indexed_documents",
    "model_markdown",
    "seed_summary",
    "text_documents",
]
