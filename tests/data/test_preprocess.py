"""Corpus indexing: tokens read back equal the tokenizer's, deterministic document-level
split, worker-count independence, clear errors, and atomic outputs."""

import gzip
import json
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_fixedcode.data.preprocess import is_validation_document, output_prefix_for
from megatron_fixedcode.data.preprocess.encode import sentence_splitter
from megatron_fixedcode.tokenizers import build_tokenizer, train_bpe_tokenizer
from tests.helpers import ASSETS, SMOLLM2
from tests.helpers.data import index_files, read_documents

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory) -> str:
    """A tiny byte-level BPE (no shared data needed): <|endoftext|> is id 0."""
    out = tmp_path_factory.mktemp("bpe")
    (out / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(3000)), encoding="utf-8")
    return str(train_bpe_tokenizer([str(out / "train.txt")], 320, str(out / "tok")))


@pytest.fixture(scope="session")
def corpus_sample(tmp_path_factory) -> tuple[Path, list[dict]]:
    """~600 documents of the corpus in tests/assets (paragraphs; ASCII, UTF-8 with BOM and CRLF,
    Latin-1), as JSONL with ids."""
    docs = []
    for path in sorted((ASSETS / "corpus").rglob("*.txt")):
        raw = path.read_bytes()
        text = raw.decode("utf-8") if raw.isascii() or _utf8(raw) else raw.decode("latin-1")
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()][:60]
        docs += [{"id": f"{path.name}:{i}", "text": p} for i, p in enumerate(paragraphs)]
    out = tmp_path_factory.mktemp("corpus") / "sample.jsonl"
    out.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return out, docs


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def expected_split(docs, seed, fraction, key="id"):
    return {
        split: [d for d in docs if is_validation_document(d[key].encode(), seed, fraction) == (split == "valid")]
        for split in ("train", "valid")
    }


def check_roundtrip(tmp_path, docs, tok, summary, fraction, append_eod=True):
    split_docs = expected_split(docs, 1234, fraction)
    for split in ("train", "valid"):
        got = read_documents(output_prefix_for(str(tmp_path / "out"), split, "text"))
        want = [tok.tokenize(d["text"]) + ([tok.eod] if append_eod else []) for d in split_docs[split]]
        want = [w for w in want if len(w) > int(append_eod)]
        assert len(got) == len(want) == summary["documents"][split]
        for g, w in zip(got, want):
            assert g.tolist() == w


def test_roundtrip_smollm2(tmp_path, corpus_sample):
    jsonl, docs = corpus_sample
    model = SMOLLM2
    summary = index_files(tmp_path, [jsonl], model, append_eod=True, id_key="id", valid_fraction=0.2)
    assert summary["dtype"] == "uint16"
    check_roundtrip(tmp_path, docs, build_tokenizer("HuggingFaceTokenizer", str(model)), summary, 0.2)
    assert summary["tokenizer"]["vocab_size"] == 49152 and summary["tokenizer"]["fingerprint"]
    assert sum(summary["doc_length_histogram_log2"]["text"].values()) == sum(summary["documents"].values())
    assert summary["records_read"] == len(docs)


