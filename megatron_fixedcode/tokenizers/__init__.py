"""Tokenizers behind one interface: ``build_tokenizer(type, model)``."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "Tokenizer": "base",
    "file_fingerprint": "base",
    "HuggingFaceTokenizer": "huggingface_tokenizer",
    "SentencePieceTokenizer": "sentencepiece_tokenizer",
    "GPT2BPETokenizer": "gpt2_bpe_tokenizer",
    "TOKENIZER_TYPES": "registry",
    "build_tokenizer": "registry",
    "tokenizer_from_args": "registry",
    "tokenizer_from_record": "registry",
    "tokenizer_record": "registry",
    "train_bpe_tokenizer": "train",
    **dict.fromkeys(
        ["carried_record", "write_carried_copy", "checkpoint_tokenizer", "checkpoint_tokenizer_files"], "carried"
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Tokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "GPT2BPETokenizer",
    "TOKENIZER_TYPES",
    "build_tokenizer",
    "tokenizer_from_args",
    "tokenizer_from_record",
    "tokenizer_record",
    "file_fingerprint",
    "train_bpe_tokenizer",
    "carried_record",
    "write_carried_copy",
    "checkpoint_tokenizer",
    "checkpoint_tokenizer_files",
]
