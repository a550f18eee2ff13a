"""Megatron GPTDataset blends: `--data-path 0.8 A 0.2 B` through BlendedMegatronDatasetBuilder.

Samples are megatron-core's own (packed across documents, shuffled by megatron's
seeded indices); we only choose the config knobs so that all seq_length positions
count: no position/attention resets, no EOD loss masking, no materialised mask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import Split

from megatron_fixedcode.data.config import DataConfig
from megatron_fixedcode.data.validate import check_token_ids
from megatron_fixedcode.tokenizers.base import register_with_megatron
from megatron_fixedcode.utils.files import indexed_dataset_fingerprint

register_with_megatron()  # our tokenizers go into GPTDatasetConfig.tokenizer

logger = logging.getLogger(__name__)

Blend = tuple[list[str], list[float] | None]

# megatron.core.datasets.megatron_dataset._PAD_TOKEN_ID: an id never present in the data.
_NO_PAD_ID = -1


class MegatronTokenizerView:
    """The few tokenizer attributes megatron's datasets read, plus a cache identity.

    Megatron hashes `tokenizer.unique_identifiers` into its index-cache key, and masks
    labels equal to `pad`; a pad that is missing or shared with EOD/BOS must not mask
    real tokens, so it maps to an id that never occurs.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.vocab_size = int(tokenizer.vocab_size)
        self.eod = int(tokenizer.eod)
        pad = getattr(tokenizer, "pad", None)
        bos = getattr(tokenizer, "bos", None)
        self.pad = _NO_PAD_ID if pad is None or pad in (self.eod, bos) else int(pad)
        self.unique_identifiers = {
            "class": type(tokenizer).__name__,
            "vocab_size": self.vocab_size,
            "eod": self.eod,
            "pad": self.pad,
            "fingerprint": str(getattr(tokenizer, "fingerprint", "")),
        }


class _Lengths:
    """Sequence lengths per prefix; datasets stay open since the arrays view their mmaps."""

    def __init__(self) -> None:
        self._opened: dict[str, IndexedDataset] = {}

    def __call__(self, prefix: str, field_name: str) -> Any:
        if prefix not in self._opened:
            if not IndexedDataset.exists(prefix):
                raise ValueError(f"{field_name}: no {prefix}.bin/.idx")
            self._opened[prefix] = IndexedDataset(prefix, mmap=False)
        return self._opened[prefix].sequence_lengths


def _weighted_by_tokens(blend: Blend, lengths: _Lengths, field_name: str) -> Blend:
    """Megatron stops an unweighted multi-prefix blend after one epoch (then IndexError);
    weights equal to the prefixes' token counts keep its proportions and allow more epochs."""
    prefixes, weights = blend
    if weights is not None or len(prefixes) == 1:
        return blend
    return prefixes, [float(lengths(p, field_name).sum(dtype=numpy.int64)) for p in prefixes]


class CheckedGPTDataset(GPTDataset):
    """megatron's GPTDataset whose every sample's token ids are checked against the vocabulary
    (a named error instead of an ``IndexError`` in a learned embedding; see data/validate.py)."""

    def _query_document_sample_shuffle_indices(self, idx):
        # (text, document_ids) on megatron-core 0.16; 0.19 appends the documents' lengths
        out = super()._query_document_sample_shuffle_indices(idx)
        text, document_ids = out[0], out[1]
        check_token_ids(
            text,
            getattr(self.config.tokenizer, "vocab_size", None),
            lambda: f"{self.dataset.path_prefix} (documents {[int(d) for d in document_ids]}, sample {idx})",
        )
        return out


