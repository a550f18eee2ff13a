"""The preprocessing run: read chunks in order, encode them (in-process or in a pool), write
megatron-core ``.bin/.idx`` per split and json key, publish atomically, write a summary.

Megatron-LM's ``tools/preprocess_data.py`` encodes one document per call; here each chunk
goes through the tokenizer's native batch path, which is where the speed comes from.
"""

import collections
import json
import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from megatron_fixedcode.data.indexed_format import optimal_dtype
from megatron_fixedcode.data.preprocess.config import PreprocessConfig, output_prefix_for
from megatron_fixedcode.data.preprocess.encode import encode_chunk, init_worker, sentence_splitter
from megatron_fixedcode.data.preprocess.inputs import expand_inputs, iter_chunks
from megatron_fixedcode.data.preprocess.outputs import AtomicIndexedOutputs
from megatron_fixedcode.utils.files import DiskFull, is_disk_full
from megatron_fixedcode.tokenizers import build_tokenizer
from megatron_fixedcode.utils.locks import lock_output_prefix

logger = logging.getLogger(__name__)

MAX_LISTED_SKIPS = 1000


def _ordered_map(submit, iterable, max_pending: int):
    """Like ``Pool.imap`` (input order kept) but reads ahead at most ``max_pending`` chunks,
    which keeps memory bounded by the chunk size (``imap`` would read all input ahead).
    ``submit(item)`` starts the work and returns a function that waits for its result."""
    pending = collections.deque()
    for item in iterable:
        pending.append(submit(item))
        if len(pending) >= max_pending:
            yield pending.popleft()()
    while pending:
        yield pending.popleft()()


class _Progress:
    """Counts for the summary and the stderr progress line."""

    def __init__(self, cfg: PreprocessConfig, files: Sequence[Path]):
        self.cfg, self.start = cfg, time.monotonic()
        self.total_bytes = sum(f.stat().st_size for f in files) or 1
        self.bytes_done = self.records = self.empty = self.next_log = 0
        self.split_keys = {"id": 0, "text": 0}
        self.docs = {s: 0 for s in cfg.splits}
        self.tokens = {s: 0 for s in cfg.splits}
        self.long_docs = {s: 0 for s in cfg.splits}
        self.hist = {k: collections.Counter() for k in cfg.json_keys}
        self.skipped: list[dict] = []
        self.num_skipped = 0
        self.skip_reasons = collections.Counter()

    def skip(self, where: str, reason: str) -> None:
        if not self.cfg.skip_bad_documents:
            raise ValueError(f"{where}: {reason} (use --skip-bad-documents to skip such records)")
        self.num_skipped += 1
        self.skip_reasons[reason.split(" (")[0]] += 1
        if len(self.skipped) < MAX_LISTED_SKIPS:
            self.skipped.append({"where": where, "reason": reason})

    def add_docs(self, split: str, key: str, doc_lengths: np.ndarray) -> None:
        if key == self.cfg.json_keys[0]:  # a record counts once, by its first key
            self.docs[split] += len(doc_lengths)
            self.long_docs[split] += int((doc_lengths >= self.cfg.min_doc_tokens).sum())
        self.tokens[split] += int(doc_lengths.sum())
        buckets = np.floor(np.log2(np.maximum(doc_lengths, 1))).astype(np.int64)
        self.hist[key].update({str(2 ** int(b)): int(n) for b, n in zip(*np.unique(buckets, return_counts=True))})

    def log(self, force: bool = False) -> None:
        if not force and self.records < self.next_log:
            return
        self.next_log = self.records + self.cfg.log_interval
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.bytes_done / elapsed
        eta = (self.total_bytes - self.bytes_done) / rate if rate > 0 else float("nan")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if math.isfinite(eta) else "?"
        logger.info(
            "%d docs, %d tokens | %.0f docs/s, %.0f tokens/s, %.2f MB/s | %.1f%% of input, ETA %s",
            self.records,
            sum(self.tokens.values()),
            self.records / elapsed,
            sum(self.tokens.values()) / elapsed,
            rate / 1e6,
            100.0 * self.bytes_done / self.total_bytes,
            eta_text,
        )


def preprocess(cfg: PreprocessConfig) -> dict:
    """Index ``cfg.input`` into ``.bin/.idx`` per split and key; returns the summary dict.

    Holds the exclusive lock ``{output_prefix}.lock`` for the whole run: a second run on the
    same prefix is refused at once (``LockHeld``, a ``ValueError`` naming the holder). A full disk
    is :class:`DiskFull` naming the outputs and the free space (the partial outputs stay ``.tmp``).
    """
    try:
        with lock_output_prefix(cfg.output_prefix):
            return _preprocess(cfg)
    except OSError as e:
        if is_disk_full(e):
            raise DiskFull(f"{cfg.output_prefix}_*", e) from None
        raise


