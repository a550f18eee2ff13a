"""Full verification of indexed-dataset shards, before a long run trusts them.

:func:`megatron_fixedcode.data.validate.check_shard` (run at every training start) reads only
the ``.idx`` header and its last entries. This module reads everything once: every entry of the
``.idx`` (sizes, pointers and document bounds consistent with each other and with the ``.bin``),
every byte of the ``.bin`` in one pass (each id < V when V is given, and its sha256), and compares
them with what indexing recorded in the shard's summary or manifest entry: documents, tokens, the
``.idx`` sha256 and the ``.bin`` sha256 (the only check that sees tokens changed within the
vocabulary). It reports what a run needs to know per shard: tokens, documents and documents long
enough for one ``seq_length + 1`` window (paper 2's eligibility).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, TextIO

import numpy

from megatron_fixedcode.data.indexed_format import IndexFile
from megatron_fixedcode.data.validate import check_shard
from megatron_fixedcode.utils.files import file_sha256

TOKEN_BLOCK = 1 << 24
"""Tokens read at once in the id scan (bounded memory whatever the shard size)."""


class ShardError(ValueError):
    """A shard failed verification; the message starts with the shard's prefix."""


def _size(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if num_bytes < 1000 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1000
    raise AssertionError


class Progress:
    """Progress of a long verification on ``stream`` (stderr): shards and bytes done of the total,
    rate and ETA, at most one line per ``interval_s`` (the first after ``interval_s``, so that a
    short run prints none)."""

    def __init__(
        self,
        num_shards: int,
        total_bytes: int,
        interval_s: float = 10.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.num_shards, self.total_bytes, self.interval_s = num_shards, total_bytes, interval_s
        self.stream, self.clock = stream or sys.stderr, clock
        self.shards_done = self.bytes_done = self.current = self.lines = 0
        self.start = self.last = clock()

    def block(self, num_bytes: int) -> None:
        """``num_bytes`` of the current shard were read."""
        self.current += num_bytes
        self._maybe_print()

    def shard_done(self, shard_bytes: int) -> None:
        self.shards_done += 1
        self.bytes_done += shard_bytes
        self.current = 0
        self._maybe_print()

    def line(self) -> str:
        done = self.bytes_done + self.current
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = done / elapsed
        eta = (self.total_bytes - done) / rate if rate > 0 else float("inf")
        eta_text = "?" if eta == float("inf") else time.strftime("%H:%M:%S", time.gmtime(max(eta, 0)))
        pct = 100.0 * done / self.total_bytes if self.total_bytes else 100.0
        return (
            f"verify: {self.shards_done}/{self.num_shards} shards, {_size(done)} of {_size(self.total_bytes)} "
            f"({pct:.0f}%), {_size(rate)}/s, ETA {eta_text}"
        )

    def finish(self) -> None:
        """The closing line, where progress was shown at all."""
        if self.lines:
            self._print()

    def _maybe_print(self) -> None:
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            self._print()

    def _print(self) -> None:
        self.lines += 1
        print(self.line(), file=self.stream, flush=True)


def verify_shard(
    prefix: str,
    vocab_size: Optional[int],
    seq_length: Optional[int] = None,
    recorded: Optional[dict] = None,
    on_block: Optional[Callable[[int], None]] = None,
) -> dict:
    """Check one ``prefix.bin/.idx`` completely; returns its counts or raises :class:`ShardError`.

    ``recorded`` is what indexing wrote down about the shard (see :func:`summary_record`), each
    entry optional: ``documents``, ``tokens``, ``idx_sha256``, ``bin_sha256`` and ``source`` (the
    record's name in messages). The result's ``content`` is ``"sha256"`` when the ``.bin``'s hash
    was compared, ``None`` when none was recorded (indexed before ``.bin`` hashes were, or not by
    this package's tools): then an in-range change of its tokens cannot be seen.
    """
    recorded = recorded or {}
    source = recorded.get("source", "its summary")
    try:
        shape = check_shard(prefix, vocab_size, field="shard")
    except ValueError as e:
        raise ShardError(f"{prefix}: {str(e).split(': ', 1)[1]}") from None
    dtype = numpy.dtype(shape["dtype"])
    index = IndexFile(prefix + ".idx")
    sizes, pointers, documents = index.sequence_lengths, index.sequence_pointers, index.document_indices
    if (sizes < 0).any():
        raise ShardError(f"{prefix}: {prefix}.idx holds a negative sequence length; the index is damaged")
    expected_pointers = numpy.concatenate([[0], numpy.cumsum(sizes.astype(numpy.int64))[:-1]]) * dtype.itemsize
    if len(sizes) and not numpy.array_equal(pointers, expected_pointers):
        bad = int(numpy.flatnonzero(pointers != expected_pointers)[0])
        raise ShardError(
            f"{prefix}: {prefix}.idx sequence {bad} starts at byte {int(pointers[bad])}, its lengths "
            f"say {int(expected_pointers[bad])}; the index is damaged"
        )
    if len(documents) and (numpy.diff(documents) < 0).any():
        raise ShardError(f"{prefix}: {prefix}.idx document bounds decrease; the index is damaged")
    tokens = int(sizes.sum(dtype=numpy.int64))
    if recorded.get("idx_sha256") and recorded["idx_sha256"] != file_sha256(prefix + ".idx"):
        raise ShardError(
            f"{prefix}: {prefix}.idx differs from the one {source} recorded (sha256); "
            "the index was changed or damaged after indexing"
        )
    digest = _scan_bin(prefix, dtype, vocab_size, want_sha256=bool(recorded.get("bin_sha256")), on_block=on_block)
    if digest is not None and digest != recorded["bin_sha256"]:
        raise ShardError(
            f"{prefix}: {prefix}.bin differs from the one {source} recorded (sha256 {digest[:12]}..., "
            f"recorded {recorded['bin_sha256'][:12]}...); its tokens were changed or damaged after "
            "indexing: restore or re-index it"
        )
    bounds = numpy.concatenate([[0], numpy.cumsum(sizes, dtype=numpy.int64)])  # token offset of each sequence
    doc_tokens = bounds[documents[1:]] - bounds[documents[:-1]] if len(documents) > 1 else numpy.zeros(0, numpy.int64)
    result = {
        "prefix": prefix,
        "dtype": dtype.name,
        "tokens": tokens,
        "documents": int(max(len(documents) - 1, 0)),
        "sequences": int(len(sizes)),
        "content": "sha256" if digest is not None else None,
    }
    if seq_length is not None:
        result["eligible_documents"] = int((doc_tokens >= seq_length + 1).sum())
    want = recorded.get("documents")
    if want is not None and want != result["documents"]:
        raise ShardError(
            f"{prefix}: holds {result['documents']} documents, {source} says {want}; "
            "the shard and its record come from different runs (re-index the shard)"
        )
    want_tokens = recorded.get("tokens")
    if want_tokens is not None and want_tokens != tokens:
        raise ShardError(f"{prefix}: holds {tokens} tokens, {source} says {want_tokens}")
    return result


def _scan_bin(
    prefix: str,
    dtype: numpy.dtype,
    vocab_size: Optional[int],
    want_sha256: bool,
    on_block: Optional[Callable[[int], None]] = None,
) -> Optional[str]:
    """One pass over the ``.bin`` in blocks (bounded memory): every id in ``[0, V)`` when V is
    known, and the file's sha256 when one was recorded (returned, else ``None``)."""
    if vocab_size is None and not want_sha256:
        return None
    digest, start = hashlib.sha256(), 0
    with open(prefix + ".bin", "rb") as f:
        for block in iter(lambda: f.read(TOKEN_BLOCK * dtype.itemsize), b""):
            if want_sha256:
                digest.update(block)
            ids = numpy.frombuffer(block, dtype, count=len(block) // dtype.itemsize)
            if vocab_size is not None and len(ids) and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
                where = int(numpy.flatnonzero((ids >= vocab_size) | (ids < 0))[0])
                raise ShardError(
                    f"{prefix}: token {start + where} of {prefix}.bin is id {int(ids[where])}, outside "
                    f"the vocabulary [0, {vocab_size}); indexed with another tokenizer or damaged"
                )
            start += len(ids)
            if on_block is not None:
                on_block(len(block))
    return digest.hexdigest() if want_sha256 else None


def summary_record(summary: dict, name: str, prefix: str) -> dict:
    """What a preprocessing (or merge) summary recorded about its output ``name``: the counts it
    can vouch for and the output's content record (``outputs_sha256``)."""
    record = {"source": "its summary", **(summary.get("outputs_sha256") or {}).get(os.path.basename(prefix), {})}
    keys = summary.get("settings", {}).get("json_keys")
    if keys is None:  # tools/merge_datasets.py: one output
        record.update(documents=summary.get("documents"), tokens=summary.get("tokens"))
        return record
    split, key = name.split("_", 1)
    if key == keys[0]:  # documents are counted by the first json key
        record["documents"] = summary.get("documents", {}).get(split)
    if len(keys) == 1:  # tokens: all keys together
        record["tokens"] = summary.get("tokens", {}).get(split)
    return record


def find_summaries(paths: Iterable[str]) -> list[tuple[dict, Path]]:
    """Per-shard summaries (``*_summary.json``) in directories, or given directly."""
    found = []
    for item in paths:
        path = Path(item)
        files = sorted(path.glob("*_summary.json")) if path.is_dir() else [path]
        for f in files:
            try:
                found.append((json.loads(f.read_text()), f))
            except (OSError, json.JSONDecodeError) as e:
                raise ShardError(f"{f}: unreadable summary ({e})") from None
    return found


def summary_jobs(summary: dict, path: Path) -> list[tuple[str, dict, str, dict]]:
    """``(prefix, recorded, split, extra)`` for every output of one preprocessing summary."""
    jobs = []
    for name, prefix in summary["outputs"].items():
        local = str(path.parent / os.path.basename(prefix))  # the directory may have moved since
        jobs.append((local, summary_record(summary, name, local), name.split("_", 1)[0], {"summary": str(path)}))
    return jobs


def verify_summary(
    summary: dict, path: Path, vocab_size: Optional[int], seq_length: Optional[int]
) -> tuple[list[dict], list[str]]:
    """Every output of one preprocessing summary, checked against what the summary recorded."""
    return _verify_jobs(summary_jobs(summary, path), vocab_size, seq_length, None)


def _shard_bytes(prefix: str) -> int:
    return sum(os.path.getsize(prefix + ext) for ext in (".bin", ".idx") if os.path.isfile(prefix + ext))


def _verify_jobs(
    jobs: list, vocab_size: Optional[int], seq_length: Optional[int], progress: Optional[Progress]
) -> tuple[list[dict], list[str]]:
    results, errors = [], []
    for prefix, record, split, extra in jobs:
        try:
            result = verify_shard(prefix, vocab_size, seq_length, record, on_block=progress and progress.block)
        except ShardError as e:
            errors.append(str(e))
            continue
        finally:
            if progress is not None:
                progress.shard_done(_shard_bytes(prefix))
        results.append({**result, **({"split": split} if split else {}), **extra})
    return results, errors


def manifest_jobs(path: str) -> list[tuple[str, dict, str]]:
    """``(prefix, recorded, split)`` for every shard of a ``manifest.json``."""
    from megatron_fixedcode.data.manifest import load_manifest

    jobs = []
    for entry in load_manifest(path)["shards"]:
        for split in ("train", "valid"):
            if split in entry:
                record = {k: v for k, v in entry[split].items() if k not in ("prefix", "eligible_documents")}
                jobs.append((entry[split]["prefix"], {**record, "source": f"manifest {path}"}, split))
    return jobs


def _is_manifest(item: str) -> bool:
    from megatron_fixedcode.data.manifest import MANIFEST_FORMAT

    if not (item.endswith(".json") and os.path.isfile(item)):
        return False
    try:
        return json.loads(Path(item).read_text()).get("format") == MANIFEST_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _records_beside(directory: Path) -> dict[str, dict]:
    """What the summaries in ``directory`` recorded about each output they describe, by prefix
    (a summary that cannot be read is skipped here: verifying the directory names it)."""
    records = {}
    for path in sorted(directory.glob("*_summary.json")):
        try:
            summary = json.loads(path.read_text())
            for name, prefix in summary["outputs"].items():
                local = str(directory / os.path.basename(prefix))
                records[local] = summary_record(summary, name, local)
        except (OSError, ValueError, KeyError, AttributeError):
            continue
    return records


def verify_paths(
    paths: Iterable[str],
    vocab_size: Optional[int],
    seq_length: Optional[int],
    progress_interval_s: Optional[float] = None,
) -> tuple[list[dict], list[str]]:
    """Verify dataset prefixes, directories (their summaries, else their ``.bin/.idx`` pairs),
    summary files or manifests; keep going past a bad shard so that one run names all of them.
    A prefix is checked against the summary beside it where one describes it. With
    ``progress_interval_s``, a :class:`Progress` line on stderr at most that often. Returns
    (results, error messages)."""
    from megatron_fixedcode.data.preprocess.outputs import is_dataset_prefix

    all_jobs, errors, beside = [], [], {}
    for item in paths:
        path = Path(item)
        prefix = item[:-4] if item.endswith((".bin", ".idx")) else item
        try:
            # a prefix first: once trained on, megatron's GPT index cache makes PREFIX/ a directory
            if is_dataset_prefix(prefix):
                directory = Path(prefix).parent.resolve()
                if directory not in beside:
                    beside[directory] = _records_beside(directory)
                record = beside[directory].get(str(directory / os.path.basename(prefix)))
                jobs = [(prefix, record, None, {})]
            elif _is_manifest(item):
                jobs = [(p, r, split, {"manifest": item}) for p, r, split in manifest_jobs(item)]
            elif path.is_dir() and not list(path.glob("*_summary.json")):
                found = sorted(p for p in (str(i)[: -len(".idx")] for i in path.glob("*.idx")) if is_dataset_prefix(p))
                if not found:
                    raise ShardError(
                        f"{item}: not a dataset: no {item}.bin/.idx, and no *_summary.json or "
                        ".bin/.idx pairs in this directory"
                    )
                jobs = [(p, None, None, {}) for p in found]
            elif path.is_dir() or item.endswith(".json"):
                jobs = [
                    job
                    for summary, summary_path in find_summaries([item])
                    for job in summary_jobs(summary, summary_path)
                ]
            else:  # a prefix with a file missing: named by the shard check
                jobs = [(prefix, None, None, {})]
        except ShardError as e:
            errors.append(str(e))
            continue
        except (KeyError, ValueError) as e:  # a summary or manifest without an expected field
            errors.append(f"{item}: unreadable summary or manifest ({e!r})")
            continue
        all_jobs += jobs
    progress = None
    if progress_interval_s is not None:
        progress = Progress(len(all_jobs), sum(_shard_bytes(job[0]) for job in all_jobs), progress_interval_s)
    results, shard_errors = _verify_jobs(all_jobs, vocab_size, seq_length, progress)
    if progress is not None:
        progress.finish()
    return results, errors + shard_errors
