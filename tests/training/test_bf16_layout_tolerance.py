"""How closely a BF16 run with the distributed optimizer, stopped on DP 2 and
resumed on PP 2 or on 1 rank, tracks the uninterrupted DP-2 run. docs/training.md promised grad
norms within 1e-4; the campaign measured 2.77e-4 (losses bit-identical), and an uninterrupted
1-rank run differs from DP 2 by 3.1e-4 as well: BF16 gradients summed in another order, not lost
state. Measured here: at most 9.6e-8 (relative grad norm, resumed steps 4-6). Asserted: 1e-6, ten
times that; a resume that lost Adam's step or moments is off by 2e-3 to 9e-3
(tests/training/test_distributed_optimizer.py), two thousand times the bound."""

import shutil

import pytest

from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus

# Max relative grad-norm difference over the resumed steps 4-6, measured here (gloo, megatron-core
# 0.16.1, 4 layers of h 64): DP2 -> PP2 9.6e-8, DP2 -> 1 rank 9.2e-8, a straight 1-rank run against
# DP 2 9.2e-8 (the campaign's larger runs: 2.77e-4 and 3.1e-4, reduction order). Asserted at ten times
# the largest here, 1e-6; a resume that lost Adam's state is off by 2e-3 or more.
BF16_LAYOUT_RTOL = 1e-6
LAYOUTS = {"1": ([], 1), "dp2": ([], 2), "pp2": (["--pipeline-model-parallel-size", "2"], 2)}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.slow
def test_bf16_distributed_optimizer_resume_on_another_layout_within_the_measured_tolerance(tmp_path):
    (tmp_path / "data").mkdir()
    common = [
        "--train-iters",
        "6",
        "--lr-warmup-iters",
        "1",
        "--num-layers",
        "4",
        "--bf16",
        "--use-distributed-optimizer",
        *data_args(write_corpus(tmp_path / "data"), "document_windows"),
    ]

    def run(name, layout, *extra):
        flags, nproc = LAYOUTS[layout]
        pretrain(*common, *flags, *extra, "--metrics-file", str(tmp_path / f"{name}.jsonl"), nproc=nproc)
        return {r["step"]: r for r in read_metrics(tmp_path / f"{name}.jsonl")}

    straight = run("straight", "dp2")
    one_rank = run("one_rank", "1")
    ckpt = tmp_path / "ckpt"
    run("first", "dp2", "--save", str(ckpt), "--exit-interval", "3")
    measured = {
        "1 rank vs DP2 (uninterrupted)": max(_rel(one_rank[s]["grad_norm"], straight[s]["grad_norm"]) for s in straight)
    }
    for now in ("pp2", "1"):
        copy = tmp_path / f"ckpt_{now}"
        shutil.copytree(ckpt, copy)
        resumed = run(f"resumed_{now}", now, "--save", str(copy), "--load", str(copy))
        assert sorted(resumed) == [4, 5, 6]
        for step, r in resumed.items():
            assert (r["lr"], r["tokens"]) == (straight[step]["lr"], straight[step]["tokens"])
            assert r["loss"] == pytest.approx(straight[step]["loss"], rel=BF16_LAYOUT_RTOL), (now, step)
        measured[f"DP2 -> {now}"] = max(_rel(r["grad_norm"], straight[s]["grad_norm"]) for s, r in resumed.items())
    print("BF16 + distributed optimizer, max relative grad-norm difference:", measured)
    assert max(measured.values()) <= BF16_LAYOUT_RTOL, measured
