"""Checkpoint save + verify on 1 and 2 data-parallel ranks: the same model, side by side in one run.

Each phase is the trainer's own path: megatron's model chunks in DDP, megatron's optimizer (plain
Adam: every tensor replicated over the DP ranks) after one step, then
``checkpoint.save_checkpoint`` (megatron's fully parallel save strategy; each rank hashes the
shard files it wrote, rank 0 merges the checksums) and the load-time verification (every rank
hashes its share of the files, ``verify_checkpoint_share``), then ``load_checkpoint``. Reported
per phase: seconds for save, verify and load, the state's bytes, and the bytes each rank wrote.
Ratios: 2-rank over 1-rank time, and the largest rank's bytes over the smallest's.

Run: ``python benchmarks/checkpoint_io.py [--smoke] [--json]`` (the script relaunches itself under
torchrun for each phase; ``--smoke``: a tiny model, for the tests).

``--formats``: instead, the distributed optimizer's two checkpoint formats on 2 ranks (gloo), one
save each: ``fully_reshardable`` (megatron-core 0.16.1 all-gathers the DP group's optimizer state
onto every rank, ``return_on_all_ranks=True``) and ``dp_reshardable`` (each rank its own shard).
Reported per rank: the host memory the save added at its peak (resident set sampled every 2 ms,
minus the resident set before the save) next to the optimizer state's bytes (FP32 main weights and
Adam's two moments, 12 B per parameter) and this rank's 1/DP share of it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MIB, emit, machine  # noqa: E402

SIZES = {
    "full": dict(num_layers=8, hidden_size=768, ffn_hidden_size=3072, vocab_size=32768),  # ~82M params, ~1.3 GB state
    "smoke": dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=1024),
}


def phase(size: str, out_dir: str) -> dict:
    """One rank of a phase (under torchrun): build, step once, save, verify, load."""
    import torch
    import torch.distributed as dist
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from megatron_fixedcode import checkpoint
    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed, parallel_ranks
    from megatron_fixedcode.models import ModelConfig, build_transformer_config
    from megatron_fixedcode.training.model_chunks import build_model_chunks

    cfg = ModelConfig(num_attention_heads=8, seq_length=64, input_embedding="binary", **SIZES[size])
    pg = initialize_distributed(ParallelLayout(), seed=1)
    chunks = build_model_chunks(cfg, build_transformer_config(cfg, ParallelLayout()), ParallelLayout(), pg)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4), chunks)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=1e-4,
        max_lr=1e-4,
        min_lr=1e-5,
        lr_warmup_steps=0,
        lr_decay_steps=10,
        lr_decay_style="constant",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=10,
        wd_incr_style="constant",
    )
    for chunk in chunks:  # one step on made-up gradients: Adam's state exists, as in any real save
        chunk.zero_grad_buffer()
        for p in chunk.parameters():
            p.main_grad.fill_(1e-3)
    optimizer.step()
    r = parallel_ranks()
    state = {"step": 1, "tokens": 0, "layout": {k: r[k] for k in ("world_size", "tp_size", "pp_size", "dp_size")}}
    dist.barrier()
    t0 = time.perf_counter()
    target = checkpoint.save_checkpoint(out_dir, 1, chunks, optimizer, scheduler, state, keep_last=1)
    t_save = time.perf_counter() - t0
    t0 = time.perf_counter()
    error = checkpoint.verify_checkpoint_share(target, dist.get_rank(), dist.get_world_size())
    dist.barrier()
    t_verify = time.perf_counter() - t0
    assert error is None, error
    t0 = time.perf_counter()
    checkpoint.load_checkpoint(out_dir, chunks, optimizer, scheduler)
    dist.barrier()
    t_load = time.perf_counter() - t0
    written = {}
    for f in Path(target).glob("__*_*.distcp"):
        rank = int(re.match(r"__(\d+)_", f.name).group(1))
        written[rank] = written.get(rank, 0) + f.stat().st_size
    total = sum(f.stat().st_size for f in Path(target).rglob("*") if f.is_file())
    times = torch.tensor([t_save, t_verify, t_load], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a phase lasts as long as its slowest rank
    return {
        "ranks": dist.get_world_size(),
        "save_s": times[0].item(),
        "verify_s": times[1].item(),
        "load_s": times[2].item(),
        "checkpoint_bytes": total,
        "bytes_written_by_rank": written,
    }


class PeakRSS:
    """Peak resident set of this process while active, sampled from /proc every ``interval_s``."""

    def __init__(self, interval_s: float = 0.002):
        import threading

        self.interval_s, self._stop, self.peak = interval_s, threading.Event(), 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def format_phase(size: str, out_dir: str, fmt: str) -> dict:
    """One rank of a --formats phase: the distributed optimizer after one step, one save in ``fmt``."""
    import gc

    import torch
    import torch.distributed as dist
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from megatron_fixedcode import checkpoint
    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed
    from megatron_fixedcode.models import ModelConfig, build_transformer_config
    from megatron_fixedcode.training.model_chunks import build_model_chunks

    cfg = ModelConfig(num_attention_heads=8, seq_length=64, input_embedding="binary", **SIZES[size])
    pg = initialize_distributed(ParallelLayout(), seed=1)
    chunks = build_model_chunks(
        cfg, build_transformer_config(cfg, ParallelLayout()), ParallelLayout(), pg, use_distributed_optimizer=True
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, use_distributed_optimizer=True), chunks
    )
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=1e-4,
        max_lr=1e-4,
        min_lr=1e-5,
        lr_warmup_steps=0,
        lr_decay_steps=10,
        lr_decay_style="constant",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=10,
        wd_incr_style="constant",
    )
    for chunk in chunks:
        chunk.zero_grad_buffer()
        for p in chunk.parameters():
            p.main_grad.fill_(1e-3)
    optimizer.step()
    num_params = sum(p.numel() for chunk in chunks for p in chunk.parameters())
    state = {
        "step": 1,
        "tokens": 0,
        "optimizer_format": fmt,
        "layout": {"world_size": dist.get_world_size(), "tp_size": 1, "pp_size": 1, "dp_size": dist.get_world_size()},
    }
    gc.collect()
    dist.barrier()
    t0 = time.perf_counter()
    with PeakRSS() as rss:
        before = PeakRSS.rss()
        checkpoint.save_checkpoint(out_dir, 1, chunks, optimizer, scheduler, state, keep_last=1)
    t_save = time.perf_counter() - t0
    added = torch.tensor([rss.peak - before], dtype=torch.float64)
    per_rank = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, added)
    return {
        "format": fmt,
        "ranks": dist.get_world_size(),
        "params": num_params,
        "save_s": t_save,
        "optimizer_state_bytes": 12 * num_params,
        "rank_share_bytes": 12 * num_params // dist.get_world_size(),
        "save_added_rss_by_rank": [int(t.item()) for t in per_rank],
    }


def _launch(nproc: int, size: str, root: Path, tag: str, *extra: str) -> dict:
    """One phase under torchrun (this file, --phase): its JSON result, or the run's output on failure."""
    out, result = root / f"ckpt_{tag}", root / f"result_{tag}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        __file__,
        "--phase",
        size,
        *extra,
        "--out",
        str(out),
        "--result",
        str(result),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"phase {tag} ({nproc} ranks) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(result.read_text())


