"""Perplexity of chosen target tokens given their context: paper 1's post-SFT measures.

* **SQuAD gold-answer perplexity**: per question, the context is
  ``tok("{context}\\n\\nQuestion: {question}\\nAnswer:")`` and the targets are
  ``tok(" " + gold_answer)`` (the first listed answer; unanswerable SQuAD-2 questions are
  skipped and counted). The answer carries no EOD: only the answer's own tokens are scored.
* **Held-out SFT perplexity**: each record encoded exactly as in training (data/sft.py), targets
  = its response tokens and their closing EOD, i.e. what ``val_loss`` of an SFT run averages.

Both report ``exp(sum NLL / number of target tokens)`` over the whole set (token-weighted, as the
trainer's validation loss). Nothing is prefixed: the sequences start as the SFT samples do. A
sequence longer than ``seq_length + 1`` loses context tokens from the left (SQuAD) or is cut at
the right like in training (SFT); both are counted.

Shape legend: B sequences in a batch, S positions, V vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable

import torch

from megatron_fixedcode.data.jsonl import jsonl_records
from megatron_fixedcode.eval.perplexity import LogitsFn, summed_nll
from megatron_fixedcode.utils.finite import check_finite_loss

SQUAD_PROMPT = "{context}\n\nQuestion: {question}\nAnswer:"


def squad_prompt(context: str, question: str) -> str:
    return SQUAD_PROMPT.format(context=context, question=question)


def _squad_rows(path: Path) -> Iterable[tuple[str, dict]]:
    """(where, {context, question, answers}) of SQuAD's own JSON (``data/paragraphs/qas``) or of
    JSONL rows in the Hugging Face layout (``answers: {"text": [...]}`` or a list, or ``answer``)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        for a, article in enumerate(data.get("data", [])):
            for p, para in enumerate(article.get("paragraphs", [])):
                for qa in para.get("qas", []):
                    yield (
                        f"{path}: article {a} paragraph {p} question {qa.get('id', '?')}",
                        {
                            "context": para.get("context"),
                            "question": qa.get("question"),
                            "answers": [x.get("text") for x in qa.get("answers", [])],
                        },
                    )
        return
    for where, row in jsonl_records(path, text.splitlines()):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object")
        answers = row.get("answers", [row["answer"]] if "answer" in row else None)
        if isinstance(answers, dict):
            answers = answers.get("text")
        yield where, {"context": row.get("context"), "question": row.get("question"), "answers": answers}


def squad_examples(
    path: str | Path, tokenize: Callable[[str], list[int]]
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(ids, target mask) per answerable question, and the number of unanswerable ones skipped."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--squad: no such file {path}")
    out, skipped = [], 0
    for where, row in _squad_rows(path):
        for key in ("context", "question"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise ValueError(f"{where}: missing or empty field {key!r}")
        if row["answers"] is None:
            raise ValueError(f"{where}: missing field 'answers' (or 'answer')")
        answers = [a for a in row["answers"] if isinstance(a, str) and a.strip()]
        if not answers:
            skipped += 1  # SQuAD 2.0's unanswerable questions have no gold answer to score
            continue
        ctx = tokenize(squad_prompt(row["context"], row["question"]))
        ans = tokenize(" " + answers[0].strip())
        out.append((ctx + ans, [0] * len(ctx) + [1] * len(ans)))
    if not out:
        raise ValueError(f"--squad {path}: no answerable question")
    return out, skipped


def fit(ids: list[int], target: list[int], seq_length: int, *, keep: str) -> tuple[list[int], list[int], bool]:
    """At most ``seq_length + 1`` tokens: drop from the left (``keep="right"``) or the right."""
    width = seq_length + 1
    if len(ids) <= width:
        return ids, target, False
    if keep == "right":
        return ids[-width:], target[-width:], True
    return ids[:width], target[:width], True


@torch.no_grad()
def target_nll(
    logits_fn: LogitsFn,
    examples: list[tuple[list[int], list[int]]],
    *,
    seq_length: int,
    pad_id: int,
    keep: str = "right",
    batch_size: int = 8,
) -> dict:
    """``{"loss", "ppl", "tokens", "examples", "truncated"}`` over the target tokens (target mask 1);
    token j is scored from positions < j; right padding is causal-safe."""
    total, count, truncated = 0.0, 0, 0
    fitted = []
    for ids, target in examples:
        ids, target, cut = fit(list(ids), list(target), seq_length, keep=keep)
        truncated += cut
        if any(target[1:]):
            fitted.append((ids, target))
    if not fitted:
        raise ValueError("no target token within the window")
    for start in range(0, len(fitted), batch_size):
        batch = fitted[start : start + batch_size]
        width = max(len(ids) for ids, _ in batch) - 1
        ids_BS = torch.full((len(batch), width), pad_id, dtype=torch.long)
        tgt_BS = torch.full((len(batch), width), -100, dtype=torch.long)
        for b, (ids, target) in enumerate(batch):
            ids_BS[b, : len(ids) - 1] = torch.tensor(ids[:-1])
            tgt_BS[b, : len(ids) - 1] = torch.tensor([t if m else -100 for t, m in zip(ids[1:], target[1:])])
        nll, num_targets = summed_nll(logits_fn(ids_BS), tgt_BS)
        total += nll
        count += num_targets
    loss = total / count
    check_finite_loss(loss, "evaluation")
    return {
        "loss": loss,
        "ppl": math.exp(min(loss, 700.0)),
        "tokens": count,
        "examples": len(fitted),
        "truncated": truncated,
        "seq_length": seq_length,
    }
