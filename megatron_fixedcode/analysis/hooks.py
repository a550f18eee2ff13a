"""Reading and editing the residual stream of a single-rank `InputInterfaceGPTModel` with hooks.

Sites: 0 is the input interface's output (the code x(t), or the learned row), site i + 1 the
output of block i (before the final norm). Shape legend: B batch, S sequence, H hidden, V vocab.
megatron works in ``[S, B, H]``; everything returned here is ``[B, S, H]``.
"""

from __future__ import annotations

import contextlib

import torch

from megatron_fixedcode.checkpoint.single_process import megatron_logits


def sites(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [model.embedding, *model.decoder.layers]


def _states(output):
    return output[0] if isinstance(output, tuple) else output


@torch.no_grad()
def next_token_nll(model: torch.nn.Module, ids_BS: torch.Tensor, vocab_size: int) -> float:
    """Mean NLL of tokens 1..S-1 given their prefixes."""
    out_BSV = megatron_logits(model, ids_BS, vocab_size)[:, :-1]
    return float(torch.nn.functional.cross_entropy(out_BSV.flatten(0, 1).double(), ids_BS[:, 1:].flatten().long()))


@torch.no_grad()
def hidden_states(model: torch.nn.Module, ids_BS: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream at every site, each ``[B, S, H]`` float32."""
    captured: list[torch.Tensor] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: captured.append(_states(out).detach().transpose(0, 1).float()))
        for m in sites(model)
    ]
    try:
        model(ids_BS.long(), torch.arange(ids_BS.shape[1]).expand_as(ids_BS), None)
    finally:
        for h in hooks:
            h.remove()
    return captured


@contextlib.contextmanager
def skip_block(model: torch.nn.Module, index: int):
    """Block ``index`` passes its input through unchanged (the residual stream skips it)."""
    layer = model.decoder.layers[index]
    layer.forward = lambda hidden_states, *args, context=None, **kwargs: (hidden_states, context)
    try:
        yield
    finally:
        del layer.forward  # the instance attribute; the class's forward is back


@contextlib.contextmanager
def patch_site(model: torch.nn.Module, site: int, position: int, value_BH: torch.Tensor):
    """Overwrite the residual stream at (``site``, ``position``) with ``value_BH``."""

    def hook(_module, _inputs, output):
        states_SBH = _states(output).clone()
        states_SBH[position] = value_BH.to(states_SBH.dtype)
        return (states_SBH, *output[1:]) if isinstance(output, tuple) else states_SBH

    handle = sites(model)[site].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
