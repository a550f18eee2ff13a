"""Megatron-LM's watchers of a long run act (docs/training.md, "Run health"): the straggler detector names a
slowed rank, the profiler traces the requested steps on the requested ranks, the weight-hash check catches
replicas that differ, and --num-workers DataLoader workers keep the losses and an exact resume."""

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_fixedcode.compat.distributed import free_port
from megatron_fixedcode.arguments.inert_flags import INERT
from megatron_fixedcode.arguments.observe_flags import WatchConfig
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.training.batch_reader import MicrobatchReader
from megatron_fixedcode.training.profiling import NEEDS_CUDA, Profiler, cuda_refusal
from tests.helpers import REPO
from tests.helpers.pretrain import TINY, data_args, read_metrics, write_corpus

WATCH_DESTS = {
    "log_straggler",
    "straggler_minmax_count",
    "disable_straggler_on_startup",
    "straggler_ctrlr_port",
    "profile",
    "use_pytorch_profiler",
    "profile_step_start",
    "profile_step_end",
    "profile_ranks",
    "record_memory_history",
    "memory_snapshot_path",
    "check_weight_hash_across_dp_replicas_interval",
    "num_workers",
}


def test_the_flags_act_with_megatrons_defaults_and_refuse_in_one_line(capsys):
    assert not WATCH_DESTS & set(INERT)
    a = parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run"]).args
    assert (
        a.straggler_minmax_count,
        a.straggler_ctrlr_port,
        a.profile_step_start,
        a.profile_step_end,
        a.profile_ranks,
        a.memory_snapshot_path,
        a.check_weight_hash_across_dp_replicas_interval,
        a.num_workers,
    ) == (1, 65535, 10, 12, [0], "snapshot.pickle", None, 2)  # Megatron-LM's defaults
    for bad, named in (
        (["--num-workers", "-1"], "--num-workers"),
        (["--check-weight-hash-across-dp-replicas-interval", "0"], "--check-weight-hash"),
        (["--profile", "--profile-step-start", "3", "--profile-step-end", "3"], "--profile-step-end"),
        (["--profile", "--use-pytorch-profiler"], "--tensorboard-dir"),
    ):
        with pytest.raises(SystemExit) as e:
            parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run", *bad])
        assert e.value.code == 2 and named in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals of a machine without CUDA")
def test_cuda_only_profiling_is_refused_without_cuda():
    assert cuda_refusal(WatchConfig(profile=True)) == NEEDS_CUDA["nsys"]
    assert cuda_refusal(WatchConfig(record_memory_history=True)) == NEEDS_CUDA["memory"]
    assert cuda_refusal(WatchConfig(profile=True, use_pytorch_profiler=True)) is None


def _profiled_steps(tb_dir: Path, start_step: int, last_step: int, rank: int = 0) -> set[int]:
    args = WatchConfig(profile=True, use_pytorch_profiler=True, profile_step_start=3, profile_step_end=5)
    profiler = Profiler(args, rank=rank, world_size=1, start_step=start_step, tensorboard_dir=str(tb_dir))
    for step in range(start_step, last_step):
        profiler.before_step(step)
        torch.ones(4) @ torch.ones(4)
        profiler.after_step(step + 1)
    profiler.close()
    traces = glob.glob(str(tb_dir / "*.pt.trace.json*"))
    return {int(n) for path in traces for n in re.findall(r"ProfilerStep#(\d+)", Path(path).read_text())}


def test_the_profiler_records_the_requested_steps_only_also_after_a_resume_and_on_the_named_ranks(tmp_path):
    assert _profiled_steps(tmp_path / "straight", 0, 7) == {3, 4}  # Megatron-LM's window: start .. end - 1
    assert _profiled_steps(tmp_path / "resumed", 2, 7) == {3, 4}  # counted from the checkpoint's step
    assert _profiled_steps(tmp_path / "requeued", 3, 7) == set()  # resumed inside the window: profiled once only
    assert _profiled_steps(tmp_path / "other", 0, 7, rank=1) == set()  # not in --profile-ranks: no trace


class _Samples:
    def __getitem__(self, i):
        return {k: torch.full((4,), i) for k in ("tokens", "labels", "loss_mask", "position_ids")}


