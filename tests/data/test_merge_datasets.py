"""Merging indexed shards: concatenation in order, dtype checks, atomic output."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from megatron_fixedcode.data.indexed_format import IndexedWriter
from megatron_fixedcode.data.preprocess import PreprocessConfig, merge_datasets, output_prefix_for, preprocess
from megatron_fixedcode.tokenizers import train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Three preprocessed shards (train and valid each) in one directory."""
    root = tmp_path_factory.mktemp("shards")
    (root / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(2000)), encoding="utf-8")
    model = train_bpe_tokenizer([str(root / "train.txt")], 300, str(root / "tok"))
    for shard in range(3):
        (root / f"in{shard}.jsonl").write_text(
            "".join(json.dumps({"text": f"shard {shard} doc t{i}"}) + "\n" for i in range(50 + shard))
        )
        preprocess(
            PreprocessConfig(
                input=[str(root / f"in{shard}.jsonl")],
                output_prefix=str(root / "idx" / f"shard{shard}"),
                tokenizer_type="HuggingFaceTokenizer",
                tokenizer_model=str(model),
                append_eod=True,
                valid_fraction=0.2,
            )
        )
    return root / "idx"


def documents(prefix: str) -> list[list[int]]:
    dataset = IndexedDataset(prefix)
    bounds = dataset.document_indices
    return [
        np.concatenate([dataset[j] for j in range(bounds[d], bounds[d + 1])]).tolist() for d in range(len(bounds) - 1)
    ]


def test_merge_directory_with_pattern(shards, tmp_path):
    result = merge_datasets([str(shards)], str(tmp_path / "merged"), pattern="*_train_text_document")
    inputs = [output_prefix_for(str(shards / f"shard{i}"), "train", "text") for i in range(3)]
    assert result["inputs"] == inputs
    want = [doc for prefix in inputs for doc in documents(prefix)]
    assert documents(str(tmp_path / "merged")) == want and result["documents"] == len(want)
    assert result["tokens"] == sum(len(d) for d in want)


def test_merge_prefixes_in_given_order(shards, tmp_path):
    inputs = [output_prefix_for(str(shards / f"shard{i}"), "valid", "text") for i in (2, 0)]
    merge_datasets(inputs, str(tmp_path / "merged"))
    assert documents(str(tmp_path / "merged")) == documents(inputs[0]) + documents(inputs[1])


def test_dtype_mismatch_is_a_clear_error(shards, tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "wide.bin"), dtype=np.int32)
    builder.add_document(np.array([70000, 1]), [2])
    builder.finalize(str(tmp_path / "wide.idx"))
    narrow = output_prefix_for(str(shards / "shard0"), "train", "text")
    with pytest.raises(ValueError, match="different token dtypes.*uint16.*int32"):
        merge_datasets([narrow, str(tmp_path / "wide")], str(tmp_path / "merged"))
    assert not list(tmp_path.glob("merged*"))


def test_missing_input_and_failed_merge_keep_previous_output(shards, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="not found"):
        merge_datasets([str(tmp_path / "nope")], str(tmp_path / "merged"))
    first = output_prefix_for(str(shards / "shard0"), "train", "text")
    merge_datasets([first], str(tmp_path / "merged"))
    before = {s: (tmp_path / f"merged{s}").read_bytes() for s in (".bin", ".idx")}

    def fail(self, path_prefix):
        raise RuntimeError("disk full")

    monkeypatch.setattr(IndexedWriter, "add_index", fail)
    with pytest.raises(RuntimeError):
        merge_datasets([str(shards)], str(tmp_path / "merged"))
    assert {s: (tmp_path / f"merged{s}").read_bytes() for s in (".bin", ".idx")} == before
    assert not list(tmp_path.glob("*.tmp"))


def test_cli(shards, tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "merge_datasets.py"),
            "--input",
            str(shards),
            "--pattern",
            "*_valid_*",
            "--output-prefix",
            str(tmp_path / "merged"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    want = sum(len(documents(output_prefix_for(str(shards / f"shard{i}"), "valid", "text"))) for i in range(3))
    assert len(documents(str(tmp_path / "merged"))) == want
    bad = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "merge_datasets.py"),
            "--input",
            str(tmp_path / "none"),
            "--output-prefix",
            str(tmp_path / "m2"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "not found" in bad.stderr and "Traceback" not in bad.stderr
