"""Settings of a preprocessing run (Megatron-LM flag names) and output naming."""

import dataclasses
from typing import Optional


@dataclasses.dataclass(kw_only=True)
class PreprocessConfig:
    """Megatron-LM flag names; see docs/data.md."""

    input: list[str]
    output_prefix: str
    tokenizer_type: str
    tokenizer_model: Optional[str] = None
    """The tokenizer file; GPT2BPETokenizer: its vocab.json (--vocab-file sets it)."""
    vocab_file: Optional[str] = None
    merge_file: Optional[str] = None
    """GPT2BPETokenizer's --vocab-file / --merge-file (Megatron-LM's flags)."""
    eod_token: Optional[str] = None
    json_keys: list[str] = dataclasses.field(default_factory=lambda: ["text"])
    id_key: Optional[str] = None
    append_eod: bool = False
    split_sentences: bool = False
    workers: int = 1
    valid_fraction: float = 0.001
    split_seed: int = 1234
    min_doc_tokens: int = 2049
    skip_bad_documents: bool = False
    log_interval: int = 10000
    max_document_bytes: int = 8 << 20
    """Largest text (UTF-8 bytes, per json key) of one record; larger ones are refused
    (``FILE:LINE``): tokenizing a text needs about 140 bytes of memory per byte of text at
    once (a 50 MB document took 7 GB), so 8 MiB keeps a worker near 1.2 GB."""
    chunk_docs: int = 1024
    chunk_bytes: int = 1 << 20
    """Chunks bound memory and are the unit of work of a pool process: many per worker."""

    def __post_init__(self):
        from megatron_fixedcode.tokenizers.base import tokenizer_files

        if (
            self.tokenizer_type == "GPT2BPETokenizer"
            and self.tokenizer_model
            and self.tokenizer_model == self.vocab_file
        ):
            self.tokenizer_model = None  # a config rebuilt from its own fields
        self.tokenizer_model, self.merge_file = tokenizer_files(self)
        if not self.tokenizer_model:
            raise ValueError("give --tokenizer-model (GPT2BPETokenizer: --vocab-file and --merge-file)")
        self.vocab_file = self.tokenizer_model if self.tokenizer_type == "GPT2BPETokenizer" else None
        if isinstance(self.input, (str, bytes)) or isinstance(self.json_keys, (str, bytes)):
            raise ValueError("input and json_keys are lists, e.g. input=['data/*.jsonl']")
        if not self.input:
            raise ValueError("--input: give at least one file, glob or directory")
        if not self.json_keys:
            raise ValueError("--json-keys: give at least one key")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"--valid-fraction must be in [0, 1), got {self.valid_fraction}")
        if self.max_document_bytes < 1:
            raise ValueError(f"--max-document-bytes must be >= 1, got {self.max_document_bytes}")
        if self.chunk_docs < 1 or self.chunk_bytes < 1:
            raise ValueError("chunk_docs and chunk_bytes must be >= 1")

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "valid") if self.valid_fraction > 0 else ("train",)


def output_prefix_for(output_prefix: str, split: str, key: str) -> str:
    """Where one split of one json key goes (the prefix for ``--data-path``)."""
    return f"{output_prefix}_{split}_{key}_document"