def run_format_phase(size: str, root: Path, fmt: str) -> dict:
    return _launch(2, size, root, fmt, "--format", fmt)


def format_table(r: dict) -> str:
    lines = [
        f"distributed optimizer, one save per format on 2 ranks (gloo), {r['phases'][0]['params'] / 1e6:.1f}M params, "
        f"{r['machine']['host_cpus']} CPUs, load {r['machine']['load_average'][0]}"
    ]
    for p in r["phases"]:
        added = ", ".join(f"rank {i}: {b / MIB:.0f} MiB" for i, b in enumerate(p["save_added_rss_by_rank"]))
        lines.append(
            f"  {p['format']}: save {p['save_s']:.2f} s; host memory added at the peak {added} "
            f"(optimizer state {p['optimizer_state_bytes'] / MIB:.0f} MiB, a rank's share "
            f"{p['rank_share_bytes'] / MIB:.0f} MiB)"
        )
    return "\n".join(lines)


def run_phase(nproc: int, size: str, root: Path) -> dict:
    return _launch(nproc, size, root, str(nproc))


def table(r: dict) -> str:
    lines = [
        f"checkpoint save + verify, {r['checkpoint_mib']:.0f} MiB of state (plain Adam, FP32), {r['machine']['host_cpus']} CPUs, load {r['machine']['load_average'][0]}"
    ]
    for p in r["phases"]:
        shares = ", ".join(f"rank {k}: {v / MIB:.0f} MiB" for k, v in sorted(p["bytes_written_by_rank"].items()))
        lines.append(
            f"  {p['ranks']} rank(s): save {p['save_s']:.2f} s, verify {p['verify_s']:.2f} s, "
            f"load {p['load_s']:.2f} s; written {shares}"
        )
    lines.append(
        f"  2 ranks / 1 rank: save {r['save_ratio_2_over_1']:.2f}x, verify {r['verify_ratio_2_over_1']:.2f}x, "
        f"save+verify {r['save_verify_ratio_2_over_1']:.2f}x; largest/smallest rank's bytes on 2 ranks "
        f"{r['write_balance_2_ranks']:.2f}"
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--formats",
        action="store_true",
        help="the distributed optimizer's two checkpoint formats: host memory per rank for a save",
    )
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("--format", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.phase:  # one rank of a torchrun phase
        result = format_phase(a.phase, a.out, a.format) if a.format else phase(a.phase, a.out)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(a.result).write_text(json.dumps(result))
        return
    size = "smoke" if a.smoke else "full"
    root = Path(tempfile.mkdtemp(prefix="mfc_ckpt_bench_"))
    if a.formats:
        try:
            phases = [run_format_phase(size, root, fmt) for fmt in ("fully_reshardable", "dp_reshardable")]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        emit({"machine": machine(), "size": SIZES[size], "phases": phases}, a.json, format_table)
        return
    try:
        phases = [run_phase(n, size, root) for n in (1, 2)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    one, two = phases
    shares = [v for v in two["bytes_written_by_rank"].values()]
    emit(
        {
            "machine": machine(),
            "size": SIZES[size],
            "phases": phases,
            "checkpoint_mib": one["checkpoint_bytes"] / MIB,
            "save_ratio_2_over_1": two["save_s"] / one["save_s"],
            "verify_ratio_2_over_1": two["verify_s"] / one["verify_s"],
            "save_verify_ratio_2_over_1": (two["save_s"] + two["verify_s"]) / (one["save_s"] + one["verify_s"]),
            "write_balance_2_ranks": max(shares) / min(shares) if len(shares) == 2 and min(shares) else float("inf"),
        },
        a.json,
        table,
    )


if __name__ == "__main__":
    main()
