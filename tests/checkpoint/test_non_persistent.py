"""Megatron-LM's non-persistent checkpoints (``--non-persistent-save-interval``): cheap saves between persistent
ones, ``global`` into SAVE/non_persistent (or ``--non-persistent-global-ckpt-dir``), ``local`` into each rank's
node-local directory (nvidia-resiliency-ext's manager, checkpoint/local.py), only the newest kept, and a resume
that loads the newest complete one of the persistent and non-persistent checkpoints, exactly."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from megatron_fixedcode import checkpoint
from tests.helpers.errors import parse_refused, refused
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
@pytest.mark.parametrize("written", ["synchronously", "in_the_background"])
def test_a_newer_non_persistent_checkpoint_is_the_one_a_restart_resumes_from_exactly(corpus, tmp_path, written):
    """--async-save writes the non-persistent checkpoints in the background too (Megatron-LM), without a progress
    line or evaluation of their own."""
    straight = tmp_path / "straight.jsonl"
    _run(corpus, tmp_path / "straight", straight)
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    background = (
        ["--async-save", "--use-persistent-ckpt-worker", "--log-progress"] if written != "synchronously" else []
    )
    first = _run(corpus, ckpt, metrics, *NON_PERSISTENT, *background)
    if background:
        assert f"writing checkpoint {ckpt / 'non_persistent' / 'iter_0000006'} in the background" in first.stderr
        progress = (ckpt / "progress.txt").read_text()
        assert "Iteration: 4" in progress and "Iteration: 6" not in progress and "Iteration: 2" not in progress
    np_dir = ckpt / "non_persistent"
    assert sorted(p.name for p in np_dir.glob("iter_*")) == ["iter_0000006"]  # 2 and 6 saved, the newest kept
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000004", "iter_0000008"]  # 4 and 8: persistent
    assert f"{'started' if background else 'saved'} non-persistent checkpoint" in first.stderr
    _crashed_after_step_6(ckpt)
    second = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    assert "Loading from a non-persistent checkpoint (non-persistent iter 6)" in second.stderr, second.stderr[-3000:]
    assert second.stderr.count("successfully loaded checkpoint from") == 1 and "at iteration 6" in second.stderr
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 9))  # each step recorded once
    assert_same_steps(read_metrics(straight), resumed)  # loss, grad norm, LR, tokens: bit for bit
    assert checkpoint.latest_step(ckpt) == 8


@pytest.mark.slow
def test_a_pinned_resume_forgets_a_newer_non_persistent_checkpoint_of_the_timeline_it_leaves(corpus, tmp_path):
    """--ckpt-step 4 leaves the timeline of non-persistent step 6: it is removed, so that the next resume without a
    pin takes this run's newest checkpoint (5), not step 6 of the run it left."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    _crashed_after_step_6(ckpt)
    pinned = _run(corpus, ckpt, metrics, *NON_PERSISTENT, "--ckpt-step", "4", "--exit-interval", "5")
    assert "non-persistent checkpoint of step 6 in" in pinned.stderr and "--ckpt-step 4" in pinned.stderr
    assert not list((ckpt / "non_persistent").glob("iter_*")) and checkpoint.latest_step(ckpt) == 5
    again = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    assert "Loading from a non-persistent checkpoint" not in again.stderr and "at iteration 5" in again.stderr


@pytest.mark.slow
def test_damaged_newest_checkpoints_are_passed_over_for_the_newest_that_verifies(corpus, tmp_path):
    """The newest persistent checkpoint (8) with a shard gone, the non-persistent one (6) with a changed byte (its
    sizes match: found when the ranks hash their shares): a resubmission passes over both with a warning naming
    each and why, keeps them on disk, loads the persistent 4 and ends as the straight run, each step once."""
    straight = tmp_path / "straight.jsonl"
    _run(corpus, tmp_path / "straight", straight)
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    gone = sorted(checkpoint.checkpoint_dir(ckpt, 8).glob("*.distcp"))[0]
    gone.unlink()
    changed = sorted(checkpoint.checkpoint_dir(ckpt / "non_persistent", 6).glob("*.distcp"))[0]
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    changed.write_bytes(bytes(data))
    proc = _run(corpus, ckpt, metrics, *NON_PERSISTENT)
    out = proc.stderr
    passed = [line for line in out.splitlines() if "checkpoint passed over (kept on disk for inspection)" in line]
    assert len(passed) == 2 and f"{gone}: missing" in passed[0] and f"{changed}: SHA-256 differs" in passed[1], out[
        -3000:
    ]
    assert "at iteration 4" in out, out[-3000:]
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 9))
    assert_same_steps(read_metrics(straight), resumed)
    (kept,) = (ckpt / "non_persistent").glob("passed_over-iter_0000006-*")  # kept as found, for inspection
    assert (kept / changed.name).read_bytes() == bytes(data) and f"kept for inspection as {kept}" in out
    assert len(list(ckpt.glob("passed_over-iter_0000008-*"))) == 1
    # named (--ckpt-step), a damaged one is a one-line refusal naming the file, never passed over
    gone = sorted(checkpoint.checkpoint_dir(ckpt, 8).glob("*.distcp"))[0]
    gone.unlink()
    proc = _run(corpus, tmp_path / "other", tmp_path / "o.jsonl", "--load", str(ckpt), "--ckpt-step", "8", check=False)
    refused(proc, f"{gone}: missing", "--ckpt-step 4")


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


