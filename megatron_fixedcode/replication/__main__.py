"""python -m megatron_fixedcode.replication [--quick] — see the package docstring."""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from megatron_fixedcode.replication.data import REPO_ROOT, build_indexed_corpus, shared_data_dir
from megatron_fixedcode.replication.report import plot_curves, summarize, write_markdown

logger = logging.getLogger(__name__)

VARIANTS = {  # name -> trainer flags; the first is the control the others are compared with
    "learned": ["--input-embedding", "learned"],
    "binary": ["--input-embedding", "binary"],
    "gf2": ["--input-embedding", "gf2", "--code-seed", "12345"],
    "binary_normmatch": ["--input-embedding", "binary", "--code-norm-match"],
    "random": ["--input-embedding", "random"],
    "sinusoidal": ["--input-embedding", "sinusoidal"],
    "lowdim": ["--input-embedding", "lowdim"],
}
MODELS = {
    "full": ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "512",
             "--seq-length", "128", "--micro-batch-size", "8", "--global-batch-size", "8", "--lr", "2e-3",
             "--min-lr", "2e-4", "--lr-warmup-iters", "20"],
    "quick": ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
              "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "4", "--lr", "3e-3",
              "--min-lr", "3e-4", "--lr-warmup-iters", "2"],
}
READING_CAVEATS = """What this run can show: whether, at this tiny scale and short budget, the fixed codes train
through the same megatron-core pipeline to perplexities comparable with the learned table, and how
large seed variation is relative to the gaps. What it cannot show: anything about the papers'
regime. The models are 4 × 128 (d/K = 8 tiles of the 16-bit code, against 128 in paper 2), see
~10^5 tokens (against 17–100B), and the learned table holds most of the learned
model's parameters (49,152 × 128 = 6.3M against ~1M in the blocks), so "learned vs fixed" here also
compares very different parameter counts and optimizer dynamics. At this budget the loss is far from
converged and dominated by unigram/bigram statistics; LAMBADA accuracy of such models is near zero
and only checks the evaluation path. The corpus (books, speeches, Wikipedia) is not FineWeb-Edu."""


