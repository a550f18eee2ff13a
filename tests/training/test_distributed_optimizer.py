"""The configuration users run, on CPU + gloo: megatron's distributed optimizer, BF16
weights, overlapped gradient reduce / parameter gather, and resume from any layout to any other.

Every trainer here has 4 layers (so PP 2 with two virtual stages fits) and trains 6 steps of a
global batch of 8 on 2 ranks unless the layout says otherwise. The layouts track each other to
float rounding (tests/models/test_parallel_parity.py), so every resumed run is compared with the DP 2 run
of its optimizer and precision, straight through.
"""

import json
import re
from pathlib import Path

import pytest

from megatron_fixedcode.checkpoint import CHECKSUMS, checkpoint_dir, latest_step
from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus
from tests.helpers.errors import logged_errors

pytestmark = pytest.mark.slow

STEPS = 6
LAYOUTS = {  # name: (flags, ranks)
    "1": ([], 1),
    "dp2": ([], 2),
    "tp2": (["--tensor-model-parallel-size", "2"], 2),
    "pp2": (["--pipeline-model-parallel-size", "2"], 2),
    "vpp2": (["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"], 2),
}
MODES = {  # optimizer and precision
    "plain": [],
    "distopt": ["--use-distributed-optimizer"],
    "bf16": ["--bf16"],
    "bf16_distopt": ["--bf16", "--use-distributed-optimizer"],
}
# Resumed steps against the straight run (measured on both megatron-core lines, 0.16.1 and 0.19.2):
# FP32 loss equal and grad norm within 1.1e-6 relative across TP/PP/DP changes; BF16 weights within
# 1.1e-5 (TP 2 -> interleaved PP 2). A resume that loses Adam's step or moments is off by 2e-3 to
# 9e-3 from the second resumed step (measured: megatron's shared step tensor, dropped moments).
RTOL = {"plain": 1e-5, "distopt": 1e-5, "bf16": 1e-4, "bf16_distopt": 1e-4}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _common(corpus):
    return [
        "--train-iters",
        str(STEPS),
        "--lr-warmup-iters",
        "1",
        "--num-layers",
        "4",
        *data_args(corpus, "document_windows"),
    ]


def _train(corpus, out: Path, mode: str, layout: str = "dp2", *extra: str, check: bool = True):
    flags, nproc = LAYOUTS[layout]
    return pretrain(
        *_common(corpus), *MODES[mode], *flags, *extra, "--metrics-file", str(out), nproc=nproc, check=check
    )


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory):
    """Each mode trained straight through on DP 2, and its start-up log."""
    root = tmp_path_factory.mktemp("straight")
    runs = {}
    for mode in MODES:
        proc = _train(corpus, root / f"{mode}.jsonl", mode)
        runs[mode] = (read_metrics(root / f"{mode}.jsonl"), proc.stdout + proc.stderr)
    overlap = ["--overlap-grad-reduce", "--overlap-param-gather"]
    proc = _train(corpus, root / "overlap.jsonl", "distopt", "dp2", *overlap)
    runs["overlap"] = (read_metrics(root / "overlap.jsonl"), proc.stdout + proc.stderr)
    return runs


def _assert_track(records, reference, rtol):
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for r, s in zip(records, reference):
        assert r["loss"] == pytest.approx(s["loss"], rel=rtol), (r["step"], r["loss"], s["loss"])
        assert r["grad_norm"] == pytest.approx(s["grad_norm"], rel=rtol), (r["step"], r["grad_norm"], s["grad_norm"])


# Measured (both megatron-core lines): the distributed optimizer's losses equal plain Adam's to the
# last bit over these 6 steps; its gradient norm, summed from the DP shards instead of whole
# gradients, differs in the last bits (<= 5e-8 relative). A broken sharding or gather (stale
# parameters on one rank) is off by > 1e-3 after one step.
SAME_UPDATE_RTOL = 1e-6


# --- equivalences -----------------------------------------------------------------------------------


def test_distributed_optimizer_matches_plain_adam(straight):
    """DP 2: reduce-scatter + sharded Adam + all-gather against all-reduce + whole Adam."""
    assert len(straight["plain"][0]) == STEPS
    _assert_track(straight["distopt"][0], straight["plain"][0], SAME_UPDATE_RTOL)
    assert "optimizer: megatron DistributedOptimizer" in straight["distopt"][1]
    assert "optimizer: torch AdamW" in straight["plain"][1]


