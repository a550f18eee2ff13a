"""tools/inspect_batch.py shows exactly the samples of a global batch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy
import pytest
import torch

from megatron_fixedcode.data import DataConfig, build_datasets, global_batch_indices
from megatron_fixedcode.data.inspect import describe_samples, format_record
from tests.helpers.data import single_process_group, tagged_documents, write_indexed_dataset
from tests.helpers import REPO
from tests.helpers import SMOLLM2_TOKENIZER as SMOLLM2

SEQ, GBS, STEP, SEED = 16, 4, 2, 5


def test_describe_samples_reports_where_each_window_came_from(tmp_path):
    lengths = [40, 9, 3, 25]
    prefix = write_indexed_dataset(tmp_path / "t", tagged_documents(lengths))
    cfg = DataConfig(
        data_path=[prefix],
        dataset_type="document_windows",
        seq_length=8,
        samples_per_shard_visit=4,
    )
    train_ds, _ = build_datasets(cfg, None, num_train_samples=12, num_valid_samples=0, seed=1)
    records = describe_samples(train_ds, global_batch_indices(1, 4))
    assert [r.index for r in records] == [4, 5, 6, 7]
    for r in records:
        (doc,) = r.documents
        assert r.token_ids == (doc * 1000 + r.start + numpy.arange(9)).tolist()
        assert r.shard == prefix and r.num_targets == 8
        assert f"doc={doc} start={r.start}" in format_record(r)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    tokenizers = pytest.importorskip("megatron_fixedcode.tokenizers")
    tokenizer = tokenizers.build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2))
    words = "the quick brown fox jumps over a lazy dog while seven wise owls watch".split()
    rng = numpy.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=int(n))) + "." for n in rng.integers(3, 60, size=30)]
    docs = [numpy.array(tokenizer.tokenize(t) + [tokenizer.eod]) for t in texts]
    root = tmp_path_factory.mktemp("inspect")
    prefix = write_indexed_dataset(root / "corpus", docs, dtype=numpy.uint16)
    return {"tokenizer": tokenizer, "prefix": prefix, "root": root}


def _run_tool(smollm2, *extra: str) -> list[dict]:
    cmd = [
        sys.executable,
        str(REPO / "tools" / "inspect_batch.py"),
        "--data-path",
        smollm2["prefix"],
        "--seq-length",
        str(SEQ),
        "--global-batch-size",
        str(GBS),
        "--seed",
        str(SEED),
        "--step",
        str(STEP),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        str(SMOLLM2),
        "--max-chars",
        "100000",
        "--json",
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _check(records, dataset, tokenizer):
    assert [r["index"] for r in records] == global_batch_indices(STEP, GBS)
    for r in records:
        sample = dataset[r["index"]]
        window = torch.cat([sample["tokens"], sample["labels"][-1:]]).tolist()
        assert r["token_ids"] == window
        assert r["text"] == tokenizer.detokenize(window)


@pytest.mark.slow
def test_tool_document_windows(smollm2):
    records = _run_tool(smollm2, "--dataset-type", "document_windows", "--samples-per-shard-visit", "8")
    cfg = DataConfig(
        data_path=[smollm2["prefix"]],
        dataset_type="document_windows",
        seq_length=SEQ,
        samples_per_shard_visit=8,
    )
    train_ds, _ = build_datasets(cfg, None, num_train_samples=100, num_valid_samples=0, seed=SEED)
    _check(records, train_ds, smollm2["tokenizer"])
    for r in records:
        assert r["documents"] == [train_ds.locate(r["index"]).document]


@pytest.mark.slow
def test_tool_gpt_dataset(smollm2):
    cache = str(smollm2["root"] / "cache")
    split = "80,20,0"
    records = _run_tool(smollm2, "--data-cache-path", cache, "--split", split)
    cfg = DataConfig(data_path=[smollm2["prefix"]], seq_length=SEQ, split=split, cache_path=cache)
    with single_process_group(smollm2["root"]):
        train_ds, _ = build_datasets(
            cfg,
            smollm2["tokenizer"],
            num_train_samples=(STEP + 1) * GBS,
            num_valid_samples=0,
            seed=SEED,
        )
        _check(records, train_ds, smollm2["tokenizer"])
