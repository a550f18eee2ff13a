"""Supervised fine-tuning data (paper 1's SFT continuation): JSONL records, loss on responses only.

A record is either a prompt/response pair (field names from ``--sft-prompt-key`` /
``--sft-response-key``, Megatron-LM style) or a chat (``--sft-messages-key``, a list of
``{"role": system|user|assistant, "content": str}``). Each record becomes one sequence:

* pair: ``tok(prompt) + tok(response) + [EOD]``;
* chat: per turn, ``tok("{Role}: {content}\\n")`` for system/user turns and, for assistant
  turns, ``tok("Assistant:") + tok(" " + content) + [EOD]`` (a plain-text template, the same for
  every tokenizer; the space opens the reply so BPE splits it as in running text).

Every segment is tokenised on its own with the run's tokenizer, so the response tokens are
exactly ``tok(response)`` and the loss mask has no boundary ambiguity. The loss covers every
response token and the EOD that closes it (the model learns to stop); prompt, role headers and
padding carry no loss.

One record per sample, right-padded to ``seq_length`` with loss mask 0 (no packing): with causal
attention a padded tail cannot influence the real tokens, so every sample sees exactly its own
tokens with positions from 0. Packing would need document-aware attention masks (reset
attention/positions per record) that the local CPU layers do not give; SFT sets are small enough
for padding's waste. A record longer than ``seq_length + 1`` tokens is cut at the right; one whose
response then lies wholly outside the window is dropped (both counted in the log).

Tokenisation happens at load time (SFT sets are small); sample ``i`` is record
``perm_e[i mod N]`` of epoch ``e = i // N`` (a Philox permutation keyed by seed, stream and
epoch), a pure function of ``i``: the trainer's step counter is its consumed-samples position,
so a resumed run continues the exact stream. Validation reads the held-out file in order.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy
import torch

from megatron_fixedcode.data.config import SFTFields  # noqa: F401 - re-exported: the record field names
from megatron_fixedcode.data.jsonl import jsonl_records

logger = logging.getLogger(__name__)

ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


class SFTDataError(ValueError):
    """A bad record: the message starts with ``FILE:LINE:``."""


@dataclass(frozen=True)
class SFTExample:
    """One record's token ids and, per token, 1 where that token is a loss target."""

    ids: tuple[int, ...]
    target: tuple[int, ...]
    where: str


def _string(record: dict, key: str, flag: str, where: str, *, empty_ok: bool) -> str:
    if key not in record:
        raise SFTDataError(f"{where}: missing field {key!r} ({flag})")
    value = record[key]
    if not isinstance(value, str):
        raise SFTDataError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise SFTDataError(f"{where}: empty {key!r}")
    return value


def _segments(record: Any, fields: SFTFields, where: str) -> list[tuple[str | None, bool]]:
    """(text, is_target) pieces of a record in order; ``None`` stands for the EOD token."""
    if not isinstance(record, dict):
        raise SFTDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if fields.messages in record:
        messages = record[fields.messages]
        if not isinstance(messages, list) or not messages:
            raise SFTDataError(f"{where}: field {fields.messages!r} must be a non-empty list of messages")
        out: list[tuple[str | None, bool]] = []
        for n, msg in enumerate(messages):
            at = f"{where}: message {n}"
            if not isinstance(msg, dict):
                raise SFTDataError(f"{at}: expected an object with 'role' and 'content'")
            role = _string(msg, "role", "role of a message", at, empty_ok=False)
            if role not in ROLES:
                raise SFTDataError(f"{at}: role {role!r} is not one of {', '.join(ROLES)}")
            content = _string(msg, "content", "content of a message", at, empty_ok=role != "assistant")
            if role == "assistant":
                out += [("Assistant:", False), (" " + content, True), (None, True)]
            else:
                out.append((f"{ROLES[role]}: {content}\n", False))
        if not any(t for _, t in out):
            raise SFTDataError(f"{where}: no assistant message (the loss is on assistant turns)")
        return out
    if fields.prompt not in record and fields.response not in record:
        raise SFTDataError(
            f"{where}: missing fields {fields.prompt!r} and {fields.response!r} "
            f"(--sft-prompt-key, --sft-response-key) or {fields.messages!r} (--sft-messages-key)"
        )
    prompt = _string(record, fields.prompt, "--sft-prompt-key", where, empty_ok=True)
    response = _string(record, fields.response, "--sft-response-key", where, empty_ok=False)
    return [(prompt, False), (response, True), (None, True)]


def encode_record(
    record: Any, fields: SFTFields, tokenize: Callable[[str], list[int]], eod: int, where: str
) -> SFTExample:
    ids: list[int] = []
    target: list[int] = []
    for text, is_target in _segments(record, fields, where):
        piece = [eod] if text is None else tokenize(text)
        ids += piece
        target += [int(is_target)] * len(piece)
    if not any(t for i, t in zip(ids, target) if i != eod):
        raise SFTDataError(f"{where}: the response tokenises to nothing")
    return SFTExample(ids=tuple(ids), target=tuple(target), where=where)


def read_sft_jsonl(path: str, fields: SFTFields, tokenize: Callable[[str], list[int]], eod: int) -> list[SFTExample]:
    """Every record of a JSONL file (blank lines skipped); the first bad one raises ``SFTDataError``."""
    if not os.path.isfile(path):
        raise SFTDataError(f"{path}: no such SFT file (JSONL, one record per line)")
    examples = []
    with open(path, encoding="utf-8") as f:
        for where, record in jsonl_records(path, f, SFTDataError):
            examples.append(encode_record(record, fields, tokenize, eod, where))
    if not examples:
        raise SFTDataError(f"{path}: no records")
    return examples


