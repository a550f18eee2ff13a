"""python -m megatron_fixedcode.replication [--quick] [--only RUN ...] [--verify RUN] — see the package docstring."""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from megatron_fixedcode.arguments.user_errors import user_errors
from megatron_fixedcode.replication.data import REPO_ROOT, prepare_study_data
from megatron_fixedcode.replication.page import PPL, read_curve, write_report
from megatron_fixedcode.replication.store import ResultStore
from megatron_fixedcode.replication.study import PLANS, Run, StudyPlan

logger = logging.getLogger(__name__)
_EVALUATION = threading.Lock()  # runs train in their own processes; evaluation and the report in this one


def train_command(plan: StudyPlan, run: Run, data: dict, checkpoint: Path, metrics: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        *plan.trainer_flags(run),
        "--train-data-path",
        data["train"],
        "--valid-data-path",
        data["valid"],
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        data["tokenizer_model"],
        "--save",
        str(checkpoint),
        "--load",
        str(checkpoint),
        "--metrics-file",
        str(metrics),
    ]


def train(plan: StudyPlan, run: Run, data: dict, config_hash: str, checkpoint: Path, log: Path) -> tuple[Path, float]:
    """Train (or resume: ``--load`` = ``--save``, the recipe saves periodically) one run. A checkpoint
    directory left by another configuration is removed first, so it is never resumed by mistake."""
    marker = checkpoint / "study_config_hash"
    if checkpoint.exists() and (not marker.is_file() or marker.read_text() != config_hash):
        shutil.rmtree(checkpoint)
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker.write_text(config_hash)
    metrics = checkpoint / "metrics.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    started = time.time()
    with open(log, "a") as f:
        proc = subprocess.run(
            train_command(plan, run, data, checkpoint, metrics),
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{run.name}: training failed (exit {proc.returncode}); see {log}")
    return metrics, time.time() - started


def execute(plan: StudyPlan, run: Run, data: dict, config_hash: str, work: Path) -> dict:
    """Train, evaluate and (for the analysed runs) read one run; the record the store keeps."""
    from megatron_fixedcode.replication.evaluate import heldout_perplexity, model_readings

    checkpoint = work / "checkpoints" / run.name
    (work / "logs").mkdir(parents=True, exist_ok=True)
    metrics_file, seconds = train(plan, run, data, config_hash, checkpoint, work / "logs" / f"{run.name}.log")
    with _EVALUATION:
        metrics = heldout_perplexity(str(checkpoint), data["valid"], max_tokens=plan.eval_tokens)
        readings = (
            model_readings(str(checkpoint), data["valid"], work / "analysis" / run.name, windows=plan.analysis_windows)
            if run in plan.analysed
            else None
        )
    steps, losses, val_steps, val_losses = read_curve(metrics_file)
    return {
        "run": run.name,
        "variant": run.variant,
        "seed": run.seed,
        "config_hash": config_hash,
        "flags": plan.trainer_flags(run, recipe=str(plan.recipe.relative_to(REPO_ROOT))),  # no machine path
        "data_fingerprint": data["fingerprint"],
        **metrics,
        "train_seconds": round(seconds, 1),
        "tokens_per_second": round(metrics["tokens_trained"] / seconds),
        "checkpoint": os.path.relpath(checkpoint, REPO_ROOT),
        "date": datetime.date.today().isoformat(),
        "curve": {"step": steps, "loss": losses, "val_step": val_steps, "val_loss": val_losses},
        "readings": readings,
    }


def verify(plan: StudyPlan, run: Run, data: dict, store: ResultStore, work: Path) -> int:
    """Retrain one run from scratch beside the study and compare with its committed record."""
    committed = store.load(run)
    if committed is None:
        raise ValueError(f"--verify {run.name}: no committed record at {store.path(run)}")
    if committed["data_fingerprint"] != data["fingerprint"]:
        print(
            f"note: the data differ from the committed run's (fingerprint {data['fingerprint']} vs "
            f"{committed['data_fingerprint']}): tokenizer or corpus not reproduced on this machine"
        )
    shutil.rmtree(work / "verify" / "checkpoints" / run.name, ignore_errors=True)
    record = execute(plan, run, data, plan.config_hash(run, data["fingerprint"]), work / "verify")
    same = f"{record['val_ppl']:{PPL}}" == f"{committed['val_ppl']:{PPL}}"
    print(
        f"{run.name}: held-out PPL {record['val_ppl']:{PPL}} now, {committed['val_ppl']:{PPL}} committed: "
        f"{'reproduced' if same else 'DIFFERENT'} (loss {record['val_loss']:.6f} vs {committed['val_loss']:.6f})"
    )
    return 0 if same else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m megatron_fixedcode.replication",
        description="The small-scale study: trains what is not done yet, then rewrites the report.",
    )
    p.add_argument("--quick", action="store_true", help="the CI regime: tiny, in a temporary directory (~1 min)")
    p.add_argument(
        "--work-dir", default=None, help="data, checkpoints, logs (default runs/study; a temp dir with --quick)"
    )
    p.add_argument(
        "--results-dir",
        default=None,
        help="one JSON per finished run (default docs/replication; WORK/results with --quick)",
    )
    p.add_argument(
        "--output-md", default=None, help="the report (default docs/REPLICATION.md; WORK/REPLICATION.md with --quick)"
    )
    p.add_argument(
        "--only", nargs="+", default=None, metavar="RUN", help="a subset of the plan, e.g. binary:1 learned:2"
    )
    p.add_argument(
        "--verify",
        default=None,
        metavar="RUN",
        help="retrain RUN (e.g. binary:1) and compare its held-out PPL with the committed record",
    )
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the records; train nothing")
    p.add_argument("--parallel", type=int, default=2, help="runs trained at once (one single-threaded process each)")
    return p


