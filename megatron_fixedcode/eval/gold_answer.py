"""Gold-answer perplexity (paper 1, after SFT): the perplexity of a question's gold answer given
its context and question, on SQuAD-format data.

Prompt (ours; paper 1 names the metric, not a template): ``[EOD] + "{context}\\n\\nQuestion:
{question}\\nAnswer:"``, continuation ``" " + answer`` (the first gold answer; unanswerable
SQuAD 2.0 questions are skipped and counted). Prompt and continuation are tokenized separately,
so the scored tokens are exactly the answer's. Only the answer tokens are targets; the loss is
the mean NLL per answer token over all questions and ``ppl = exp(loss)``. A pair longer than the
model's context keeps its last ``seq_length + 1`` tokens (the prompt is cut from the left) and is
counted in ``truncated``.

Shape legend: B questions in a batch, S positions, V vocabulary.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable

import torch

from megatron_fixedcode.eval.perplexity import LogitsFn

PROMPT = "{context}\n\nQuestion: {question}\nAnswer:"


def _first_answer(answers) -> str | None:
    if isinstance(answers, dict):  # Hugging Face datasets: {"text": [...], "answer_start": [...]}
        answers = answers.get("text") or []
    texts = [a["text"] if isinstance(a, dict) else a for a in answers or []]
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    return texts[0] if texts else None


def read_squad(path: str | Path) -> tuple[list[tuple[str, str, str]], int]:
    """(context, question, gold answer) triples and the number of questions without an answer.

    Reads the official SQuAD JSON (``{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}``) or
    JSONL with ``context``, ``question`` and ``answers`` (strings, ``{"text": ...}`` items, or the
    datasets library's ``{"text": [...]}``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--squad {path}: no such file")
    text = path.read_text(encoding="utf-8")
    items: list[tuple[str, str, object]] = []
    try:
        if path.suffix == ".json":
            for article in json.loads(text)["data"]:
                for paragraph in article["paragraphs"]:
                    for qa in paragraph["qas"]:
                        items.append((paragraph["context"], qa["question"], qa.get("answers")))
        else:
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    record = json.loads(line)
                    items.append((record["context"], record["question"], record.get("answers")))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"--squad {path}: not SQuAD JSON or JSONL with context/question/answers ({e!r})") from None
    triples, unanswerable = [], 0
    for context, question, answers in items:
        answer = _first_answer(answers)
        if answer is None:
            unanswerable += 1
        else:
            triples.append((context, question, answer))
    if not triples:
        raise ValueError(f"--squad {path}: no question with a gold answer")
    return triples, unanswerable


def encode(triples: Iterable[tuple[str, str, str]], tokenize: Callable[[str], list[int]], eod: int
           ) -> list[tuple[list[int], list[int]]]:
    return [([eod, *tokenize(PROMPT.format(context=c, question=q))], tokenize(" " + a)) for c, q, a in triples]


@torch.no_grad()
def gold_answer_nll(logits_fn: LogitsFn, pairs: list[tuple[list[int], list[int]]], *, seq_length: int, eod: int,
                    batch_size: int = 8) -> dict:
    """``{"loss", "ppl", "answers", "answer_tokens", "truncated"}`` over (prompt ids, answer ids) pairs."""
    total, count, truncated = 0.0, 0, 0
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, answer in pairs:
        if not answer:
            raise ValueError("a gold answer tokenizes to no tokens")
        seq = prompt + answer
        if len(seq) > seq_length + 1:
            truncated += 1
            seq = seq[-(seq_length + 1):]
        if len(answer) > len(seq) - 1:
            raise ValueError(f"a gold answer of {len(answer)} tokens does not fit the context {seq_length}")
        targets = [-100] * (len(seq) - 1 - len(answer)) + answer  # only the answer is scored
        rows.append((seq[:-1], targets))
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(x) for x, _ in chunk)
        ids_BS = torch.full((len(chunk), width), eod, dtype=torch.long)
        tgt_BS = torch.full((len(chunk), width), -100, dtype=torch.long)
        for b, (x, y) in enumerate(chunk):
            ids_BS[b, : len(x)] = torch.tensor(x)
            tgt_BS[b, : len(y)] = torch.tensor(y)
        logits_BSV = logits_fn(ids_BS).double()
        total += float(torch.nn.functional.cross_entropy(logits_BSV.flatten(0, 1), tgt_BS.flatten(),
                                                         ignore_index=-100, reduction="sum"))
        count += int((tgt_BS != -100).sum())
    loss = total / count
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "answers": len(pairs), "answer_tokens": count,
            "truncated": truncated, "seq_length": seq_length, "prompt": PROMPT}
