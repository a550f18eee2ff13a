"""Shared test helpers: tiny megatron indexed datasets and a single-process gloo group.

Datasets are written with megatron's own IndexedDatasetBuilder from synthetic token
arrays, so tests do not depend on the preprocessing tool or a tokenizer.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import numpy
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def write_indexed_dataset(prefix: str | Path, documents: list[numpy.ndarray], dtype: type = numpy.int32) -> str:
    """Write `documents` (one sequence each) as `<prefix>.bin/.idx`; returns the prefix."""
    prefix = str(prefix)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in documents:
        builder.add_item(torch.from_numpy(numpy.asarray(doc, dtype=numpy.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def random_documents(
    rng: numpy.random.Generator,
    lengths: list[int],
    vocab_size: int = 1000,
) -> list[numpy.ndarray]:
    """Documents with the given lengths and random tokens in [1, vocab_size)."""
    return [rng.integers(1, vocab_size, size=n, dtype=numpy.int64) for n in lengths]


def tagged_documents(lengths: list[int], shard: int = 0) -> list[numpy.ndarray]:
    """Documents whose every token encodes (shard, document, position), so a window's
    origin can be read back from its tokens: token = shard*10^6 + doc*10^3 + pos."""
    return [shard * 1_000_000 + d * 1_000 + numpy.arange(n, dtype=numpy.int64) for d, n in enumerate(lengths)]


class StubTokenizer:
    """The attributes megatron's GPTDataset reads (no text). The default vocabulary covers the
    ids of `tagged_documents` for up to 8 shards (samples are checked against it)."""

    def __init__(self, vocab_size: int = 1 << 23, eod: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        self.bos = None
        self.pad = None
        self.fingerprint = f"stub-{vocab_size}-{eod}"


@contextlib.contextmanager
def single_process_group(tmp_dir: str | Path) -> Iterator[None]:
    """A world-size-1 gloo group (megatron's dataset caching calls get_rank())."""
    if torch.distributed.is_initialized():
        yield
        return
    store = os.path.join(str(tmp_dir), "pg_store")
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", world_size=1, rank=0)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def read_documents(prefix: str) -> list[numpy.ndarray]:
    """Each document's tokens (its sequences concatenated), via megatron-core's reader."""
    dataset = IndexedDataset(prefix)
    bounds = dataset.document_indices
    return [numpy.concatenate([dataset[j] for j in range(bounds[d], bounds[d + 1])]) for d in range(len(bounds) - 1)]


def index_files(tmp_path, inputs, tokenizer, name="out", tokenizer_type="HuggingFaceTokenizer", **kwargs) -> dict:
    """``preprocess`` of ``inputs`` to ``tmp_path/name`` (no validation split unless asked); its summary."""
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess

    cfg = PreprocessConfig(
        input=[str(i) for i in inputs],
        output_prefix=str(tmp_path / name),
        tokenizer_type=tokenizer_type,
        tokenizer_model=str(tokenizer),
        **{"valid_fraction": 0.0, **kwargs},
    )
    return preprocess(cfg)


def _dp_stream_worker(
    out_dir: str, step: int, global_batch_size: int, micro_batch_size: int, seq_length: int, prefixes: list[str]
) -> None:
    """One torchrun rank: read this rank's microbatches of `step` for both dataset types and
    gather them; rank 0 writes {dataset_type: {index: tokens}} to out_dir/stream.json."""
    import json

    from megatron_fixedcode.data import (
        DataConfig,
        build_datasets,
        fetch_microbatch,
        num_microbatches,
        rank_microbatch_indices,
    )

    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    result = {}
    for dataset_type in ("gpt", "document_windows"):
        cfg = DataConfig(
            data_path=prefixes,
            dataset_type=dataset_type,
            seq_length=seq_length,
            split="60,40,0",
            cache_path=os.path.join(out_dir, "cache"),
            samples_per_shard_visit=5,
        )
        train_ds, _ = build_datasets(
            cfg,
            StubTokenizer(),
            num_train_samples=(step + 1) * global_batch_size,
            num_valid_samples=0,
            seed=9,
        )
        mine = {}
        for mb in range(num_microbatches(global_batch_size, micro_batch_size, world)):
            idx = rank_microbatch_indices(
                step,
                mb,
                global_batch_size=global_batch_size,
                micro_batch_size=micro_batch_size,
                dp_rank=rank,
                dp_size=world,
            )
            tokens = fetch_microbatch(train_ds, idx)["tokens"]
            mine.update({i: t.tolist() for i, t in zip(idx, tokens)})
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        union = {}
        for part in gathered:
            assert not set(part) & set(union), "ranks read overlapping samples"
            union.update(part)
        result[dataset_type] = {str(i): union[i] for i in sorted(union)}
    if rank == 0:
        with open(os.path.join(out_dir, "stream.json"), "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    import sys

    _out, _step, _gbs, _mbs, _seq, *_prefixes = sys.argv[1:]
    _dp_stream_worker(_out, int(_step), int(_gbs), int(_mbs), int(_seq), _prefixes)