def test_overlapped_grad_reduce_and_param_gather_match_no_overlap(straight):
    """The same collectives, started asynchronously as buckets fill (measured: bit-identical)."""
    _assert_track(straight["overlap"][0], straight["distopt"][0], SAME_UPDATE_RTOL)
    assert "overlap: grad reduce, param gather" in straight["overlap"][1]


def test_bf16_distributed_optimizer_matches_bf16_plain(straight):
    """BF16 weights with FP32 main weights sharded over DP vs kept whole."""
    _assert_track(straight["bf16_distopt"][0], straight["bf16"][0], SAME_UPDATE_RTOL)
    assert "optimizer: megatron Float16OptimizerWithFloat16Params" in straight["bf16"][1]
    # and BF16 is BF16: not the FP32 run's losses
    assert [r["loss"] for r in straight["bf16"][0]] != [r["loss"] for r in straight["plain"][0]]


# --- any layout to any layout -------------------------------------------------------------------------

CASES = [  # (saved on, resumed on, mode, what the resume log says is kept)
    ("tp2", "1", "plain", "weights and optimizer state resharded, RNG starts fresh (TP/PP changed)"),
    ("1", "dp2", "distopt", "weights resharded, optimizer state and the RNG states of data-parallel rank 0 kept"),
    ("pp2", "tp2", "distopt", "weights and optimizer state resharded, RNG starts fresh (TP/PP changed)"),
    ("tp2", "vpp2", "bf16_distopt", "weights and optimizer state resharded, RNG starts fresh (TP/PP changed)"),
    ("dp2", "pp2", "bf16", "weights and optimizer state resharded, RNG starts fresh (TP/PP changed)"),
]


@pytest.fixture(scope="module")
def resumed(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("resumed")
    runs = {}
    for saved, now, mode, _ in CASES:
        name = f"{saved}_to_{now}_{mode}"
        ckpt = str(root / name)
        _train(corpus, root / f"{name}_first.jsonl", mode, saved, "--save", ckpt, "--exit-interval", "3")
        assert latest_step(ckpt) == 3
        proc = _train(corpus, root / f"{name}.jsonl", mode, now, "--save", ckpt, "--load", ckpt)
        runs[name] = (read_metrics(root / f"{name}.jsonl"), proc.stdout + proc.stderr, Path(ckpt))
    return runs


@pytest.mark.parametrize("saved,now,mode,kept", CASES, ids=[f"{s}->{n}-{m}" for s, n, m, _ in CASES])
def test_resume_on_another_layout_keeps_adam_schedule_and_stream(straight, resumed, saved, now, mode, kept):
    records, log, _ = resumed[f"{saved}_to_{now}_{mode}"]
    assert kept in log, log[-3000:]
    reference = {r["step"]: r for r in straight[mode][0]}
    assert [r["step"] for r in records] == [4, 5, 6]
    for r in records:
        s = reference[r["step"]]
        assert (r["lr"], r["tokens"]) == (s["lr"], s["tokens"]), r["step"]  # the schedule and the sample stream
        # steps 5 and 6 are the first whose weights Adam's restored state moved
        assert r["loss"] == pytest.approx(s["loss"], rel=RTOL[mode]), (r["step"], r["loss"], s["loss"])
        assert r["grad_norm"] == pytest.approx(s["grad_norm"], rel=RTOL[mode]), (
            r["step"],
            r["grad_norm"],
            s["grad_norm"],
        )


def test_checkpoint_writes_spread_over_data_parallel_ranks(resumed):
    """DP 2 with megatron's plain (BF16) optimizer: every tensor is replicated over both ranks;
    the fully parallel save strategy gives each rank about half of the bytes to write. The
    checksums cover every file, each rank's shard files hashed by that rank."""
    target = checkpoint_dir(resumed["dp2_to_pp2_bf16"][2], 3)
    written = {0: 0, 1: 0}
    for f in target.glob("__*_*.distcp"):
        written[int(re.match(r"__(\d+)_", f.name).group(1))] += f.stat().st_size
    assert min(written.values()) > 0 and max(written.values()) <= 1.5 * min(written.values()), written
    recorded = json.loads((target / CHECKSUMS).read_text())["files"]
    on_disk = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file() and p.name != CHECKSUMS}
    assert set(recorded) == on_disk


