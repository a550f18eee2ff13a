"""Mean next-token NLL (nats) and perplexity of a model on documents, one protocol for megatron
checkpoints and Hugging Face exports.

Protocol: every document is ``[EOD] + its tokens``; EOD (``<|endoftext|>``, id 0 for SmolLM2 —
the zero vector of the canonical and zero-offset GF(2) codes) is the unscored context of the
first token. It is fed because the tokenizer has no BOS and every variant must score the same
targets under the same conditioning. Packed-sample training (``gpt``) put EOD before every
document; document-window training (paper 2) never feeds token 0 as an input, so there the first
prediction of each document is out of training distribution, alike for every variant. Each document is cut into
non-overlapping windows of ``seq_length`` predictions (the last one shorter); windows never cross
documents. Every token of every document is a prediction target, counted once.

Shape legend: B windows in a batch, S positions, V vocabulary.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from megatron_fixedcode.utils.finite import check_finite_loss

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # ids [B, S] -> logits [B, S, V]
NLL_CHUNK_BYTES = 64 << 20  # float64 log-probabilities held at once: ~170 positions at V = 49,152


def default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``: what ``--device`` means when not given."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def summed_nll(logits_BSV: torch.Tensor, tgt_BS: torch.Tensor) -> tuple[float, int]:
    """(sum of -log p(target), number of targets) over the positions whose target is not -100.

    The log-softmax runs in float64 (as one float64 cross-entropy over the batch did) but on at most
    ``NLL_CHUNK_BYTES`` of positions at a time, on the logits' device and from their own dtype: the
    peak is the logits plus one chunk, not a float64 copy of the whole ``[B, S, V]`` batch (6.4 GB
    at B = 8, S = 2048, V = 49,152) and its float64 log-softmax beside it."""
    logits_NV = logits_BSV.flatten(0, 1)
    tgt_N = tgt_BS.flatten().to(logits_NV.device)
    rows = max(1, NLL_CHUNK_BYTES // (8 * logits_NV.shape[-1]))
    total = torch.zeros((), dtype=torch.float64, device=logits_NV.device)
    for start in range(0, logits_NV.shape[0], rows):
        t_n = tgt_N[start : start + rows]
        keep_n = t_n != -100
        if not bool(keep_n.any()):
            continue
        # log p(t) = x_t - logsumexp(x); no boolean-indexed copy of the rows (it fragments the heap)
        x_nV = logits_NV[start : start + rows].double()
        logp_n = x_nV.gather(1, t_n.clamp(min=0).unsqueeze(1)).squeeze(1) - torch.logsumexp(x_nV, dim=-1)
        total -= torch.where(keep_n, logp_n, 0.0).sum()
    return float(total), int((tgt_N != -100).sum())


def read_text(path: str | Path) -> str:
    """UTF-8 (BOM stripped), falling back to Latin-1 for the odd legacy file."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def text_documents(paths: Iterable[str | Path], tokenize: Callable[[str], list[int]]) -> list[list[int]]:
    docs = []
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"--text-files: no such file {path}")
        docs.append(tokenize(read_text(path)))
        if not docs[-1]:
            raise ValueError(f"--text-files {path}: empty (no tokens to evaluate)")
    return docs


def indexed_documents(prefix: str) -> list[list[int]]:
    """The documents of a megatron ``.bin/.idx`` dataset (e.g. a validation split) as stored."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    if not Path(prefix + ".idx").is_file():
        raise ValueError(f"--data-path: no {prefix}.idx")
    ds = IndexedDataset(prefix)
    bounds = ds.document_indices
    return [
        np.concatenate([ds[j] for j in range(bounds[d], bounds[d + 1])]).astype(np.int64).tolist()
        for d in range(len(bounds) - 1)
    ]


def windows(docs: list[list[int]], seq_length: int, eod: int) -> Iterator[tuple[list[int], list[int]]]:
    """(inputs, targets) pairs of at most ``seq_length`` tokens each."""
    for doc in docs:
        seq = [eod, *doc]
        for start in range(0, len(seq) - 1, seq_length):
            chunk = seq[start : start + seq_length + 1]
            yield chunk[:-1], chunk[1:]


@torch.no_grad()
def document_nll(
    logits_fn: LogitsFn,
    docs: list[list[int]],
    *,
    seq_length: int,
    eod: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
) -> dict:
    """``{"loss", "ppl", "tokens", "documents", "windows"}``; right padding is causal-safe."""
    total, count, num_windows = 0.0, 0, 0
    pending: list[tuple[list[int], list[int]]] = []

    def flush() -> None:
        nonlocal total, count
        width = max(len(x) for x, _ in pending)
        ids_BS = torch.full((len(pending), width), eod, dtype=torch.long)
        tgt_BS = torch.full((len(pending), width), -100, dtype=torch.long)
        for b, (x, y) in enumerate(pending):
            ids_BS[b, : len(x)] = torch.tensor(x)
            tgt_BS[b, : len(y)] = torch.tensor(y)
        nll, num_targets = summed_nll(logits_fn(ids_BS), tgt_BS)
        total += nll
        count += num_targets
        pending.clear()

    for x, y in windows(docs, seq_length, eod):
        if max_tokens is not None and count + sum(len(t) for _, t in pending) >= max_tokens:
            break
        pending.append((x, y))
        num_windows += 1
        if len(pending) == batch_size:
            flush()
    if pending:
        flush()
    if count == 0:
        raise ValueError("no tokens to evaluate (empty documents?)")
    loss = total / count
    check_finite_loss(loss, "evaluation")
    return {
        "loss": loss,
        "ppl": math.exp(min(loss, 700.0)),
        "tokens": count,
        "documents": len(docs),
        "windows": num_windows,
        "seq_length": seq_length,
        "eod": eod,
    }


def megatron_logits_fn(model: torch.nn.Module, vocab_size: int) -> LogitsFn:
    from megatron_fixedcode.checkpoint.single_process import megatron_logits

    device = next(model.parameters()).device
    return lambda ids_BS: megatron_logits(model, ids_BS.to(device), vocab_size)


def hf_logits_fn(model: torch.nn.Module) -> LogitsFn:
    """Logits in the model's dtype (bfloat16 under ``--dtype bfloat16``): :func:`summed_nll` upcasts
    them a chunk at a time."""
    return lambda ids_BS: model(ids_BS.to(model.device)).logits
