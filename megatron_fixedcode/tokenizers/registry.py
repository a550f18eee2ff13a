"""`build_tokenizer`: a local tokenizer by Megatron-LM's ``--tokenizer-type`` name."""

from pathlib import Path
from typing import Optional

from megatron_fixedcode.tokenizers.base import Tokenizer
from megatron_fixedcode.tokenizers.huggingface_tokenizer import HuggingFaceTokenizer
from megatron_fixedcode.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

TOKENIZER_TYPES = {
    "HuggingFaceTokenizer": HuggingFaceTokenizer,
    "SentencePieceTokenizer": SentencePieceTokenizer,
    # Megatron-LM's names for a SentencePiece model with no extra special tokens, which is what this
    # project's SentencePieceTokenizer is (Megatron-LM's SentencePieceTokenizer adds <CLS>, <SEP>, ...)
    "GPTSentencePieceTokenizer": SentencePieceTokenizer,
    "Llama2Tokenizer": SentencePieceTokenizer,
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
