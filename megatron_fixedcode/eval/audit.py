"""Request audit of a harness run: per task, a hash of the exact request set and how many
requests were cut to the model's context.

Paper 2 checks that every variant saw identical prompt sets and reports truncated requests
(MMLU 5-shot: 1,508 of 56,168). The hash covers what the model is asked (request type, document
id, request index, the request's arguments), not how it tokenizes them, so two models with the
same tokenizer and context must give equal hashes; the truncation count depends on the model's
context length and tokenizer and is reported next to it.

Truncation is counted as lm-eval's HF model applies it: a loglikelihood request feeds
``context + continuation`` minus its last token and keeps the last ``max_length`` tokens;
``generate_until`` keeps the last ``max_length - max_gen_toks`` context tokens; rolling
loglikelihoods (perplexity tasks) are scored in windows and never truncated.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def _request_key(req_type: str, inst) -> str:
    return json.dumps([req_type, inst.doc_id, inst.idx, list(inst.args)], default=str, ensure_ascii=False)


def _input_length(lm, req_type: str, args) -> int | None:
    """Tokens the model would be fed before truncation (None: not truncated by construction)."""
    if req_type == "loglikelihood":
        context, continuation = args[0], args[1]
        if context == "":
            context_enc, continuation_enc = [lm.prefix_token_id], lm.tok_encode(continuation)
        else:
            context_enc, continuation_enc = lm._encode_pair(context, continuation)
        return len(context_enc) + len(continuation_enc) - 1
    if req_type == "generate_until":
        max_gen = (args[1] or {}).get("max_gen_toks", getattr(lm, "max_gen_toks", 256)) if len(args) > 1 else 256
        return len(lm.tok_encode(args[0])) + int(max_gen)
    return None


class RequestAudit:
    """Wraps an lm-eval LM instance's request methods; :meth:`summary` is per task name."""

    REQUEST_TYPES = ("loglikelihood", "loglikelihood_rolling", "generate_until")

    def __init__(self, lm) -> None:
        self.lm = lm
        self.keys: dict[str, list[str]] = {}
        self.truncated: dict[str, int] = {}
        for req_type in self.REQUEST_TYPES:
            method = getattr(lm, req_type, None)
            if method is not None:
                setattr(lm, req_type, self._wrap(req_type, method))

    def reset(self) -> None:
        self.keys.clear()
        self.truncated.clear()

    def _wrap(self, req_type: str, method):
        def audited(requests, *args, **kwargs):
            self.record(req_type, requests)
            return method(requests, *args, **kwargs)

        return audited

    def record(self, req_type: str, requests) -> None:
        max_length = self.lm.max_length
        for inst in requests:
            task = inst.task_name or "?"
            self.keys.setdefault(task, []).append(_request_key(req_type, inst))
            length = _input_length(self.lm, req_type, inst.args)
            self.truncated[task] = self.truncated.get(task, 0) + int(length is not None and length > max_length)

    def summary(self) -> dict[str, dict[str, Any]]:
        out = {}
        for task, keys in self.keys.items():
            digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
            out[task] = {
                "requests": len(keys),
                "sha256": digest,
                "truncated": self.truncated.get(task, 0),
                "max_length": self.lm.max_length,
            }
        return out


def differing_request_sets(results: list[dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Tasks whose request hashes differ between the given results: ``{task: {label: sha256}}``."""
    by_task: dict[str, dict[str, str | None]] = {}
    labelled = [
        (r.get("label") or r.get("input_embedding") or r.get("model"), r)
        for r in results
        if r.get("requests") is not None
    ]
    tasks = sorted(set().union(*[set(r["requests"]) for _, r in labelled])) if labelled else []
    for task in tasks:
        hashes = {
            f"{label} (seed {r.get('seed')})" if r.get("seed") is not None else str(label): (
                r["requests"].get(task) or {}
            ).get("sha256")
            for label, r in labelled
        }
        if len(set(hashes.values())) > 1:
            by_task[task] = hashes
    return by_task
