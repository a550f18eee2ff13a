"""Data configuration shared by the dataset paths (GPT blend, document windows, SFT records).

Flag names follow Megatron-LM (`--data-path`, `--valid-data-path`, `--split`,
`--data-cache-path`) so recipes read the same as ordinary Megatron runs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field


def is_blend_weight(text: str) -> bool:
    """A word of a Megatron-LM blend list ("0.3 prefixA 0.7 prefixB") that is a weight, not a prefix."""
    try:
        float(text)
        return True
    except ValueError:
        return False


logger = logging.getLogger(__name__)

DATASET_TYPES = ("gpt", "document_windows", "sft")


@dataclass(frozen=True)
class SFTFields:
    """Field names of an SFT record (``--sft-prompt-key``, ``--sft-response-key``, ``--sft-messages-key``)."""

    prompt: str = "prompt"
    response: str = "response"
    messages: str = "messages"


# Paper 2: 1024 microbatches per rank per shard visit, 8 sequences per microbatch, 2 ranks.
PAPER2_SAMPLES_PER_SHARD_VISIT = 1024 * 8 * 2


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def check_blend_weights(weights, names, field_name: str) -> None:
    """Every weight a finite number > 0: megatron's BlendedDataset asserts it on every rank (a
    traceback each), and NaN or infinity would pass a "non-negative with a positive sum" test."""
    for weight, name in zip(weights, names):
        value = float(weight)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"{field_name}: the weight of {name} is {weight}; every blend weight must be a finite "
                "number > 0 (leave a dataset out of the blend instead of weighting it 0)"
            )


def parse_blend(data_path: list[str] | str, field_name: str = "data_path") -> tuple[list[str], list[float] | None]:
    """Parse Megatron's `--data-path` list: `A B C` (prefixes) or `0.8 A 0.2 B` (weight/prefix).

    Megatron's own `get_blend_from_list` silently falls back to "prefixes only" on a
    malformed weighted list; a typo in a blend must fail loudly instead, so this parser
    raises ValueError naming `field_name`.
    """
    items = data_path.split() if isinstance(data_path, str) else [str(x) for x in data_path]
    items = [x.strip() for x in items if x.strip()]
    if not items:
        raise ValueError(f"{field_name}: needs at least one dataset prefix")
    numeric = [_as_float(x) is not None for x in items]
    if len(items) % 2 == 0 and all(numeric[0::2]) and not any(numeric[1::2]):
        weights = [float(x) for x in items[0::2]]
        prefixes = items[1::2]
        check_blend_weights(items[0::2], prefixes, field_name)
        return prefixes, weights
    if any(numeric):
        raise ValueError(
            f"{field_name}: expected either prefixes only or weight/prefix pairs (e.g. '0.8 A 0.2 B'), got {items}"
        )
    return items, None


def samples_per_shard_visit(microbatches_per_rank: int, micro_batch_size: int, data_parallel_size: int) -> int:
    """Global samples in one shard visit, from the paper's per-rank wording.

    The visit is fixed in global samples so the stream does not change when a resumed
    run uses a different data-parallel size or micro batch size.
    """
    return microbatches_per_rank * micro_batch_size * data_parallel_size


@dataclass(kw_only=True)
class DataConfig:
    """Where training/validation tokens come from and how samples are drawn."""

    data_path: list[str]
    """Megatron blend list: prefixes, or weight/prefix pairs. Each prefix is a `.bin/.idx` shard."""

    valid_data_path: list[str] | None = None
    """Separate validation blend. When None the GPT path splits `data_path` by `split`."""

    dataset_type: str = "gpt"
    """'gpt' (megatron GPTDataset, packed across documents), 'document_windows' (paper 2) or 'sft'
    (JSONL records, loss on responses; data/sft.py)."""

    seq_length: int = 2048
    """Model context; each sample reads seq_length + 1 tokens."""

    split: str = "99,1,0"
    """GPT path only, used when valid_data_path is None (Megatron's `--split`)."""

    cache_path: str | None = None
    """Megatron index cache dir (`--data-cache-path`); None: megatron's default beside the data."""

    samples_per_shard_visit: int = PAPER2_SAMPLES_PER_SHARD_VISIT
    """Document windows: global samples drawn from one shard before moving to the next."""

    mmap_bin_files: bool = True
    sft_fields: SFTFields = field(default_factory=SFTFields)
    """SFT only: the record field names."""

    num_dataset_builder_threads: int = 1
    mock: bool = False
    """megatron-core's MockGPTDataset (Megatron-LM's ``--mock-data``): no data paths, split 1,1,1."""

    num_workers: int = 2
    """DataLoader worker processes reading the training batches ahead (``--num-workers``)."""

    blend: tuple[list[str], list[float] | None] = field(init=False)
    valid_blend: tuple[list[str], list[float] | None] | None = field(init=False)

    def __post_init__(self) -> None:
        if self.dataset_type not in DATASET_TYPES:
            raise ValueError(f"dataset_type: must be one of {DATASET_TYPES}, got {self.dataset_type!r}")
        if self.seq_length <= 0:
            raise ValueError(f"seq_length: must be positive, got {self.seq_length}")
        if self.samples_per_shard_visit <= 0:
            raise ValueError(f"samples_per_shard_visit: must be positive, got {self.samples_per_shard_visit}")
        if self.num_dataset_builder_threads <= 0:
            raise ValueError("num_dataset_builder_threads: must be positive")
        if self.mock:
            if self.dataset_type != "gpt" or self.data_path or self.valid_data_path:
                raise ValueError("mock: megatron's mock GPTDataset takes no data paths and dataset_type 'gpt'")
            self.blend, self.valid_blend = ([], None), None
            return
        self.blend = parse_blend(self.data_path, "data_path")
        self.valid_blend = (
            None if self.valid_data_path is None else parse_blend(self.valid_data_path, "valid_data_path")
        )
        if self.dataset_type == "sft":
            for name, blend in (("data_path", self.blend), ("valid_data_path", self.valid_blend)):
                if blend is not None and blend[1] is not None:
                    raise ValueError(
                        f"{name}: --dataset-type sft reads JSONL files in order; blend weights are not supported"
                    )
