"""Cheap consistency checks of indexed-dataset shards, and the named token-id check.

At start-up (``build_datasets``) every shard of the train and valid blends is checked without
reading its tokens: the ``.idx`` header, version and dtype code; the
``.idx`` size against its sequence / document counts; the document index bounds; the ``.bin``
size against the last sequence's pointer and length; and that the token dtype can hold every
id of the vocabulary. A damaged shard is refused with a ``ValueError`` naming it, instead of
training until the sampler reaches the damage.

A full scan (every id < V) is the data verification tool's job; during training every sample
is checked as it is read (:func:`check_token_ids`), for every input interface alike, so an
out-of-range id is a named error and never a bare ``IndexError`` in an embedding.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Optional

import numpy

from megatron_fixedcode.data.indexed_format import read_array, read_header


class TokenIdOutOfRange(ValueError):
    """A token id >= the vocabulary size was read from a shard."""


def check_shard(prefix: str, vocab_size: Optional[int] = None, field: str = "data_path") -> dict:
    """Check one ``prefix.bin/.idx`` pair (index only, no token scan); returns its shape.

    Raises ``ValueError("FIELD PREFIX: reason")`` on the first problem found.
    """
    where = f"{field} {prefix}"
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise ValueError(f"{where}: {path} not found")
    idx_size, bin_size = os.path.getsize(idx_path), os.path.getsize(bin_path)
    try:
        header = read_header(idx_path)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    dtype, num_sequences, num_documents = header.dtype, header.num_sequences, header.num_document_bounds
    expected_idx = header.index_bytes
    if idx_size not in (expected_idx, expected_idx + num_sequences):  # + int8 modes (multimodal)
        raise ValueError(
            f"{where}: {idx_path} is {idx_size} bytes, its header ({num_sequences} sequences, "
            f"{num_documents} document bounds) needs {expected_idx}; the index is damaged or truncated"
        )
    if num_documents:
        first, last = (int(read_array(idx_path, header, "documents", i, 1)[0]) for i in (0, num_documents - 1))
        if first != 0 or last != num_sequences:
            raise ValueError(
                f"{where}: {idx_path} document bounds run from {first} to {last}, expected 0 to "
                f"{num_sequences}; the index is damaged"
            )
    expected_bin = 0
    if num_sequences:
        last_size = int(read_array(idx_path, header, "lengths", num_sequences - 1, 1)[0])
        last_pointer = int(read_array(idx_path, header, "pointers", num_sequences - 1, 1)[0])
        expected_bin = last_pointer + last_size * dtype.itemsize
    if bin_size != expected_bin:
        raise ValueError(
            f"{where}: {bin_path} is {bin_size} bytes but its index describes {expected_bin} "
            f"({num_sequences} sequences of {dtype.name}); the .bin is "
            f"{'truncated' if bin_size < expected_bin else 'longer than indexed'} or belongs to another index "
            "(re-run preprocessing for it)"
        )
    if vocab_size is not None and dtype.kind in "iu" and vocab_size - 1 > numpy.iinfo(dtype).max:
        raise ValueError(
            f"{where}: tokens are stored as {dtype.name} (ids up to {numpy.iinfo(dtype).max}) but the "
            f"vocabulary has {vocab_size} ids; the shard was indexed with another tokenizer"
        )
    return {
        "dtype": dtype.name,
        "sequences": num_sequences,
        "documents": max(num_documents - 1, 0),
        "bin_bytes": bin_size,
    }


def check_shards(prefixes: Iterable[str], vocab_size: Optional[int], field: str) -> list[dict]:
    """:func:`check_shard` for every shard a run trains or validates on; an empty one is refused
    too (megatron's samplers would fail on it with an mmap or sizing error far from the cause).
    Returns each shard's shape (:func:`check_shard`)."""
    shapes = []
    for prefix in prefixes:
        shape = check_shard(prefix, vocab_size, field)
        shapes.append(shape)
        if shape["sequences"] == 0 or shape["bin_bytes"] == 0:
            raise ValueError(
                f"{field} {prefix}: the shard holds no tokens ({shape['sequences']} sequences, "
                f"{shape['bin_bytes']} bytes; was its input empty?); leave it out of --{field.replace('_', '-')} "
                "or re-index it from a non-empty input"
            )
    return shapes


def check_token_ids(tokens: numpy.ndarray, vocab_size: Optional[int], where) -> None:
    """Refuse ids outside ``[0, vocab_size)`` with a ``TokenIdOutOfRange`` naming ``where``
    (a string, or a zero-argument callable building it, called only on failure)."""
    if vocab_size is None or tokens.size == 0:
        return
    hi, lo = int(tokens.max()), int(tokens.min())
    if hi >= vocab_size or lo < 0:
        bad = hi if hi >= vocab_size else lo
        text = where() if callable(where) else where
        raise TokenIdOutOfRange(
            f"{text}: token id {bad} is outside the vocabulary [0, {vocab_size}); the data was indexed "
            "with another tokenizer or is damaged"
        )


def recorded_tokenizer(prefix: str) -> tuple[dict, str] | None:
    """The tokenizer this project's indexing tools recorded for ``prefix`` (``OUT_summary.json`` beside
    ``OUT_{split}_{key}_document``) and that summary's path; None for data indexed elsewhere."""
    if not prefix.endswith("_document"):
        return None
    for segments in (2, 3):  # split and key, or a key with one underscore
        parts = prefix[: -len("_document")].rsplit("_", segments)
        summary = f"{parts[0]}_summary.json"
        if len(parts) != segments + 1 or not os.path.isfile(summary):
            continue
        try:
            with open(summary) as f:
                record = json.load(f)
            outputs = {os.path.basename(p) for p in record.get("outputs", {}).values()}
        except (OSError, ValueError, AttributeError):
            return None  # unreadable: verify_dataset names it; the shard itself is checked above
        if os.path.basename(prefix) in outputs and isinstance(record.get("tokenizer"), dict):
            return record["tokenizer"], summary
    return None


def check_recorded_tokenizer(prefixes: Iterable[str], tokenizer, field: str) -> None:
    """Refuse shards whose summary records another tokenizer than the run's (by content fingerprint):
    their ids would mean other tokens, whether or not they fit the vocabulary. Runs without a
    tokenizer file (``--vocab-size``) and data indexed by other tools are not checked."""
    if not callable(getattr(tokenizer, "describe", None)):
        return
    for prefix in prefixes:
        found = recorded_tokenizer(prefix)
        if found is None or found[0].get("fingerprint") in (None, tokenizer.fingerprint):
            continue
        rec, summary = found
        raise ValueError(
            f"{field} {prefix}: indexed with tokenizer {rec.get('path')} ({rec.get('vocab_size')} ids, fingerprint "
            f"{rec.get('fingerprint')}; {summary}), but this run's tokenizer {getattr(tokenizer, 'model_path', '?')} has "
            f"{tokenizer.vocab_size} ids, fingerprint {tokenizer.fingerprint}: train with the tokenizer the data was "
            "indexed with, or re-index it"
        )
