"""Our numpy ``.bin/.idx`` writer is byte-identical to megatron-core's ``IndexedDatasetBuilder``,
and preprocessing imports neither megatron-core nor torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_fixedcode.data.indexed_format import IndexedWriter, IndexFile, optimal_dtype
from megatron_fixedcode.tokenizers import train_bpe_tokenizer
from tests.helpers import REPO


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("bpe")
    (out / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(3000)), encoding="utf-8")
    return str(train_bpe_tokenizer([str(out / "train.txt")], 320, str(out / "tok")))


def _documents(seed: int, n: int, vocab: int):
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        lengths = rng.integers(0, 50, size=rng.integers(0, 4))  # empty documents and sentences included
        docs.append((rng.integers(0, vocab, size=int(lengths.sum())), lengths))
    return docs


@pytest.mark.parametrize("vocab", [50000, 70000])  # uint16 and int32 tokens
def test_writer_bytes_equal_indexed_dataset_builder(tmp_path, vocab):
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    assert optimal_dtype(vocab) is DType.optimal_dtype(vocab)
    dtype = optimal_dtype(vocab)
    docs, more = _documents(0, 300, vocab), _documents(1, 50, vocab)
    ref = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype)
    for ids, lengths in docs:
        ref.add_document(ids, lengths.tolist())
    ref.finalize(str(tmp_path / "ref.idx"))
    part = IndexedDatasetBuilder(str(tmp_path / "part.bin"), dtype=dtype)
    for ids, lengths in more:
        part.add_document(ids, lengths.tolist())
    part.finalize(str(tmp_path / "part.idx"))

    ours = IndexedWriter(str(tmp_path / "ours.bin"), dtype)
    for batch in (docs[:7], docs[7:8], docs[8:]):  # batches of any size, one call each
        ours.add_documents(
            np.concatenate([d[0] for d in batch]),
            np.concatenate([d[1] for d in batch]),
            np.array([len(d[1]) for d in batch]),
        )
    ours.finalize(str(tmp_path / "ours.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"ref{suffix}").read_bytes()

    ref = IndexedDatasetBuilder(str(tmp_path / "ref2.bin"), dtype=dtype)
    ref.add_index(str(tmp_path / "ref"))
    ref.add_index(str(tmp_path / "part"))
    ref.finalize(str(tmp_path / "ref2.idx"))
    merged = IndexedWriter(str(tmp_path / "ours2.bin"), dtype)
    merged.add_index(str(tmp_path / "ours"))
    merged.add_index(str(tmp_path / "part"))
    merged.finalize(str(tmp_path / "ours2.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours2{suffix}").read_bytes() == (tmp_path / f"ref2{suffix}").read_bytes()
    index = IndexFile(str(tmp_path / "ours2.idx"))
    assert (
        index.dtype == np.dtype(dtype)
        and merged.num_documents == len(docs) + len(more) == len(index.document_indices) - 1
    )


def test_empty_writer_matches(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16).finalize(str(tmp_path / "ref.idx"))
    IndexedWriter(str(tmp_path / "ours.bin"), np.uint16).finalize(str(tmp_path / "ours.idx"))
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "ref.idx").read_bytes()


def test_preprocess_imports_no_torch(tmp_path, small_tokenizer):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 5}) + "\n" for i in range(50)))
    probe = (
        "import runpy, sys; sys.argv = sys.argv[1:]\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
        "print([m for m in ('torch', 'megatron.core') if m in sys.modules], code)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            str(REPO / "tools" / "preprocess_data.py"),
            "--input",
            str(corpus),
            "--output-prefix",
            str(tmp_path / "out"),
            "--append-eod",
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            small_tokenizer,
            "--workers",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.strip().splitlines()[-1] == "[] 0", proc.stderr
    assert Path(str(tmp_path / "out") + "_train_text_document.idx").is_file()
