"""The embedded default: corpus → tokenizer → index → a tiny fixed-code model and its learned-input
control, trained the same way on CPU ranks; prints both validation perplexities side by side.

Every variant trains the same number of steps on the same LR schedule. ``--minutes`` chooses that
step count before any variant trains, from a short timed probe of each variant (the fused CPU
kernel is built first, so no clock pays for its compile); it never cuts a run short.

    python -m megatron_fixedcode.quickstart_pipeline            # about 1-2 minutes per model on 2 CPU cores
    python -m megatron_fixedcode.quickstart_pipeline --quick    # a few steps: checks the pipeline
    python -m megatron_fixedcode.quickstart_pipeline --input my_docs/ --tokenizer-model tok/tokenizer.json

Without ``--input`` the corpus is the docstrings of the Python standard library's sources (read
with ``ast``, nothing imported): about 1.8 MB of English text present on every Python installation,
one document per module, in sorted path order, so the same Python version gives the same bytes.
Every stage writes under ``--work-dir`` (default ``runs/quickstart``):
``corpus/``, ``tokenizer/``, ``data/``, ``checkpoints/<variant>/``, ``logs/<variant>/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from megatron_fixedcode.arguments.user_errors import ArgumentParser, report_error
from megatron_fixedcode.data.quickstart_corpus import stdlib_documents, user_corpus, write_corpus

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = Path(__file__).resolve().parent / "recipes" / "tiny_cpu.yaml"  # examples/recipes, package data


# ---------------------------------------------------------------- tokenizer and index


def build_data(args: argparse.Namespace) -> dict:
    """Corpus, tokenizer and index under ``args.work_dir``; returns the paths the trainer needs."""
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess
    from megatron_fixedcode.tokenizers import train_bpe_tokenizer

    work = Path(args.work_dir)
    corpus_dir = work / "corpus"
    if args.input:
        inputs, text = user_corpus(args.input, corpus_dir, need_text=args.tokenizer_model is None)
        id_key = None  # split by text hash: user files need no id field
    else:
        jsonl, text, count = write_corpus(stdlib_documents(int(args.corpus_mb * 2**20)), corpus_dir)
        logger.info("corpus: %d stdlib modules' docstrings, %.2f MB -> %s", count, jsonl.stat().st_size / 2**20, jsonl)
        inputs, id_key = [str(jsonl)], "id"
    tokenizer_model = args.tokenizer_model
    if tokenizer_model is None:
        tokenizer_model = str(train_bpe_tokenizer([str(text)], args.vocab_size, str(work / "tokenizer")))
        logger.info("tokenizer: byte-level BPE, vocab %d -> %s", args.vocab_size, tokenizer_model)
    prefix = work / "data" / "corpus"
    summary = preprocess(
        PreprocessConfig(
            input=inputs,
            output_prefix=str(prefix),
            tokenizer_type=args.tokenizer_type,
            tokenizer_model=tokenizer_model,
            append_eod=True,
            id_key=id_key,
            valid_fraction=args.valid_fraction,
            min_doc_tokens=65,
            log_interval=1_000_000,
        )
    )
    if summary["documents"].get("valid", 0) == 0:
        raise ValueError(f"no document fell into the validation split: raise --valid-fraction ({args.valid_fraction})")
    logger.info(
        "index: %s",
        ", ".join(
            f"{s} {summary['documents'][s]} documents / {summary['tokens'][s]} tokens" for s in summary["documents"]
        ),
    )
    return {
        "tokenizer_model": tokenizer_model,
        "train": summary["outputs"]["train_text"],
        "valid": summary["outputs"]["valid_text"],
        "summary": summary,
    }


# ---------------------------------------------------------------- training


QUICK_STEPS = 6
PROBE_STEPS = 8  # timed steps per variant before training (the first two, warm-up, are not counted)
MIN_STEPS = 20  # however small the time limit: below this the comparison says nothing
EVALUATIONS = 4  # validation every steps // 4, and at the end
HANG_BACKSTOP_S = 900  # a run killed by this failed; it is never a budget


def train_command(variant: str, data: dict, args: argparse.Namespace, steps: int, *, probe: bool = False) -> list[str]:
    """The torchrun command of one variant (``python -m torch.distributed.run`` is ``torchrun``).

    ``steps`` is the same for every variant, and with it the LR schedule (the recipe's cosine ends
    at the last step); no time limit is passed, so no variant can stop early.
    """
    work = Path(args.work_dir)
    logs = work / "logs" / ("probe" if probe else variant)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(args.nproc),
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        str(args.config),
        "--input-embedding",
        variant,
        "--train-data-path",
        data["train"],
        "--valid-data-path",
        data["valid"],
        "--tokenizer-type",
        args.tokenizer_type,
        "--tokenizer-model",
        data["tokenizer_model"],
        "--metrics-file",
        str(logs / (f"{variant}.jsonl" if probe else "metrics.jsonl")),
        "--train-iters",
        str(steps),
    ]
    if probe:  # no checkpoint, one validation batch at the end
        return cmd + ["--eval-iters", "1", "--log-interval", "1"]
    cmd += ["--save", str(work / "checkpoints" / variant)]
    if args.quick:
        return cmd + ["--eval-interval", "3", "--eval-iters", "1", "--log-interval", "1"]
    return cmd + [
        "--eval-interval",
        str(max(1, steps // EVALUATIONS)),
        "--eval-iters",
        str(args.eval_iters),
        "--log-interval",
        str(max(1, steps // 20)),
    ]


def build_kernel(variants: Sequence[str]) -> None:
    """Compile the fused CPU fixed-code kernel now (30-70 s on a fresh machine, cached on disk), so
    that neither the probe nor a training run of a code variant pays for it."""
    if any(v != "learned" for v in variants):
        from megatron_fixedcode.kernels import fixed_code_cpu_kernel

        fixed_code_cpu_kernel()  # None if it cannot be built: every run then uses the torch path alike


def choose_steps(seconds_per_step: dict[str, float], minutes: float, max_steps: int, eval_iters: int) -> int:
    """One step count for every variant: as many as the slowest variant trains in ``minutes``
    (its evaluations included, a forward costing ~1/3 of a step), within [MIN_STEPS, max_steps]."""
    if minutes <= 0 or not seconds_per_step:
        return max_steps
    slowest = max(seconds_per_step.values())
    fits = int((60 * minutes - EVALUATIONS * eval_iters * slowest / 3) / slowest)
    return min(max_steps, max(MIN_STEPS, fits))


def probe_seconds_per_step(variant: str, data: dict, args: argparse.Namespace) -> float:
    """Median seconds per training step of a short run of ``variant`` (start-up not counted)."""
    metrics = Path(args.work_dir) / "logs" / "probe" / f"{variant}.jsonl"
    metrics.unlink(missing_ok=True)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    rc, output = _run(train_command(variant, data, args, PROBE_STEPS, probe=True), timeout_s=HANG_BACKSTOP_S)
    times = sorted(r["step_time_s"] for r in _records(metrics) if "step_time_s" in r and r.get("step", 0) > 2)
    if rc != 0 or not times:
        raise RuntimeError(f"the timing probe of {variant} failed (exit {rc}):\n{output[-2000:]}")
    return times[len(times) // 2]


def _run(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    """(exit code, output) of a command in its own process group, all of which a hang past ``timeout_s`` ends."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONWARNINGS="ignore")
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            output, _ = proc.communicate()
        return proc.returncode, output


