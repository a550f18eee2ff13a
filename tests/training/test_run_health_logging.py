"""Megatron-LM's run-health flags act, under Megatron's names: --log-params-norm, --log-num-zeros-in-grad,
--log-memory-to-tensorboard, the timers (--timing-log-level, --timing-log-option, --log-timers-to-tensorboard),
--log-progress and --distributed-timeout-minutes (docs/training.md, "Run health")."""

import re
from pathlib import Path

import pytest

from megatron_fixedcode.arguments.inert_flags import INERT
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.training.progress_log import ProgressLog
from megatron_fixedcode.training.timers import LEVEL1_TIMERS, LEVEL2_TIMERS, timers_to_log
from tests.helpers.pretrain import TINY, data_args, pretrain, read_metrics, write_corpus

HEALTH = [
    "--log-params-norm",
    "--log-num-zeros-in-grad",
    "--log-memory-to-tensorboard",
    "--timing-log-level",
    "2",
    "--log-timers-to-tensorboard",
    "--log-progress",
]


def test_the_flags_act_with_megatrons_defaults():
    cfg = parse_pretrain_args(
        [
            *TINY,
            "--train-iters",
            "2",
            "--dry-run",
            *HEALTH,
            "--timing-log-option",
            "all",
            "--distributed-timeout-minutes",
            "3",
        ]
    )
    assert cfg.inert == []
    lg = cfg.logging
    assert (
        lg.log_params_norm,
        lg.log_num_zeros_in_grad,
        lg.log_memory_to_tensorboard,
        lg.log_timers_to_tensorboard,
        lg.log_progress,
        lg.timing_log_level,
        lg.timing_log_option,
    ) == (True, True, True, True, True, 2, "all")
    assert cfg.args.distributed_timeout_minutes == 3
    default = parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run"])
    assert (
        default.logging.timing_log_level,
        default.logging.timing_log_option,
        default.args.distributed_timeout_minutes,
    ) == (0, "minmax", 10)  # Megatron-LM's defaults
    assert not {
        "log_params_norm",
        "log_num_zeros_in_grad",
        "log_memory_to_tensorboard",
        "timing_log_level",
        "timing_log_option",
        "log_timers_to_tensorboard",
        "log_progress",
        "distributed_timeout_minutes",
    } & set(INERT)


def test_timers_at_megatrons_levels():
    assert timers_to_log(0) == []
    assert (
        timers_to_log(1) == list(LEVEL1_TIMERS) and "forward-backward" in LEVEL1_TIMERS and "optimizer" in LEVEL1_TIMERS
    )
    assert timers_to_log(2) == [*LEVEL1_TIMERS, *LEVEL2_TIMERS] and "batch-generator" in LEVEL2_TIMERS


