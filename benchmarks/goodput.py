"""Goodput of a days-long run under failures, per recovery and checkpoint strategy (checkpoint/cadence.py's model).

Paper 2's run (1.7B parameters, 100B tokens) on 16 GPUs, and the same model on 256 and 4,096 GPUs for the same
days of compute, under the Llama 3 report's failure rate (419 unexpected interruptions in 54 days on 16,384
GPUs). Each strategy is simulated (400 runs) and compared side by side with the first, as a ratio:

* ``requeue by a person``: persistent checkpoints every 1,000 steps (the launchers' SAVE_INTERVAL); a crash ends
  the job FAILED until someone resubmits it (``--human-hours``, default 4: a night);
* ``in-job restart``: the same checkpoints; the group restarts inside the allocation (detect + restart + load);
* ``+ non-persistent (sync)``: in-job restart, and non-persistent checkpoints at Young/Daly's interval;
* ``+ non-persistent (async)``: the same, their save blocking training only for the staging share that
  ``benchmarks/async_save.py`` measured;
* ``requeue and wait``: in-job restart, except that a node loss (the hardware share of faults, ~78% in Llama 3)
  ends the allocation: the job waits ``--queue-wait-hours`` (default 2) in the queue, then restarts;
* ``shrink and continue``: a node loss is cut out: the run relaunches on the nodes left (8 GPUs each) within the
  restart time and goes on at (nodes - lost) / nodes of the throughput; the node returns after
  ``--repair-hours`` (default 24) and the run grows back at its next save for one restart
  (``recovery/node_loss.py`` states the model's choices).

Inputs measured on this machine: the per-rank write and read rates of the trainer's save and load
(``docs/benchmark_runs/checkpoint_io_2026-12-02.json``), the async save's blocking share
(``docs/benchmark_runs/async_save_2026-12-04.json``), and a restart's fixed cost, measured here (a 1-step tiny
trainer run: interpreter, imports, process group, model, one step). Assumed, and printed: the tokens per GPU per
second (``--tokens-per-gpu-s``; the GPU check has not run), the shared filesystem's aggregate write rate
(``--fs-gbs``) and the time to detect a failure (``--detect-s``).

Run: ``python benchmarks/goodput.py [--json] [--smoke]`` (``--smoke``: 40 runs per strategy, for the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_fixedcode.checkpoint.cadence import (  # noqa: E402
    LLAMA3_FAILURES_PER_GPU_HOUR,
    expected_goodput,
    mtbf_seconds,
    young_daly_interval,
)
from megatron_fixedcode.checkpoint.save_checks import estimate_checkpoint_bytes  # noqa: E402
from megatron_fixedcode.recovery.node_loss import LLAMA3_HARDWARE_SHARE, expected_node_loss_goodput  # noqa: E402

PARAMS = 1_711_400_000  # paper 2's binary/gf2 model (docs/SCALING.md)
TOKENS_16 = 100e9  # paper 2's budget on 16 GPUs
STEP_TOKENS = 128 * 2048  # paper 2's global batch x sequence
SAVE_INTERVAL_STEPS = 1000  # examples/slurm_common.sh's SAVE_INTERVAL
GPUS_PER_NODE = 8
RUNS = REPO / "docs" / "benchmark_runs"


def measured_rates() -> dict:
    """This machine's per-rank save and load rates (bytes/s, 1 rank) and the async save's blocking share."""
    io = json.loads((RUNS / "checkpoint_io_2026-12-02.json").read_text())
    one = next(p for p in io["phases"] if p["ranks"] == 1)
    runs = json.loads((RUNS / "async_save_2026-12-04.json").read_text())["runs"]
    blocked = {r["async"]: sum(r["save_blocking_s"]) / len(r["save_blocking_s"]) for r in runs}
    return {
        "write_bytes_per_s": one["checkpoint_bytes"] / one["save_s"],
        "read_bytes_per_s": one["checkpoint_bytes"] / one["load_s"],
        "async_blocking_share": blocked[True] / blocked[False],
        "measured_on": io["machine"]["date"],
    }


def measure_restart_s() -> float:
    """A restart's fixed cost here: a fresh trainer process to the end of one step of a tiny model."""
    cmd = [sys.executable, "-m", "megatron_fixedcode.pretrain", "--num-layers", "2", "--hidden-size", "64"]
    cmd += ["--num-attention-heads", "4", "--ffn-hidden-size", "128", "--seq-length", "32", "--lr", "1e-3"]
    cmd += ["--train-iters", "1", "--mock-data", "--vocab-size", "1024", "--transformer-impl", "local"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def scenarios(a, rates: dict, restart_fixed_s: float) -> list[dict]:
    rows = []
    for gpus in (16, 256, 4096):
        compute_s = TOKENS_16 / (16 * a.tokens_per_gpu_s)  # the same days of compute at every size
        total_bytes = estimate_checkpoint_bytes(PARAMS, distributed_optimizer=True)  # paper 2's: 16 B/param
        save_s = max(total_bytes / gpus / rates["write_bytes_per_s"], total_bytes / (a.fs_gbs * 1e9))
        load_s = total_bytes / gpus / rates["read_bytes_per_s"]
        mtbf = mtbf_seconds(gpus)
        persistent_s = SAVE_INTERVAL_STEPS * STEP_TOKENS / (16 * a.tokens_per_gpu_s)  # weak scaling: same step time
        restart_s = a.detect_s + restart_fixed_s + load_s
        nonpersistent_s = young_daly_interval(save_s, mtbf)
        async_save_s = save_s * rates["async_blocking_share"]
        queue_s = a.queue_wait_hours * 3600
        loss = dict(nodes=gpus // GPUS_PER_NODE, hardware_share=LLAMA3_HARDWARE_SHARE, queue_wait_s=queue_s)
        grow = dict(shrink=True, repair_s=a.repair_hours * 3600, grow_s=restart_fixed_s + load_s)
        strategies = [
            ("requeue by a person", persistent_s, save_s, a.human_hours * 3600 + restart_s, None),
            ("in-job restart", persistent_s, save_s, restart_s, None),
            ("+ non-persistent (sync)", min(persistent_s, nonpersistent_s), save_s, restart_s, None),
            (
                "+ non-persistent (async)",
                min(persistent_s, young_daly_interval(async_save_s, mtbf)),
                async_save_s,
                restart_s,
                None,
            ),
            ("requeue and wait", persistent_s, save_s, queue_s + restart_s, loss),  # restart: a node loss's
            ("shrink and continue", persistent_s, save_s, restart_s, {**loss, **grow}),
        ]
        for name, interval, cost, restart, policy in strategies:
            if policy is None:
                mean, p10, failures = expected_goodput(compute_s, interval, cost, restart, mtbf, trials=a.trials)
            else:
                mean, p10, failures = expected_node_loss_goodput(
                    compute_s, interval, cost, restart_s, mtbf, trials=a.trials, **policy
                )
            rows.append(
                {
                    "gpus": gpus,
                    "strategy": name,
                    "interval_s": interval,
                    "save_s": cost,
                    "restart_s": restart,
                    "mtbf_h": mtbf / 3600,
                    "compute_h": compute_s / 3600,
                    "failures": failures,
                    "goodput": mean,
                    "goodput_p10": p10,
                }
            )
        base = rows[-len(strategies)]["goodput"]
        for row in rows[-len(strategies) :]:
            row["vs_requeue"] = row["goodput"] / base
    return rows


def table(result: dict) -> str:
    a = result["assumed"]
    lines = [
        f"failure rate: {result['failures_per_gpu_hour']:.3g} per GPU-hour (Llama 3: 419 in 54 days on 16,384 GPUs)",
        f"measured here: save {result['rates']['write_bytes_per_s'] / 1e6:.0f} MB/s and load "
        f"{result['rates']['read_bytes_per_s'] / 1e6:.0f} MB/s per rank, async blocking share "
        f"{result['rates']['async_blocking_share']:.2f}, restart fixed cost {result['restart_fixed_s']:.1f} s",
        f"assumed: {a['tokens_per_gpu_s']:,} tokens/GPU/s, filesystem {a['fs_gbs']} GB/s, detection "
        f"{a['detect_s']} s, a person resubmits after {a['human_hours']} h, a requeue waits {a['queue_wait_hours']} h, "
        f"a lost node is back after {a['repair_hours']} h ({GPUS_PER_NODE} GPUs a node, "
        f"{100 * LLAMA3_HARDWARE_SHARE:.0f}% of faults lose one)",
        "",
        "| GPUs | strategy | checkpoint every | save blocks | restart | failures | goodput (p10) | vs requeue |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['gpus']:,} | {r['strategy']} | {r['interval_s'] / 60:.1f} min | {r['save_s']:.2f} s | "
            f"{r['restart_s'] / 60:.1f} min | {r['failures']:.2f} | {100 * r['goodput']:.2f}% "
            f"({100 * r['goodput_p10']:.2f}%) | **{r['vs_requeue']:.3f}x** |"
        )
    return "\n".join(lines)


ASSUMED = ("tokens_per_gpu_s", "fs_gbs", "detect_s", "human_hours", "queue_wait_hours", "repair_hours")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="40 simulated runs per strategy (the tests)")
    p.add_argument("--tokens-per-gpu-s", type=int, default=30_000, help="assumed training throughput per GPU")
    p.add_argument("--fs-gbs", type=float, default=20.0, help="assumed aggregate write rate of the shared filesystem")
    p.add_argument("--detect-s", type=float, default=30.0, help="assumed time to detect a crash or hang")
    p.add_argument("--human-hours", type=float, default=4.0, help="assumed wait for a person to resubmit")
    p.add_argument("--queue-wait-hours", type=float, default=2.0, help="assumed queue wait of a requeued job")
    p.add_argument("--repair-hours", type=float, default=24.0, help="assumed time until a lost node is back")
    a = p.parse_args()
    a.trials = 40 if a.smoke else 400
    rates = measured_rates()
    restart_fixed_s = measure_restart_s()
    result = {
        "failures_per_gpu_hour": LLAMA3_FAILURES_PER_GPU_HOUR,
        "rates": rates,
        "restart_fixed_s": restart_fixed_s,
        "assumed": {k: getattr(a, k) for k in ASSUMED},
        "trials": a.trials,
        "rows": scenarios(a, rates, restart_fixed_s),
    }
    print(json.dumps(result, sort_keys=True) if a.json else table(result))


if __name__ == "__main__":
    main()