def run_variant(variant: str, data: dict, args: argparse.Namespace, steps: int) -> int:
    """Train one variant from scratch for ``steps`` steps, streaming rank 0's log; returns the exit code."""
    work = Path(args.work_dir)
    for stale in (work / "checkpoints" / variant, work / "logs" / variant):
        shutil.rmtree(stale, ignore_errors=True)  # a rerun starts fresh instead of resuming
    (work / "logs" / variant).mkdir(parents=True)
    cmd = train_command(variant, data, args, steps)
    print(f"\n=== {variant}: torchrun {' '.join(cmd[3:])}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONWARNINGS="ignore")
    log_path = work / "logs" / variant / "train.log"
    with (
        open(log_path, "w") as log,
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        ) as proc,
    ):
        # A backstop for a hang only: a run it kills has failed (the table is not printed as a comparison).
        backstop = threading.Timer(max(HANG_BACKSTOP_S, 60 * 3 * args.minutes), os.killpg, (proc.pid, signal.SIGTERM))
        backstop.start()
        try:
            for line in proc.stdout:
                log.write(line)
                print(f"[{variant}] {line}", end="", flush=True)
            rc = proc.wait()
        finally:
            backstop.cancel()
    return rc


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_metrics(path: Path) -> dict:
    """Last training record and last evaluation record of a metrics JSONL file."""
    last, last_eval = {}, {}
    for record in _records(path):
        last = record
        if "val_loss" in record:
            last_eval = record
    return {"last": last, "eval": last_eval}


