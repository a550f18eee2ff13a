"""Data indexed by this project's tools records its tokenizer (``OUT_summary.json``): the batch shell's
pre-flight and the trainer refuse a run whose tokenizer is another one in one line naming both, also when
every id of the data fits the other vocabulary (a larger tokenizer: the ids would mean other tokens)."""

from __future__ import annotations

import json

import pytest

from megatron_fixedcode.cli.preprocess_data import main as preprocess_main
from megatron_fixedcode.data.build import check_data_shards
from megatron_fixedcode.data.config import DataConfig
from megatron_fixedcode.tokenizers import build_tokenizer
from megatron_fixedcode.training.preflight import main as preflight_main
from tests.helpers import ASSETS, REPO, SMOLLM2_TOKENIZER


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    corpus = root / "books.jsonl"
    books = sorted((ASSETS / "corpus" / "gutenberg").glob("*.txt"))[:1]
    corpus.write_text("".join(json.dumps({"text": b.read_text(errors="replace")[:20000]}) + "\n" for b in books))
    assert (
        preprocess_main(
            [
                "--input",
                str(corpus),
                "--output-prefix",
                str(root / "books"),
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                str(SMOLLM2_TOKENIZER),
                "--append-eod",
            ]
        )
        == 0
    )
    # a word-level tokenizer with more ids than SmolLM2's 49,152: every id of the data fits it
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, 60000)}}, unk_token="w1"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    other.save(str(root / "other.json"))
    return root


def _preflight(indexed, tokenizer, capsys) -> tuple[int, str]:
    code = preflight_main(
        [
            "--config",
            str(REPO / "examples/recipes/tiny_cpu.yaml"),
            "--data-path",
            str(indexed / "books_train_text_document"),
            "--tokenizer-model",
            str(tokenizer),
            "--train-iters",
            "2",
        ]
    )
    return code, capsys.readouterr().err.strip()


def test_the_tokenizer_the_data_was_indexed_with_passes(indexed, capsys):
    assert _preflight(indexed, SMOLLM2_TOKENIZER, capsys) == (0, "")


def test_another_tokenizer_is_refused_before_torchrun_and_by_the_trainer(indexed, capsys):
    code, err = _preflight(indexed, indexed / "other.json", capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    prefix = indexed / "books_train_text_document"
    assert err.startswith(
        f"error: data_path {prefix}: indexed with tokenizer {SMOLLM2_TOKENIZER} (49152 ids, fingerprint "
    ), err
    assert f"{indexed / 'books_summary.json'}), but this run's tokenizer {indexed / 'other.json'} has 60000 ids" in err
    with pytest.raises(ValueError) as e:  # the trainer, for a run started without the launcher
        check_data_shards(
            DataConfig(data_path=[str(prefix)], seq_length=64),
            build_tokenizer("HuggingFaceTokenizer", str(indexed / "other.json")),
        )
    assert str(e.value) == err.removeprefix("error: ")
