"""The shared English corpus as JSONL documents, indexed with the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``$MFC_SHARED_DATA`` or ``../shared/data`` beside the checkout."""
    path = Path(os.environ.get("MFC_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
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
        [d for f in sorted((corpus / "gutenberg").glob("*.txt")) for d in _chunks(f"pg/{f.stem}", _gutenberg_body(_read(f)), chunk_chars)],
        [d for f in sorted((corpus / "state_union").glob("*.txt")) if "README" not in f.name.upper()
         for d in _chunks(f"sotu/{f.stem}", _read(f), chunk_chars)],
        [d for d in _chunks("wikitext2", _read(corpus / "wikitext-2" / "valid.txt").replace(" @-@ ", "-"), chunk_chars)],
    ]
    total, i = 0, 0
    while any(sources) and total < max_bytes:
        source = sources[i % len(sources)]
        i += 1
        if source:
            doc = source.pop(0)
            total += len(doc["text"].encode("utf-8"))
            yield doc


def build_indexed_corpus(work: Path, max_bytes: int, valid_fraction: float = 0.05) -> dict:
    """JSONL corpus → SmolLM2 tokens → ``.bin/.idx`` train/valid split (by a hash of the document id)."""
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess

    root = shared_data_dir()
    tokenizer = str(root / "tokenizers" / "smollm2" / "tokenizer.json")
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    jsonl = work / "corpus" / "english.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for doc in corpus_documents(root, max_bytes):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    summary = preprocess(PreprocessConfig(
        input=[str(jsonl)], output_prefix=str(work / "data" / "english"), tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model=tokenizer, append_eod=True, id_key="id", valid_fraction=valid_fraction,
        min_doc_tokens=2, log_interval=1_000_000,
    ))
    return {"tokenizer_model": tokenizer, "train": summary["outputs"]["train_text"],
            "valid": summary["outputs"]["valid_text"], "documents": summary["documents"], "tokens": summary["tokens"]}
