"""Train a byte-level BPE ``tokenizer.json`` on local text files.

Byte-level means every input byte is representable, so no text ever maps to an
unknown token. ``<|endoftext|>`` is special token id 0, the end-of-document id.
"""

import glob
import logging
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

logger = logging.getLogger(__name__)

EOD_TOKEN = "<|endoftext|>"


def expand_text_inputs(inputs: Sequence[str]) -> list[Path]:
    """Files, globs or directories (searched recursively) -> sorted files."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            matches = sorted(Path(p) for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not matches:
                raise ValueError(f"--input {item!r}: no such file, directory or glob match")
            files += matches
    return files


def check_utf8(path: Path) -> None:
    """The Rust trainer's own error names no file; name the file and line instead."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not valid UTF-8 ({e.reason} at byte {e.start})") from None


def train_bpe_tokenizer(
    inputs: Sequence[str],
    vocab_size: int,
    output_dir: str,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = (EOD_TOKEN,),
) -> Path:
    """Train and write ``output_dir/tokenizer.json``; returns its path.

    ``special_tokens`` get the first ids in order, so the default puts ``<|endoftext|>`` at 0.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(special_tokens):
        raise ValueError(
            f"--vocab-size {vocab_size} is below the byte alphabet plus special tokens "
            f"({len(alphabet) + len(special_tokens)})"
        )
    files = expand_text_inputs(inputs)
    if not files:
        raise ValueError(f"--input {list(inputs)}: no files found")
    for path in files:
        check_utf8(path)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    logger.info("training byte-level BPE (vocab %d) on %d files", vocab_size, len(files))
    tokenizer.train([str(f) for f in files], trainer)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    logger.info("wrote %s (vocab %d)", out / "tokenizer.json", tokenizer.get_vocab_size())
    return out / "tokenizer.json"
