"""Indexing throughput of the shard-parallel (array) path next to one preprocess_data process.

The shared corpus is cut into --shards JSONL shards. Measured, best of --repeat:

* one process: ``preprocess`` over all shards at once (what ``tools/preprocess_data.py`` does),
  ``--workers 1`` = the tokenizer's native threads on every core;
* array path: --tasks concurrent ``tools/preprocess_shards.py task`` processes (what the Slurm
  array tasks run, one per node in production), sharing the cores; wall time includes each
  task's start-up (imports, tokenizer load), as on a cluster.

Reported: tokens/s and tokens/s per core for each, and the array path's indexing-only rate
(from the per-shard summaries, without start-up). docs/data.md turns these into wall time at
N nodes x C cores. Run: ``python benchmarks/preprocess_shards.py [--shards 12 --tasks 2]``.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MFC_SHARED_DATA", REPO.parent / "shared" / "data"))


def write_shards(corpus_dir: Path, out: Path, num_shards: int) -> list[Path]:
    paragraphs = []
    for path in sorted(p for p in corpus_dir.rglob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        paragraphs += [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(num_shards):
        path = out / f"shard-{s:03d}.jsonl"
        path.write_text(
            "".join(json.dumps({"id": f"{s}:{i}", "text": t}) + "\n" for i, t in enumerate(paragraphs[s::num_shards]))
        )
        paths.append(path)
    return paths


def one_process(shards: list[Path], tokenizer: str, out: Path) -> tuple[float, int]:
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = preprocess(
        PreprocessConfig(
            input=[str(s) for s in shards],
            output_prefix=str(out / "all"),
            tokenizer_type="HuggingFaceTokenizer",
            tokenizer_model=tokenizer,
            id_key="id",
            append_eod=True,
            log_interval=10**9,
        )
    )
    return time.perf_counter() - t0, sum(summary["tokens"].values())


def array_path(shards: list[Path], tokenizer: str, out: Path, tasks: int, cores: int) -> tuple[float, int, float]:
    from megatron_fixedcode.data import shards as shard_plan

    shutil.rmtree(out, ignore_errors=True)
    plan = shard_plan.make_plan(
        [str(s) for s in shards],
        str(out),
        "HuggingFaceTokenizer",
        tokenizer,
        num_tasks=tasks,
        id_key="id",
        append_eod=True,
        log_interval=10**9,
    )
    shard_plan.write_plan(plan)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
        "RAYON_NUM_THREADS": str(max(1, cores // tasks)),
    }
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tools" / "preprocess_shards.py"),
                "task",
                "--output-dir",
                str(out),
                "--task-id",
                str(i),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(plan["num_tasks"])
    ]
    if any(p.wait() for p in procs):
        raise RuntimeError("an array task failed")
    wall = time.perf_counter() - t0
    summaries = [json.loads(p.read_text()) for p in out.glob("*_summary.json")]
    tokens = sum(sum(s["tokens"].values()) for s in summaries)
    busy = sum(s["elapsed_seconds"] for s in summaries)  # indexing time summed over shards
    return wall, tokens, tokens / busy * plan["num_tasks"] if busy else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", default=str(SHARED / "corpus"))
    p.add_argument("--tokenizer-model", default=str(SHARED / "tokenizers" / "smollm2" / "tokenizer.json"))
    p.add_argument("--shards", type=int, default=12)
    p.add_argument("--tasks", type=int, default=None, help="concurrent array tasks (default: the core count)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    tasks = args.tasks or cores
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = write_shards(Path(args.corpus_dir), tmp / "in", args.shards)
        one = min(one_process(shards, args.tokenizer_model, tmp / "one") for _ in range(args.repeat))
        arr = min(array_path(shards, args.tokenizer_model, tmp / "arr", tasks, cores) for _ in range(args.repeat))
    result = {
        "cores": cores,
        "shards": args.shards,
        "array_tasks": tasks,
        "tokens": one[1],
        "one_process": {
            "seconds": one[0],
            "tokens_per_s": one[1] / one[0],
            "tokens_per_s_per_core": one[1] / one[0] / cores,
        },
        "array": {
            "seconds": arr[0],
            "tokens_per_s": arr[1] / arr[0],
            "tokens_per_s_per_core": arr[1] / arr[0] / cores,
            "indexing_only_tokens_per_s_per_core": arr[2] / cores,
        },
    }
    assert arr[1] == one[1], (arr[1], one[1])  # the same tokens either way
    print(f"{result['tokens']} tokens, {args.shards} shards, {cores} cores")
    for name in ("one_process", "array"):
        r = result[name]
        print(
            f"{name:12s} {r['seconds']:8.2f} s  {r['tokens_per_s']:12,.0f} tokens/s  "
            f"{r['tokens_per_s_per_core']:12,.0f} tokens/s/core"
        )
    print(
        f"array, indexing only (no start-up): {result['array']['indexing_only_tokens_per_s_per_core']:,.0f} tokens/s/core"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
