"""Megatron-LM's non-persistent checkpoints (``--non-persistent-save-interval`` with
``--non-persistent-ckpt-type global``): cheap saves between persistent ones into SAVE/non_persistent (or
``--non-persistent-global-ckpt-dir``), only the newest kept, and a resume that loads the newest complete one of
the persistent and non-persistent checkpoints, exactly."""

from __future__ import annotations

import shutil

import pytest

from megatron_fixedcode import checkpoint
from tests.helpers.errors import parse_refused
from tests.helpers.pretrain import assert_same_steps, data_args, pretrain, read_metrics, write_corpus

NON_PERSISTENT = ["--non-persistent-save-interval", "2", "--non-persistent-ckpt-type", "global"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _run(corpus, ckpt, metrics, *extra, check=True):
    return pretrain(
        *data_args(corpus, "gpt"),
        "--train-iters",
        "8",
        "--save",
        str(ckpt),
        "--load",
        str(ckpt),
        "--save-interval",
        "4",
        "--metrics-file",
        str(metrics),
        "--eval-interval",
        "1000",
        *extra,
        check=check,
    )


def _crashed_after_step_6(ckpt) -> None:
    """What a crash after step 6's non-persistent save and before step 8's persistent one leaves."""
    shutil.rmtree(checkpoint.checkpoint_dir(ckpt, 8))
    (ckpt / checkpoint.LATEST_MARKER).write_text("4")


@pytest.mark.slow
def test_a_newer_non_persistent_checkpoint_is_the_one_a_restart_resumes_from_exactly(corpus, tmp_path):
    straight = tmp_path / "straight.jsonl"
    _run(corpus, tmp_path / "straight", straight)
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    first = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    np_dir = ckpt / "non_persistent"
    assert sorted(p.name for p in np_dir.glob("iter_*")) == ["iter_0000006"]  # 2 and 6 saved, the newest kept
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000004", "iter_0000008"]  # 4 and 8: persistent
    assert "saved non-persistent checkpoint" in first.stderr
    _crashed_after_step_6(ckpt)
    second = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    assert "Loading from a non-persistent checkpoint (non-persistent iter 6)" in second.stderr, second.stderr[-3000:]
    assert "successfully loaded checkpoint from" in second.stderr and "at iteration 6" in second.stderr
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 9))  # each step recorded once
    assert_same_steps(read_metrics(straight), resumed)  # loss, grad norm, LR, tokens: bit for bit
    assert checkpoint.latest_step(ckpt) == 8


@pytest.mark.slow
def test_a_kill_during_the_non_persistent_write_leaves_the_previous_one_and_an_older_one_loses(corpus, tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    _crashed_after_step_6(ckpt)
    np_dir = ckpt / "non_persistent"
    partial = checkpoint.checkpoint_dir(np_dir, 8)  # killed mid-write: files, no marker move
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"partial")
    proc = _run(corpus, ckpt, metrics, *NON_PERSISTENT, "--exit-interval", "7")  # step 7 saved (persistent)
    assert "non-persistent iter 6" in proc.stderr, proc.stderr[-3000:]
    # a persistent checkpoint newer than the non-persistent one is the one that loads
    proc = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    assert "non-persistent checkpoints are older than persistent checkpoint" in proc.stderr
    assert "at iteration 7" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--non-persistent-ckpt-type", "local", "--non-persistent-save-interval", "2"], "not wired here yet"),
        (["--non-persistent-save-interval", "2"], "needs --non-persistent-ckpt-type global"),
        (["--non-persistent-ckpt-type", "global"], "act with --non-persistent-save-interval"),
        (NON_PERSISTENT[:1] + ["0"] + NON_PERSISTENT[2:], "must be >= 1"),
        (NON_PERSISTENT, "it needs --save"),
    ],
)
def test_the_flags_are_checked_before_anything_starts(flags, needle, capsys, tmp_path):
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32"]
    argv = [*model, "--ffn-hidden-size", "128", "--lr", "1e-3", "--train-iters", "2", "--mock-data", "--vocab-size"]
    argv += ["256", *flags] + ([] if needle == "it needs --save" else ["--save", str(tmp_path / "ckpt")])
    assert needle in parse_refused(argv, capsys)
