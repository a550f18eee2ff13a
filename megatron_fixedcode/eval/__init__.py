"""Evaluation: validation loss/perplexity of checkpoints and exports, the LM Evaluation Harness,
and per-model / across-seed reports."""
from megatron_fixedcode.eval.perplexity import document_nll, indexed_documents, text_documents
from megatron_fixedcode.eval.report import compare, comparison_markdown, model_markdown, seed_summary

__all__ = ["compare", "comparison_markdown", "document_nll", "indexed_documents", "model_markdown",
           "seed_summary", "text_documents"]
