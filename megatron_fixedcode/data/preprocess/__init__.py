"""Corpus indexing: JSONL/Parquet -> megatron-core ``.bin/.idx`` with a document-level split."""

from megatron_fixedcode.data.preprocess.config import PreprocessConfig, output_prefix_for
from megatron_fixedcode.data.preprocess.encode import is_validation_document
from megatron_fixedcode.data.preprocess.inputs import SUFFIXES, expand_inputs
from megatron_fixedcode.data.preprocess.outputs import (
    AtomicIndexedOutputs,
    find_dataset_prefixes,
    merge_datasets,
)
from megatron_fixedcode.data.preprocess.pipeline import preprocess

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
