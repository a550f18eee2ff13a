"""One entry point for the trainer: (train, valid) datasets for every dataset type."""

from __future__ import annotations

import logging
from typing import Any, Callable

from megatron_fixedcode.data.config import DataConfig
from megatron_fixedcode.data.document_window import DocumentWindowDataset
from megatron_fixedcode.data.gpt_blend import build_gpt_datasets
from megatron_fixedcode.data.sft import build_sft_datasets
from megatron_fixedcode.data.validate import check_recorded_tokenizer, check_shards

logger = logging.getLogger(__name__)

TRAIN_STREAM_ID = 0
VALID_STREAM_ID = 1


def check_data_shards(cfg: DataConfig, tokenizer: Any) -> None:
    """Every shard of the train and valid blends: ``.bin`` size matches its ``.idx``, the token
    dtype holds the vocabulary, and a shard indexed here was indexed with this tokenizer (index and
    summary reads only; see data/validate.py). Raises a ``ValueError`` naming the shard."""
    vocab_size = getattr(tokenizer, "vocab_size", None)
    for field, blend in (("data_path", cfg.blend), ("valid_data_path", cfg.valid_blend)):
        if blend is not None:
            check_shards(blend[0], None if vocab_size is None else int(vocab_size), field)
            check_recorded_tokenizer(blend[0], tokenizer, field)


def build_document_window_datasets(
    cfg: DataConfig,
    *,
    num_train_samples: int,
    num_valid_samples: int,
    seed: int,
    vocab_size: int | None = None,
) -> tuple[DocumentWindowDataset, DocumentWindowDataset | None]:
    """Train windows over `data_path`; valid windows over `valid_data_path` (own stream), if set."""
    train_ds = DocumentWindowDataset(
        cfg.blend[0],
        weights=cfg.blend[1],
        seq_length=cfg.seq_length,
        num_samples=num_train_samples,
        seed=seed,
        samples_per_shard_visit=cfg.samples_per_shard_visit,
        stream_id=TRAIN_STREAM_ID,
        mmap=cfg.mmap_bin_files,
        vocab_size=vocab_size,
    )
    valid_ds = None
    if cfg.valid_blend is not None and num_valid_samples > 0:
        valid_ds = DocumentWindowDataset(
            cfg.valid_blend[0],
            weights=cfg.valid_blend[1],
            seq_length=cfg.seq_length,
            num_samples=num_valid_samples,
            seed=seed,
            samples_per_shard_visit=cfg.samples_per_shard_visit,
            stream_id=VALID_STREAM_ID,
            mmap=cfg.mmap_bin_files,
            vocab_size=vocab_size,
        )
    elif num_valid_samples > 0:
        logger.warning("document_windows without valid_data_path: no validation dataset")
    return train_ds, valid_ds


def build_datasets(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    num_train_samples: int,
    num_valid_samples: int,
    seed: int,
    is_built_on_rank: Callable[[], bool] = lambda: True,
) -> tuple[Any, Any]:
    """(train, valid) for `cfg.dataset_type`; both yield dicts with the same tensor keys.

    `tokenizer` gives the GPT path its EOD/pad ids, and both its vocabulary size: every shard
    is checked first (``check_data_shards``), and every sample's ids as it is read.
    """
    if cfg.dataset_type == "sft":  # JSONL files, tokenised here with the run's tokenizer
        return build_sft_datasets(
            cfg, tokenizer, num_train_samples=num_train_samples, num_valid_samples=num_valid_samples, seed=seed
        )
    vocab_size = getattr(tokenizer, "vocab_size", None)
    check_data_shards(cfg, tokenizer)
    if cfg.dataset_type == "gpt":
        return build_gpt_datasets(
            cfg,
            tokenizer,
            num_train_samples=num_train_samples,
            num_valid_samples=num_valid_samples,
            seed=seed,
            is_built_on_rank=is_built_on_rank,
        )
    return build_document_window_datasets(
        cfg,
        num_train_samples=num_train_samples,
        num_valid_samples=num_valid_samples,
        seed=seed,
        vocab_size=None if vocab_size is None else int(vocab_size),
    )
