"""Save + load of the distributed checkpoint on the GPU, the recipe's way, with bit-identical losses after it.

    python scripts/gpu_check/ckpt_roundtrip.py --data-dir OUT/bench-data --work DIR --out OUT/ckpt.json [--log OUT/ckpt.log]

Two runs of the real trainer CLI (`python -m megatron_fixedcode.pretrain`, what users launch) with
bench.py's flags for the binary variant (paper-2 recipe: fp32-autocast-bf16, distributed optimizer
with its overlap flags, local layers, fusions on) at --num-layers 1 (the save's size is not what is
checked; 1 layer + head is ~0.2B parameters, ~2.4 GB of FP32 weights and Adam state):

  A: 4 steps, --save DIR --save-interval 2 (megatron dist_checkpointing, fully parallel save)
  B: --load DIR --ckpt-step 2, steps 3-4

B's steps 3-4 must have A's losses and grad norms exactly (the binary code: no embedding-table
backward, whose atomics are not deterministic on CUDA). Both runs' output goes to --log; the JSON
holds the per-step records, the time of each run and the checkpoint's size. Exit 1 if they differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, STANDIN_VOCAB, make_data, trainer_argv  # noqa: E402

KEYS = ("loss", "grad_norm")


def run_trainer(argv: list[str], log, nproc: int = 1) -> tuple[int, float]:
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1 else []
    cmd = [sys.executable, *launch, "-m", "megatron_fixedcode.pretrain", *argv]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t


def records(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {r["step"]: {k: r.get(k) for k in KEYS} for r in rows if "step" in r and "loss" in r}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--work", required=True, help="checkpoint + metrics (removed first)")
    p.add_argument("--out", required=True)
    p.add_argument("--log", default=None, help="both runs' output (default: stdout)")
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--no-compile-fusions", action="store_true")
    p.add_argument("--cpu-standin", action="store_true", help="toy size on CPU (the CPU test)")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks (torchrun; data parallel, the global batch scaled "
        "with them): NCCL on GPUs (one GPU each), gloo with --cpu-standin",
    )
    a = p.parse_args(argv)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prefix = make_data(Path(a.data_dir), *((100_000, STANDIN_VOCAB) if a.cpu_standin else ()))
    base = trainer_argv(
        "binary",
        prefix,
        4,
        num_layers=a.num_layers,
        compile_fusions=not a.no_compile_fusions,
        cpu_standin=a.cpu_standin,
    ) + ["--log-interval", "1", "--eval-iters", "1"]
    if a.nproc > 1:  # the same micro batch on each rank: the global batch grows with the ranks
        gbs = int(base[len(base) - 1 - base[::-1].index("--global-batch-size") + 1])
        base += ["--global-batch-size", str(gbs * a.nproc)]
    ckpt = work / "ckpt"
    log = open(a.log, "a") if a.log else sys.stdout
    layers = int(base[len(base) - 1 - base[::-1].index("--num-layers") + 1])  # the last one given wins
    result: dict = {"trainer_argv": base, "num_layers": layers, "ranks": a.nproc}
    rc_a, result["save_run_s"] = run_trainer(
        [*base, "--save", str(ckpt), "--save-interval", "2", "--metrics-file", str(work / "a.jsonl")], log, a.nproc
    )
    result["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) if ckpt.exists() else 0
    rc_b = None
    if rc_a == 0:
        rc_b, result["load_run_s"] = run_trainer(
            [*base, "--load", str(ckpt), "--ckpt-step", "2", "--metrics-file", str(work / "b.jsonl")], log, a.nproc
        )
    first, second = records(work / "a.jsonl"), records(work / "b.jsonl")
    after = {step: (first.get(step), second.get(step)) for step in (3, 4)}
    identical = rc_a == 0 and rc_b == 0 and all(x is not None and x == y for x, y in after.values())
    result.update(
        save_run_rc=rc_a,
        load_run_rc=rc_b,
        identical_after_load=identical,
        steps_after_load={str(k): {"uninterrupted": x, "loaded": y} for k, (x, y) in after.items()},
    )
    Path(a.out).write_text(json.dumps(result, indent=1))
    if log is not sys.stdout:
        log.close()
    summary = (
        f"summary: {a.nproc} rank(s): save run exit {rc_a} ({result['save_run_s']:.0f} s, checkpoint {result['checkpoint_bytes'] / 2**30:.2f} GiB)"
        f", load run exit {rc_b}"
        + (f" ({result['load_run_s']:.0f} s)" if rc_b is not None else "")
        + f"; steps 3-4 after the load {'bit-identical' if identical else 'DIFFER'}: "
        + "; ".join(f"step {k} {x} vs {y}" for k, (x, y) in after.items())
    )
    print(summary)
    shutil.rmtree(ckpt, ignore_errors=True)  # GBs on the GPU machine's disk
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