@user_errors  # a bad run name, a missing record or missing shared data: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a = build_parser().parse_args(argv)
    plan = PLANS["quick" if a.quick else "full"]
    only = [Run.parse(r) for r in a.only] if a.only else None
    target = Run.parse(a.verify) if a.verify else None
    for r in (only or []) + ([target] if target else []):
        if r not in plan.runs:
            raise ValueError(f"run {r.name} is not in the {plan.name} plan ({', '.join(x.name for x in plan.runs)})")
    work = Path(a.work_dir or (tempfile.mkdtemp(prefix="study_") if a.quick else REPO_ROOT / "runs" / "study"))
    store = ResultStore(Path(a.results_dir or (work / "results" if a.quick else REPO_ROOT / "docs" / "replication")))
    out_md = Path(a.output_md or (work / "REPLICATION.md" if a.quick else REPO_ROOT / "docs" / "REPLICATION.md"))
    data = prepare_study_data(work, corpus_mb=plan.corpus_mb, vocab_size=plan.vocab_size)
    logger.info(
        "data %s: train %s tokens, held-out %s tokens",
        data["fingerprint"],
        f"{data['tokens']['train']:,}",
        f"{data['tokens']['valid']:,}",
    )
    if target:
        return verify(plan, target, data, store, work)
    hashes = {r: plan.config_hash(r, data["fingerprint"]) for r in plan.runs}
    todo = [r for r in (only or plan.runs) if not store.is_done(r, hashes[r])]
    skipped = [r.name for r in (only or plan.runs) if r not in todo]
    if skipped:
        logger.info("already done (config hash matches): %s", ", ".join(skipped))
    if a.report_only:
        todo = []

    def land(run: Run) -> None:
        record = execute(plan, run, data, hashes[run], work)
        with _EVALUATION:
            store.write(run, record)
            write_report(plan, store.current(plan.runs, hashes), data, out_md, store.directory)
        logger.info(
            "%s: held-out PPL %.1f (%s tokens/s) -> %s",
            run.name,
            record["val_ppl"],
            f"{record['tokens_per_second']:,}",
            store.path(run),
        )

    with concurrent.futures.ThreadPoolExecutor(max(1, a.parallel)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(land, r) for r in todo]):
            future.result()
    write_report(plan, store.current(plan.runs, hashes), data, out_md, store.directory)
    print(
        f"{len(store.current(plan.runs, hashes))} of {len(plan.runs)} runs done; trained {len(todo)} now, "
        f"skipped {len(skipped)}; wrote {out_md}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