def train_command(variant: str, seed: int, data: dict, work: Path, args) -> list[str]:
    iters = args.train_iters
    return [sys.executable, "-m", "megatron_fixedcode.pretrain", *MODELS["quick" if args.quick else "full"],
            *VARIANTS[variant], "--seed", str(seed), "--train-iters", str(iters), "--transformer-impl", "local",
            "--data-path", data["train"], "--valid-data-path", data["valid"], "--dataset-type", "gpt",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", data["tokenizer_model"],
            "--eval-interval", str(max(1, iters // 5)), "--eval-iters", "2" if args.quick else "4",
            "--log-interval", str(max(1, iters // 50)), "--save", str(work / "checkpoints" / f"{variant}_s{seed}"),
            "--metrics-file", str(work / "logs" / f"{variant}_s{seed}.jsonl")]


def run_training(cmd: list[str], log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"training failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron_fixedcode.replication")
    p.add_argument("--quick", action="store_true", help="tiny CI run in a temporary directory (< 2 min)")
    p.add_argument("--work-dir", default=None, help="default runs/replication (a temporary directory with --quick)")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--train-iters", type=int, default=None)
    p.add_argument("--corpus-mb", type=float, default=None)
    p.add_argument("--parallel", type=int, default=3, help="training runs at once (one CPU process each)")
    p.add_argument("--lambada-examples", type=int, default=None)
    p.add_argument("--val-tokens", type=int, default=None)
    p.add_argument("--output-md", default=None, help="default docs/REPLICATION.md (work dir with --quick)")
    p.add_argument("--reading", default=None, help="markdown file with the hand-written reading")
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a = build_parser().parse_args(argv)
    quick = a.quick
    a.variants = a.variants or ["learned", "binary", "gf2"]
    a.seeds = a.seeds or ([1, 2] if quick else [1, 2, 3])
    a.train_iters = a.train_iters or (4 if quick else 60)
    corpus_mb = a.corpus_mb or (0.15 if quick else 3.0)
    lambada_n = a.lambada_examples or (10 if quick else 200)
    val_tokens = a.val_tokens or (1024 if quick else 16384)
    if len(a.seeds) < 1 or a.parallel < 1:
        raise SystemExit("give at least one seed and --parallel >= 1")
    work = Path(a.work_dir or (tempfile.mkdtemp(prefix="replication_") if quick else REPO_ROOT / "runs" / "replication"))
    out_md = Path(a.output_md or (work / "REPLICATION.md" if quick else REPO_ROOT / "docs" / "REPLICATION.md"))
    started = time.time()
    for stale in ("checkpoints", "logs"):
        shutil.rmtree(work / stale, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    data = build_indexed_corpus(work, int(corpus_mb * 2**20))
    logger.info("corpus: %s documents, %s tokens", data["documents"], data["tokens"])
    jobs = [(v, s) for s in a.seeds for v in a.variants]
    with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
        futures = {pool.submit(run_training, train_command(v, s, data, work, a), work / "logs" / f"{v}_s{s}.log"): (v, s)
                   for v, s in jobs}
        for fut in concurrent.futures.as_completed(futures):
            fut.result()
            logger.info("trained %s seed %d (%.1f min)", *futures[fut], (time.time() - started) / 60)
    from megatron_fixedcode.replication.evaluate import evaluate_checkpoint, lambada_examples

    examples = lambada_examples(shared_data_dir(), lambada_n)
    results: dict[str, dict[int, dict]] = {v: {} for v in a.variants}
    for v, s in jobs:
        results[v][s] = evaluate_checkpoint(str(work / "checkpoints" / f"{v}_s{s}"), data["valid"], examples,
                                            max_tokens=val_tokens)
        logger.info("%s seed %d: val ppl %.2f, LAMBADA %.3f", v, s, results[v][s]["val_ppl"],
                    results[v][s]["lambada"]["accuracy"])
    table = summarize(results)
    (work / "results.json").write_text(json.dumps({"results": results, "table": table}, indent=1, default=str))
    figure = plot_curves({v: {s: work / "logs" / f"{v}_s{s}.jsonl" for s in a.seeds} for v in a.variants},
                         out_md.parent / ("replication_loss.png" if not quick else "loss.png"))
    model = MODELS["quick" if quick else "full"]
    flags = dict(zip(model[::2], model[1::2]))
    tokens_per_run = results[a.variants[0]][a.seeds[0]]["tokens_trained"]
    setup = {
        "summary": f"{len(a.variants)} inputs × {len(a.seeds)} seeds, {a.train_iters} steps each",
        "date": datetime.date.today().isoformat(), "wall_minutes": (time.time() - started) / 60,
        "val_tokens": results[a.variants[0]][a.seeds[0]]["val_tokens"], "lambada_examples": lambada_n,
        "description": (
            f"Corpus: {corpus_mb:g} MB of the shared English corpus (Gutenberg books without license text, State of the "
            f"Union speeches, WikiText-2 valid), ~4,000-character paragraph-aligned documents, split train/held-out by a "
            f"hash of the document id: {data['documents']['train']} train / {data['documents']['valid']} held-out documents, "
            f"{data['tokens']['train']:,} / {data['tokens']['valid']:,} tokens. Tokenizer: SmolLM2 "
            f"(V = 49,152, K = 16). Model: llama block (RMSNorm, SwiGLU, RoPE, no biases), {flags['--num-layers']} layers × "
            f"{flags['--hidden-size']}, {flags['--num-attention-heads']} heads, FFN {flags['--ffn-hidden-size']}, context "
            f"{flags['--seq-length']}, untied head, FP32 on CPU. AdamW lr {flags['--lr']} → {flags['--min-lr']}, "
            f"{flags['--lr-warmup-iters']} warmup steps, cosine, wd 0.01, clip 1.0; {flags['--global-batch-size']} "
            f"sequences per step, {a.train_iters} steps = {tokens_per_run:,} prediction targets per run. Seeds "
            f"{a.seeds} (`--seed`: init and data order; gf2 keeps the paper's code seed 12345). One CPU process per run. "
            f"Inputs: {', '.join(f'`{v}` (`' + ' '.join(VARIANTS[v]) + '`)' for v in a.variants)}."),
    }
    reading = Path(a.reading).read_text() if a.reading else READING_CAVEATS
    write_markdown(out_md, table, setup, figure, reading)
    print(f"wrote {out_md} and {figure} (work dir {work}, {(time.time() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
