"""Each research input interface through the real trainer: resume is bit-identical (loss, grad
norm, lr, tokens, validation loss), and lowdim's trained coordinates are in the checkpoint."""

import pytest

from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus
from tests.helpers.pretrain import assert_same_steps

pytestmark = pytest.mark.slow
INTERFACES = {
    "binary-centered-normmatch": ["--input-embedding", "binary", "--code-centered", "--code-norm-match"],
    "random": ["--input-embedding", "random", "--code-width", "24"],
    "sinusoidal": ["--input-embedding", "sinusoidal"],
    "lowdim": ["--input-embedding", "lowdim"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("name", sorted(INTERFACES))
def test_resume_is_bit_identical(tmp_path, corpus, name):
    common = [*INTERFACES[name], "--train-iters", "6", "--eval-interval", "3", *data_args(corpus, "document_windows")]
    ckpt = str(tmp_path / "ckpt")
    pretrain(*common, "--save", ckpt, "--save-interval", "3", "--metrics-file", str(tmp_path / "straight.jsonl"))
    pretrain(*common, "--load", ckpt, "--ckpt-step", "3", "--metrics-file", str(tmp_path / "resumed.jsonl"))
    straight, resumed = read_metrics(tmp_path / "straight.jsonl"), read_metrics(tmp_path / "resumed.jsonl")
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert_same_steps(straight, resumed)