def _local_files(local) -> dict[str, list[str]]:
    return {rank.name: sorted(p.name for p in rank.iterdir()) for rank in sorted(local.iterdir())}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adam", "distributed"])
def test_local_checkpoints_a_kill_mid_write_leaves_the_previous_one_and_a_changed_file_is_passed_over(
    corpus, tmp_path, optimizer
):
    """Two ranks, persistent saves every 4 steps, local ones every 3. A kill while step 9's local files were written
    (rank 0's complete, rank 1's half): the restart loads local step 6 (newer than the persistent 4), saves 9 over
    the remains and ends as the straight run, each step once. Then rank 1's file of step 9 changed on disk: not
    used (its checksum), the persistent step 8 loads, and the run again ends as the straight run."""
    pytest.importorskip("nvidia_resiliency_ext")
    local, ckpt, metrics = tmp_path / "local", tmp_path / "ckpt", tmp_path / "m.jsonl"
    flags = ["--non-persistent-save-interval", "3", "--non-persistent-ckpt-type", "local"]
    flags += ["--non-persistent-local-ckpt-dir", str(local), "--train-iters", "10"]

    def run(save, m, *extra):
        return pretrain(
            *data_args(corpus, "gpt"),
            "--save",
            str(save),
            "--load",
            str(save),
            "--save-interval",
            "4",
            "--metrics-file",
            str(m),
            "--eval-interval",
            "1000",
            *(["--use-distributed-optimizer"] if optimizer == "distributed" else []),  # local: dp_reshardable
            *extra,
            nproc=2,
        )

    straight = tmp_path / "straight.jsonl"
    run(tmp_path / "straight", straight, "--train-iters", "10")
    background = ["--async-save", "--use-persistent-ckpt-worker"] if optimizer == "distributed" else []
    first = run(ckpt, metrics, *flags, "--exit-interval", "8", *background)
    assert "saved non-persistent local checkpoint of step 6" in first.stderr, first.stderr[-3000:]
    assert ("local non-persistent checkpoints are still written synchronously" in first.stderr) == bool(background)
    six = "iter_0000006_{}_local.pt"
    assert _local_files(local) == {r: [six.format(r), six.format(r) + ".sha256"] for r in "01"}  # 3 went at 6
    # killed while step 9 was written: rank 0's file complete (renamed, its checksum beside it), rank 1's half
    for suffix in ("", ".sha256"):
        shutil.copy(local / "0" / (six.format(0) + suffix), local / "0" / f"iter_0000009_0_local.pt{suffix}")
    (local / "1" / "iter_0000009_1_local.dirty.pt").write_bytes((local / "1" / six.format(1)).read_bytes()[:999])
    shutil.rmtree(checkpoint.checkpoint_dir(ckpt, 8))
    (ckpt / checkpoint.LATEST_MARKER).write_text("4")
    second = run(ckpt, metrics, *flags)
    assert "Loading from a non-persistent checkpoint (non-persistent iter 6)" in second.stderr, second.stderr[-3000:]
    assert "at iteration 6" in second.stderr
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 11))  # each step recorded once
    assert_same_steps(read_metrics(straight), resumed)  # loss, grad norm, LR, tokens: bit for bit
    nine = "iter_0000009_{}_local.pt"
    assert _local_files(local) == {r: [nine.format(r), nine.format(r) + ".sha256"] for r in "01"}
    # rank 1's step-9 file changed since it was written; the persistent 10 is gone, 8 is the newest
    changed = bytearray((local / "1" / nine.format(1)).read_bytes())
    changed[-100] ^= 0xFF
    (local / "1" / nine.format(1)).write_bytes(bytes(changed))
    shutil.rmtree(checkpoint.checkpoint_dir(ckpt, 10))
    (ckpt / checkpoint.LATEST_MARKER).write_text("8")
    third = run(ckpt, metrics, *flags)
    assert "its bytes changed since it was written (checksum): not used" in third.stderr, third.stderr[-3000:]
    assert "at iteration 8" in third.stderr and "non-persistent iter" not in third.stderr
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 11))
    assert_same_steps(read_metrics(straight), resumed)
    # the changed file was forgotten with the rest; step 9 saved again, intact
    assert _local_files(local) == {r: [nine.format(r), nine.format(r) + ".sha256"] for r in "01"}
    again = local / "1" / nine.format(1)
    assert hashlib.sha256(again.read_bytes()).hexdigest() == Path(f"{again}.sha256").read_text()


