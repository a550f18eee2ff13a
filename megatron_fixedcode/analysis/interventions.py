"""Causal interventions: skip a block and measure the loss; patch one position of the residual
stream from a clean context into a corrupted one and measure how much of the answer returns."""

from __future__ import annotations

import torch

from megatron_fixedcode.analysis.hooks import hidden_states, next_token_nll, patch_site, skip_block
from megatron_fixedcode.checkpoint.single_process import megatron_logits


def layer_ablation(model: torch.nn.Module, ids_BS: torch.Tensor, vocab_size: int) -> dict:
    """Loss with every block skipped in turn; ``delta`` = ablated − intact (nats per token)."""
    base = next_token_nll(model, ids_BS, vocab_size)
    rows = []
    for i in range(len(model.decoder.layers)):
        with skip_block(model, i):
            loss = next_token_nll(model, ids_BS, vocab_size)
        rows.append({"block": i, "loss": loss, "delta": loss - base})
    return {"loss": base, "tokens": int(ids_BS[:, 1:].numel()), "blocks": rows}


def _answer_logprob(model, ids_S, vocab_size, answer: int) -> float:
    return float(torch.log_softmax(megatron_logits(model, ids_S[None], vocab_size)[0, -1].double(), -1)[answer])


@torch.no_grad()
def activation_patching(
    model: torch.nn.Module, clean_S: torch.Tensor, corrupt_S: torch.Tensor, vocab_size: int, answer: int | None = None
) -> dict:
    """Patch clean → corrupt at every (site, position); metric: log p(answer) at the last position.

    ``answer`` defaults to the clean run's top prediction. ``delta[site][pos]`` = patched − corrupt
    metric; ``restored`` = delta / (clean − corrupt) when the two runs differ by more than 1e-6
    (read it only when ``gap`` is large against the deltas: a small gap makes the ratio noise).
    """
    if clean_S.shape != corrupt_S.shape:
        raise ValueError(f"contexts must have the same length, got {tuple(clean_S.shape)} and {tuple(corrupt_S.shape)}")
    if answer is None:
        answer = int(megatron_logits(model, clean_S[None], vocab_size)[0, -1].argmax())
    clean_states = hidden_states(model, clean_S[None])
    clean = _answer_logprob(model, clean_S, vocab_size, answer)
    corrupt = _answer_logprob(model, corrupt_S, vocab_size, answer)
    gap = clean - corrupt
    delta = []
    for site, states_BSH in enumerate(clean_states):
        row = []
        for pos in range(clean_S.shape[0]):
            with patch_site(model, site, pos, states_BSH[:, pos]):
                row.append(_answer_logprob(model, corrupt_S, vocab_size, answer) - corrupt)
        delta.append(row)
    restored = [[d / gap for d in row] for row in delta] if abs(gap) > 1e-6 else None
    return {
        "answer": answer,
        "clean_logprob": clean,
        "corrupt_logprob": corrupt,
        "gap": gap,
        "changed_positions": [int(p) for p in torch.nonzero(clean_S != corrupt_S).flatten()],
        "delta": delta,
        "restored": restored,
    }
