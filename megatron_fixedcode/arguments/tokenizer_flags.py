"""Megatron-LM's tokenizer flags, shared by the trainer and every tool: their names and the types read
here (no tokenizer library imported: parsers use it). Which files they name is
:func:`megatron_fixedcode.tokenizers.base.tokenizer_files`."""

from __future__ import annotations

import dataclasses

from megatron_fixedcode.arguments.config_fields import borrowed, from_dests


# Megatron-LM's --tokenizer-type values read here: tokenizers.registry.TOKENIZER_TYPES (a test checks they agree;
# not imported: the dry run needs no tokenizer library)
TOKENIZER_NAMES = (
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "GPT2BPETokenizer",
)
# Megatron-LM's --tokenizer-type values this project does not read -> what they are (refused in one line).
OTHER_TOKENIZERS = {
    "TikTokenizer": "TikToken vocabularies",
    "BertWordPieceLowerCase": "BERT / T5",
    "BertWordPieceCase": "BERT / T5",
    "MultimodalTokenizer": "multimodal models",
    "NullMultimodalTokenizer": "multimodal models",
    "SFTTokenizer": "Megatron's SFT path (give --dataset-type sft, docs/sft.md)",
}
NULL_TOKENIZER = "NullTokenizer"  # the trainer's: pre-tokenized data, no tokenizer file


def add_tokenizer_args(
    p,
    *,
    type_default: str | None = None,
    trainer: bool = False,
    type_help: str | None = None,
    model_help: str = "tokenizer.json (or its directory) or a SentencePiece .model",
) -> None:
    """Megatron-LM's tokenizer flags: --tokenizer-type (one of :data:`TOKENIZER_NAMES`; the trainer also takes
    NullTokenizer and names Megatron-LM's other types to refuse them in one line) and --tokenizer-model, or for
    GPT2BPETokenizer --vocab-file and --merge-file (see ``tokenizers.base.tokenizer_files``)."""
    choices = [*TOKENIZER_NAMES, NULL_TOKENIZER, *OTHER_TOKENIZERS] if trainer else list(TOKENIZER_NAMES)
    default_note = f" (default {type_default})" if type_default and not trainer else ""
    p.add_argument(
        "--tokenizer-type",
        choices=choices,
        required=type_default is None,
        default=type_default,
        help=(type_help or ", ".join(TOKENIZER_NAMES)) + default_note,
    )
    p.add_argument("--tokenizer-model", default=None, help=model_help)
    p.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
    p.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """The tokenizer the trainer's flags name, after parsing (or the checkpoint's own: training/run_plan.py);
    its fields are the flags' dests, which ``tokenizers.base.tokenizer_files`` reads."""

    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = borrowed("core_flags", default=None)  # pre-tokenized data with no tokenizer file

    @classmethod
    def from_args(cls, a) -> "TokenizerConfig":
        return from_dests(cls, a)

    def names_file(self) -> bool:
        return bool(self.tokenizer_model or self.vocab_file)
