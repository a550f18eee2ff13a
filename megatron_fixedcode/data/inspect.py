"""What the model saw at step N: shard, document, window start and text of every sample."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import torch

from megatron_fixedcode.data.build import build_datasets
from megatron_fixedcode.data.config import DataConfig
from megatron_fixedcode.data.document_window import DocumentWindowDataset
from megatron_fixedcode.data.gpt_blend import locate_gpt_sample
from megatron_fixedcode.data.sampler import global_batch_indices

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SampleRecord:
    """One sample of a global batch; `token_ids` is the whole seq_length + 1 window."""

    index: int
    shard: str
    documents: list[int]
    start: int
    num_targets: int
    token_ids: list[int]
    text: str

    def as_dict(self, with_token_ids: bool = False) -> dict[str, Any]:
        record = asdict(self)
        if not with_token_ids:
            record.pop("token_ids")
        return record


def ensure_process_group() -> None:
    """A world-size-1 gloo group, for megatron's dataset code in a standalone tool."""
    if torch.distributed.is_initialized():
        return
    store = os.path.join(tempfile.mkdtemp(prefix="mfc_pg_"), "store")
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", world_size=1, rank=0)


def describe_samples(
    dataset: Any, indices: list[int], tokenizer: Any = None, max_chars: int = 200
) -> list[SampleRecord]:
    """Records for `indices` of a DocumentWindowDataset or megatron GPT/Blended dataset."""
    records = []
    for index in indices:
        sample = dataset[index]
        window = torch.cat([sample["tokens"], sample["labels"][-1:]]).tolist()
        if isinstance(dataset, DocumentWindowDataset):
            loc = dataset.locate(index)
            shard, documents, start = loc.prefix, [loc.document], loc.start
        else:
            loc = locate_gpt_sample(dataset, index)
            shard, documents, start = loc.shard, loc.documents, loc.start
        text = "" if tokenizer is None else tokenizer.detokenize(window)
        records.append(
            SampleRecord(
                index=index,
                shard=shard,
                documents=documents,
                start=start,
                num_targets=int((sample["loss_mask"] > 0).sum()),
                token_ids=window,
                text=text[:max_chars],
            )
        )
    return records


def inspect_global_batch(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    step: int,
    global_batch_size: int,
    seed: int,
    num_train_samples: int | None = None,
    max_chars: int = 200,
) -> list[SampleRecord]:
    """Records of every sample of global batch `step`.

    GPT path: megatron's shuffle depends on the run's total train samples, so pass the
    run's `num_train_samples`; document windows do not depend on it.
    """
    indices = global_batch_indices(step, global_batch_size)
    if num_train_samples is None:
        num_train_samples = indices[-1] + 1
    if num_train_samples <= indices[-1]:
        raise ValueError(f"num_train_samples: {num_train_samples} does not cover step {step}")
    if cfg.dataset_type == "gpt":
        ensure_process_group()
    train_ds, _ = build_datasets(cfg, tokenizer, num_train_samples=num_train_samples, num_valid_samples=0, seed=seed)
    return describe_samples(train_ds, indices, tokenizer, max_chars)


def format_record(record: SampleRecord) -> str:
    """Two lines: where the window came from, then its (truncated) text."""
    docs = ",".join(str(d) for d in record.documents)
    return (
        f"sample {record.index} shard={record.shard} doc={docs} start={record.start} "
        f"targets={record.num_targets}\n    {record.text!r}"
    )
