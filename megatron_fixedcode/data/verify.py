"""Full verification of indexed-dataset shards, before a long run trusts them.

:func:`megatron_fixedcode.data.validate.check_shard` (run at every training start) reads only
the ``.idx`` header and its last entries. This module reads everything once: every entry of the
``.idx`` (sizes, pointers and document bounds consistent with each other and with the ``.bin``),
every token (each id < V), and compares the counts with the shard's preprocessing summary
(documents, tokens and, where recorded, the ``.idx`` sha256 and ``.bin`` size). It reports what a
run needs to know per shard: tokens, documents and documents long enough for one
``seq_length + 1`` window (paper 2's eligibility).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

import numpy

from megatron_fixedcode.data.validate import _HEADER_BYTES, check_shard
from megatron_fixedcode.files import file_sha256

TOKEN_BLOCK = 1 << 24
"""Tokens read at once in the id scan (bounded memory whatever the shard size)."""


class ShardError(ValueError):
    """A shard failed verification; the message starts with the shard's prefix."""


def _read_index(prefix: str, num_sequences: int) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """Sizes, pointers and document bounds (the layout megatron-core's ``_IndexWriter`` writes)."""
    with open(prefix + ".idx", "rb") as f:
        f.seek(_HEADER_BYTES - 8)
        num_documents = int(numpy.frombuffer(f.read(8), numpy.int64)[0])
        sizes = numpy.frombuffer(f.read(num_sequences * 4), numpy.int32)
        pointers = numpy.frombuffer(f.read(num_sequences * 8), numpy.int64)
        documents = numpy.frombuffer(f.read(num_documents * 8), numpy.int64)
    return sizes, pointers, documents


def verify_shard(prefix: str, vocab_size: Optional[int], seq_length: Optional[int] = None,
                 summary: Optional[dict] = None, split: str = "train") -> dict:
    """Check one ``prefix.bin/.idx`` completely; returns its counts or raises :class:`ShardError`.

    ``summary`` is the shard's preprocessing summary (``documents[split]`` is compared, and the
    ``outputs_sha256`` entry for the prefix when present).
    """
    try:
        shape = check_shard(prefix, vocab_size, field="shard")
    except ValueError as e:
        raise ShardError(f"{prefix}: {str(e).split(': ', 1)[1]}") from None
    dtype = numpy.dtype(shape["dtype"])
    sizes, pointers, documents = _read_index(prefix, shape["sequences"])
    if (sizes < 0).any():
        raise ShardError(f"{prefix}: {prefix}.idx holds a negative sequence length; the index is damaged")
    expected_pointers = numpy.concatenate([[0], numpy.cumsum(sizes.astype(numpy.int64))[:-1]]) * dtype.itemsize
    if len(sizes) and not numpy.array_equal(pointers, expected_pointers):
        bad = int(numpy.flatnonzero(pointers != expected_pointers)[0])
        raise ShardError(f"{prefix}: {prefix}.idx sequence {bad} starts at byte {int(pointers[bad])}, its lengths "
                         f"say {int(expected_pointers[bad])}; the index is damaged")
    if len(documents) and (numpy.diff(documents) < 0).any():
        raise ShardError(f"{prefix}: {prefix}.idx document bounds decrease; the index is damaged")
    tokens = int(sizes.sum(dtype=numpy.int64))
    if summary is not None:
        recorded = (summary.get("outputs_sha256") or {}).get(os.path.basename(prefix))
        if recorded and recorded["idx_sha256"] != file_sha256(prefix + ".idx"):
            raise ShardError(f"{prefix}: {prefix}.idx differs from the one its summary recorded (sha256); "
                             "the index was changed or damaged after indexing")
    _scan_tokens(prefix, dtype, tokens, vocab_size)
    bounds = numpy.concatenate([[0], numpy.cumsum(sizes, dtype=numpy.int64)])  # token offset of each sequence
    doc_tokens = bounds[documents[1:]] - bounds[documents[:-1]] if len(documents) > 1 else numpy.zeros(0, numpy.int64)
    result = {"prefix": prefix, "dtype": dtype.name, "tokens": tokens, "documents": int(max(len(documents) - 1, 0)),
              "sequences": int(len(sizes))}
    if seq_length is not None:
        result["eligible_documents"] = int((doc_tokens >= seq_length + 1).sum())
    if summary is not None:
        want = summary.get("documents", {}).get(split)
        if want is not None and want != result["documents"]:
            raise ShardError(f"{prefix}: holds {result['documents']} documents, its summary says {want}; "
                             "the shard and its summary come from different runs (re-index the shard)")
        want_tokens = summary.get("tokens", {}).get(split)  # all json keys together
        single_key = len(summary.get("settings", {}).get("json_keys", [])) == 1
        if single_key and want_tokens is not None and want_tokens != tokens:
            raise ShardError(f"{prefix}: holds {tokens} tokens, its summary says {want_tokens}")
    return result


def _scan_tokens(prefix: str, dtype: numpy.dtype, tokens: int, vocab_size: Optional[int]) -> None:
    if not tokens or vocab_size is None:
        return
    data = numpy.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(tokens,))
    try:
        for start in range(0, tokens, TOKEN_BLOCK):
            block = data[start:start + TOKEN_BLOCK]
            hi, lo = int(block.max()), int(block.min())
            if hi >= vocab_size or lo < 0:
                where = start + int(numpy.flatnonzero((block >= vocab_size) | (block < 0))[0])
                raise ShardError(f"{prefix}: token {where} of {prefix}.bin is id {int(data[where])}, outside the "
                                 f"vocabulary [0, {vocab_size}); indexed with another tokenizer or damaged")
    finally:
        del data


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


def verify_summary(summary: dict, path: Path, vocab_size: Optional[int], seq_length: Optional[int]
                   ) -> tuple[list[dict], list[str]]:
    """Every output of one preprocessing summary, its counts checked against the summary."""
    results, errors = [], []
    first_key = summary["settings"]["json_keys"][0]
    for name, prefix in summary["outputs"].items():
        split, key = name.split("_", 1)
        local = str(path.parent / os.path.basename(prefix))  # the directory may have moved since
        try:
            result = verify_shard(local, vocab_size, seq_length, summary if key == first_key else None, split)
        except ShardError as e:
            errors.append(str(e))
            continue
        results.append({**result, "split": split, "summary": str(path)})
    return results, errors


def verify_paths(paths: Iterable[str], vocab_size: Optional[int], seq_length: Optional[int]
                 ) -> tuple[list[dict], list[str]]:
    """Verify directories (their summaries), summary files or prefixes; keep going past a bad
    shard so that one run names all of them. Returns (results, error messages)."""
    results, errors = [], []
    for item in paths:
        path = Path(item)
        if path.is_dir() and not list(path.glob("*_summary.json")):
            from megatron_fixedcode.data.preprocess.outputs import find_dataset_prefixes

            jobs = [(p, None, None) for p in find_dataset_prefixes([item])]
        elif path.is_dir() or item.endswith("_summary.json"):
            jobs = [(None, s, f) for s, f in find_summaries([item])]
        else:
            jobs = [(item[:-4] if item.endswith((".bin", ".idx")) else item, None, None)]
        for prefix, summary, summary_path in jobs:
            try:
                if summary is None:
                    results.append(verify_shard(prefix, vocab_size, seq_length))
                else:
                    good, bad = verify_summary(summary, summary_path, vocab_size, seq_length)
                    results, errors = results + good, errors + bad
            except ShardError as e:
                errors.append(str(e))
            except (KeyError, ValueError) as e:
                errors.append(f"{summary_path or prefix}: {e}")
    return results, errors
