"""Indexed-dataset outputs that appear atomically, and merging of shards.

Everything is written under ``.tmp`` names; ``publish`` renames ``.bin`` then ``.idx``
after removing the old ``.idx``, so at no moment does a prefix hold an ``.idx`` whose
``.bin`` belongs to another run. Failed runs delete their ``.tmp`` files and leave earlier
outputs untouched.

Every published output gets a *content record* (:meth:`AtomicIndexedOutputs.content_records`):
its ``.bin`` size and SHA-256 (hashed as it is written, no second read) and its ``.idx`` SHA-256.
Summaries keep it under ``outputs_sha256``, manifests carry it and ``tools/verify_dataset.py``
checks it: an in-range change of the tokens (reversed, replaced, set to EOD) passes every
structural check, and only the hash names it.
"""

import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from megatron_fixedcode.data.indexed_format import IndexedWriter, IndexFile
from megatron_fixedcode.utils.files import file_sha256
from megatron_fixedcode.utils.locks import lock_output_prefix

logger = logging.getLogger(__name__)


class AtomicIndexedOutputs:
    """One ``.bin/.idx`` writer (megatron-core's format, see ``indexed_format``) per name, published all together."""

    def __init__(self, prefixes: dict, dtype) -> None:
        self.prefixes = dict(prefixes)
        self.builders = {}
        for name, prefix in self.prefixes.items():
            Path(prefix).parent.mkdir(parents=True, exist_ok=True)
            self.builders[name] = IndexedWriter(prefix + ".bin.tmp", dtype)

    def add_documents(self, name, ids: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Append documents given flat ids, sequence lengths and sequences per document.

        Returns the documents' token counts.
        """
        counts = np.asarray(counts, dtype=np.int64)
        self.builders[name].add_documents(ids, lengths, counts)
        seq_bounds = np.r_[0, np.cumsum(counts)]
        return np.diff(np.r_[0, np.cumsum(lengths, dtype=np.int64)][seq_bounds])

    def add_index(self, name, path_prefix: str) -> None:
        self.builders[name].add_index(path_prefix)

    def publish(self) -> None:
        for name, prefix in self.prefixes.items():
            self.builders[name].finalize(prefix + ".idx.tmp")
        for prefix in self.prefixes.values():
            Path(prefix + ".idx").unlink(missing_ok=True)
            os.replace(prefix + ".bin.tmp", prefix + ".bin")
            os.replace(prefix + ".idx.tmp", prefix + ".idx")

    def content_records(self) -> dict:
        """``{basename: {"bin_bytes", "bin_sha256", "idx_sha256"}}`` of the published outputs."""
        return {
            os.path.basename(prefix): {
                "bin_bytes": os.path.getsize(prefix + ".bin"),
                "bin_sha256": self.builders[name].bin_sha256.hexdigest(),
                "idx_sha256": file_sha256(prefix + ".idx"),
            }
            for name, prefix in self.prefixes.items()
        }

    def discard(self) -> None:
        for name, prefix in self.prefixes.items():
            self.builders[name].data_file.close()
            for suffix in (".bin.tmp", ".idx.tmp"):
                Path(prefix + suffix).unlink(missing_ok=True)


def is_dataset_prefix(prefix: str) -> bool:
    return Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()


def find_dataset_prefixes(inputs: Sequence[str], pattern: str = "*", flag: str = "--input") -> list[str]:
    """Prefixes given directly, or every complete ``.bin/.idx`` pair in a directory (sorted).

    A prefix with both files is a prefix even when a directory of the same name exists: megatron's
    GPT index cache (``PREFIX/cache/``) creates one the first time a run trains on it. ``flag``
    names the argument in errors (the caller's, e.g. ``--input``).
    """
    prefixes = []
    for item in inputs:
        path = Path(item)
        prefix = item[:-4] if item.endswith((".bin", ".idx")) else item
        if is_dataset_prefix(prefix):
            prefixes.append(prefix)
        elif path.is_dir():
            found = sorted(str(p)[: -len(".idx")] for p in path.glob(pattern + ".idx"))
            found = [p for p in found if Path(p + ".bin").is_file()]
            if not found:
                matching = f" matching --pattern {pattern!r}" if pattern != "*" else ""
                raise ValueError(f"{flag} {item}: no .bin/.idx pairs{matching} in this directory")
            prefixes += found
        else:
            for suffix in (".bin", ".idx"):
                if not Path(prefix + suffix).is_file():
                    raise ValueError(f"{flag} {item}: {prefix + suffix} not found")
    return prefixes


def merge_datasets(inputs: Sequence[str], output_prefix: str, pattern: str = "*") -> dict:
    """Concatenate indexed datasets in order (Megatron-LM ``tools/merge_datasets.py``).

    Returns ``{"inputs", "output_prefix", "dtype", "documents", "tokens", "outputs_sha256"}``, also
    written as ``{output_prefix}_summary.json`` (what ``tools/verify_dataset.py`` checks the output
    against). Holds the lock ``{output_prefix}.lock`` for the whole merge (a concurrent writer is
    refused at once).
    """
    with lock_output_prefix(output_prefix):
        return _merge_datasets(inputs, output_prefix, pattern)


def _merge_datasets(inputs: Sequence[str], output_prefix: str, pattern: str) -> dict:
    prefixes = find_dataset_prefixes(inputs, pattern)
    if output_prefix in prefixes:
        raise ValueError(f"--output-prefix {output_prefix} is also an input")
    dtypes = {p: IndexFile(p + ".idx").dtype for p in prefixes}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{p}: {np.dtype(d).name}" for p, d in dtypes.items())
        raise ValueError(f"--input datasets have different token dtypes ({listing}); re-index them alike")
    dtype = dtypes[prefixes[0]]
    outputs = AtomicIndexedOutputs({"merged": output_prefix}, dtype)
    try:
        for prefix in prefixes:
            logger.info("adding %s", prefix)
            outputs.add_index("merged", prefix)
        builder = outputs.builders["merged"]
        documents, tokens = builder.num_documents, builder.num_tokens
        outputs.publish()
    except BaseException:
        outputs.discard()
        raise
    summary = {
        "inputs": prefixes,
        "output_prefix": output_prefix,
        "dtype": np.dtype(dtype).name,
        "documents": documents,
        "tokens": tokens,
        "outputs": {"merged": output_prefix},
        "outputs_sha256": outputs.content_records(),
    }
    tmp = Path(f"{output_prefix}_summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, f"{output_prefix}_summary.json")
    return summary
