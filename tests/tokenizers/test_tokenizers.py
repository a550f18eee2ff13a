"""Tokenizers: one interface over HF tokenizer.json and SentencePiece, megatron-core compatible."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_fixedcode.tokenizers import (
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    SentencePieceTokenizer,
    build_tokenizer,
    train_bpe_tokenizer,
)

from tests.helpers import ASSETS, SMOLLM2, write_gpt2_bpe_files

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. Numbers 12345 and symbols #$%! "
    "Unicode: café, naïve, 東京, emoji 🙂.\n\nA second paragraph with  double  spaces.\n"
)


@pytest.fixture(scope="session")
def smollm2():
    return build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2))


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory) -> Path:
    import sentencepiece

    out = tmp_path_factory.mktemp("sp")
    lines = [f"document {i}: {SAMPLE_TEXT} word{i % 37} and more words {i * 7}" for i in range(200)]
    (out / "train.txt").write_text("\n".join(lines), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(out / "train.txt"),
        model_prefix=str(out / "sp"),
        vocab_size=400,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        minloglevel=2,
    )
    return out / "sp.model"


def corpus_texts(num: int = 200) -> list[str]:
    text = (ASSETS / "corpus" / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n \n") if p.strip()][:num]


def test_smollm2_properties(smollm2):
    assert isinstance(smollm2, HuggingFaceTokenizer)
    assert smollm2.vocab_size == 49152
    assert smollm2.eod == 0 and smollm2.eos == 0
    assert len(smollm2.fingerprint) == 16
    same = build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2 / "tokenizer.json"))
    assert same.fingerprint == smollm2.fingerprint and same.eod == 0
    assert smollm2.describe()["vocab_size"] == 49152


def test_batch_equals_single_and_roundtrip(smollm2):
    texts = corpus_texts() + [SAMPLE_TEXT, ""]
    assert smollm2.encode_batch(texts) == [smollm2.tokenize(t) for t in texts]
    assert smollm2.detokenize(smollm2.tokenize(SAMPLE_TEXT)) == SAMPLE_TEXT


def test_megatron_core_compatible(smollm2):
    """A virtual subclass once the data pipeline (which hands it to megatron-core) is imported."""
    import megatron_fixedcode.data.gpt_blend  # noqa: F401
    from megatron.core.tokenizers import MegatronTokenizerBase

    assert isinstance(smollm2, MegatronTokenizerBase)
    assert smollm2.unique_identifiers["class"] == "HuggingFaceTokenizer"
    clone = pickle.loads(pickle.dumps(smollm2))
    assert clone.tokenize(SAMPLE_TEXT) == smollm2.tokenize(SAMPLE_TEXT) and clone.eod == smollm2.eod


def test_gpt_dataset_accepts_tokenizer(smollm2, tmp_path):
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split

    builder = IndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16)
    for _ in range(4):
        builder.add_document(smollm2.tokenize(SAMPLE_TEXT) + [smollm2.eod], [len(smollm2.tokenize(SAMPLE_TEXT)) + 1])
    builder.finalize(str(tmp_path / "d.idx"))
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=16,
        split="100,0,0",
        tokenizer=smollm2,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=None,
        mmap_bin_files=True,
    )
    dataset = IndexedDataset(str(tmp_path / "d"))
    gpt = GPTDataset(dataset, str(tmp_path / "d"), np.arange(4, dtype=np.int32), 4, Split.train, config)
    assert gpt[0]["tokens"].shape == (16,)


def test_eod_detection_and_override(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "<|stop|>": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"tokenizer\.json: no end-of-document token"):
        build_tokenizer("HuggingFaceTokenizer", str(tmp_path))
    assert build_tokenizer("HuggingFaceTokenizer", str(tmp_path), eod_token="<|stop|>").eod == 2
    with pytest.raises(ValueError, match="not in the vocabulary"):
        build_tokenizer("HuggingFaceTokenizer", str(tmp_path), eod_token="<nope>")


def test_user_errors(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer-type"):
        build_tokenizer("TikTokenizer", str(tmp_path))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        build_tokenizer("HuggingFaceTokenizer", str(tmp_path))
    with pytest.raises(ValueError, match="no SentencePiece model"):
        build_tokenizer("SentencePieceTokenizer", str(tmp_path / "missing.model"))


def test_sentencepiece(sp_model):
    tok = build_tokenizer("SentencePieceTokenizer", str(sp_model))
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.vocab_size == 400 and tok.eod == 2 and tok.bos == 1 and tok.pad is None
    texts = [SAMPLE_TEXT, "word3 and more", ""]
    assert tok.encode_batch(texts) == [tok.tokenize(t) for t in texts]
    assert tok.detokenize(tok.tokenize("word3 and more")) == "word3 and more"
    assert pickle.loads(pickle.dumps(tok)).tokenize(SAMPLE_TEXT) == tok.tokenize(SAMPLE_TEXT)


def test_train_bpe_tokenizer(tmp_path):
    (tmp_path / "a.txt").write_text(SAMPLE_TEXT * 20, encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("other words entirely " * 50, encoding="utf-8")
    path = train_bpe_tokenizer([str(tmp_path)], 300, str(tmp_path / "out"))
    tok = build_tokenizer("HuggingFaceTokenizer", str(path.parent))
    assert tok.vocab_size == 300 and tok.eod == 0
    assert tok.detokenize(tok.tokenize(SAMPLE_TEXT)) == SAMPLE_TEXT  # byte-level: lossless
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not valid UTF-8"):
        train_bpe_tokenizer([str(tmp_path / "bad.txt")], 300, str(tmp_path / "out2"))
    with pytest.raises(ValueError, match="--vocab-size"):
        train_bpe_tokenizer([str(tmp_path / "a.txt")], 100, str(tmp_path / "out3"))


def test_train_tokenizer_cli(tmp_path):
    (tmp_path / "a.txt").write_text(SAMPLE_TEXT * 20, encoding="utf-8")
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "train_tokenizer.py"),
            "--input",
            str(tmp_path / "*.txt"),
            "--vocab-size",
            "280",
            "--output",
            str(tmp_path / "tok"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert build_tokenizer("HuggingFaceTokenizer", str(tmp_path / "tok")).vocab_size == 280
    bad = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "train_tokenizer.py"),
            "--input",
            str(tmp_path / "none*"),
            "--vocab-size",
            "280",
            "--output",
            str(tmp_path / "tok2"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "--input" in bad.stderr and "Traceback" not in bad.stderr


@pytest.fixture(scope="session")
def gpt2_files(tmp_path_factory) -> tuple[Path, Path]:
    return write_gpt2_bpe_files(tmp_path_factory.mktemp("gpt2"))


def test_gpt2_bpe_equals_megatron_pure_python_gpt2_tokenizer(gpt2_files):
    """Megatron-LM's GPT2BPETokenizer from vocab.json + merges.txt: the ids of Megatron-LM's own
    pure-Python GPT2Tokenizer on the same files (tests/helpers/megatron_gpt2_reference.py, an independent
    implementation), EOD <|endoftext|>, vocabulary the entries of vocab.json (Megatron-LM's len(encoder))."""
    pytest.importorskip("regex")
    from tests.helpers.megatron_gpt2_reference import GPT2Tokenizer

    vocab, merges = gpt2_files
    tok = build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(merges))
    ref = GPT2Tokenizer(str(vocab), str(merges))
    assert isinstance(tok, GPT2BPETokenizer)
    assert (tok.vocab_size, tok.eod, tok.bos, tok.pad) == (1001, 1000, None, None)
    assert (len(ref.encoder), ref.encoder["<|endoftext|>"]) == (1001, 1000)
    book = (ASSETS / "corpus" / "gutenberg" / "pg84-0.txt").read_text(encoding="utf-8")  # BOM, CRLF, curly quotes
    edge = [
        "",
        " ",
        "  two leading\n\n\ttab\r\n   trailing   ",
        "it's I'll we've they'd 'quoted' 3.14 12345",
        "naïve café — “quotes” Ünïcödé 東京 日本語 🙂👍🏽 e\u0301 zero\u200bwidth \u00a0nbsp",
        "a\n \n  \n",
        "\ufeffBOM",
    ]
    texts = corpus_texts() + [book[:60000], book[-20000:]] + edge
    assert [tok.tokenize(t) for t in texts] == [ref.encode(t) for t in texts]
    assert sum(len(tok.tokenize(t)) for t in texts) > 20000
    assert tok.encode_batch(texts) == [tok.tokenize(t) for t in texts]
    assert all(tok.detokenize(tok.tokenize(t)) == ref.decode(tok.tokenize(t)) == t for t in texts)  # lossless
    assert tok.tokenize("a<|endoftext|>b") == ref.encode("a<|endoftext|>b")  # no special tokens, as Megatron-LM
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.tokenize(edge[4]) == tok.tokenize(edge[4]) and clone.fingerprint == tok.fingerprint
    assert tok.describe()["merge_file"] == str(merges) and tok.unique_identifiers["tokenizer_path"] == [
        str(vocab),
        str(merges),
    ]