def format_results(results: dict[str, dict], work: Path) -> str:
    rows = [
        f"{'input':>8}  {'steps':>6}  {'tokens':>9}  {'train loss':>10}  {'val loss':>8}  {'val ppl':>8}  checkpoint"
    ]
    for variant, m in results.items():
        last, ev = m["last"], m["eval"]
        val_ppl = ev.get("val_ppl", math.exp(ev["val_loss"]) if "val_loss" in ev else float("nan"))
        rows.append(
            f"{variant:>8}  {last.get('step', 0):>6}  {last.get('tokens', 0):>9}  "
            f"{last.get('loss', float('nan')):>10.4f}  {ev.get('val_loss', float('nan')):>8.4f}  "
            f"{val_ppl:>8.2f}  {work / 'checkpoints' / variant}"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m megatron_fixedcode.quickstart_pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--work-dir", default="runs/quickstart")
    p.add_argument(
        "--input",
        nargs="+",
        default=None,
        help="your corpus: JSONL/JSON(.gz)/Parquet with a 'text' field, or any text files (one document each)",
    )
    p.add_argument("--tokenizer-model", default=None, help="your tokenizer (tokenizer.json, its directory, or .model)")
    p.add_argument(
        "--tokenizer-type", default="HuggingFaceTokenizer", choices=["HuggingFaceTokenizer", "SentencePieceTokenizer"]
    )
    p.add_argument("--vocab-size", type=int, default=4096, help="of the BPE trained when no --tokenizer-model")
    p.add_argument("--corpus-mb", type=float, default=3.0, help="cap on the stdlib docstring corpus")
    p.add_argument("--valid-fraction", type=float, default=0.05)
    p.add_argument("--variants", nargs="+", default=["binary", "learned"], choices=["binary", "gf2", "learned"])
    p.add_argument("--config", default=str(TINY_RECIPE), help="trainer recipe")
    p.add_argument("--nproc", type=int, default=2, help="CPU ranks (gloo)")
    p.add_argument(
        "--minutes",
        type=float,
        default=2.5,
        help="time target per variant: a timed probe picks ONE step count for all variants before "
        "training (at least %d, at most --train-iters); 0: exactly --train-iters" % MIN_STEPS,
    )
    p.add_argument(
        "--train-iters",
        type=int,
        default=1000,
        help="most steps per variant (1000 x 8 x 64 = 512k targets, about one pass over the stdlib corpus)",
    )
    p.add_argument("--eval-iters", type=int, default=20, help="validation batches per evaluation (4 evaluations)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_STEPS} steps per variant, no probe: checks the pipeline end to end",
    )
    p.add_argument("--data-only", action="store_true", help="stop after corpus, tokenizer and index")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        data = build_data(args)
    except ValueError as e:
        report_error(e)
        return 2
    print(f"tokenizer {data['tokenizer_model']}\ntrain {data['train']}\nvalid {data['valid']}", flush=True)
    if args.data_only:
        return 0
    build_kernel(args.variants)  # before any clock starts
    steps = QUICK_STEPS if args.quick else args.train_iters
    if not args.quick and args.minutes > 0:
        try:
            timing = {v: probe_seconds_per_step(v, data, args) for v in args.variants}
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        steps = choose_steps(timing, args.minutes, args.train_iters, args.eval_iters)
        print(
            "probe: "
            + ", ".join(f"{v} {s:.3f} s/step" for v, s in timing.items())
            + f" -> {steps} steps for every variant (time target {args.minutes:g} min each)",
            flush=True,
        )
    codes = {v: run_variant(v, data, args, steps) for v in args.variants}
    work = Path(args.work_dir)
    results = {v: read_metrics(work / "logs" / v / "metrics.jsonl") for v in args.variants}
    done = {v: m["last"].get("step") for v, m in results.items()}
    equal = all(s == steps for s in done.values())
    print("\nvalidation on held-out documents (a toy-scale smoke comparison, not a reproduction of the papers):")
    print(format_results(results, work), flush=True)
    failed = [v for v, rc in codes.items() if rc != 0]
    if equal and not failed:
        tokens = {m["last"].get("tokens") for m in results.values()}
        targets = f" ({tokens.pop():,} targets)" if len(tokens) == 1 and None not in tokens else ""
        print(f"equal budget: every variant trained {steps} steps{targets} on the same LR schedule", flush=True)
        return 0
    print(f"NOT COMPARABLE: the variants did not all finish {steps} steps ({done})", flush=True)
    if failed:
        print(f"error: training failed for {', '.join(failed)}: see {work}/logs/<variant>/train.log", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
