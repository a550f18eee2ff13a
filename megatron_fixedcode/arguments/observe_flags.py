"""Megatron-LM's flags that watch a long run (core_v0.16.1's names, dests and defaults): the straggler detector
(``StragglerDetectionConfig``), the profiler and memory history (``ProfilingConfig``), the weight-hash check
across data-parallel replicas and ``--num-workers``. What they do: ``recovery/straggler.py``,
``training/profiling.py``, ``training/run_watch.py``, ``training/batch_reader.py``; docs/training.md.
"""

from __future__ import annotations

import argparse
import dataclasses

from megatron_fixedcode.arguments.config_fields import borrowed, converted, from_dests


def add_observe_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("watching the run (Megatron-LM's straggler detector, profiler, weight-hash check)")
    g.add_argument(
        "--log-straggler",
        action="store_true",
        help="megatron-core's StragglerDetector: every --log-interval, rank 0 logs the min/max forward time "
        "and estimated TFLOP/s across ranks with the rank of each ('MnRtt/Rnk: ... | MxRtt/Rnk: ...'); "
        "on the CPU the times are the wall clock and the GPU readings 0",
    )
    g.add_argument(
        "--straggler-minmax-count",
        type=int,
        default=1,
        help="also log the N ranks of lowest and highest estimated throughput",
    )
    g.add_argument(
        "--disable-straggler-on-startup",
        action="store_true",
        help="start with the detector off; an HTTP request to --straggler-ctrlr-port on rank 0 toggles it",
    )
    g.add_argument(
        "--straggler-ctrlr-port",
        type=int,
        default=65535,
        help="rank 0's port that toggles the detector on/off (takes effect at the next report)",
    )
    g.add_argument(
        "--profile",
        action="store_true",
        help="profile steps --profile-step-start..--profile-step-end on --profile-ranks: torch.profiler "
        "with --use-pytorch-profiler, else the CUDA profiler range for nsys "
        "(--capture-range=cudaProfilerApi; needs CUDA)",
    )
    g.add_argument(
        "--use-pytorch-profiler",
        action="store_true",
        help="--profile with torch.profiler: a trace per rank into --tensorboard-dir (TensorBoard's "
        "profiler plugin), the steps labelled ProfilerStep#N",
    )
    g.add_argument("--profile-step-start", type=int, default=10, help="first step profiled (Megatron-LM's count)")
    g.add_argument("--profile-step-end", type=int, default=12, help="the profile stops after this step")
    g.add_argument("--profile-ranks", type=int, nargs="+", default=[0], help="global ranks to profile")
    g.add_argument(
        "--record-memory-history",
        action="store_true",
        help="record CUDA allocations from the model's build on; the last rank writes a snapshot to "
        "--memory-snapshot-path every --log-interval (and oom_rank-R_PATH on an OOM); needs CUDA",
    )
    g.add_argument("--memory-snapshot-path", default="snapshot.pickle", help="where --record-memory-history writes")
    g.add_argument(
        "--check-weight-hash-across-dp-replicas-interval",
        type=int,
        default=None,
        help="megatron-core's check_param_hashes_across_dp_replicas at the start and every N steps: "
        "a mismatch stops the run naming the step (exit 3)",
    )
    g.add_argument(
        "--num-workers",
        type=int,
        default=2,
        help="DataLoader worker processes reading the training batches ahead (0: read in the training "
        "process); the batches, hence the losses and an exact resume, are the same for any N",
    )


def refuse_observe(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The parse-time refusals of these flags (what needs CUDA is refused at launch: training/runtime_checks.py)."""
    if a.num_workers < 0:
        p.error(f"--num-workers must be >= 0, got {a.num_workers}")
    interval = a.check_weight_hash_across_dp_replicas_interval
    if interval is not None and interval < 1:
        p.error(f"--check-weight-hash-across-dp-replicas-interval must be >= 1, got {interval}")
    if a.profile and a.profile_step_end <= a.profile_step_start:
        p.error(
            f"--profile-step-end ({a.profile_step_end}) must be after --profile-step-start ({a.profile_step_start})"
        )
    if a.profile and a.use_pytorch_profiler and not a.tensorboard_dir:
        p.error("--profile --use-pytorch-profiler writes its traces into --tensorboard-dir: give one")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchConfig:
    """These flags (``--num-workers`` aside: the data's), each default the parser's (a test checks they agree):
    ``WatchConfig()`` watches nothing."""

    log_straggler: bool = False
    straggler_minmax_count: int = 1
    disable_straggler_on_startup: bool = False
    straggler_ctrlr_port: int = 65535
    profile: bool = False
    use_pytorch_profiler: bool = False
    profile_step_start: int = 10
    profile_step_end: int = 12
    profile_ranks: tuple[int, ...] = converted(tuple, default=(0,))
    record_memory_history: bool = False
    memory_snapshot_path: str = "snapshot.pickle"
    check_weight_hash_across_dp_replicas_interval: int | None = None
    log_interval: int = borrowed("logging_flags", default=1)  # when the straggler report and snapshot are written

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "WatchConfig":
        return from_dests(cls, a)
