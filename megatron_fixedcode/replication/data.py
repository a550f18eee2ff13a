"""The study's data: the shared English corpus as JSONL documents, a BPE tokenizer trained on its
train split, and the indexed train/held-out data."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterator

from megatron_fixedcode.utils.files import file_sha256

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``$MFC_SHARED_DATA``, else ``../shared/data`` beside the checkout (the full corpus), else the
    sample a clone carries (``tests/assets``, see its SOURCES.md): a clone alone runs the study."""
    beside = REPO_ROOT.parent / "shared" / "data"
    default = (
        beside if (beside / "tokenizers" / "smollm2" / "tokenizer.json").is_file() else REPO_ROOT / "tests" / "assets"
    )
    path = Path(os.environ.get("MFC_SHARED_DATA", default))
    if not (path / "tokenizers" / "smollm2" / "tokenizer.json").is_file():
        raise ValueError(f"shared data not found at {path} (set MFC_SHARED_DATA)")
    return path


def _read(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # six State of the Union files
    return text.replace("\r\n", "\n")


def _gutenberg_body(text: str) -> str:
    start = re.search(r"\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n", text)
    end = re.search(r"\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG", text)
    return text[start.end() if start else 0 : end.start() if end else len(text)]


def _chunks(source: str, text: str, chunk_chars: int) -> Iterator[dict]:
    """Paragraph-aligned pieces of about ``chunk_chars`` characters, each a document."""
    piece, index = [], 0
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para:
            continue
        piece.append(para)
        if sum(len(p) for p in piece) >= chunk_chars:
            yield {"id": f"{source}#{index}", "text": "\n\n".join(piece)}
            piece, index = [], index + 1
    if piece:
        yield {"id": f"{source}#{index}", "text": "\n\n".join(piece)}


def corpus_documents(root: Path, max_bytes: int, chunk_chars: int = 4000) -> Iterator[dict]:
    """Gutenberg books (license header/footer cut), State of the Union speeches and WikiText-2
    (valid) articles, interleaved by source so any prefix mixes all three, up to ``max_bytes``."""
    corpus = root / "corpus"
    sources = [
        [
            d
            for f in sorted((corpus / "gutenberg").glob("*.txt"))
            for d in _chunks(f"pg/{f.stem}", _gutenberg_body(_read(f)), chunk_chars)
        ],
        [
            d
            for f in sorted((corpus / "state_union").glob("*.txt"))
            if "README" not in f.name.upper()
            for d in _chunks(f"sotu/{f.stem}", _read(f), chunk_chars)
        ],
        [
            d
            for d in _chunks("wikitext2", _read(corpus / "wikitext-2" / "valid.txt").replace(" @-@ ", "-"), chunk_chars)
        ],
    ]
    total, i = 0, 0
    while any(sources) and total < max_bytes:
        source = sources[i % len(sources)]
        i += 1
        if source:
            doc = source.pop(0)
            total += len(doc["text"].encode("utf-8"))
            yield doc


def prepare_study_data(
    work: Path, *, corpus_mb: float, vocab_size: int, valid_fraction: float = 0.05, split_seed: int = 1234
) -> dict:
    """Corpus JSONL → byte-level BPE tokenizer (V = ``vocab_size``, trained on the train documents
    only) → ``.bin/.idx`` train/held-out split by the seeded hash of the document id (the split
    ``preprocess_data.py`` makes). Reused when ``data.json`` records the same settings; the
    returned ``fingerprint`` hashes the tokenizer and the indexed files by content."""
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess
    from megatron_fixedcode.data.preprocess.encode import is_validation_document
    from megatron_fixedcode.tokenizers.train import train_bpe_tokenizer

    settings = {
        "corpus_mb": corpus_mb,
        "vocab_size": vocab_size,
        "valid_fraction": valid_fraction,
        "split_seed": split_seed,
    }
    record = work / "data" / "data.json"
    if record.is_file():
        data = json.loads(record.read_text())
        if data["settings"] == settings and all(
            Path(data[k] + ext).is_file() for k in ("train", "valid") for ext in (".bin", ".idx")
        ):
            return data
    (work / "data").mkdir(parents=True, exist_ok=True)
    jsonl, train_text = work / "data" / "corpus.jsonl", work / "data" / "train_text.txt"
    with open(jsonl, "w", encoding="utf-8") as out, open(train_text, "w", encoding="utf-8") as text:
        for doc in corpus_documents(shared_data_dir(), int(corpus_mb * 2**20)):
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
            if not is_validation_document(doc["id"].encode("utf-8"), split_seed, valid_fraction):
                text.write(doc["text"] + "\n\n")
    tokenizer = train_bpe_tokenizer([str(train_text)], vocab_size, str(work / "data" / "tokenizer"))
    summary = preprocess(
        PreprocessConfig(
            input=[str(jsonl)],
            output_prefix=str(work / "data" / "corpus"),
            tokenizer_type="HuggingFaceTokenizer",
            tokenizer_model=str(tokenizer),
            append_eod=True,
            id_key="id",
            valid_fraction=valid_fraction,
            split_seed=split_seed,
            min_doc_tokens=2,
            log_interval=1_000_000,
        )
    )
    train, valid = summary["outputs"]["train_text"], summary["outputs"]["valid_text"]
    files = [tokenizer] + [Path(prefix + ext) for prefix in (train, valid) for ext in (".bin", ".idx")]
    data = {
        "settings": settings,
        "tokenizer_model": str(tokenizer),
        "train": train,
        "valid": valid,
        "documents": summary["documents"],
        "tokens": summary["tokens"],
        "fingerprint": hashlib.sha256("".join(file_sha256(f) for f in files).encode()).hexdigest()[:16],
    }
    record.write_text(json.dumps(data, indent=1))
    return data