def test_bf16_finetune_keeps_the_checkpoint_weights(corpus, resumed, tmp_path):
    """--finetune loads weights only; the BF16 optimizer's FP32 main weights must be copied from
    them (reload_model_params) or the first step writes the initial weights back: at a tiny LR
    the second step's loss then jumps to the untrained ~ln(1024) = 6.93 (measured: 4.60 -> 6.94)."""
    ckpt = resumed["tp2_to_vpp2_bf16_distopt"][2]
    _train(
        corpus,
        tmp_path / "ft.jsonl",
        "bf16_distopt",
        "dp2",
        "--finetune",
        "--load",
        str(ckpt),
        "--lr",
        "1e-12",
        "--min-lr",
        "1e-12",
        "--lr-warmup-iters",
        "0",
        "--train-iters",
        "3",
    )
    losses = [r["loss"] for r in read_metrics(tmp_path / "ft.jsonl")]
    assert losses[0] < 6.85  # the checkpoint is trained
    for later in losses[1:]:
        assert later == pytest.approx(losses[0], rel=2e-2), losses  # other batches, the same weights


# --- what megatron-core cannot reshard is refused, naming the flag ---------------------------------


def _one_error_line(proc) -> str:
    """The one ERROR line of a refused run: a rank exited with code 2 and none with a traceback
    of its own (torchrun then stops the others, SIGTERM, exits 1 and prints its summary)."""
    out = proc.stdout + proc.stderr
    errors = logged_errors(out)
    exit_codes = re.findall(r"exitcode\s*:\s*(-?\d+)", out)
    assert proc.returncode == 2 or (proc.returncode == 1 and "2" in exit_codes and set(exit_codes) <= {"2", "-15"}), (
        out[-3000:]
    )
    assert len(errors) == 1 and "[rank" not in out, out[-3000:]
    return errors[0]


def test_optimizer_change_on_resume_is_refused(corpus, resumed, tmp_path):
    ckpt = str(resumed["tp2_to_1_plain"][2])  # saved without the distributed optimizer
    proc = _train(corpus, tmp_path / "x.jsonl", "distopt", "1", "--load", ckpt, check=False)
    line = _one_error_line(proc)
    assert "saved without --use-distributed-optimizer" in line and "--finetune" in line


def test_dp_reshardable_state_resumes_across_dp_and_refuses_tp(corpus, straight, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _train(
        corpus,
        tmp_path / "a.jsonl",
        "distopt",
        "dp2",
        "--no-dist-ckpt-optim-fully-reshardable",
        "--save",
        ckpt,
        "--exit-interval",
        "3",
    )
    proc = _train(corpus, tmp_path / "tp.jsonl", "distopt", "tp2", "--load", ckpt, check=False)
    line = _one_error_line(proc)
    assert "dp_reshardable" in line and "--no-dist-ckpt-optim-fully-reshardable" in line and "TP 2" in line
    _train(corpus, tmp_path / "dp1.jsonl", "distopt", "1", "--load", ckpt, "--save", ckpt)
    reference = {r["step"]: r for r in straight["distopt"][0]}
    for r in read_metrics(tmp_path / "dp1.jsonl"):
        assert r["loss"] == pytest.approx(reference[r["step"]]["loss"], rel=RTOL["distopt"]), r["step"]


# --- the smaller items on the path users run ---------------------------------------------------------


def test_pipeline_stages_free_their_sent_outputs_and_ddp_checks_each_ranks_gradients(corpus, tmp_path):
    """deallocate_pipeline_outputs for PP > 1 (as Megatron-LM); megatron DDP's check_for_nan_in_grad
    with --check-for-nan-in-loss-and-grad: under --rerun-mode disabled a non-finite loss or gradient stops the
    run (exit 3) with a line naming the rank that found it and the step (validate_results: test_rerun.py)."""
    from megatron_fixedcode.compat import ParallelLayout
    from megatron_fixedcode.models import ModelConfig, build_transformer_config

    cfg = ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=32,
        vocab_size=1024,
        input_embedding="binary",
    )
    assert build_transformer_config(cfg, ParallelLayout(pipeline_model_parallel_size=2)).deallocate_pipeline_outputs
    assert not build_transformer_config(cfg, ParallelLayout()).deallocate_pipeline_outputs
    proc = pretrain(
        "--train-iters",
        "6",
        "--lr",
        "1e30",
        "--lr-warmup-iters",
        "0",
        "--clip-grad",
        "0",
        "--rerun-mode",
        "disabled",
        *data_args(corpus, "document_windows"),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    line = logged_errors(out)[0]
    # Megatron-LM's order: the loss function's check, then megatron DDP's of the gradient buckets
    assert re.search(r"step \d+: rank 0: .*found (NaN|Inf) in local (forward loss calculation|grad norm)", line), line
    assert "--no-check-for-nan-in-loss-and-grad" in line
