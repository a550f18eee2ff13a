"""Corpus indexing: JSONL/Parquet -> megatron-core ``.bin/.idx`` with a document-level split."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "PreprocessConfig": "config",
    "output_prefix_for": "config",
    "is_validation_document": "encode",
    "SUFFIXES": "inputs",
    "expand_inputs": "inputs",
    "AtomicIndexedOutputs": "outputs",
    "find_dataset_prefixes": "outputs",
    "merge_datasets": "outputs",
    "preprocess": "pipeline",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "SUFFIXES",
    "AtomicIndexedOutputs",
    "PreprocessConfig",
    "expand_inputs",
    "find_dataset_prefixes",
    "is_validation_document",
    "merge_datasets",
    "output_prefix_for",
    "preprocess",
]