def test_progress_log_has_megatrons_lines_and_cumulative_throughput_restarts_with_the_world_size(tmp_path):
    def job(world_size, saves):
        log = ProgressLog(
            str(tmp_path), enabled=True, rank0=True, world_size=world_size, flops_per_sample=1e12, seq_length=1000
        )
        log.start(saves[0] - 1)
        for it in saves:
            log.saved(it, it * 1000)

    job(1, [1, 2])
    job(1, [3])  # a resume: Starting job again, the count goes on
    job(2, [4])  # another world size: cumulative throughput counts from this job
    lines = [line.split("\t") for line in (tmp_path / "progress.txt").read_text().splitlines()]
    assert [t[3] for t in lines] == [
        "Starting job",
        "Saved checkpoint",
        "Saved checkpoint",
        "Starting job",
        "Saved checkpoint",
        "Starting job",
        "Saved checkpoint",
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", t[0]) and t[1].startswith("Job ID: ") for t in lines)
    assert [t[2] for t in lines] == ["# GPUs: 1"] * 5 + ["# GPUs: 2"] * 2
    saved = lines[4]
    assert saved[4] == "Iteration: 3" and saved[5].startswith("Job throughput: ") and saved[5].endswith(" TFLOP/s/GPU")
    assert saved[6].startswith("Cumulative throughput: ") and saved[7] == "Floating-point operations: 3.00e+15"
    assert saved[8] == "Tokens (in billions): 0.00"
    disabled = ProgressLog(None, enabled=True, rank0=True, world_size=1, flops_per_sample=1.0, seq_length=1)
    disabled.start(0)
    disabled.saved(1, 1)  # no --save: nothing, as Megatron-LM


def test_progress_log_of_async_saves_has_megatrons_two_lines(tmp_path):
    """--async-save: ``Saving async checkpoint`` (with the throughputs) when the write starts, ``Saved async
    checkpoint`` when it is finalized."""
    log = ProgressLog(str(tmp_path), enabled=True, rank0=True, world_size=1, flops_per_sample=1e12, seq_length=1000)
    log.start(0)
    log.saved(2, 2000, asynchronous=True)
    log.async_saved(2)
    lines = [line.split("\t") for line in (tmp_path / "progress.txt").read_text().splitlines()]
    assert [t[3:5] for t in lines[1:]] == [
        ["Saving async checkpoint", "Iteration: 2"],
        ["Saved async checkpoint", "Iteration: 2"],
    ]
    assert lines[1][7] == "Floating-point operations: 2.00e+15" and len(lines[2]) == 5


@pytest.mark.slow
def test_distributed_timeout_reaches_torchs_and_megatrons_groups():
    import subprocess
    import sys

    from tests.helpers import REPO

    code = (
        "from megatron_fixedcode.compat import initialize_distributed\n"
        "from megatron_fixedcode.compat.distributed import collective_timeout\n"
        "from megatron_fixedcode.compat.layout import ParallelLayout\n"
        "from megatron.core import parallel_state as ps\n"
        "initialize_distributed(ParallelLayout(), timeout_s=180)\n"
        "print([str(collective_timeout(g)) for g in (None, ps.get_data_parallel_group(),"
        " ps.get_tensor_model_parallel_group(), ps.get_model_parallel_group())])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == str(["0:03:00"] * 4), out.stderr[-3000:]


def _scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_one_rank_logs_the_numbers_timers_and_progress_under_megatrons_names_across_a_resume(corpus, tmp_path):
    pytest.importorskip("tensorboard")
    common = [
        *data_args(corpus, "gpt"),
        "--train-iters",
        "4",
        "--log-interval",
        "2",
        "--save",
        str(tmp_path / "ck"),
        "--save-interval",
        "2",
        "--tensorboard-dir",
        str(tmp_path / "tb"),
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        "--eval-interval",
        "2",
        "--distributed-timeout-minutes",
        "3",
        *HEALTH,
    ]
    first = pretrain(*common, "--exit-interval", "2")
    second = pretrain(*common, "--load", str(tmp_path / "ck"))
    log = first.stderr + second.stderr
    lines = [line for line in log.splitlines() if " iteration " in line and "consumed samples" in line]
    assert len(lines) == 2 and all(
        re.search(
            r"grad norm: [\d.]+ \| num zeros: [\d.]+ \| params norm: [\d.]+ \| "
            r"number of skipped",
            line,
        )
        for line in lines
    ), lines
    assert "(min, max) time across ranks (ms):" in log
    for name in (
        "forward-backward",
        "forward-compute",
        "backward-compute",
        "batch-generator",
        "optimizer ",
        "all-grads-sync",
        "save-checkpoint",
        "evaluate",
    ):
        assert re.search(rf"\n    {name}\s*\.+: \([\d.]+, [\d.]+\)", log), name
    assert "collectives time out after 0:03:00 (--distributed-timeout-minutes 3)" in log
    assert "no CUDA memory on this machine" in log
    records = read_metrics(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(r["params_norm"] > 0 for r in records)
    assert all("num_zeros" in r for r in records)
    tags = _scalars(tmp_path / "tb")
    for tag in (
        "params-norm",
        "num-zeros",
        "mem-rss-bytes",
        "forward-backward-time",
        "optimizer-time",
        "batch-generator-time",
        "params-norm vs samples",
    ):
        assert tag in tags, (tag, sorted(tags))
    assert [s for s, _ in tags["params-norm"]] == [1, 2, 3, 4]
    assert [s for s, _ in tags["forward-backward-time"]] == [2, 4]  # every --log-interval
    progress = [line.split("\t")[3:5] for line in (tmp_path / "ck" / "progress.txt").read_text().splitlines()]
    assert progress == [
        ["Starting job"],
        ["Saved checkpoint", "Iteration: 2"],
        ["Starting job"],
        ["Saved checkpoint", "Iteration: 4"],
    ]


def _first_line_numbers(proc) -> tuple[float, float]:
    line = next(line for line in proc.stderr.splitlines() if " iteration " in line and "params norm" in line)
    return float(re.search(r"params norm: ([\d.]+)", line)[1]), float(re.search(r"num zeros: ([\d.]+)", line)[1])


@pytest.mark.slow
def test_params_norm_and_zeros_count_each_parameter_once_across_tp_and_dp(corpus, tmp_path):
    """The same model on 1 rank, TP 2 and DP 2: the same parameter norm (TP duplicates and DP replicas
    counted once) and the same count of zeros; --timing-log-option all names every rank."""
    common = [*data_args(corpus, "gpt"), "--train-iters", "1", "--log-params-norm", "--log-num-zeros-in-grad"]
    one = _first_line_numbers(pretrain(*common))
    tp2 = _first_line_numbers(pretrain(*common, "--tensor-model-parallel-size", "2", nproc=2))
    dp2 = pretrain(*common, "--timing-log-level", "1", "--timing-log-option", "all", nproc=2)
    assert tp2[0] == pytest.approx(one[0], rel=1e-5) and _first_line_numbers(dp2)[0] == pytest.approx(one[0], rel=1e-5)
    assert tp2[1] == one[1] == _first_line_numbers(dp2)[1]
    assert "times across ranks (ms):\n  forward-backward:\n     rank  0: " in dp2.stderr
    assert "\n     rank  1: " in dp2.stderr
