"""Tokenizers behind one interface: ``build_tokenizer(type, model)``."""

from pathlib import Path
from typing import Optional

from megatron_fixedcode.tokenizers.base import Tokenizer, file_fingerprint
from megatron_fixedcode.tokenizers.huggingface_tokenizer import HuggingFaceTokenizer
from megatron_fixedcode.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from megatron_fixedcode.tokenizers.train import train_bpe_tokenizer

TOKENIZER_TYPES = {
    "HuggingFaceTokenizer": HuggingFaceTokenizer,
    "SentencePieceTokenizer": SentencePieceTokenizer,
}


def build_tokenizer(
    tokenizer_type: str, tokenizer_model: str, eod_token: Optional[str] = None
) -> Tokenizer:
    """Load a local tokenizer by Megatron-LM's ``--tokenizer-type`` name."""
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ValueError(
            f"--tokenizer-type {tokenizer_type!r} is not supported; "
            f"choose one of {', '.join(TOKENIZER_TYPES)}"
        )
    return TOKENIZER_TYPES[tokenizer_type](Path(tokenizer_model), eod_token)


__all__ = [
    "Tokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "TOKENIZER_TYPES",
    "build_tokenizer",
    "file_fingerprint",
    "train_bpe_tokenizer",
]
