#!/usr/bin/env python
"""Does data loading keep up? Samples/s of DocumentWindowDataset and of megatron-core's GPTDataset
(through our blend builder, index build excluded) at the paper-2 shapes (seq 2048, micro batch 8)
against what the trainer consumes.

    python benchmarks/dataloader.py [--docs 20000] [--json]

A synthetic shard (uint16, document lengths log-uniform in [64, 16384] tokens, as web text) is
written to a temporary directory with megatron's IndexedDatasetBuilder. The consumption figure is
the paper-2 run's: 262,144 targets per step at a step time of ``--step-seconds`` (default 8 s, the
1.7B recipe on 2 H100s at ~40% MFU: 6·1.7e9·262144 / (2·0.4·989e12) ≈ 3.4 s per forward-backward
of the global batch, doubled for full recompute and optimizer) — 16 samples/s, 8 per rank. The target
is samples/s ≥ 10 × consumption, on one CPU core per rank.
"""

from __future__ import annotations

import megatron_fixedcode  # noqa: F401  (first: its megatron-core compatibility patches, compat/)

# isort: split
import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine  # noqa: E402
from megatron_fixedcode.data import DocumentWindowDataset  # noqa: E402
from megatron_fixedcode.data.config import DataConfig  # noqa: E402
from megatron_fixedcode.data.gpt_blend import build_gpt_datasets  # noqa: E402
from megatron_fixedcode.data.sampler import fetch_microbatch, rank_microbatch_indices  # noqa: E402


def write_shard(prefix: str, num_docs: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(64), np.log(16384), size=num_docs)).astype(np.int64)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in lengths:
        builder.add_item(torch.from_numpy(rng.integers(0, 49152, size=int(n), dtype=np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return int(lengths.sum())


class _Tokenizer:
    """What the GPT dataset builder reads from a tokenizer (the shard is synthetic)."""

    vocab_size, eod, pad, bos = 49152, 0, None, None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=20000)
    p.add_argument("--steps", type=int, default=8, help="global batches of 128 to read")
    p.add_argument("--step-seconds", type=float, default=8.0)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.docs, a.steps = 500, 1
    torch.set_num_threads(1)
    seq, mbs, gbs, dp = 2048, 8, 128, 2
    samples = a.steps * gbs // dp  # one rank's share
    consumption = gbs / dp / a.step_seconds  # samples/s one rank consumes

    def read_rank_share(ds) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(a.steps):
            for m in range(gbs // (mbs * dp)):
                batch = fetch_microbatch(
                    ds,
                    rank_microbatch_indices(
                        step, m, global_batch_size=gbs, micro_batch_size=mbs, dp_rank=0, dp_size=dp
                    ),
                )
                assert batch["tokens"].shape == (mbs, seq)
        return time.perf_counter() - t0, time.process_time() - c0

    with tempfile.TemporaryDirectory() as tmp:
        tokens = write_shard(f"{tmp}/shard", a.docs)
        t0 = time.perf_counter()
        windows = DocumentWindowDataset(
            [f"{tmp}/shard"], seq_length=seq, num_samples=gbs * a.steps, seed=1234, samples_per_shard_visit=16384
        )
        build_s = time.perf_counter() - t0
        wall, cpu = read_rank_share(windows)
        t0 = time.perf_counter()
        gpt, _ = build_gpt_datasets(
            DataConfig(data_path=[f"{tmp}/shard"], seq_length=seq, split="100,0,0", cache_path=f"{tmp}/cache"),
            _Tokenizer(),
            num_train_samples=gbs * a.steps,
            num_valid_samples=0,
            seed=1234,
        )
        gpt_build_s = time.perf_counter() - t0
        gpt_wall, gpt_cpu = read_rank_share(gpt)
    result = {
        "benchmark": "dataloader",
        "machine": machine(),
        "docs": a.docs,
        "tokens": tokens,
        "index_build_s": build_s,
        "samples_per_s": samples / wall,
        "samples_per_cpu_s": samples / cpu,
        "gpt_index_build_s": gpt_build_s,
        "gpt_samples_per_s": samples / gpt_wall,
        "gpt_samples_per_cpu_s": samples / gpt_cpu,
        "consumption_samples_per_s": consumption,
        "headroom": (samples / wall) / consumption,
        "gpt_headroom": (samples / gpt_wall) / consumption,
    }
    emit(
        result,
        a.json,
        lambda r: (
            f"document windows, seq {seq}: {r['samples_per_s']:,.0f} samples/s per rank "
            f"({r['samples_per_cpu_s']:,.0f} per CPU-second), index built in {r['index_build_s']:.3f} s\n"
            f"megatron GPTDataset: {r['gpt_samples_per_s']:,.0f} samples/s per rank, index built in "
            f"{r['gpt_index_build_s']:.3f} s\n"
            f"trainer consumption at paper-2 shapes: {r['consumption_samples_per_s']:.1f} samples/s per rank "
            f"-> headroom {r['headroom']:,.0f}x / GPTDataset {r['gpt_headroom']:,.0f}x (target >= 10x)"
        ),
    )


if __name__ == "__main__":
    main()
