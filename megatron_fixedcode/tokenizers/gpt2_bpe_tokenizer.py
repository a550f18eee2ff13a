"""Megatron-LM's ``GPT2BPETokenizer``: GPT-2's byte-level BPE from a ``vocab.json`` and a ``merges.txt``.

Read as Megatron-LM's ``gpt2_tokenization.GPT2Tokenizer`` reads them (core_v0.16.1): the vocabulary
is the JSON object, the merges are the lines of the file but its first (the ``#version`` header) and
its last (empty after the final newline), no special tokens are added (``<|endoftext|>`` in a text is
tokenized as text), EOD is the id of ``<|endoftext|>`` and the vocabulary size is the number of
entries of ``vocab.json``. Encoding runs in HF ``tokenizers`` (a BPE model with GPT-2's ByteLevel
pre-tokenizer, no prefix space); tests/tokenizers/test_tokenizers.py checks its ids against Megatron-LM's own
pure-Python tokenizer (tests/helpers/megatron_gpt2_reference.py).
"""

import hashlib
import json
from pathlib import Path
from typing import Optional, Sequence

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from megatron_fixedcode.tokenizers.base import Tokenizer

EOD_TOKEN = "<|endoftext|>"


def _read(path: Path, flag: str, what: str) -> str:
    if not path.is_file():
        raise ValueError(f"{flag}: no GPT-2 {what} at {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag}: {path} is not a readable GPT-2 {what} ({e})") from None


def load_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(_read(path, "--vocab-file", "vocab.json"))
    except ValueError as e:
        if str(e).startswith("--vocab-file"):
            raise
        raise ValueError(
            f"--vocab-file: {path} is not a valid GPT-2 vocab.json ({e}); the file is damaged or truncated"
        ) from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and i >= 0 for i in vocab.values()):
        raise ValueError(f"--vocab-file: {path} is not a GPT-2 vocab.json (a JSON object token -> id)")
    return vocab


def load_merges(path: Path) -> list[tuple[str, str]]:
    """Megatron-LM's rule: ``read().split('\\n')[1:-1]``, each line split on whitespace."""
    merges = []
    for number, line in enumerate(_read(path, "--merge-file", "merges.txt").split("\n")[1:-1], start=2):
        parts = tuple(line.split())
        if len(parts) == 2:
            merges.append(parts)
        elif parts:  # Megatron-LM ranks such a line but no pair can match it
            raise ValueError(f"--merge-file: {path}:{number} is not a merge (two tokens): {line[:80]!r}")
    return merges


class GPT2BPETokenizer(Tokenizer):
    """``path`` is the vocab.json, ``merge_file`` the merges.txt (Megatron-LM's --vocab-file, --merge-file)."""

    tokenizer_type = "GPT2BPETokenizer"

    def __init__(self, path: Path, eod_token: Optional[str] = None, merge_file: Optional[str] = None) -> None:
        if merge_file is None:
            raise ValueError("--tokenizer-type GPT2BPETokenizer reads --vocab-file and --merge-file: give --merge-file")
        vocab_path, merge_path = Path(path), Path(merge_file)
        self._vocab = load_vocab(vocab_path)
        merges = load_merges(merge_path)
        unknown = next((t for pair in merges for t in (*pair, "".join(pair)) if t not in self._vocab), None)
        if unknown is not None:
            raise ValueError(
                f"--merge-file: {merge_path} merges into {unknown!r}, which {vocab_path} lacks: "
                "the files are not a pair"
            )
        try:
            tok = HFTokenizer(models.BPE(vocab=self._vocab, merges=merges))
        except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions
            raise ValueError(f"--vocab-file {vocab_path} / --merge-file {merge_path}: not a GPT-2 BPE ({e})") from None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        self._tok = tok
        self.merge_file = merge_path
        name = eod_token or EOD_TOKEN
        if name not in self._vocab:
            raise ValueError(f"--vocab-file: {vocab_path} has no {name!r} (the end-of-document token)")
        self._eod = self._vocab[name]
        super().__init__(vocab_path, eod_token)
        digest = hashlib.sha256(vocab_path.read_bytes() + b"\0" + merge_path.read_bytes())
        self.fingerprint = digest.hexdigest()[:16]  # both files: another merges.txt is another tokenizer
        self.unique_identifiers["tokenizer_path"] = [str(vocab_path), str(merge_path)]
        self.unique_identifiers["fingerprint"] = self.fingerprint
        self.unique_description = json.dumps(self.unique_identifiers, indent=4)

    def __reduce__(self):
        return (type(self), (self.model_path, self.eod_token, str(self.merge_file)))

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)  # Megatron-LM: len(encoder)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def bos(self) -> Optional[int]:
        return None

    @property
    def pad(self) -> Optional[int]:
        return None

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def hf_tokenizer(self) -> HFTokenizer:
        """The ``tokenizers`` object (an HF export saves it as tokenizer.json)."""
        return self._tok

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def describe(self) -> dict:
        return {**super().describe(), "merge_file": str(self.merge_file)}
