"""In-process evaluation of a checkpoint: held-out perplexity on a fixed token budget (the same
windows for every run) and LAMBADA last-word accuracy (greedy, the whole word must come out)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def lambada_examples(root: Path, limit: int) -> list[tuple[str, str]]:
    """(context, " " + last word) of the first ``limit`` LAMBADA test passages (OpenAI version)."""
    out = []
    with open(root / "eval" / "lambada" / "lambada_test.jsonl", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"].strip()
            context, word = text.rsplit(" ", 1)
            out.append((context, " " + word))
            if len(out) == limit:
                break
    return out


@torch.no_grad()
def lambada(model, tokenizer, examples: list[tuple[str, str]], seq_length: int, vocab_size: int) -> dict:
    """Accuracy (every target token is the argmax) and target perplexity; contexts keep their last
    ``seq_length − len(target)`` tokens (the models never saw longer windows)."""
    from megatron_fixedcode.export.megatron_io import megatron_logits

    correct, nll, count = 0, 0.0, 0
    for context, target in examples:
        tgt = tokenizer.tokenize(target)
        ctx = tokenizer.tokenize(context)[-(seq_length - len(tgt)):]
        ids = torch.tensor([ctx + tgt[:-1]])
        logp = torch.log_softmax(megatron_logits(model, ids, vocab_size)[0, len(ctx) - 1 :].double(), dim=-1)
        tgt_t = torch.tensor(tgt)
        correct += int(bool((logp.argmax(dim=-1) == tgt_t).all()))
        nll -= float(logp[torch.arange(len(tgt)), tgt_t].sum())
        count += len(tgt)
    return {"accuracy": correct / len(examples), "examples": len(examples), "target_ppl": math.exp(nll / count),
            "stderr": math.sqrt(max(correct / len(examples) * (1 - correct / len(examples)), 1e-12) / len(examples))}


def evaluate_checkpoint(load: str, valid_prefix: str, examples, *, max_tokens: int) -> dict:
    from megatron_fixedcode.eval.perplexity import document_nll, indexed_documents, megatron_logits_fn
    from megatron_fixedcode.export.megatron_io import load_megatron_checkpoint
    from megatron_fixedcode.tokenizers import build_tokenizer

    ckpt = load_megatron_checkpoint(load)
    cfg, state = ckpt.model_cfg, ckpt.trainer_state
    tokenizer = build_tokenizer(state["tokenizer"]["type"], state["tokenizer"]["model"])
    ppl = document_nll(megatron_logits_fn(ckpt.model, cfg.vocab_size), indexed_documents(valid_prefix),
                       seq_length=cfg.seq_length, eod=tokenizer.eod, max_tokens=max_tokens)
    return {"step": ckpt.step, "tokens_trained": state["tokens"], "val_loss": ppl["loss"], "val_ppl": ppl["ppl"],
            "val_tokens": ppl["tokens"], "lambada": lambada(ckpt.model, tokenizer, examples, cfg.seq_length, cfg.vocab_size)}