def test_gpt2_bpe_reads_merges_as_megatron_and_names_bad_files(gpt2_files, tmp_path):
    """Megatron-LM drops the first line of merges.txt (the #version header) and the
    last (after the final newline): without a header the first merge is not applied. Bad files: one
    line naming the file."""
    pytest.importorskip("regex")
    from tests.helpers.megatron_gpt2_reference import GPT2Tokenizer

    vocab, merges = gpt2_files
    lines = merges.read_text(encoding="utf-8").split("\n")
    headless = tmp_path / "headless.txt"
    headless.write_text("\n".join(lines[1:]), encoding="utf-8")
    tok = build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(headless))
    text = SAMPLE_TEXT * 3
    assert tok.tokenize(text) == GPT2Tokenizer(str(vocab), str(headless)).encode(text)
    full = build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(merges))
    assert tok.tokenize(text) != full.tokenize(text) and tok.fingerprint != full.fingerprint
    with pytest.raises(ValueError, match="give --merge-file"):
        build_tokenizer("GPT2BPETokenizer", str(vocab))
    with pytest.raises(ValueError, match=f"--merge-file: no GPT-2 merges.txt at {tmp_path / 'none.txt'}"):
        build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(tmp_path / "none.txt"))
    damaged = tmp_path / "vocab.json"
    damaged.write_bytes(vocab.read_bytes()[:5000])
    with pytest.raises(ValueError, match=f"--vocab-file: {damaged} is not a valid GPT-2 vocab.json"):
        build_tokenizer("GPT2BPETokenizer", str(damaged), merge_file=str(merges))
    damaged.write_text('{"a": 0, "b": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match=f"--merge-file: {merges} merges into .* which {damaged} lacks"):
        build_tokenizer("GPT2BPETokenizer", str(damaged), merge_file=str(merges))
    (tmp_path / "bad.txt").write_text("#version: 0.2\nĠ t\nthree tokens here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.txt:3 is not a merge"):
        build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(tmp_path / "bad.txt"))
    no_eod = {k: v for k, v in json.loads(vocab.read_text(encoding="utf-8")).items() if k != "<|endoftext|>"}
    damaged.write_text(json.dumps(no_eod), encoding="utf-8")
    with pytest.raises(ValueError, match="has no '<\\|endoftext\\|>'"):
        build_tokenizer("GPT2BPETokenizer", str(damaged), merge_file=str(merges))
