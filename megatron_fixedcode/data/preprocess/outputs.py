"""Indexed-dataset outputs that appear atomically, and merging of shards.

Everything is written under ``.tmp`` names; ``publish`` renames ``.bin`` then ``.idx``
after removing the old ``.idx``, so at no moment does a prefix hold an ``.idx`` whose
``.bin`` belongs to another run. Failed runs delete their ``.tmp`` files and leave earlier
outputs untouched.
"""

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from megatron_fixedcode.data.preprocess.indexed_format import IndexedWriter, IndexFile
from megatron_fixedcode.locks import lock_output_prefix

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

    def discard(self) -> None:
        for name, prefix in self.prefixes.items():
            self.builders[name].data_file.close()
            for suffix in (".bin.tmp", ".idx.tmp"):
                Path(prefix + suffix).unlink(missing_ok=True)


def find_dataset_prefixes(inputs: Sequence[str], pattern: str = "*") -> list[str]:
    """Prefixes given directly, or every complete ``.bin/.idx`` pair in a directory (sorted)."""
    prefixes = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p)[: -len(".idx")] for p in path.glob(pattern + ".idx"))
            found = [p for p in found if Path(p + ".bin").is_file()]
            if not found:
                raise ValueError(f"--input {item}: no .bin/.idx pairs matching {pattern!r}")
            prefixes += found
        else:
            prefix = item[:-4] if item.endswith((".bin", ".idx")) else item
            for suffix in (".bin", ".idx"):
                if not Path(prefix + suffix).is_file():
                    raise ValueError(f"--input {item}: {prefix + suffix} not found")
            prefixes.append(prefix)
    return prefixes


def merge_datasets(inputs: Sequence[str], output_prefix: str, pattern: str = "*") -> dict:
    """Concatenate indexed datasets in order (Megatron-LM ``tools/merge_datasets.py``).

    Returns ``{"inputs", "output_prefix", "dtype", "documents", "tokens"}``. Holds the lock
    ``{output_prefix}.lock`` for the whole merge (a concurrent writer is refused at once).
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
    return {"inputs": prefixes, "output_prefix": output_prefix, "dtype": np.dtype(dtype).name,
            "documents": documents, "tokens": tokens}
