"""DocumentWindowDataset (paper 2) and the data-parallel sample layout."""

from __future__ import annotations

import math

import numpy
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_fixedcode.data import (
    DataConfig,
    DocumentWindowDataset,
    RankMicrobatchSampler,
    build_datasets,
    collate_samples,
    count_prediction_targets,
    fetch_microbatch,
    global_batch_indices,
    num_microbatches,
    rank_microbatch_indices,
    samples_per_shard_visit,
)
from tests.helpers.data import random_documents, tagged_documents, write_indexed_dataset

SEQ = 8
# Lengths straddle the eligibility bound SEQ + 1 = 9: 8 and 3 are too short, 9 has one start.
LENGTHS = [[20, 8, 9, 31, 3, 12], [15, 40, 5, 9], [10, 25]]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("windows")
    return [
        write_indexed_dataset(root / f"shard{s}", tagged_documents(lengths, shard=s))
        for s, lengths in enumerate(LENGTHS)
    ]


def _dataset(shards, **kw) -> DocumentWindowDataset:
    args = dict(seq_length=SEQ, num_samples=4000, seed=7, samples_per_shard_visit=24)
    args.update(kw)
    return DocumentWindowDataset(shards, **args)


def _decode_tag(window: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    return window // 1_000_000, (window % 1_000_000) // 1_000, window % 1_000


def test_windows_stay_in_one_long_enough_document(shards):
    ds = _dataset(shards, num_samples=2000)
    seen_docs = set()
    for i in range(len(ds)):
        sample = ds[i]
        window = torch.cat([sample["tokens"], sample["labels"][-1:]]).numpy()
        shard, doc, pos = _decode_tag(window)
        loc = ds.locate(i)
        assert (shard == loc.shard).all() and (doc == loc.document).all()
        assert (pos == loc.start + numpy.arange(SEQ + 1)).all()
        assert LENGTHS[loc.shard][loc.document] >= SEQ + 1
        assert torch.equal(sample["tokens"][1:], sample["labels"][:-1])
        assert torch.equal(sample["loss_mask"], torch.ones(SEQ))
        assert torch.equal(sample["position_ids"], torch.arange(SEQ))
        seen_docs.add((loc.shard, loc.document))
    eligible = {(s, d) for s, ls in enumerate(LENGTHS) for d, n in enumerate(ls) if n >= SEQ + 1}
    assert seen_docs == eligible


def test_documents_of_several_sequences_are_one_document(tmp_path):
    """Sentence-split documents: windows may cross sequences, never documents."""
    builder = IndexedDatasetBuilder(str(tmp_path / "split.bin"), dtype=numpy.int32)
    doc_lengths = {0: [4, 3, 5], 1: [2, 2], 2: [6, 6]}
    for d, lengths in doc_lengths.items():
        tokens = d * 1_000 + numpy.arange(sum(lengths))
        builder.add_document(tokens, lengths)
    builder.finalize(str(tmp_path / "split.idx"))
    ds = DocumentWindowDataset(
        [str(tmp_path / "split")],
        seq_length=SEQ,
        num_samples=300,
        seed=1,
        samples_per_shard_visit=7,
    )
    assert ds.eligible[0].document.tolist() == [0, 2]
    for i in range(len(ds)):
        window = torch.cat([ds[i]["tokens"], ds[i]["labels"][-1:]]).numpy()
        loc = ds.locate(i)
        assert (window == loc.document * 1_000 + loc.start + numpy.arange(SEQ + 1)).all()


def test_sample_is_a_pure_function_of_seed_and_index(shards):
    stream = _dataset(shards, num_samples=300)
    fresh = _dataset(shards, num_samples=10_000)  # another run length, another instance
    for i in [299, 0, 150, 24, 23, 47, 48, 1]:
        for key in ("tokens", "labels"):
            assert torch.equal(fresh[i][key], stream[i][key])
    other_seed = _dataset(shards, seed=8)
    assert any(not torch.equal(other_seed[i]["tokens"], stream[i]["tokens"]) for i in range(20))


def test_shard_visits_follow_the_documented_schedule(shards):
    ds = _dataset(shards)
    num_shards = len(shards)
    for epoch in range(20):
        visits = [ds.shard_of_visit(epoch * num_shards + k) for k in range(num_shards)]
        assert sorted(visits) == list(range(num_shards))
    for i in range(0, 24 * 9):
        assert ds.locate(i).shard == ds.shard_of_visit(i // 24)


def test_weighted_shard_blend_is_honoured(shards):
    ds = _dataset(shards, weights=[0.8, 0.2, 0.0])
    num_visits = 5000
    counts = numpy.bincount([ds.shard_of_visit(v) for v in range(num_visits)], minlength=3)
    assert counts[2] == 0
    assert abs(counts[0] / num_visits - 0.8) < 0.02


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square(df), Wilson-Hilferty normal approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_documents_and_starts_are_uniform(tmp_path):
    lengths = [9, 11, 14, 18, 30, 5, 60]
    prefix = write_indexed_dataset(tmp_path / "u", tagged_documents(lengths))
    num_samples = 20_000
    ds = DocumentWindowDataset([prefix], seq_length=SEQ, num_samples=num_samples, seed=3, samples_per_shard_visit=100)
    locs = [ds.locate(i) for i in range(num_samples)]
    eligible = [d for d, n in enumerate(lengths) if n >= SEQ + 1]
    doc_counts = numpy.array([sum(1 for x in locs if x.document == d) for d in eligible])
    expected = num_samples / len(eligible)
    chi2_doc = float(((doc_counts - expected) ** 2 / expected).sum())
    assert chi2_doc < _chi2_critical(len(eligible) - 1)
    chi2_start, df_start = 0.0, 0
    for d, count in zip(eligible, doc_counts):
        num_starts = lengths[d] - SEQ
        starts = numpy.bincount([x.start for x in locs if x.document == d], minlength=num_starts)
        assert len(starts) == num_starts  # start in [0, len - SEQ - 1]
        chi2_start += float(((starts - count / num_starts) ** 2 / (count / num_starts)).sum())
        df_start += num_starts - 1
    assert chi2_start < _chi2_critical(df_start)


def test_data_parallel_ranks_read_the_same_global_stream(shards):
    ds = _dataset(shards)
    gbs, mbs = 16, 2
    for step in (0, 3):
        expected = fetch_microbatch(ds, global_batch_indices(step, gbs))
        for dp_size in (1, 2, 4):
            parts = []
            for mb in range(num_microbatches(gbs, mbs, dp_size)):
                for rank in range(dp_size):
                    idx = rank_microbatch_indices(
                        step,
                        mb,
                        global_batch_size=gbs,
                        micro_batch_size=mbs,
                        dp_rank=rank,
                        dp_size=dp_size,
                    )
                    parts.append(fetch_microbatch(ds, idx))
            samples = [{k: v[j] for k, v in p.items()} for p in parts for j in range(mbs)]
            union = collate_samples(samples)
            for key in expected:
                assert torch.equal(union[key], expected[key])


def test_rank_sampler_with_workers_resumes_mid_stream(shards):
    """DataLoader workers and a resume at consumed_samples read the same samples."""
    ds = _dataset(shards, num_samples=96)
    gbs, mbs = 16, 2
    reference = fetch_microbatch(ds, list(range(32, 96)))
    per_rank = []
    for rank in range(2):
        sampler = RankMicrobatchSampler(
            total_samples=96, consumed_samples=32, micro_batch_size=mbs, dp_rank=rank, dp_size=2
        )
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate_samples, num_workers=2)
        per_rank.append(list(loader))
    assert len(per_rank[0]) == len(sampler) == 64 // (mbs * 2)
    interleaved = [mb["tokens"] for pair in zip(*per_rank) for mb in pair]
    assert torch.equal(torch.cat(interleaved), reference["tokens"])
    assert count_prediction_targets(per_rank[0][0]) == mbs * SEQ
    assert gbs % (mbs * 2) == 0


def test_build_datasets_document_windows(shards, tmp_path):
    docs = random_documents(numpy.random.default_rng(0), [30, 12])
    valid = write_indexed_dataset(tmp_path / "valid", docs)
    cfg = DataConfig(
        data_path=shards,
        valid_data_path=[valid],
        dataset_type="document_windows",
        seq_length=SEQ,
        samples_per_shard_visit=samples_per_shard_visit(4, 2, 2),
    )
    train_ds, valid_ds = build_datasets(cfg, None, num_train_samples=50, num_valid_samples=10, seed=5)
    assert len(train_ds) == 50 and len(valid_ds) == 10
    assert train_ds.samples_per_shard_visit == 16
    assert valid_ds.prefixes == [valid]
    assert train_ds.targets_per_sample() == SEQ


def test_bad_inputs_raise_value_errors(shards, tmp_path):
    short = write_indexed_dataset(tmp_path / "short", tagged_documents([3, 8]))
    with pytest.raises(ValueError, match="prefixes"):
        DocumentWindowDataset([short], seq_length=SEQ, num_samples=1, seed=0, samples_per_shard_visit=1)
    with pytest.raises(ValueError, match="weights"):
        _dataset([shards[0], short], weights=[0.5, 0.5])
    with pytest.raises(ValueError, match="samples_per_shard_visit"):
        DataConfig(data_path=shards, dataset_type="document_windows", samples_per_shard_visit=0)
    with pytest.raises(ValueError, match="global_batch_size"):
        rank_microbatch_indices(0, 0, global_batch_size=10, micro_batch_size=4, dp_rank=0, dp_size=1)
    with pytest.raises(IndexError):
        _dataset(shards, num_samples=5)[5]


@pytest.mark.slow
def test_two_gloo_ranks_read_the_dp1_global_batch(shards, tmp_path):
    """torchrun, 2 ranks: gathered per-rank microbatches == the 1-rank global batch, both types."""
    import json

    from tests.helpers.data import StubTokenizer, single_process_group
    from tests.helpers import REPO, torchrun

    step, gbs, mbs = 3, 8, 2
    torchrun(
        REPO / "tests" / "helpers" / "data.py",
        str(tmp_path),
        str(step),
        str(gbs),
        str(mbs),
        str(SEQ),
        *shards,
        nproc=2,
        timeout=180,
    )
    gathered = json.loads((tmp_path / "stream.json").read_text())
    for dataset_type in ("gpt", "document_windows"):
        cfg = DataConfig(
            data_path=shards,
            dataset_type=dataset_type,
            seq_length=SEQ,
            split="60,40,0",
            cache_path=str(tmp_path / "cache1"),
            samples_per_shard_visit=5,
        )
        with single_process_group(tmp_path):
            train_ds, _ = build_datasets(
                cfg,
                StubTokenizer(),
                num_train_samples=(step + 1) * gbs,
                num_valid_samples=0,
                seed=9,
            )
            indices = global_batch_indices(step, gbs)
            expected = fetch_microbatch(train_ds, indices)["tokens"].tolist()
        assert list(gathered[dataset_type]) == [str(i) for i in indices]
        assert list(gathered[dataset_type].values()) == expected
