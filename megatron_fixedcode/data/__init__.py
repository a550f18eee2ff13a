"""Training data: megatron GPTDataset blends, paper-2 document windows and SFT records."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "build_datasets": "build",
    "build_document_window_datasets": "build",
    "DataConfig": "config",
    "parse_blend": "config",
    "samples_per_shard_visit": "config",
    "DocumentWindowDataset": "document_window",
    "WindowLocation": "document_window",
    "build_gpt_datasets": "gpt_blend",
    "SFTDataset": "sft",
    "build_sft_datasets": "sft",
    "locate_gpt_sample": "gpt_blend",
    "RankMicrobatchSampler": "sampler",
    "collate_samples": "sampler",
    "count_prediction_targets": "sampler",
    "fetch_microbatch": "sampler",
    "global_batch_indices": "sampler",
    "num_microbatches": "sampler",
    "rank_microbatch_indices": "sampler",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