def test_gpt2_bpe_with_megatron_flags(tmp_path, corpus_sample, capsys):
    """Megatron-LM's spelling: --tokenizer-type GPT2BPETokenizer --vocab-file --merge-file; the .bin/.idx
    hold Megatron-LM's own pure-Python GPT-2 BPE ids (tests/helpers/megatron_gpt2_reference.py) + EOD, 2 workers
    as 1; --tokenizer-model with them, or a lone --vocab-file, is one line."""
    pytest.importorskip("regex")
    from megatron_fixedcode.cli.preprocess_data import main
    from tests.helpers import write_gpt2_bpe_files
    from tests.helpers.megatron_gpt2_reference import GPT2Tokenizer

    jsonl, docs = corpus_sample
    vocab, merges = write_gpt2_bpe_files(tmp_path / "gpt2")
    flags = [
        "--input",
        str(jsonl),
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        str(vocab),
        "--merge-file",
        str(merges),
        "--append-eod",
        "--id-key",
        "id",
        "--valid-fraction",
        "0.2",
    ]
    assert main([*flags, "--output-prefix", str(tmp_path / "out"), "--workers", "2"]) == 0
    summary = json.loads((tmp_path / "out_summary.json").read_text())
    assert summary["tokenizer"]["type"] == "GPT2BPETokenizer" and summary["tokenizer"]["merge_file"] == str(merges)
    assert summary["tokenizer"]["vocab_size"] == 1001 and summary["tokenizer"]["eod"] == 1000
    ref = GPT2Tokenizer(str(vocab), str(merges))
    check_roundtrip(
        tmp_path, docs, types.SimpleNamespace(tokenize=ref.encode, eod=ref.encoder["<|endoftext|>"]), summary, 0.2
    )
    assert main([*flags, "--output-prefix", str(tmp_path / "one")]) == 0
    for split in ("train", "valid"):
        for suffix in (".bin", ".idx"):
            assert (
                Path(output_prefix_for(str(tmp_path / "one"), split, "text") + suffix).read_bytes()
                == Path(output_prefix_for(str(tmp_path / "out"), split, "text") + suffix).read_bytes()
            )
    capsys.readouterr()
    assert main([*flags, "--output-prefix", str(tmp_path / "x"), "--tokenizer-model", str(tmp_path)]) == 2
    assert "drop --tokenizer-model" in capsys.readouterr().err
    assert main([*flags[:6], "--output-prefix", str(tmp_path / "x")]) == 2
    assert "needs both --vocab-file and --merge-file" in capsys.readouterr().err


def test_roundtrip_sentencepiece(tmp_path, corpus_sample):
    import sentencepiece

    jsonl, docs = corpus_sample
    (tmp_path / "train.txt").write_text("\n".join(d["text"] for d in docs[:200]), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(tmp_path / "train.txt"),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=500,
        byte_fallback=True,
        minloglevel=2,
    )
    model = tmp_path / "sp.model"
    summary = index_files(
        tmp_path,
        [jsonl],
        model,
        tokenizer_type="SentencePieceTokenizer",
        id_key="id",
        valid_fraction=0.2,
        append_eod=False,
    )
    tok = build_tokenizer("SentencePieceTokenizer", str(model))
    check_roundtrip(tmp_path, docs, tok, summary, 0.2, append_eod=False)


def test_parquet_and_gzip_match_jsonl(tmp_path, small_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [{"id": str(i), "text": f"doc t{i} word{i % 13}."} for i in range(300)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(d) + "\n" for d in docs))
    pq.write_table(pa.Table.from_pylist(docs), tmp_path / "a.parquet", row_group_size=64)
    outputs = []
    for name in ("a.jsonl", "a.jsonl.gz", "a.parquet"):
        index_files(tmp_path, [tmp_path / name], small_tokenizer, name=name, append_eod=True, chunk_docs=50)
        outputs.append(Path(output_prefix_for(str(tmp_path / name), "train", "text") + ".bin").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_workers_and_chunking_do_not_change_bytes(tmp_path, corpus_sample):
    jsonl, _ = corpus_sample
    model = SMOLLM2
    for name, workers, chunk_docs in (("w1", 1, 16), ("w2", 2, 16), ("w2b", 2, 5)):
        index_files(
            tmp_path,
            [jsonl],
            model,
            name=name,
            workers=workers,
            chunk_docs=chunk_docs,
            append_eod=True,
            valid_fraction=0.1,
        )
    for split in ("train", "valid"):
        for suffix in (".bin", ".idx"):
            files = [
                Path(output_prefix_for(str(tmp_path / n), split, "text") + suffix).read_bytes()
                for n in ("w1", "w2", "w2b")
            ]
            assert files[0] == files[1] == files[2]


def test_split_is_document_level_and_within_bounds(tmp_path, small_tokenizer):
    num_docs, fraction = 20000, 0.1
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"id": f"id{i}", "text": f"t{i}"}) + "\n" for i in range(num_docs)))
    tok = build_tokenizer("HuggingFaceTokenizer", small_tokenizer)
    ids = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        index_files(tmp_path, [path], small_tokenizer, name=name, valid_fraction=fraction, split_seed=seed, id_key="id")
        ids[name] = {
            split: [
                tok.detokenize(d.tolist())
                for d in read_documents(output_prefix_for(str(tmp_path / name), split, "text"))
            ]
            for split in ("train", "valid")
        }
    train, valid = set(ids["a"]["train"]), set(ids["a"]["valid"])
    assert not train & valid and len(train | valid) == num_docs
    sigma = (num_docs * fraction * (1 - fraction)) ** 0.5
    assert abs(len(valid) - num_docs * fraction) < 5 * sigma
    assert ids["a"] == ids["b"]  # deterministic
    assert set(ids["c"]["valid"]) != valid  # the seed matters
    want = {f"t{i}" for i in range(num_docs) if is_validation_document(f"id{i}".encode(), 7, fraction)}
    assert valid == want


