"""`build_tokenizer`: a local tokenizer by Megatron-LM's ``--tokenizer-type`` name."""

from pathlib import Path
from typing import Optional

from megatron_fixedcode.tokenizers.base import Tokenizer, tokenizer_files
from megatron_fixedcode.tokenizers.gpt2_bpe_tokenizer import GPT2BPETokenizer
from megatron_fixedcode.tokenizers.huggingface_tokenizer import HuggingFaceTokenizer
from megatron_fixedcode.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

TOKENIZER_TYPES = {
    "HuggingFaceTokenizer": HuggingFaceTokenizer,
    "SentencePieceTokenizer": SentencePieceTokenizer,
    # Megatron-LM's names for a SentencePiece model with no extra special tokens, which is what this
    # project's SentencePieceTokenizer is (Megatron-LM's SentencePieceTokenizer adds <CLS>, <SEP>, ...)
    "GPTSentencePieceTokenizer": SentencePieceTokenizer,
    "Llama2Tokenizer": SentencePieceTokenizer,
    # Megatron-LM's GPT-2 BPE: --vocab-file vocab.json --merge-file merges.txt (tokenizer_model: the vocab.json)
    "GPT2BPETokenizer": GPT2BPETokenizer,
}


def build_tokenizer(
    tokenizer_type: str, tokenizer_model: str, eod_token: Optional[str] = None, merge_file: Optional[str] = None
) -> Tokenizer:
    """Load a local tokenizer by Megatron-LM's ``--tokenizer-type`` name (GPT2BPETokenizer: ``tokenizer_model``
    is its vocab.json, ``merge_file`` its merges.txt)."""
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ValueError(
            f"--tokenizer-type {tokenizer_type!r} is not supported; choose one of {', '.join(TOKENIZER_TYPES)}"
        )
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(Path(tokenizer_model), eod_token, merge_file)
    if merge_file is not None:
        raise ValueError(f"--merge-file is read by --tokenizer-type GPT2BPETokenizer, not {tokenizer_type}")
    return TOKENIZER_TYPES[tokenizer_type](Path(tokenizer_model), eod_token)


def tokenizer_from_args(a, eod_token: Optional[str] = None) -> Optional[Tokenizer]:
    """The tokenizer Megatron-LM's flags name, or None when they name none."""
    path, merges = tokenizer_files(a)
    return build_tokenizer(a.tokenizer_type, path, eod_token, merges) if path else None


def tokenizer_from_record(record: dict, model: Optional[str] = None) -> Optional[Tokenizer]:
    """The tokenizer a checkpoint's :func:`tokenizer_record` names (``model`` overrides its path), or None
    when it names no file (pre-tokenized data, --vocab-size)."""
    path = model or record.get("model")
    return (
        build_tokenizer(record.get("type") or "HuggingFaceTokenizer", path, merge_file=record.get("merge_file"))
        if path
        else None
    )


def tokenizer_record(a) -> dict:
    """What a checkpoint records of the tokenizer the flags name: type, model (GPT2BPETokenizer: the
    vocab.json) and, for GPT2BPETokenizer, merge_file."""
    path, merges = tokenizer_files(a)
    return {"type": a.tokenizer_type, "model": path, **({"merge_file": merges} if merges else {})}
