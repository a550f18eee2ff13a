"""The one tokenizer interface used by preprocessing and by megatron-core datasets.

It has the members of megatron-core's ``MegatronTokenizerBase`` so a tokenizer can be put in a
``GPTDatasetConfig`` as it is (``GPTDataset`` reads ``vocab_size`` and ``eod``); it is registered as
a virtual subclass of it (``register_with_megatron``) rather than derived from it, so that
tokenizing a corpus does not import megatron-core and torch (seconds of start-up).
"""

import hashlib
import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence


def register_with_megatron() -> None:
    """Make ``isinstance(tok, MegatronTokenizerBase)`` hold; called where tokenizers meet megatron-core."""
    from megatron.core.tokenizers import MegatronTokenizerBase

    MegatronTokenizerBase.register(Tokenizer)


# Tried in this order when the tokenizer file does not name its end-of-document token.
KNOWN_EOD_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
KNOWN_BOS_TOKENS = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
KNOWN_PAD_TOKENS = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")


def file_fingerprint(path: Path, num_hex: int = 16) -> str:
    """Short sha256 of a serialized tokenizer model, so outputs can name what produced them."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:num_hex]


class Tokenizer(ABC):
    """Text <-> ids with the special ids a pretraining pipeline needs.

    Subclasses set ``self.fingerprint`` and implement the abstract members. ``bos`` and
    ``pad`` may be None; ``eod`` never is.
    """

    tokenizer_type: str = "Tokenizer"

    def __init__(self, path: Path, eod_token: Optional[str] = None) -> None:
        self.path = str(path)  # MegatronTokenizerBase.__init__(path, config={})
        self.model_path = Path(path)
        self.eod_token = eod_token
        self.fingerprint = file_fingerprint(self.model_path)
        self.unique_identifiers = OrderedDict(
            [
                ("class", type(self).__name__),
                ("tokenizer_path", [str(self.model_path)]),
                ("fingerprint", self.fingerprint),
                ("eod", self.eod),
            ]
        )
        self.unique_description = json.dumps(self.unique_identifiers, indent=4)

    def __reduce__(self):
        # Rebuild from the file in worker processes rather than pickling native objects.
        return (type(self), (self.model_path, self.eod_token))

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """True vocabulary size, added and special tokens included."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """End-of-document id appended by ``--append-eod``."""

    @property
    @abstractmethod
    def bos(self) -> Optional[int]:
        """Beginning-of-sequence id, or None."""

    @property
    @abstractmethod
    def pad(self) -> Optional[int]:
        """Padding id, or None."""

    @property
    def eos(self) -> int:
        return self.eod

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Encode one text, without adding special tokens."""

    @abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts with the library's native (multithreaded) batch path."""

    @abstractmethod
    def detokenize(self, ids: Sequence[int]) -> str:
        """Decode ids to text."""

    @property
    @abstractmethod
    def vocab(self) -> dict[str, int]:
        """Token string -> id."""

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    def apply_chat_template(self, *args, **kwargs):
        raise NotImplementedError("pretraining tokenizers have no chat template")

    def describe(self) -> dict:
        """What a summary file records about the tokenizer."""
        return {
            "type": self.tokenizer_type,
            "path": str(self.model_path),
            "fingerprint": self.fingerprint,
            "vocab_size": self.vocab_size,
            "eod": self.eod,
            "bos": self.bos,
            "pad": self.pad,
        }


def tokenizer_files(a) -> tuple[Optional[str], Optional[str]]:
    """(tokenizer path, merge file) Megatron-LM's flags name (an argparse namespace): --vocab-file and
    --merge-file for GPT2BPETokenizer, else --tokenizer-model. Combinations Megatron-LM would not read
    are refused (ValueError, one line)."""
    vocab, merges = getattr(a, "vocab_file", None), getattr(a, "merge_file", None)
    if a.tokenizer_type != "GPT2BPETokenizer":
        if vocab or merges:
            flag = "--vocab-file" if vocab else "--merge-file"
            raise ValueError(
                f"{flag}: read with --tokenizer-type GPT2BPETokenizer (GPT-2 BPE vocab.json + merges.txt) "
                f"only, not {a.tokenizer_type}"
            )
        return a.tokenizer_model, None
    if a.tokenizer_model:
        raise ValueError(
            "--tokenizer-type GPT2BPETokenizer reads --vocab-file and --merge-file: drop --tokenizer-model"
        )
    if bool(vocab) != bool(merges):
        raise ValueError(
            f"--tokenizer-type GPT2BPETokenizer needs both --vocab-file and --merge-file "
            f"(got only {'--vocab-file' if vocab else '--merge-file'})"
        )
    return vocab, merges