def _preprocess(cfg: PreprocessConfig) -> dict:
    files = expand_inputs(cfg.input)
    tokenizer = build_tokenizer(cfg.tokenizer_type, cfg.tokenizer_model, cfg.eod_token, cfg.merge_file)
    dtype = optimal_dtype(tokenizer.vocab_size)
    if cfg.split_sentences and not sentence_splitter()[1]:
        logger.warning("nltk punkt data not installed: splitting sentences with untrained punkt")
    logger.info("%d input files, %s tokens, outputs %s_*", len(files), np.dtype(dtype).name, cfg.output_prefix)
    prefixes = {(s, k): output_prefix_for(cfg.output_prefix, s, k) for s in cfg.splits for k in cfg.json_keys}
    progress, outputs = _Progress(cfg, files), AtomicIndexedOutputs(prefixes, dtype)
    try:
        if cfg.workers == 1:
            init_worker(cfg, None, tokenizer)
            # Two threads: the native batch encode of one chunk (GIL released, all cores)
            # overlaps JSON parsing of the next and writing of the previous one.
            with ThreadPoolExecutor(2) as threads:
                submit = lambda chunk: threads.submit(encode_chunk, chunk).result  # noqa: E731 (a one-line closure)
                _consume(_ordered_map(submit, iter_chunks(files, cfg), 3), progress, outputs)
        else:
            threads = max(1, (os.cpu_count() or 1) // cfg.workers)
            with multiprocessing.get_context("fork").Pool(
                cfg.workers, init_worker, (cfg, threads, None, os.getpid())
            ) as pool:
                submit = lambda chunk: pool.apply_async(encode_chunk, (chunk,)).get  # noqa: E731 (a one-line closure)
                _consume(_ordered_map(submit, iter_chunks(files, cfg), 2 * cfg.workers), progress, outputs)
        progress.log(force=True)
        outputs.publish()
    except BaseException:
        outputs.discard()
        raise
    summary = _summary(cfg, files, tokenizer, dtype, progress, outputs)
    tmp = Path(f"{cfg.output_prefix}_summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, f"{cfg.output_prefix}_summary.json")
    return summary


def _consume(results, progress: _Progress, outputs: AtomicIndexedOutputs) -> None:
    for result in results:
        for where, reason in result["errors"]:
            progress.skip(where, reason)
        for (split, key), part in sorted(result["parts"].items()):
            progress.add_docs(split, key, outputs.add_documents((split, key), *part))
        progress.records += result["records"]
        progress.empty += result["empty"]
        for kind, n in result.get("split_keys", {}).items():
            progress.split_keys[kind] += n
        progress.bytes_done = max(progress.bytes_done, result.get("bytes_done", 0))
        progress.log()


def _summary(cfg, files, tokenizer, dtype, progress: _Progress, outputs: AtomicIndexedOutputs) -> dict:
    elapsed = time.monotonic() - progress.start
    total_tokens = sum(progress.tokens.values())
    return {
        "output_prefix": cfg.output_prefix,
        "outputs": {f"{s}_{k}": p for (s, k), p in outputs.prefixes.items()},
        "outputs_sha256": outputs.content_records(),  # checked by tools/verify_dataset.py
        "dtype": np.dtype(dtype).name,
        "documents": progress.docs,
        "tokens": progress.tokens,
        "records_read": progress.records,
        "split_keys": progress.split_keys,
        "empty_documents": progress.empty,
        "skipped": {
            "count": progress.num_skipped,
            "by_reason": dict(progress.skip_reasons),
            "listed": progress.skipped,
        },
        "min_doc_tokens": cfg.min_doc_tokens,
        "documents_with_min_doc_tokens": progress.long_docs,
        "doc_length_histogram_log2": {
            k: dict(sorted(h.items(), key=lambda kv: int(kv[0]))) for k, h in progress.hist.items()
        },
        "input_files": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
        "input_bytes": progress.total_bytes,
        "tokenizer": tokenizer.describe(),
        "settings": {
            "json_keys": cfg.json_keys,
            "id_key": cfg.id_key,
            "append_eod": cfg.append_eod,
            "split_sentences": cfg.split_sentences,
            "valid_fraction": cfg.valid_fraction,
            "split_seed": cfg.split_seed,
            "workers": cfg.workers,
        },
        "elapsed_seconds": round(elapsed, 3),
        "throughput": {
            "docs_per_s": progress.records / max(elapsed, 1e-9),
            "tokens_per_s": total_tokens / max(elapsed, 1e-9),
            "mb_per_s": progress.total_bytes / 1e6 / max(elapsed, 1e-9),
        },
    }
