"""Preprocessing throughput: ours vs a Megatron-LM-style baseline vs the tokenizer's ceiling.

* baseline: like Megatron-LM ``tools/preprocess_data.py``: a ``multiprocessing.Pool``,
  ``imap(..., chunksize=32)`` over JSON lines, one ``encode`` call per document, written with
  ``IndexedDatasetBuilder.add_document`` (it uses the fast ``tokenizers`` library directly,
  not ``transformers.AutoTokenizer`` as Megatron-LM does, so it is a generous baseline);
* ours: ``megatron_fixedcode.data.preprocess.preprocess`` with the same worker count;
* ceiling: one ``encode_batch_fast`` call (ids included) over all texts already in memory.

Throughput is timed in this process (imports already paid). Then each is timed as a whole process
from the command line, start-up included (``--whole-process``): ``tools/preprocess_data.py``
against the baseline run as its own ``python`` process (which imports megatron-core, as
Megatron-LM's tool does), with start-up (``-h``, and ``python -c pass``) reported separately.

Run: ``python benchmarks/preprocess.py`` (defaults to ../shared/data beside the checkout, else tests/assets).
"""

import megatron_fixedcode  # noqa: F401  (first: its megatron-core compatibility patches, compat/)

# isort: split
import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")

import numpy as np  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402

from megatron_fixedcode.data.preprocess import PreprocessConfig, output_prefix_for, preprocess  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = (
    REPO.parent / "shared" / "data"
)  # the full corpus beside the checkout; a clone alone has the sample in tests/assets
if not (SHARED / "corpus").is_dir():
    SHARED = REPO / "tests" / "assets"


def build_documents(corpus_dir: Path, doc_bytes: int) -> list[str]:
    """Each corpus file split at blank lines, paragraphs grouped into ~doc_bytes documents."""
    docs = []
    for path in sorted(p for p in corpus_dir.rglob("*") if p.is_file() and p.name != "README"):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        current = ""
        for paragraph in re.split(r"\n\s*\n", text):
            current += paragraph + "\n\n"
            if len(current) >= doc_bytes:
                docs.append(current)
                current = ""
        if current.strip():
            docs.append(current)
    return docs


_TOK = {}


def _baseline_init(model: str) -> None:
    _TOK["tok"] = HFTokenizer.from_file(model)


def _baseline_encode(line: str):
    text = json.loads(line)["text"]
    ids = _TOK["tok"].encode(text, add_special_tokens=False).ids
    return ids + [0] if ids else ids, len(line)


def run_baseline(jsonl: Path, model: str, prefix: str, workers: int, vocab_size: int) -> None:
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab_size))
    with (
        open(jsonl, encoding="utf-8") as fin,
        multiprocessing.get_context("fork").Pool(workers, _baseline_init, (model,)) as pool,
    ):
        for ids, _ in pool.imap(_baseline_encode, fin, 32):
            if ids:
                builder.add_document(ids, [len(ids)])
    builder.finalize(prefix + ".idx")


def _cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its reaped children (pool workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(fn, *args, **kwargs) -> tuple[float, float]:
    """(wall seconds, CPU seconds): CPU time shows the work done even when other jobs share the cores."""
    wall, cpu = time.perf_counter(), _cpu_seconds()
    fn(*args, **kwargs)
    return time.perf_counter() - wall, _cpu_seconds() - cpu


def run_ceiling(texts: list[str], model: str) -> tuple[float, float]:
    tok = HFTokenizer.from_file(model)
    return timed(lambda: [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)])


