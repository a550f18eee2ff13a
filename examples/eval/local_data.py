"""Local-file datasets for the LM Evaluation Harness, read in their original formats from the
data directory $MFC_SHARED_DATA (laid out as the repository's tests/assets, which holds 40-record
samples). Nothing is downloaded or copied. Used by the ``*_local.yaml`` tasks here via ``custom_dataset``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def data_root() -> Path:
    if not os.environ.get("MFC_SHARED_DATA"):
        raise ValueError("set MFC_SHARED_DATA to the evaluation data directory (eval/, corpus/ as in tests/assets)")
    root = Path(os.environ["MFC_SHARED_DATA"])
    if not root.is_dir():
        raise ValueError(f"evaluation data not found at {root} (MFC_SHARED_DATA)")
    return root


# The files each dataset function reads, relative to data_root(): checked before a run that names the task
DATA_FILES = {
    "piqa": ("eval/piqa/valid.jsonl", "eval/piqa/valid-labels.lst"),
    "lambada": ("eval/lambada/lambada_test.jsonl",),
    "arc_easy": ("eval/mosaicml_icl/arc_easy.jsonl",),
    "arc_challenge": ("eval/mosaicml_icl/arc_challenge.jsonl",),
    "winogrande": ("eval/mosaicml_icl/winogrande.jsonl",),
    "wikitext2_valid": ("corpus/wikitext-2/valid.txt",),
}


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _dataset(split: str, rows: list[dict]):
    import datasets

    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})


def piqa(**kwargs):
    """PIQA dev: valid.jsonl {goal, sol1, sol2} + valid-labels.lst (one 0/1 per line)."""
    root = data_root() / "eval" / "piqa"
    labels = (root / "valid-labels.lst").read_text().split()
    docs = _jsonl(root / "valid.jsonl")
    if len(labels) != len(docs):
        raise ValueError(f"{root}: {len(docs)} questions but {len(labels)} labels")
    return _dataset("validation", [{**d, "label": int(y)} for d, y in zip(docs, labels)])


def lambada(**kwargs):
    """LAMBADA test, OpenAI version (the file lm-eval's lambada_openai uses): {text}."""
    return _dataset("test", _jsonl(data_root() / "eval" / "lambada" / "lambada_test.jsonl"))


def arc_easy(**kwargs):
    """ARC-Easy test in MosaicML ICL format {query, choices, gold}."""
    return _dataset("test", _jsonl(data_root() / "eval" / "mosaicml_icl" / "arc_easy.jsonl"))


def arc_challenge(**kwargs):
    return _dataset("test", _jsonl(data_root() / "eval" / "mosaicml_icl" / "arc_challenge.jsonl"))


def winogrande(**kwargs):
    """WinoGrande dev in MosaicML schema format {context_options, continuation, gold}."""
    return _dataset("validation", _jsonl(data_root() / "eval" / "mosaicml_icl" / "winogrande.jsonl"))


def wikitext2_valid(**kwargs):
    """WikiText-2 validation (tokenized form), one document per article (`` = Title = `` lines)."""
    lines = (data_root() / "corpus" / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    pages, current = [], []
    for line in lines:
        if re.match(r"^ = [^=].* = $", line.rstrip("\n")) and current:
            pages.append("".join(current))
            current = []
        current.append(line)
    if current:
        pages.append("".join(current))
    return _dataset("validation", [{"page": p} for p in pages if p.strip()])


def winogrande_target(doc):
    return doc["continuation"].strip()


def wikitext_detokenize(doc):
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    return wikitext_detokenizer(doc)


def wikitext_results(doc, results):
    from lm_eval.tasks.wikitext.preprocess_wikitext import process_results

    return process_results(doc, results)
