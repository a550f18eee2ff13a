"""megatron-core's ``.bin/.idx`` format (``MMIDIDX``, version 1) written and read with numpy alone: the
one reader and writer of the format in this package (preprocessing, merging, the start-up shard
check, the data verification tool and the manifest all read an ``.idx`` here).

Writing it needs no torch: importing megatron-core for ``IndexedDatasetBuilder`` costs seconds of
start-up per preprocessing run. The bytes are identical to the builder's
(tests/data/test_preprocess_format.py compares them); training reads the files with megatron-core.

Layout: header (magic, version, dtype code, #sequences, #document bounds), then the sequence
lengths (int32), the sequence byte pointers (int64) and the document bounds (int64, documents + 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Optional

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
CODE_DTYPES = {code: np.dtype(name) for name, code in DTYPE_CODES.items()}
HEADER_BYTES = len(HEADER) + 8 + 1 + 8 + 8  # magic, version, dtype code, #sequences, #document bounds


def optimal_dtype(vocab_size: Optional[int]) -> type:
    """Token dtype for a vocabulary (``DType.optimal_dtype``): uint16 below 65500, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


@dataclasses.dataclass(frozen=True)
class IndexHeader:
    """The fixed-size head of an ``.idx``: where its three arrays start."""

    dtype: np.dtype
    num_sequences: int
    num_document_bounds: int  # documents + 1 (megatron's ``document_indices``)

    @property
    def pointers_offset(self) -> int:
        return HEADER_BYTES + 4 * self.num_sequences

    @property
    def documents_offset(self) -> int:
        return self.pointers_offset + 8 * self.num_sequences

    @property
    def index_bytes(self) -> int:
        """The ``.idx`` size (without the multimodal modes, one byte per sequence after it)."""
        return self.documents_offset + 8 * self.num_document_bounds


def read_header(idx_path: str) -> IndexHeader:
    """Parse and check an ``.idx`` head; ``ValueError("IDX_PATH reason")`` when it is not one."""
    with open(idx_path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[: len(HEADER)] != HEADER:
        raise ValueError(f"{idx_path} is not a megatron-core index (bad or truncated header)")
    version, code = struct.unpack_from("<QB", head, len(HEADER))
    if version != VERSION:
        raise ValueError(f"{idx_path} has index version {version}, expected {VERSION}")
    if code not in CODE_DTYPES:
        raise ValueError(f"{idx_path} has an unknown token dtype code {code}")
    num_sequences, num_document_bounds = struct.unpack_from("<QQ", head, len(HEADER) + 9)
    return IndexHeader(CODE_DTYPES[code], num_sequences, num_document_bounds)


_ARRAYS = {
    "lengths": (np.int32, lambda h: HEADER_BYTES, lambda h: h.num_sequences),
    "pointers": (np.int64, lambda h: h.pointers_offset, lambda h: h.num_sequences),
    "documents": (np.int64, lambda h: h.documents_offset, lambda h: h.num_document_bounds),
}


def read_array(idx_path: str, header: IndexHeader, name: str, start: int = 0, count: int | None = None) -> np.ndarray:
    """Entries ``start:start+count`` of one array (``lengths``, ``pointers`` or ``documents``)."""
    dtype, offset, length = _ARRAYS[name]
    count = length(header) - start if count is None else count
    return np.fromfile(idx_path, dtype=dtype, count=count, offset=offset(header) + start * np.dtype(dtype).itemsize)


class IndexFile:
    """The arrays of one ``.idx`` (``_IndexReader`` without multimodal modes)."""

    def __init__(self, idx_path: str) -> None:
        self.header = read_header(idx_path)
        self.dtype = self.header.dtype
        self.sequence_lengths = read_array(idx_path, self.header, "lengths")
        self.sequence_pointers = read_array(idx_path, self.header, "pointers")
        self.document_indices = read_array(idx_path, self.header, "documents")


class IndexedWriter:
    """``IndexedDatasetBuilder`` (non-multimodal) with whole batches of documents per call."""

    def __init__(self, bin_path: str, dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.data_file = open(bin_path, "wb")
        self._lengths: list[np.ndarray] = []
        self._doc_ends: list[np.ndarray] = []  # sequence count at the end of each document
        self.num_sequences = 0
        self.num_tokens = 0
        self.bin_sha256 = hashlib.sha256()  # of every byte written: the content record costs no second read

    @property
    def num_documents(self) -> int:
        return sum(len(d) for d in self._doc_ends)

    def add_documents(self, ids: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> None:
        """Documents as flat token ids, their sequences' lengths and sequences per document."""
        ids = np.asarray(ids)
        data = ids.astype(self.dtype, copy=False).tobytes(order="C")
        self.data_file.write(data)
        self.bin_sha256.update(data)
        self._lengths.append(np.asarray(lengths, dtype=np.int32))
        self._doc_ends.append(self.num_sequences + np.cumsum(counts, dtype=np.int64))
        self.num_sequences += int(np.sum(counts))
        self.num_tokens += int(ids.size)

    def add_index(self, path_prefix: str) -> None:
        """Append a whole dataset (``IndexedDatasetBuilder.add_index``)."""
        index = IndexFile(path_prefix + ".idx")
        if index.dtype != self.dtype:
            raise ValueError(f"{path_prefix}: token dtype {index.dtype.name}, expected {self.dtype.name}")
        self._lengths.append(index.sequence_lengths)
        self._doc_ends.append(self.num_sequences + index.document_indices[1:])
        self.num_sequences += len(index.sequence_lengths)
        self.num_tokens += int(index.sequence_lengths.sum(dtype=np.int64))
        with open(path_prefix + ".bin", "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                self.data_file.write(block)
                self.bin_sha256.update(block)

    def finalize(self, idx_path: str) -> None:
        self.data_file.close()
        lengths = np.concatenate([np.zeros(0, np.int32), *self._lengths])
        pointers = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= self.dtype.itemsize
        doc_indices = np.concatenate([np.zeros(1, np.int64), *self._doc_ends])
        with open(idx_path, "wb") as f:
            f.write(HEADER + struct.pack("<QB", VERSION, DTYPE_CODES[self.dtype.name]))
            f.write(struct.pack("<QQ", len(lengths), len(doc_indices)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_indices.tobytes(order="C"))
