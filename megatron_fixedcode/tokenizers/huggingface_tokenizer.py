"""Hugging Face ``tokenizers`` (a ``tokenizer.json``), loaded locally, never downloaded."""

import json
from pathlib import Path
from typing import Optional, Sequence

from tokenizers import Tokenizer as HFTokenizer

from megatron_fixedcode.tokenizers.base import (
    KNOWN_BOS_TOKENS,
    KNOWN_EOD_TOKENS,
    KNOWN_PAD_TOKENS,
    Tokenizer,
)


def resolve_tokenizer_json(path: Path) -> Path:
    """Accept the file itself or a directory holding ``tokenizer.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"--tokenizer-model: no tokenizer.json at {path}")
    return path


def _config_token(path: Path, field: str) -> Optional[str]:
    """A special token named by a ``tokenizer_config.json`` next to the file, if any."""
    config = path.parent / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get(field)
    except (ValueError, AttributeError) as e:  # bad JSON or bytes, or not an object
        raise ValueError(f"--tokenizer-model: {config} is not a valid tokenizer_config.json ({e})") from None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _load(json_path: Path) -> HFTokenizer:
    """The Rust parser raises a bare ``Exception`` on a damaged file: name the file instead."""
    try:
        return HFTokenizer.from_str(json_path.read_text(encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 - tokenizers has no narrower exception type
        raise ValueError(
            f"--tokenizer-model: {json_path} is not a valid tokenizer.json ({e}); the file is damaged or truncated"
        ) from None


class HuggingFaceTokenizer(Tokenizer):
    """Wraps ``tokenizers.Tokenizer``; ``encode_batch`` runs in Rust threads."""

    tokenizer_type = "HuggingFaceTokenizer"

    def __init__(self, path: Path, eod_token: Optional[str] = None) -> None:
        json_path = resolve_tokenizer_json(path)
        self._tok = _load(json_path)
        self._eod = self._find(json_path, [eod_token] if eod_token else None, "eos_token", KNOWN_EOD_TOKENS)
        if self._eod is None:
            raise ValueError(
                f"{json_path}: no end-of-document token found "
                f"(looked for {', '.join(KNOWN_EOD_TOKENS)}); pass eod_token (--eod-token)"
            )
        self._bos = self._find(json_path, None, "bos_token", KNOWN_BOS_TOKENS)
        self._pad = self._find(json_path, None, "pad_token", KNOWN_PAD_TOKENS)
        super().__init__(json_path, eod_token)

    def _find(self, path: Path, explicit, config_field: str, known) -> Optional[int]:
        if explicit is not None:
            token_id = self._tok.token_to_id(explicit[0])
            if token_id is None:
                raise ValueError(f"{path}: eod token {explicit[0]!r} is not in the vocabulary")
            return token_id
        candidates = [_config_token(path, config_field), *known]
        for token in candidates:
            if token is not None and self._tok.token_to_id(token) is not None:
                return self._tok.token_to_id(token)
        return None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def bos(self) -> Optional[int]:
        return self._bos

    @property
    def pad(self) -> Optional[int]:
        return self._pad

    @property
    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)
