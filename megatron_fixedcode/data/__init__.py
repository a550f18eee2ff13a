"""Training data: megatron GPTDataset blends, paper-2 document windows and SFT records."""

from megatron_fixedcode.data.build import build_datasets, build_document_window_datasets
from megatron_fixedcode.data.config import DataConfig, parse_blend, samples_per_shard_visit
from megatron_fixedcode.data.document_window import DocumentWindowDataset, WindowLocation
from megatron_fixedcode.data.gpt_blend import build_gpt_datasets, locate_gpt_sample
from megatron_fixedcode.data.sft import SFTDataset, build_sft_datasets
from megatron_fixedcode.data.sampler import (
    RankMicrobatchSampler,
    collate_samples,
    count_prediction_targets,
    fetch_microbatch,
    global_batch_indices,
    num_microbatches,
    rank_microbatch_indices,
)

__all__ = [
    "DataConfig",
    "DocumentWindowDataset",
    "RankMicrobatchSampler",
    "SFTDataset",
    "WindowLocation",
    "build_datasets",
    "build_document_window_datasets",
    "build_gpt_datasets",
    "build_sft_datasets",
    "collate_samples",
    "count_prediction_targets",
    "fetch_microbatch",
    "global_batch_indices",
    "locate_gpt_sample",
    "num_microbatches",
    "parse_blend",
    "rank_microbatch_indices",
    "samples_per_shard_visit",
]
