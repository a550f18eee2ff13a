"""Shard-parallel indexing (issue 12): the paper's per-document split key, per-shard outputs
that resume, the dataset verifier and the manifest the trainer reads."""

import json

import pytest

from megatron_fixedcode.data.preprocess import is_validation_document, output_prefix_for
from megatron_fixedcode.tokenizers import build_tokenizer, train_bpe_tokenizer
from tests.test_preprocess import read_documents, run


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("bpe")
    (out / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(3000)), encoding="utf-8")
    return str(train_bpe_tokenizer([str(out / "train.txt")], 320, str(out / "tok")))


def test_split_key_is_id_where_present_else_text_per_document(tmp_path, small_tokenizer):
    """Paper 2: the id where a record has one, a hash of the text where it has none (null,
    empty or absent), decided per document; the summary counts both."""
    fraction, seed = 0.3, 11
    records = []
    for i in range(3000):
        record = {"text": f"t{i} word{i % 7}"}
        if i % 3 == 0:
            record["id"] = f"doc-{i}"
        elif i % 3 == 1:
            record["id"] = None if i % 2 else ""
        records.append(record)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = run(tmp_path, [path], small_tokenizer, valid_fraction=fraction, split_seed=seed, id_key="id")
    assert summary["split_keys"] == {"id": 1000, "text": 2000}

    def key(r):
        return r["id"].encode() if r.get("id") else r["text"].encode()

    tok = build_tokenizer("HuggingFaceTokenizer", small_tokenizer)
    want_valid = [r["text"] for r in records if is_validation_document(key(r), seed, fraction)]
    got_valid = [tok.detokenize(d.tolist()) for d in read_documents(output_prefix_for(str(tmp_path / "out"), "valid", "text"))]
    assert got_valid == want_valid
    # the id decides where there is one: the text hash alone gives another split of those records
    by_text = [r["text"] for r in records if is_validation_document(r["text"].encode(), seed, fraction)]
    assert got_valid != by_text
    assert summary["documents"]["valid"] + summary["documents"]["train"] == 3000
    no_id = run(tmp_path, [path], small_tokenizer, name="noid", valid_fraction=fraction, split_seed=seed)
    assert no_id["split_keys"] == {"id": 0, "text": 3000}
