"""Paper-2 document windows: one window of seq_length + 1 tokens inside one document.

Sample `i` of the global stream is a pure function of (seed, stream_id, i):

* shard visit  `v = i // samples_per_shard_visit`;
* the visit's shard: unweighted blends walk a seeded permutation of the shards per
  epoch-of-shards (epoch `v // num_shards`), so every shard is visited once per epoch;
  weighted blends draw the shard per visit with replacement, proportional to the weights;
* inside that shard a document uniformly among those with >= seq_length + 1 tokens,
  then a start uniformly in [0, len - seq_length - 1] (sampling with replacement).

Each draw uses its own counter-based generator (Philox keyed by a SeedSequence of
(seed, stream_id, purpose, counter)), so no RNG state is carried between samples:
a resumed run, a different data-parallel size or DataLoader worker count all read
the same stream without replaying it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_fixedcode.data.validate import check_token_ids

logger = logging.getLogger(__name__)

_PURPOSE_WINDOW = 0
_PURPOSE_SHARD_ORDER = 1


def _generator(*entropy: int) -> numpy.random.Generator:
    return numpy.random.Generator(numpy.random.Philox(numpy.random.SeedSequence(list(entropy))))


@dataclass(frozen=True, kw_only=True)
class WindowLocation:
    """Where a sample's seq_length + 1 tokens were read from."""

    shard: int
    prefix: str
    document: int
    start: int


@dataclass(frozen=True, kw_only=True)
class EligibleDocuments:
    """Per shard: documents long enough for one window, as parallel arrays.

    `first_sequence` is the IndexedDataset sequence a document starts at; a document
    made of several sequences (sentence splitting) is contiguous in the `.bin` file, so
    a window is one read from that sequence's pointer.
    """

    document: numpy.ndarray
    first_sequence: numpy.ndarray
    length: numpy.ndarray

    @classmethod
    def from_indexed(cls, dataset: IndexedDataset, min_length: int) -> "EligibleDocuments":
        lengths_S = numpy.asarray(dataset.sequence_lengths, dtype=numpy.int64)
        bounds_D1 = numpy.asarray(dataset.document_indices, dtype=numpy.int64)
        cum_S1 = numpy.concatenate([numpy.zeros(1, numpy.int64), numpy.cumsum(lengths_S)])
        doc_len_D = cum_S1[bounds_D1[1:]] - cum_S1[bounds_D1[:-1]]
        doc_D = numpy.flatnonzero(doc_len_D >= min_length)
        return cls(document=doc_D, first_sequence=bounds_D1[doc_D], length=doc_len_D[doc_D])

    def __len__(self) -> int:
        return int(self.document.shape[0])