def test_workers_read_the_same_microbatches_as_the_training_process_from_any_step():
    kwargs = dict(global_batch=8, micro_batch_size=2, dp_rank=1, dp_size=2, num_microbatches=2, total_samples=64)
    kwargs["digest"] = True  # each microbatch's sample digest, computed in the worker: the same as inline
    inline, workers = MicrobatchReader(_Samples(), **kwargs), MicrobatchReader(_Samples(), num_workers=2, **kwargs)
    for step in (0, 1, 2, 2, 5, 6, 1):  # a step run again, a jump: the workers restart there
        expected, got = inline.read(step), workers.read(step)
        assert got[1] is None and all(torch.equal(a[k], b[k]) for a, b in zip(expected[0], got[0]) for k in a)
    assert [b["tokens"][:, 0].tolist() for b in inline.read(1)[0]] == [[10, 11], [14, 15]]
    assert all("sample_digest" in b for b in workers.read(3)[0])


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "tests.helpers.slowed_rank",
        *TINY,
        *args,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_ranks_straggler_profiler_weight_hashes_and_workers(tmp_path):
    """Rank 1 slowed on purpose is named by the detector; rank 1 alone writes a trace, of step 3 only; the weight
    hashes match until rank 1's are nudged, which stops the run naming the step; with DataLoader workers a stop
    at step 2 and a resume give the straight run's losses (read in the training process) bit for bit."""
    pytest.importorskip("tensorboard")
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    common = [*data_args(corpus, "gpt"), "--train-iters", "4", "--log-interval", "2"]
    ck, tb = str(tmp_path / "ck"), tmp_path / "tb"
    watch = [
        "--slow-rank",
        "1",
        "--log-straggler",
        "--check-weight-hash-across-dp-replicas-interval",
        "1",
        "--num-workers",
        "1",
        "--save",
        ck,
        "--save-interval",
        "2",
        "--metrics-file",
        str(tmp_path / "r.jsonl"),
    ]
    first = _run(*common, *watch, "--exit-interval", "2", "--straggler-ctrlr-port", str(free_port()))
    assert first.returncode == 0, first.stderr[-5000:]
    second = _run(
        *common,
        *watch,
        "--load",
        ck,
        "--straggler-ctrlr-port",
        str(free_port()),
        "--profile",
        "--use-pytorch-profiler",
        "--profile-step-start",
        "3",
        "--profile-step-end",
        "4",
        "--profile-ranks",
        "1",
        "--tensorboard-dir",
        str(tb),
    )
    assert second.returncode == 0, second.stderr[-5000:]
    straight = _run(
        *common,
        "--num-workers",
        "0",
        "--metrics-file",
        str(tmp_path / "s.jsonl"),
        "--check-weight-hash-across-dp-replicas-interval",
        "4",
        "--diverge-at",
        "4",
    )
    log = first.stderr + second.stderr
    reports = re.findall(
        r"MnRtt/Rnk: [\d.]+ms/(\d) \| MxRtt/Rnk: [\d.]+ms/(\d) .*"
        r"MnEtpt/Rnk: [\d.]+TF/(\d) \| MxEtpt/Rnk: [\d.]+TF/(\d)",
        log,
    )
    assert reports == [("0", "1", "1", "0")] * 2, log[-5000:]  # steps 2 and 4: rank 1 slowest
    assert [int(n) for n in re.findall(r">>> Weight hashes match after (\d+) iterations", log)] == [0, 1, 2, 2, 3, 4]
    traces = glob.glob(str(tb / "*.pt.trace.json*"))
    assert len(traces) == 1, traces
    trace = json.loads(Path(traces[0]).read_text())
    assert trace["distributedInfo"]["rank"] == 1
    assert set(re.findall(r"ProfilerStep#(\d+)", Path(traces[0]).read_text())) == {"3"}
    # every rank finds it (a collective); torchrun may stop the second before it exits on its own
    assert straight.returncode != 0 and "exitcode  : 3" in straight.stderr, straight.stderr[-5000:]
    assert re.search(r"ERROR:.*step 4: the weights differ between data-parallel replicas", straight.stderr)
    assert ">>> Weight hashes match after 0 iterations" in straight.stderr
    resumed, reference = read_metrics(tmp_path / "r.jsonl"), read_metrics(tmp_path / "s.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4] == [r["step"] for r in reference]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in reference]