_CACHE: dict[tuple, list[SFTExample]] = {}


def load_sft_examples(paths: Sequence[str], fields: SFTFields, tokenizer: Any) -> list[SFTExample]:
    """Records of the files in order, tokenised once per process (the run's plan reads them first,
    so a bad record is a one-line error before any process group exists)."""
    key = (tuple(os.path.realpath(p) for p in paths), fields, getattr(tokenizer, "fingerprint", id(tokenizer)))
    if key not in _CACHE:
        _CACHE[key] = [ex for p in paths for ex in read_sft_jsonl(p, fields, tokenizer.tokenize, tokenizer.eod)]
    return _CACHE[key]


def fit_to_window(examples: list[SFTExample], seq_length: int, where: str) -> list[SFTExample]:
    """Cut each record to ``seq_length + 1`` tokens; drop those left with no loss target."""
    width = seq_length + 1
    kept = [
        SFTExample(ids=e.ids[:width], target=e.target[:width], where=e.where)
        for e in examples
        if any(e.target[1:width])
    ]
    cut = sum(len(e.ids) > width for e in examples)
    if cut:
        logger.warning(
            "%s: %d of %d records exceed %d tokens and are cut at the right; %d dropped "
            "(no response token inside the window)",
            where,
            cut,
            len(examples),
            width,
            len(examples) - len(kept),
        )
    if not kept:
        raise SFTDataError(f"{where}: no record has a response token within seq_length + 1 = {width} tokens")
    return kept


class SFTDataset(torch.utils.data.Dataset):
    """Padded SFT samples with the GPT path's keys (``tokens``, ``labels``, ``loss_mask``, ``position_ids``).

    ``loss_mask[j]`` is 1 exactly when ``labels[j]`` is a response token (or its closing EOD).
    """

    def __init__(
        self,
        examples: list[SFTExample],
        *,
        seq_length: int,
        num_samples: int,
        seed: int,
        stream_id: int = 0,
        pad_id: int,
        shuffle: bool = True,
    ) -> None:
        if not examples:
            raise ValueError("examples: needs at least one record")
        self.examples = examples
        self.seq_length = seq_length
        self.num_samples = num_samples
        self.seed, self.stream_id, self.shuffle = seed, stream_id, shuffle
        self.pad_id = pad_id
        self._order: tuple[int, numpy.ndarray | None] = (-1, None)
        self._position_ids = torch.arange(seq_length, dtype=torch.long)

    def __len__(self) -> int:
        return self.num_samples

    def record_index(self, index: int) -> int:
        """Which record global sample ``index`` is."""
        n = len(self.examples)
        epoch, k = divmod(index, n)
        if not self.shuffle:
            return k
        if self._order[0] != epoch:
            rng = numpy.random.Generator(
                numpy.random.Philox(numpy.random.SeedSequence([self.seed, self.stream_id, epoch]))
            )
            self._order = (epoch, rng.permutation(n))
        return int(self._order[1][k])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside [0, {self.num_samples})")
        ex = self.examples[self.record_index(index)]
        width = self.seq_length + 1
        ids = torch.full((width,), self.pad_id, dtype=torch.long)
        target = torch.zeros(width, dtype=torch.float)
        n = min(len(ex.ids), width)  # longer records are cut at the right (fit_to_window logs them)
        ids[:n] = torch.tensor(ex.ids[:n], dtype=torch.long)
        target[:n] = torch.tensor(ex.target[:n], dtype=torch.float)
        return {
            "tokens": ids[:-1].contiguous(),
            "labels": ids[1:].contiguous(),
            "loss_mask": target[1:].contiguous(),
            "position_ids": self._position_ids.clone(),
        }


def build_sft_datasets(
    cfg, tokenizer: Any, *, num_train_samples: int, num_valid_samples: int, seed: int
) -> tuple[SFTDataset, SFTDataset | None]:
    """Train: shuffled records of ``data_path``; valid: ``valid_data_path`` in file order (cycled)."""
    pad_id = tokenizer.pad if getattr(tokenizer, "pad", None) is not None else tokenizer.eod
    fields = cfg.sft_fields
    train = fit_to_window(load_sft_examples(cfg.blend[0], fields, tokenizer), cfg.seq_length, "data_path")
    train_ds = SFTDataset(
        train, seq_length=cfg.seq_length, num_samples=num_train_samples, seed=seed, stream_id=0, pad_id=pad_id
    )
    valid_ds = None
    if cfg.valid_blend is not None and num_valid_samples > 0:
        valid = fit_to_window(
            load_sft_examples(cfg.valid_blend[0], fields, tokenizer), cfg.seq_length, "valid_data_path"
        )
        valid_ds = SFTDataset(
            valid,
            seq_length=cfg.seq_length,
            num_samples=num_valid_samples,
            seed=seed,
            stream_id=1,
            pad_id=pad_id,
            shuffle=False,
        )
    logger.info(
        "SFT: %d train records%s, padded to %d tokens, loss on response tokens + EOD",
        len(train),
        f", {len(valid_ds.examples)} valid records" if valid_ds else "",
        cfg.seq_length,
    )
    return train_ds, valid_ds