def gpt_dataset_config(cfg: DataConfig, tokenizer: Any, seed: int) -> GPTDatasetConfig:
    """The GPTDatasetConfig for `cfg`: every position is a prediction target."""
    knobs = dict(
        random_seed=seed,
        sequence_length=cfg.seq_length,
        path_to_cache=cfg.cache_path,
        mmap_bin_files=cfg.mmap_bin_files,
        num_dataset_builder_threads=cfg.num_dataset_builder_threads,
        tokenizer=MegatronTokenizerView(tokenizer),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    if cfg.mock:  # no blend: megatron-core sets mock and its even split "1,1,1" itself
        return GPTDatasetConfig(blend=None, blend_per_split=None, split=None, **knobs)
    lengths = _Lengths()
    blend = _weighted_by_tokens(cfg.blend, lengths, "data_path")
    if cfg.valid_blend is not None:
        valid_blend = _weighted_by_tokens(cfg.valid_blend, lengths, "valid_data_path")
        blends = {"blend_per_split": [blend, valid_blend, None], "split": None}
    else:
        blends = {"blend": blend, "split": cfg.split}
    config = GPTDatasetConfig(**knobs, **blends)
    _check_splits_not_empty(config, lengths)
    # megatron's index-cache key holds paths, seed, lengths and the tokenizer, nothing of the data:
    # the shards' fingerprint joins it, so a prefix re-indexed with another corpus builds a new index
    prefixes = [*blend[0], *(cfg.valid_blend[0] if cfg.valid_blend is not None else [])]
    config.tokenizer.unique_identifiers["data_fingerprint"] = indexed_dataset_fingerprint(prefixes)
    return config


def build_gpt_datasets(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    num_train_samples: int,
    num_valid_samples: int,
    seed: int,
    is_built_on_rank: Callable[[], bool] = lambda: True,
) -> tuple[Any, Any]:
    """(train, valid) megatron datasets for the blend(s) in `cfg`; valid may be None.

    Must be called on all ranks when torch.distributed is initialised (megatron builds
    the index cache on rank 0 and barriers). The train stream depends on
    `num_train_samples` (megatron sizes its shuffle and blend indices from it), so a
    resumed run must pass the same value.
    """
    if cfg.dataset_type != "gpt":
        raise ValueError(f"dataset_type: build_gpt_datasets needs 'gpt', got {cfg.dataset_type!r}")
    if num_train_samples <= 0:
        raise ValueError(f"num_train_samples: must be positive, got {num_train_samples}")
    if num_valid_samples < 0:
        raise ValueError(f"num_valid_samples: must be >= 0, got {num_valid_samples}")
    config = gpt_dataset_config(cfg, tokenizer, seed)
    builder = BlendedMegatronDatasetBuilder(
        MockGPTDataset if cfg.mock else CheckedGPTDataset,
        [num_train_samples, num_valid_samples, 0],
        is_built_on_rank,
        config,
    )
    train_ds, valid_ds, _ = builder.build()
    if valid_ds is not None and len(valid_ds) == 0:
        valid_ds = None
    logger.info(
        "GPT datasets: train=%s valid=%s",
        None if train_ds is None else len(train_ds),
        None if valid_ds is None else len(valid_ds),
    )
    return train_ds, valid_ds


def _check_splits_not_empty(config: GPTDatasetConfig, lengths: _Lengths) -> None:
    """Megatron loops forever sizing a split that holds no tokens; name the cause instead."""
    if config.blend_per_split is not None:
        fields = ("data_path", "valid_data_path")
        checks = [
            (prefix, (0.0, 1.0), name)
            for blend, name in zip(config.blend_per_split, fields)
            if blend is not None
            for prefix in blend[0]
        ]
    else:
        checks = [
            (prefix, bounds, Split(i).name)
            for prefix in config.blend[0]
            for i, bounds in enumerate(config.split_matrix)
            if bounds is not None
        ]
    for prefix, (lo, hi), name in checks:
        seq_lengths = lengths(prefix, "data_path" if name != "valid_data_path" else name)
        num_seqs = len(seq_lengths)
        beg, end = int(round(lo * num_seqs)), int(round(hi * num_seqs))
        if int(seq_lengths[beg:end].sum(dtype=numpy.int64)) == 0:
            if config.blend_per_split is not None:  # no --split in play: the shard itself is empty
                raise ValueError(
                    f"{name} {prefix}: its {num_seqs} sequences hold no tokens; leave it out "
                    "or re-index it from a non-empty input"
                )
            raise ValueError(
                f"split: the {name} part of {prefix} ({end - beg} of {num_seqs} sequences) "
                "has no tokens; change --split or give --valid-data-path"
            )


@dataclass(frozen=True, kw_only=True)
class GptSampleLocation:
    """Where a GPTDataset sample came from (megatron's 'documents' are IndexedDataset sequences)."""

    shard: str
    documents: list[int]
    start: int


def locate_gpt_sample(dataset: Any, index: int) -> GptSampleLocation:
    """Follow megatron's blend, shuffle and sample indices back to shard/document/offset."""
    if isinstance(dataset, BlendedDataset):
        sub = dataset.datasets[int(dataset.dataset_index[index])]
        index = int(dataset.dataset_sample_index[index])
    else:
        sub = dataset
    if not isinstance(sub, GPTDataset):
        raise TypeError(f"expected a GPTDataset or BlendedDataset, got {type(sub).__name__}")
    if sub.shuffle_index is None:
        sub._query_document_sample_shuffle_indices(0)  # loads megatron's deferred index mmaps
    shuffled = int(sub.shuffle_index[index])
    doc_beg, offset = (int(x) for x in sub.sample_index[shuffled])
    doc_end = int(sub.sample_index[shuffled + 1][0])
    documents = [int(d) for d in sub.document_index[doc_beg : doc_end + 1]]
    return GptSampleLocation(shard=sub.dataset.path_prefix, documents=documents, start=offset)
