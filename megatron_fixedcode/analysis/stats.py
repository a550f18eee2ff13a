"""Activation statistics across depth, overall and by token identity.

``token_variance_fraction`` (η²) is the share of the residual stream's variance explained by the
identity of the current token (between-token over total variance, over the tokens that occur at
least ``min_count`` times): 1 at site 0 for any input table (the input is a function of the
token), falling as context mixes in.
"""

from __future__ import annotations

import numpy as np
import torch


def activation_stats(
    states: list[torch.Tensor], ids_BS: torch.Tensor, *, min_count: int = 5, top_tokens: int = 10, seed: int = 0
) -> dict:
    ids_N = ids_BS.reshape(-1).numpy()
    tokens, inverse, counts = np.unique(ids_N, return_inverse=True, return_counts=True)
    frequent = counts >= min_count
    keep_N = frequent[inverse]
    top = tokens[np.argsort(-counts, kind="stable")[:top_tokens]]
    pairs = np.random.default_rng(seed).integers(0, len(ids_N), size=(2, 2000))
    layers = []
    for site, states_BSH in enumerate(states):
        x_NH = states_BSH.reshape(len(ids_N), -1).double().numpy()
        norms_N = np.linalg.norm(x_NH, axis=1)
        unit = x_NH / np.maximum(norms_N[:, None], 1e-12)
        xs, inv = x_NH[keep_N], inverse[keep_N]
        total = ((xs - xs.mean(axis=0)) ** 2).sum()
        group_mean = np.zeros((len(tokens), x_NH.shape[1]))
        np.add.at(group_mean, inv, xs)
        group_mean /= np.maximum(counts, 1)[:, None]
        within = ((xs - group_mean[inv]) ** 2).sum()
        layers.append(
            {
                "site": site,
                "mean_norm": float(norms_N.mean()),
                "rms": float(np.sqrt((x_NH**2).mean())),
                "mean_cosine": float((unit[pairs[0]] * unit[pairs[1]]).sum(axis=1).mean()),  # anisotropy
                "token_variance_fraction": float(1 - within / total) if total > 0 else None,
                "norm_by_token": {int(t): float(norms_N[ids_N == t].mean()) for t in top},
            }
        )
    return {"num_positions": int(len(ids_N)), "num_frequent_tokens": int(frequent.sum()), "sites": layers}
