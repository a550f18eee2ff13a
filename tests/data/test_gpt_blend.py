"""Megatron GPTDataset blends built through BlendedMegatronDatasetBuilder."""

from __future__ import annotations

import numpy
import pytest
import torch

from megatron_fixedcode.data import DataConfig, build_datasets, locate_gpt_sample, parse_blend
from megatron_fixedcode.data.sampler import count_prediction_targets, fetch_microbatch
from tests.helpers.data import (
    StubTokenizer,
    single_process_group,
    tagged_documents,
    write_indexed_dataset,
)

SEQ = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    rng = numpy.random.default_rng(0)
    lengths = {s: rng.integers(5, 200, size=40).tolist() for s in range(3)}
    prefixes = [write_indexed_dataset(root / f"shard{s}", tagged_documents(lengths[s], shard=s)) for s in range(3)]
    with single_process_group(root):
        yield {"root": root, "prefixes": prefixes, "lengths": lengths}


def _build(data, data_path, num_train=400, num_valid=40, seed=11, **kw):
    kw.setdefault("split", "90,10,0")
    cfg = DataConfig(data_path=data_path, seq_length=SEQ, cache_path=str(data["root"] / "cache"), **kw)
    return build_datasets(cfg, StubTokenizer(), num_train_samples=num_train, num_valid_samples=num_valid, seed=seed)


def _document_tokens(data, shard: int, document: int) -> numpy.ndarray:
    return tagged_documents(data["lengths"][shard], shard=shard)[document]


def test_samples_are_shifted_windows_of_the_raw_documents(data):
    train_ds, _ = _build(data, [data["prefixes"][0]])
    assert len(train_ds) >= 400
    for i in range(0, 400, 7):
        sample = train_ds[i]
        assert set(sample) == {"tokens", "labels", "loss_mask", "position_ids"}
        assert sample["tokens"].shape == sample["labels"].shape == (SEQ,)
        assert torch.equal(sample["tokens"][1:], sample["labels"][:-1])
        assert torch.equal(sample["loss_mask"], torch.ones(SEQ))
        assert torch.equal(sample["position_ids"], torch.arange(SEQ))
        loc = locate_gpt_sample(train_ds, i)
        raw = numpy.concatenate([_document_tokens(data, 0, d) for d in loc.documents])
        window = torch.cat([sample["tokens"], sample["labels"][-1:]]).numpy()
        assert (window == raw[loc.start : loc.start + SEQ + 1]).all()
    batch = fetch_microbatch(train_ds, list(range(8)))
    assert count_prediction_targets(batch) == 8 * SEQ


def test_weighted_blend_is_honoured(data):
    a, b, _ = data["prefixes"]
    train_ds, _ = _build(data, ["0.8", a, "0.2", b], num_train=1000)
    shards = numpy.array([int(train_ds[i]["tokens"][0]) // 1_000_000 for i in range(1000)])
    fraction_a = float((shards == 0).mean())
    assert set(shards.tolist()) <= {0, 1}
    assert abs(fraction_a - 0.8) < 0.02
    for i in (0, 500, 999):
        loc = locate_gpt_sample(train_ds, i)
        assert loc.shard == (a if shards[i] == 0 else b)


def test_unweighted_blend_runs_past_one_epoch_in_size_proportion(data):
    """Megatron alone would stop an unweighted multi-prefix blend after one epoch."""
    a, b, _ = data["prefixes"]
    one_epoch = sum(sum(data["lengths"][s]) for s in (0, 1)) // SEQ
    train_ds, _ = _build(data, [a, b], num_train=3 * one_epoch)
    assert len(train_ds) >= 3 * one_epoch
    shards = numpy.array([int(train_ds[i]["tokens"][0]) // 1_000_000 for i in range(len(train_ds))])
    share_a = sum(data["lengths"][0]) / sum(sum(data["lengths"][s]) for s in (0, 1))
    assert abs(float((shards == 0).mean()) - share_a) < 0.03


def test_separate_valid_data_path(data):
    a, b, c = data["prefixes"]
    train_ds, valid_ds = _build(data, [a, b], valid_data_path=[c])
    train_shards = {int(train_ds[i]["tokens"][0]) // 1_000_000 for i in range(0, 400, 5)}
    valid_shards = {int(valid_ds[i]["tokens"][0]) // 1_000_000 for i in range(len(valid_ds))}
    assert train_shards == {0, 1}
    assert valid_shards == {2}
    assert len(valid_ds) >= 40


def test_same_seed_same_stream_other_seed_other_stream(data):
    first, _ = _build(data, [data["prefixes"][1]], seed=3)
    again, _ = _build(data, [data["prefixes"][1]], seed=3)
    other, _ = _build(data, [data["prefixes"][1]], seed=4)
    same = [torch.equal(first[i]["tokens"], again[i]["tokens"]) for i in range(50)]
    diff = [torch.equal(first[i]["tokens"], other[i]["tokens"]) for i in range(50)]
    assert all(same) and not all(diff)


def test_empty_split_is_an_error_not_a_hang(data):
    with pytest.raises(ValueError, match="split: the valid part"):
        _build(data, [data["prefixes"][0]], split="99,1,0")


def test_parse_blend_forms():
    assert parse_blend(["A", "B"]) == (["A", "B"], None)
    assert parse_blend("0.8 A 0.2 B") == (["A", "B"], [0.8, 0.2])
    assert parse_blend(["30", "x/y", "70", "z"]) == (["x/y", "z"], [30.0, 70.0])
    for bad in (["0.8", "A", "B"], ["0.8", "A", "B", "C"], ["-1", "A", "2", "B"], []):
        with pytest.raises(ValueError, match="data_path"):
            parse_blend(bad)
    with pytest.raises(ValueError, match="valid_data_path"):
        DataConfig(data_path=["A"], valid_data_path=["0.5", "B", "C"])
    with pytest.raises(ValueError, match="dataset_type"):
        DataConfig(data_path=["A"], dataset_type="packed")
    with pytest.raises(ValueError, match="seq_length"):
        DataConfig(data_path=["A"], seq_length=0)
