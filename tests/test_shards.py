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


# --- tools/verify_dataset.py ---------------------------------------------------------------------

def _verify(capsys, *argv):
    from tools.verify_dataset import main

    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def indexed(tmp_path, small_tokenizer):
    """A two-split dataset from preprocess_data's library path, in its own directory."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": " ".join(f"word{j % 13} t{i}" for j in range(i % 40 + 1))})
                            + "\n" for i in range(400)))
    out = tmp_path / "idx"
    out.mkdir()
    summary = run(out, [path], small_tokenizer, name="shard", valid_fraction=0.2, append_eod=True)
    return out, summary


def test_verify_reports_counts_of_a_good_dataset(indexed, capsys):
    out, summary = indexed
    rc, stdout, _ = _verify(capsys, out, "--vocab-size", 320, "--seq-length", 30, "--json")
    assert rc == 0
    rows = {r["split"]: r for r in map(json.loads, stdout.splitlines())}
    for split in ("train", "valid"):
        docs = read_documents(output_prefix_for(str(out / "shard"), split, "text"))
        assert rows[split]["documents"] == len(docs) == summary["documents"][split]
        assert rows[split]["tokens"] == sum(map(len, docs)) == summary["tokens"][split]
        assert rows[split]["eligible_documents"] == sum(len(d) >= 31 for d in docs) > 0


@pytest.mark.parametrize("damage", ["truncated_bin", "flipped_idx_size", "flipped_idx_header", "id_beyond_vocab",
                                    "summary_count"])
def test_verify_names_the_damaged_shard(indexed, capsys, damage):
    out, _ = indexed
    train = output_prefix_for(str(out / "shard"), "train", "text")
    valid = output_prefix_for(str(out / "shard"), "valid", "text")
    if damage == "truncated_bin":
        with open(train + ".bin", "r+b") as f:
            f.truncate(f.seek(0, 2) - 2)
    elif damage.startswith("flipped_idx"):
        data = bytearray(open(train + ".idx", "rb").read())
        data[34 + 4 * 3 if damage == "flipped_idx_size" else 2] ^= 0x01  # sequence 3's length / the magic
        open(train + ".idx", "wb").write(bytes(data))
    elif damage == "id_beyond_vocab":
        data = bytearray(open(train + ".bin", "rb").read())
        data[100:102] = (320).to_bytes(2, "little")  # uint16 token 50 = V
        open(train + ".bin", "wb").write(bytes(data))
    else:
        summary = json.loads((out / "shard_summary.json").read_text())
        summary["documents"]["train"] += 1
        (out / "shard_summary.json").write_text(json.dumps(summary))
    rc, stdout, stderr = _verify(capsys, out, "--vocab-size", 320)
    assert rc == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {train}: "), stderr
    expected = {"truncated_bin": "truncated", "flipped_idx_size": "the index is damaged",
                "flipped_idx_header": "not a megatron-core index", "id_beyond_vocab": "id 320, outside the vocabulary",
                "summary_count": "its summary says"}[damage]
    assert expected in errors[0]
    assert f"ok {valid}:" in stdout  # the good shard is still reported