@pytest.mark.slow
def test_another_runs_local_checkpoint_is_passed_over_and_forgotten(corpus, tmp_path):
    """A local directory holding another run's checkpoint (another seed): the new run says so, starts at step 1
    instead of loading it, and its own local saves replace it."""
    pytest.importorskip("nvidia_resiliency_ext")
    local = tmp_path / "local"
    flags = ["--non-persistent-save-interval", "2", "--non-persistent-ckpt-type", "local"]
    flags += ["--non-persistent-local-ckpt-dir", str(local), "--save-interval", "100", "--train-iters", "3"]
    for seed, run in (("1234", "a"), ("99", "b")):
        ckpt = tmp_path / run
        proc = pretrain(
            *data_args(corpus, "gpt"),
            *flags,
            "--seed",
            seed,
            "--save",
            str(ckpt),
            "--load",
            str(ckpt),
            "--metrics-file",
            str(tmp_path / f"{run}.jsonl"),
            nproc=2,
        )
    assert f"local checkpoint of step 2 in {local} was saved by another run (differs: seed): not used" in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert [r["step"] for r in read_metrics(tmp_path / "b.jsonl")] == [1, 2, 3]
    assert sorted(p.name for p in local.glob("*/*.pt")) == ["iter_0000002_0_local.pt", "iter_0000002_1_local.pt"]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (
            ["--non-persistent-ckpt-type", "local", "--non-persistent-save-interval", "2"],
            "needs --non-persistent-local-ckpt-dir",
        ),
        (
            [
                "--non-persistent-ckpt-type",
                "local",
                "--non-persistent-save-interval",
                "2",
                "--non-persistent-local-ckpt-dir",
                "/l",
                "--non-persistent-global-ckpt-dir",
                "/g",
            ],
            "acts with --non-persistent-ckpt-type global, not local",
        ),
        (
            NON_PERSISTENT + ["--non-persistent-local-ckpt-dir", "/l"],
            "acts with --non-persistent-ckpt-type local, not global",
        ),
        (["--non-persistent-save-interval", "2"], "needs --non-persistent-ckpt-type global or local"),
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


def _poison_local(files) -> None:
    """Every floating tensor of each rank's local file set to NaN, the file's checksum rewritten to match: a
    checkpoint saved so (weights that diverged), not one damaged after its save."""
    import torch

    for path in files:
        state = torch.load(path, weights_only=False)
        with torch.no_grad():
            for tensor in state.tensors:
                if tensor.is_floating_point():
                    tensor.fill_(float("nan"))
        torch.save(state, path)
        Path(f"{path}.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.mark.slow
def test_a_local_checkpoint_loads_once_and_one_with_non_finite_weights_is_refused_as_a_persistent_one(corpus, tmp_path):
    """Persistent saves at 2 and 4 (the end), a local one at 3; the persistent 4 lost (a crash before its marker
    moved). The resume loads the local 3 alone (one load: no persistent load under it) and goes on; the same
    local checkpoint saved with NaN weights and valid checksums is refused at resume as a persistent one is: one
    line naming the tensor, exit 2."""
    pytest.importorskip("nvidia_resiliency_ext")
    local, ckpt = tmp_path / "local", tmp_path / "ckpt"
    flags = ["--non-persistent-save-interval", "3", "--non-persistent-ckpt-type", "local"]
    flags += ["--non-persistent-local-ckpt-dir", str(local), "--save-interval", "2", "--lr-decay-iters", "8"]

    def run(iters: int, check=True):
        args = [*data_args(corpus, "gpt"), *flags, "--train-iters", str(iters), "--save", str(ckpt)]
        return pretrain(*args, "--load", str(ckpt), "--eval-interval", "1000", check=check)

    run(4)
    shutil.rmtree(checkpoint.checkpoint_dir(ckpt, 4))
    (ckpt / checkpoint.LATEST_MARKER).write_text("2")
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path, kept, ignore=shutil.ignore_patterns("kept"))
    resumed = run(5)
    log = resumed.stdout + resumed.stderr
    assert log.count("resumed from local checkpoint") == 1 and "resumed from " + str(ckpt) not in log, log[-3000:]
    assert log.count("successfully loaded checkpoint from") == 1, log[-3000:]
    for crashed in (local, ckpt):  # back to the moment of the crash
        shutil.rmtree(crashed)
        shutil.copytree(kept / crashed.name, crashed)
    _poison_local(sorted(local.glob("*/iter_0000003_*_local.pt")))
    line = refused(run(5, check=False), "not finite")
    assert str(local) in line and "is not finite; refusing to resume from it" in line, line