def _run_process(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU seconds of the process and its children): CPU time is the steadier figure under load."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return timed(subprocess.run, cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def whole_process(jsonl: Path, model: str, work: Path, workers: int, vocab_size: int, repeat: int) -> dict:
    """Best-of-N wall seconds of whole command-line processes (start-up included)."""
    ours = [
        sys.executable,
        str(REPO / "tools" / "preprocess_data.py"),
        "--input",
        str(jsonl),
        "--output-prefix",
        str(work / "cli_ours"),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        model,
        "--workers",
        str(workers),
        "--append-eod",
        "--valid-fraction",
        "0",
        "--log-interval",
        str(10**9),
    ]
    base = [
        sys.executable,
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); import preprocess as b; "
        "b.run_baseline(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))",
        str(Path(__file__).parent),
        str(jsonl),
        model,
        str(work / "cli_base"),
        str(workers),
        str(vocab_size),
    ]
    times = {"python -c pass": [], "preprocess_data.py -h": [], "ours": [], "baseline": []}
    for _ in range(repeat):
        times["python -c pass"].append(_run_process([sys.executable, "-c", "pass"]))
        times["preprocess_data.py -h"].append(_run_process(ours[:2] + ["-h"]))
        times["baseline"].append(_run_process(base))
        times["ours"].append(_run_process(ours))
    prefix = output_prefix_for(str(work / "cli_ours"), "train", "text")
    identical = all(
        Path(str(work / "cli_base") + s).read_bytes() == Path(prefix + s).read_bytes() for s in (".bin", ".idx")
    )
    return {**{k: min(v) for k, v in times.items()}, "identical": identical}  # best by wall time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", default=str(SHARED / "corpus"))
    p.add_argument("--tokenizer-model", default=str(SHARED / "tokenizers" / "smollm2" / "tokenizer.json"))
    p.add_argument("--doc-bytes", type=int, default=4000, help="approximate document size")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=3, help="best of N runs of each measurement")
    p.add_argument(
        "--no-whole-process",
        dest="whole_process",
        action="store_false",
        help="skip the command-line (start-up included) comparison",
    )
    args = p.parse_args(argv)
    corpus = Path(args.corpus_dir)
    if not corpus.is_dir():
        print(f"error: --corpus-dir {corpus} not found", file=sys.stderr)
        return 2
    texts = build_documents(corpus, args.doc_bytes)
    work = Path(tempfile.mkdtemp(prefix="mfc_bench_"))
    try:
        jsonl = work / "corpus.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": text}) + "\n")
        num_bytes = jsonl.stat().st_size
        vocab_size = HFTokenizer.from_file(args.tokenizer_model).get_vocab_size()
        print(
            f"corpus: {len(texts)} documents, {num_bytes / 1e6:.1f} MB JSONL, {multiprocessing.cpu_count()} CPUs, "
            f"load average before {os.getloadavg()[0]:.2f}"
        )
        # Interleaved repeats, best of each: other load on the machine hits all variants alike.
        times = {}
        for _ in range(args.repeat):
            times.setdefault("ceiling", []).append(run_ceiling(texts, args.tokenizer_model))
            for workers in args.workers:
                base_prefix = str(work / f"baseline_w{workers}")
                times.setdefault(("baseline", workers), []).append(
                    timed(run_baseline, jsonl, args.tokenizer_model, base_prefix, workers, vocab_size)
                )
                cfg = PreprocessConfig(
                    input=[str(jsonl)],
                    output_prefix=str(work / f"ours_w{workers}"),
                    workers=workers,
                    tokenizer_type="HuggingFaceTokenizer",
                    tokenizer_model=args.tokenizer_model,
                    append_eod=True,
                    valid_fraction=0.0,
                    log_interval=10**9,
                )
                times.setdefault(("ours", workers), []).append(timed(preprocess, cfg))
        best = {name: min(runs) for name, runs in times.items()}  # by wall time
        ceiling_s, ceiling_cpu = best["ceiling"]
        rows = []
        for workers in args.workers:
            base_prefix = str(work / f"baseline_w{workers}")
            ours_prefix = output_prefix_for(str(work / f"ours_w{workers}"), "train", "text")
            identical = all(
                Path(base_prefix + s).read_bytes() == Path(ours_prefix + s).read_bytes() for s in (".bin", ".idx")
            )
            rows.append((workers, best[("baseline", workers)], best[("ours", workers)], identical))
        num_tokens = int(np.fromfile(ours_prefix + ".bin", dtype=DType.optimal_dtype(vocab_size)).size)
        whole = {
            w: whole_process(jsonl, args.tokenizer_model, work, w, vocab_size, args.repeat)
            for w in (args.workers if args.whole_process else [])
        }
    finally:
        shutil.rmtree(work)
    print(f"load average after {os.getloadavg()[0]:.2f}, best of {args.repeat} interleaved runs")

    def rate(t):
        wall, cpu = t
        return (
            f"{len(texts) / wall:6.0f} docs/s {num_tokens / wall / 1e3:6.0f} ktok/s "
            f"{num_bytes / wall / 1e6:5.2f} MB/s | {cpu / (num_bytes / 1e6):.3f} CPU-s/MB"
        )

    print(f"ceiling (encode_batch_fast, in memory): {rate((ceiling_s, ceiling_cpu))}")
    for workers, base, ours, identical in rows:
        print(f"workers={workers} baseline:  {rate(base)}")
        print(f"workers={workers} ours:      {rate(ours)}")
        print(
            f"workers={workers} ours/baseline {base[0] / ours[0]:.2f}x wall, {base[1] / ours[1]:.2f}x CPU; "
            f"ours/ceiling {ceiling_s / ours[0]:.0%} wall, {ceiling_cpu / ours[1]:.0%} CPU; "
            f"identical .bin/.idx: {identical}"
        )
    for workers, w in whole.items():
        (pw, _), (hw, _), (bw, bc), (ow, oc) = (
            w[k] for k in ("python -c pass", "preprocess_data.py -h", "baseline", "ours")
        )
        print(f"workers={workers} start-up: python -c pass {pw:.2f}s, preprocess_data.py -h {hw:.2f}s")
        print(
            f"workers={workers} whole process (start-up included, best of {args.repeat}): baseline {bw:.2f}s "
            f"({bc:.2f} CPU-s), ours {ow:.2f}s ({oc:.2f} CPU-s): {bw / ow:.2f}x wall, {bc / oc:.2f}x CPU; "
            f"identical .bin/.idx: {w['identical']}"
        )
    return 0 if all(r[3] for r in rows) and all(w["identical"] for w in whole.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
