"""The start-up free-space estimate from the real bytes per parameter of each
optimizer and precision (it assumed 12 for all: 25% low with the distributed optimizer, so it never
warned), checked against real saves; and a resume in another precision says so in one line."""

import math
import shutil
from pathlib import Path

import pytest

from megatron_fixedcode.checkpoint import save_checks
from tests.helpers.pretrain import data_args, pretrain, write_corpus

# Big enough that the tensors dominate the files (2.36M parameters), small enough for one CPU step.
SIZE = ["--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "1024", "--num-attention-heads", "4"]
MODES = {  # name: (flags, estimate_checkpoint_bytes keywords)
    "fp32_distopt": (["--use-distributed-optimizer"], dict(distributed_optimizer=True)),
    "bf16_distopt": (["--bf16", "--use-distributed-optimizer"], dict(bf16=True, distributed_optimizer=True)),
    "fp32_plain": ([], {}),
    "bf16_plain": (["--bf16"], dict(bf16=True)),
    "fp32_distopt_dp_reshardable": (
        ["--use-distributed-optimizer", "--no-dist-ckpt-optim-fully-reshardable"],
        dict(distributed_optimizer=True, fully_reshardable=False),
    ),
}


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    root = tmp_path_factory.mktemp("size")
    corpus = write_corpus(root)
    out = {}
    for name, (flags, _) in MODES.items():
        proc = pretrain(
            *SIZE, *flags, "--train-iters", "1", "--save", str(root / name), *data_args(corpus, "document_windows")
        )
        out[name] = (root / name, proc.stdout + proc.stderr)
    return corpus, out


def _num_parameters(target: Path) -> int:
    from megatron.core import dist_checkpointing

    meta = dist_checkpointing.load_tensors_metadata(str(target))
    return sum(math.prod(v.global_shape) for k, v in meta.items() if not k.startswith("optimizer"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_checkpoint_size_estimate_matches_a_real_save(saves, mode):
    ckpt, _ = saves[1][mode]
    target = ckpt / "iter_0000001"
    on_disk = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    params = _num_parameters(target)
    estimate = save_checks.estimate_checkpoint_bytes(params, **MODES[mode][1])
    print(f"{mode}: {params} parameters, {on_disk} bytes on disk = {on_disk / params:.3f} B/param")
    assert on_disk <= estimate <= 1.03 * on_disk + (1 << 20), (mode, on_disk / params, estimate / params)


def test_free_space_warning_uses_the_distributed_optimizers_size(tmp_path, monkeypatch):
    """Room for 1.8 checkpoints at 12 B/param (the old estimate) is room for fewer than 1.4 at 16."""
    params = 1_700_000_000
    old = params * 12
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(save_checks.shutil, "disk_usage", lambda p: usage._replace(free=int(2.2 * old)))
    size = save_checks.estimate_checkpoint_bytes(params, distributed_optimizer=True)
    assert size >= params * 16
    assert "less than 2 checkpoints" in save_checks.free_space_warning(tmp_path, size)


@pytest.mark.parametrize(
    "saved, now, line",
    [
        (
            "fp32_distopt",
            ["--bf16", "--use-distributed-optimizer"],
            "precision changed: the checkpoint was saved with FP32 weights (no --bf16), this run trains with BF16 weights (--bf16)",
        ),
        (
            "bf16_distopt",
            ["--use-distributed-optimizer"],
            "precision changed: the checkpoint was saved with BF16 weights (--bf16), this run trains with FP32 weights (no --bf16)",
        ),
    ],
    ids=["fp32->bf16", "bf16->fp32"],
)
@pytest.mark.slow
def test_a_resume_in_another_precision_says_so_in_one_line(saves, tmp_path, saved, now, line):
    corpus, runs = saves
    ckpt, log = runs[saved]
    assert "precision changed" not in log
    proc = pretrain(
        *SIZE,
        *now,
        "--train-iters",
        "2",
        "--load",
        str(ckpt),
        "--save",
        str(tmp_path / "next"),
        *data_args(corpus, "document_windows"),
    )
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if "precision changed" in x]
    assert len(lines) == 1 and line in lines[0], lines
