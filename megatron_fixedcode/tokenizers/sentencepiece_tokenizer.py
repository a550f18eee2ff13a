"""SentencePiece ``.model`` files."""

import os
from pathlib import Path
from typing import Optional, Sequence

import sentencepiece

from megatron_fixedcode.tokenizers.base import KNOWN_EOD_TOKENS, Tokenizer


class SentencePieceTokenizer(Tokenizer):
    """Wraps ``SentencePieceProcessor``; batch encoding uses its native threads."""

    tokenizer_type = "SentencePieceTokenizer"

    def __init__(self, path: Path, eod_token: Optional[str] = None) -> None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"--tokenizer-model: no SentencePiece model at {path}")
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as e:  # a damaged or non-SentencePiece file
            raise ValueError(f"--tokenizer-model: {path} is not a valid SentencePiece model ({e})") from None
        self._eod = self._find_eod(path, eod_token)
        super().__init__(path, eod_token)

    def _piece_id(self, piece: str) -> Optional[int]:
        token_id = self._sp.piece_to_id(piece)
        return token_id if self._sp.id_to_piece(token_id) == piece else None

    def _find_eod(self, path: Path, eod_token: Optional[str]) -> int:
        if eod_token is not None:
            token_id = self._piece_id(eod_token)
            if token_id is None:
                raise ValueError(f"{path}: eod token {eod_token!r} is not in the vocabulary")
            return token_id
        if self._sp.eos_id() >= 0:
            return self._sp.eos_id()
        for token in KNOWN_EOD_TOKENS:
            if self._piece_id(token) is not None:
                return self._piece_id(token)
        raise ValueError(
            f"{path}: no end-of-document token found (model has no eos id and none of "
            f"{', '.join(KNOWN_EOD_TOKENS)}); pass eod_token (--eod-token)"
        )

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def bos(self) -> Optional[int]:
        return self._sp.bos_id() if self._sp.bos_id() >= 0 else None

    @property
    def pad(self) -> Optional[int]:
        return self._sp.pad_id() if self._sp.pad_id() >= 0 else None

    @property
    def vocab(self) -> dict[str, int]:
        return {self._sp.id_to_piece(i): i for i in range(self.vocab_size)}

    def tokenize(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._sp.decode(list(ids))
