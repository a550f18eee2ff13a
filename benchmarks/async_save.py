"""Step time during a save, with and without ``--async-save``: the same training run twice, side by side.

Both runs are the trainer itself (``python -m megatron_fixedcode.pretrain``, megatron's mock data, one rank
unless ``--nproc``), identical but for ``--async-save --use-persistent-ckpt-worker`` in the second; each saves
every ``--save-interval`` steps. The trainer's log line gives the wall time of every step, the save included
in the step after it (``elapsed time per iteration``). Reported per run: the median step away from saves, and
the mean step of the ``window`` steps that follow each intermediate save (the steps during a save: the sync
run's blocking write lands in the first of them; the async run's background write overlaps them, its
finalize, checksums included, in whichever step finds the write done); and the time each save blocked
training ("saved/started checkpoint ... in X s"). Ratio: async over sync for the save windows.

Run: ``python benchmarks/async_save.py [--smoke] [--json]`` (``--smoke``: a tiny model, for the tests).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIZES = {
    "full": dict(layers=4, hidden=512, ffn=2048, vocab=32768, seq=128, iters=16, interval=4, window=2),
    "smoke": dict(layers=2, hidden=64, ffn=128, vocab=1024, seq=32, iters=8, interval=3, window=1),
}
STEP = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([\d.]+)")
SAVE = re.compile(r"(saved|started) checkpoint \S+ in ([\d.]+) s")


def run(size: str, root: Path, nproc: int, asynchronous: bool) -> dict:
    s = SIZES[size]
    save = root / ("async" if asynchronous else "sync")
    cmd = [
        sys.executable,
        *(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1 else []),
        "-m",
        "megatron_fixedcode.pretrain",
        "--mock-data",
        "--transformer-impl",
        "local",
        "--num-layers",
        str(s["layers"]),
        "--hidden-size",
        str(s["hidden"]),
        "--ffn-hidden-size",
        str(s["ffn"]),
        "--num-attention-heads",
        "8",
        "--seq-length",
        str(s["seq"]),
        "--max-position-embeddings",
        str(s["seq"]),
        "--vocab-size",
        str(s["vocab"]),
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        str(2 * nproc),
        "--lr",
        "1e-4",
        "--train-iters",
        str(s["iters"]),
        "--log-interval",
        "1",
        "--eval-iters",
        "0",
        "--save",
        str(save),
        "--save-interval",
        str(s["interval"]),
        "--ckpt-keep-last",
        "2",
        *(["--async-save", "--use-persistent-ckpt-worker"] if asynchronous else []),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the {'async' if asynchronous else 'sync'} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    log = proc.stdout + proc.stderr
    steps = {int(m[1]): float(m[2]) / 1000 for m in STEP.finditer(log)}
    saves = [float(m[2]) for m in SAVE.finditer(log)]
    after = {k + j for k in range(s["interval"], s["iters"], s["interval"]) for j in range(1, s["window"] + 1)}
    quiet = [t for k, t in steps.items() if k not in after and k > 1 and k % s["interval"]]
    return {
        "async": asynchronous,
        "steps": len(steps),
        "step_s_median_away_from_saves": statistics.median(quiet),
        "step_s_mean_during_saves": statistics.mean(steps[k] for k in sorted(after) if k in steps),
        "save_blocking_s": saves,
        "during_saves_steps": sorted(after),
    }


def table(r: dict) -> str:
    lines = [
        f"step time during a save, {r['size']} model, {r['nproc']} rank(s), {r['machine']['host_cpus']} CPUs, "
        f"load {r['machine']['load_average'][0]}"
    ]
    for p in r["runs"]:
        lines.append(
            f"  {'async' if p['async'] else 'sync '}: step {p['step_s_median_away_from_saves']:.3f} s away "
            f"from saves, {p['step_s_mean_during_saves']:.3f} s during saves "
            f"(steps {p['during_saves_steps']});"
            f" a save blocked {', '.join(f'{t:.2f}' for t in p['save_blocking_s'])} s"
        )
    lines.append(f"  async / sync, step time during saves: {r['async_over_sync_during_saves']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model, for the tests")
    p.add_argument("--json", action="store_true")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks of each run (gloo on the CPU)")
    args = p.parse_args()
    size = "smoke" if args.smoke else "full"
    with tempfile.TemporaryDirectory(prefix="mfc_async_save_") as tmp:
        runs = [run(size, Path(tmp), args.nproc, False), run(size, Path(tmp), args.nproc, True)]
    result = {
        "size": size,
        "nproc": args.nproc,
        "model": SIZES[size],
        "machine": machine(),
        "runs": runs,
        "async_over_sync_during_saves": runs[1]["step_s_mean_during_saves"] / runs[0]["step_s_mean_during_saves"],
    }
    emit(result, args.json, table)


if __name__ == "__main__":
    main()