class DocumentWindowDataset(torch.utils.data.Dataset):
    """A fixed-length view of the infinite window stream, with GPTDataset's sample keys.

    `len()` is `num_samples` (the run's planned samples); any index below it is valid
    in any order. Samples are dicts of `tokens`, `labels` [seq_length] (labels are the
    tokens shifted by one), `loss_mask` (all ones) and `position_ids`.
    """

    def __init__(
        self,
        prefixes: list[str],
        *,
        weights: list[float] | None = None,
        seq_length: int,
        num_samples: int,
        seed: int,
        samples_per_shard_visit: int,
        stream_id: int = 0,
        mmap: bool = True,
        vocab_size: int | None = None,
    ) -> None:
        if not prefixes:
            raise ValueError("prefixes: needs at least one shard")
        if weights is not None and len(weights) != len(prefixes):
            raise ValueError(f"weights: {len(weights)} weights for {len(prefixes)} prefixes")
        if seq_length <= 0 or num_samples < 0 or samples_per_shard_visit <= 0:
            raise ValueError(
                "seq_length, samples_per_shard_visit must be positive and num_samples >= 0, got "
                f"{seq_length}, {samples_per_shard_visit}, {num_samples}"
            )
        if seed < 0 or stream_id < 0:
            raise ValueError(f"seed, stream_id: must be >= 0, got {seed}, {stream_id}")
        self.seq_length = seq_length
        self.num_samples = num_samples
        self.seed = seed
        self.stream_id = stream_id
        self.samples_per_shard_visit = samples_per_shard_visit
        self.prefixes = list(prefixes)
        self.vocab_size = vocab_size  # every window's ids are checked against it (data/validate.py)
        self.datasets = [IndexedDataset(p, mmap=mmap) for p in self.prefixes]
        self.eligible = [EligibleDocuments.from_indexed(d, seq_length + 1) for d in self.datasets]
        self._shards, self._probs = self._schedule(weights)
        self._order_cache: tuple[int, numpy.ndarray | None] = (-1, None)
        self._position_ids = torch.arange(seq_length, dtype=torch.long)
        self._loss_mask = torch.ones(seq_length, dtype=torch.float)

    def _schedule(self, weights: list[float] | None) -> tuple[numpy.ndarray, numpy.ndarray | None]:
        """Shards that can be visited, and their visit probabilities when weighted."""
        counts = [len(e) for e in self.eligible]
        for prefix, count, dataset in zip(self.prefixes, counts, self.datasets):
            logger.info(
                "%s: %d of %d documents have >= %d tokens",
                prefix,
                count,
                len(dataset.document_indices) - 1,
                self.seq_length + 1,
            )
        if weights is None:
            shards = numpy.array([s for s, c in enumerate(counts) if c > 0], dtype=numpy.int64)
            if len(shards) < len(counts):
                num_skipped = len(counts) - len(shards)
                logger.warning("skipping %d shard(s) with no eligible document", num_skipped)
            if len(shards) == 0:
                raise ValueError(f"prefixes: no document has >= {self.seq_length + 1} tokens")
            return shards, None
        empty = [p for p, c, w in zip(self.prefixes, counts, weights) if w > 0 and c == 0]
        if empty:
            raise ValueError(f"weights: weighted shard(s) with no eligible document: {empty}")
        w = numpy.asarray(weights, dtype=numpy.float64)
        if (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights: must be >= 0 with a positive sum, got {weights}")
        return numpy.arange(len(w), dtype=numpy.int64), w / w.sum()

    def __len__(self) -> int:
        return self.num_samples

    def _epoch_order(self, epoch: int) -> numpy.ndarray:
        """Seeded shard permutation of one epoch-of-shards (the last one is kept)."""
        if self._order_cache[0] != epoch:
            rng = _generator(self.seed, self.stream_id, _PURPOSE_SHARD_ORDER, epoch)
            self._order_cache = (epoch, rng.permutation(self._shards))
        return self._order_cache[1]

    def shard_of_visit(self, visit: int) -> int:
        """The shard resident during shard visit `visit`."""
        if self._probs is None:
            order = self._epoch_order(visit // len(self._shards))
            return int(order[visit % len(self._shards)])
        rng = _generator(self.seed, self.stream_id, _PURPOSE_SHARD_ORDER, visit)
        return int(rng.choice(self._shards, p=self._probs))

    def locate(self, index: int) -> WindowLocation:
        """Shard, document and window start of global sample `index` (no token I/O)."""
        if index < 0:
            raise IndexError(f"sample index must be >= 0, got {index}")
        shard = self.shard_of_visit(index // self.samples_per_shard_visit)
        eligible = self.eligible[shard]
        rng = _generator(self.seed, self.stream_id, _PURPOSE_WINDOW, index)
        k = int(rng.integers(len(eligible)))
        start = int(rng.integers(int(eligible.length[k]) - self.seq_length))
        return WindowLocation(
            shard=shard,
            prefix=self.prefixes[shard],
            document=int(eligible.document[k]),
            start=start,
        )

    def window_tokens(self, location: WindowLocation) -> numpy.ndarray:
        """The seq_length + 1 tokens of a located window."""
        eligible = self.eligible[location.shard]
        k = int(numpy.searchsorted(eligible.document, location.document))
        first_sequence = int(eligible.first_sequence[k])
        return self.datasets[location.shard].get(first_sequence, offset=location.start, length=self.seq_length + 1)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside [0, {self.num_samples})")
        location = self.locate(index)
        window = self.window_tokens(location)
        check_token_ids(
            window,
            self.vocab_size,
            lambda: (
                f"{location.prefix} (document {location.document}, tokens {location.start}.."
                f"{location.start + self.seq_length}, sample {index})"
            ),
        )
        text = torch.from_numpy(window.astype(numpy.int64))
        return {
            "tokens": text[:-1].contiguous(),
            "labels": text[1:].contiguous(),
            "loss_mask": self._loss_mask.clone(),
            "position_ids": self._position_ids.clone(),
        }

    def targets_per_sample(self) -> int:
        """Prediction targets in every sample: all seq_length positions count."""
        return self.seq_length