def test_no_id_key_hashes_text_and_zero_fraction_writes_train_only(tmp_path, small_tokenizer):
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i % 50}"}) + "\n" for i in range(500)))
    summary = index_files(tmp_path, [path], small_tokenizer, valid_fraction=0.3)
    valid = {tuple(d) for d in read_documents(output_prefix_for(str(tmp_path / "out"), "valid", "text"))}
    train = {tuple(d) for d in read_documents(output_prefix_for(str(tmp_path / "out"), "train", "text"))}
    assert not train & valid and summary["documents"]["valid"] > 0  # equal texts share a split
    summary = index_files(tmp_path, [path], small_tokenizer, name="only", valid_fraction=0.0)
    assert list(summary["documents"]) == ["train"]
    assert not list(tmp_path.glob("only_valid*"))


def test_dtype_choice(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    for name, size in (("small", 1000), ("large", 70000)):
        vocab = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, size)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(tmp_path / f"{name}.json"))
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"text": f"w{size - 1} w1 w{size // 2}"}) + "\n")
        summary = index_files(
            tmp_path, [tmp_path / f"{name}.jsonl"], tmp_path / f"{name}.json", name=name, append_eod=True
        )
        assert summary["dtype"] == {"small": "uint16", "large": "int32"}[name]
        (doc,) = read_documents(output_prefix_for(str(tmp_path / name), "train", "text"))
        assert doc.tolist() == [size - 1, 1, size // 2, 0]


def test_split_sentences(tmp_path, small_tokenizer):
    text = "First sentence here. Second one follows! Third one, at last?"
    (tmp_path / "s.jsonl").write_text(json.dumps({"text": text}) + "\n")
    index_files(tmp_path, [tmp_path / "s.jsonl"], small_tokenizer, split_sentences=True, append_eod=True)
    dataset = IndexedDataset(output_prefix_for(str(tmp_path / "out"), "train", "text"))
    sentences = sentence_splitter()[0].tokenize(text)
    tok = build_tokenizer("HuggingFaceTokenizer", small_tokenizer)
    assert len(sentences) == 3 and dataset.document_indices.tolist() == [0, 3]
    assert [dataset[i].tolist() for i in range(3)] == [tok.tokenize(s) for s in sentences[:2]] + [
        tok.tokenize(sentences[2]) + [0]
    ]


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _parquet_bytes(tmp_path, rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    return (tmp_path / "t.parquet").read_bytes()


BAD_INPUTS = {
    "bad_json": (
        "b.jsonl",
        lambda _: b'{"text": "a"}\n{"text": "b"}\n{"text": \n{"text": "d"}\n',
        r"b\.jsonl:3: malformed JSON",
    ),
    "missing_key": ("m.jsonl", lambda _: b'{"text": "a"}\n{"body": "b"}\n', r"m\.jsonl:2: missing .*'text'"),
    "non_utf8": ("u.jsonl", lambda _: b'{"text": "a"}\n{"text": "bad \xff"}\n', r"u\.jsonl:2: not valid UTF-8"),
    "lone_surrogate": (
        "s.jsonl",
        lambda _: b'{"text": "a"}\n{"text": "x \\ud800 y"}\n',
        r"s\.jsonl:2: key 'text' holds a lone surrogate",
    ),
    "empty_file": ("e.jsonl", lambda _: b"", r"e\.jsonl: empty file"),
    "truncated_gzip": (
        "g.jsonl.gz",
        lambda _: _truncated(gzip.compress(b'{"text": "abc"}\n' * 5000)),
        r"g\.jsonl\.gz:\d+: truncated or corrupt gzip",
    ),
    "truncated_parquet": (
        "p.parquet",
        lambda t: _truncated(_parquet_bytes(t, [{"text": "abc"}] * 100)),
        r"p\.parquet: unreadable parquet",
    ),
    "parquet_null": (
        "n.parquet",
        lambda t: _parquet_bytes(t, [{"text": "a"}, {"text": None}]),
        r"n\.parquet:row 2: missing",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_file_and_line(tmp_path, small_tokenizer, case):
    name, make, pattern = BAD_INPUTS[case]
    data = make(tmp_path)
    (tmp_path / name).write_bytes(data)
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "fine"}\n')
    with pytest.raises(ValueError, match=pattern):
        index_files(tmp_path, [good, tmp_path / name], small_tokenizer)
    summary = index_files(tmp_path, [good, tmp_path / name], small_tokenizer, skip_bad_documents=True)
    assert summary["skipped"]["count"] >= 1
    assert re.search(
        pattern, f"{summary['skipped']['listed'][0]['where']}: {summary['skipped']['listed'][0]['reason']}"
    )
    assert summary["documents"]["train"] >= 1


def test_empty_documents_are_counted_and_progress_is_logged(tmp_path, small_tokenizer, caplog):
    (tmp_path / "e.jsonl").write_text('{"text": "a"}\n{"text": ""}\n\n{"text": "b"}\n')
    with caplog.at_level("INFO", logger="megatron_fixedcode.data.preprocess"):
        summary = index_files(tmp_path, [tmp_path / "e.jsonl"], small_tokenizer, append_eod=True)
    assert summary["empty_documents"] == 1 and summary["documents"]["train"] == 2
    assert re.search(r"docs/s, .* tokens/s, .* MB/s \| 100\.0% of input, ETA", caplog.text)


def test_failure_keeps_previous_output(tmp_path, small_tokenizer):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(1000)))
    index_files(tmp_path, [good], small_tokenizer)
    prefix = output_prefix_for(str(tmp_path / "out"), "train", "text")
    before = {s: Path(prefix + s).read_bytes() for s in (".bin", ".idx")}
    late_bad = tmp_path / "late_bad.jsonl"
    late_bad.write_text(good.read_text() * 3 + "{not json\n")
    with pytest.raises(ValueError, match=r"late_bad\.jsonl:3001"):
        index_files(tmp_path, [late_bad], small_tokenizer, chunk_docs=100)
    assert {s: Path(prefix + s).read_bytes() for s in (".bin", ".idx")} == before
    assert not list(tmp_path.glob("*.tmp"))


def test_cli_error_and_killed_run(tmp_path, small_tokenizer):
    """Through the CLI: a user error exits 2 without a traceback; a killed run publishes nothing."""
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(100)))
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": f"doc t{i} word{i % 13}. " * 20}) + "\n" for i in range(100000)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{oops\n')
    cli = [
        sys.executable,
        str(REPO / "tools" / "preprocess_data.py"),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        small_tokenizer,
        "--output-prefix",
        str(tmp_path / "out"),
        "--valid-fraction",
        "0",
    ]
    err = subprocess.run(cli + ["--input", str(bad)], capture_output=True, text=True, cwd=REPO)
    assert err.returncode == 2 and "bad.jsonl:2: malformed JSON" in err.stderr and "Traceback" not in err.stderr
    index_files(tmp_path, [small], small_tokenizer)
    prefix = output_prefix_for(str(tmp_path / "out"), "train", "text")
    before = {s: Path(prefix + s).read_bytes() for s in (".bin", ".idx")}
    proc = subprocess.Popen(
        cli + ["--input", str(big), "--chunk-docs", "200"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        tmp_bin = Path(prefix + ".bin.tmp")
        if tmp_bin.exists() and tmp_bin.stat().st_size > 0:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert {s: Path(prefix + s).read_bytes() for s in (".bin", ".idx")} == before
    assert len(read_documents(prefix)) == 100
