"""The quickstart's corpus (``quickstart_pipeline.py``): without ``--input``, the docstrings of the Python
standard library's sources (read with ``ast``, nothing imported), one document per module in sorted path
order, so the same Python version gives the same bytes; with it, the user's JSONL/JSON(.gz) or text files."""

from __future__ import annotations

import ast
import gzip
import json
import sysconfig
from pathlib import Path
from typing import Iterator, Sequence


SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


JSON_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
INDEXED_SUFFIXES = JSON_SUFFIXES + (".parquet",)


def stdlib_documents(max_bytes: int = 3 << 20) -> Iterator[dict]:
    """``{"id": module, "text": docstrings}`` for each stdlib source file, in sorted path order.

    Module, class and function docstrings (``ast.walk`` order) joined by blank lines; files that do
    not parse or hold no docstring are skipped. Stops after ``max_bytes`` of UTF-8 text.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        nodes = (
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        )
        text = "\n\n".join(d for d in (ast.get_docstring(n) for n in nodes) if d)
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate escape in a docstring
            continue
        if not size:
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        yield {"id": module, "text": text}
        total += size
        if total >= max_bytes:
            return


def write_corpus(documents: Iterator[dict], out_dir: Path) -> tuple[Path, Path, int]:
    """``corpus.jsonl`` (for indexing) and ``corpus.txt`` (for tokenizer training); returns both and the count."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl, txt, count = out_dir / "corpus.jsonl", out_dir / "corpus.txt", 0
    with open(jsonl, "w", encoding="utf-8") as fj, open(txt, "w", encoding="utf-8") as ft:
        for doc in documents:
            fj.write(json.dumps(doc, ensure_ascii=False) + "\n")
            ft.write(doc["text"] + "\n\n")
            count += 1
    if count == 0:
        raise ValueError("the corpus is empty: this Python ships no stdlib sources; give --input files")
    return jsonl, txt, count


def _json_texts(path: Path, key: str = "text") -> Iterator[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)[key]


def user_corpus(inputs: Sequence[str], out_dir: Path, need_text: bool) -> tuple[list[str], Path | None]:
    """User inputs → (files for the indexer, a text file for tokenizer training or None).

    JSONL/JSON(.gz)/Parquet files are indexed as they are (key ``text``); any other file is one
    document (``corpus/user_text.jsonl``). Directories are searched recursively, in sorted order.
    """
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if not path.exists():
            raise ValueError(f"--input {item}: no such file or directory")
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out_dir.mkdir(parents=True, exist_ok=True)
    indexed = [str(f) for f in files if f.name.endswith(INDEXED_SUFFIXES)]
    plain = [f for f in files if not f.name.endswith(INDEXED_SUFFIXES)]
    if plain:
        converted = out_dir / "user_text.jsonl"
        with open(converted, "w", encoding="utf-8") as out:
            for f in plain:
                try:
                    text = f.read_text(encoding="utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"--input {f}: not UTF-8 text ({e.reason})") from None
                if text.strip():
                    out.write(json.dumps({"id": str(f), "text": text}, ensure_ascii=False) + "\n")
        indexed.append(str(converted))
    if not indexed:
        raise ValueError(f"--input {list(inputs)}: no files found")
    if not need_text:
        return indexed, None
    if any(f.endswith(".parquet") for f in indexed):
        raise ValueError("training a tokenizer on Parquet input is not supported here: give --tokenizer-model")
    txt = out_dir / "tokenizer_text.txt"
    with open(txt, "w", encoding="utf-8") as out:
        for f in indexed:
            for text in _json_texts(Path(f)):
                out.write(text + "\n\n")
    return indexed, txt
