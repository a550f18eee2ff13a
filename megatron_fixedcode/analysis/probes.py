"""Linear probes in closed form (ridge regression on one-hot targets, classified by argmax).

Features are standardized with training statistics; the bias is the training mean of the targets.
Shape legend: N examples, H features, C classes.
"""

from __future__ import annotations

import numpy as np


def ridge_fit(x_NH: np.ndarray, y_NC: np.ndarray, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """W, b minimizing ||x W + b − y||² + l2·||W||² (float64, closed form)."""
    x_mean, y_mean = x_NH.mean(axis=0), y_NC.mean(axis=0)
    xc = x_NH - x_mean
    gram_HH = xc.T @ xc + l2 * np.eye(x_NH.shape[1])
    w_HC = np.linalg.solve(gram_HH, xc.T @ (y_NC - y_mean))
    return w_HC, y_mean - x_mean @ w_HC


def probe_accuracy(
    x_NH: np.ndarray, labels_N: np.ndarray, *, train_fraction: float = 0.7, l2: float = 0.01, seed: int = 0
) -> dict:
    """Held-out accuracy of a ridge probe of integer ``labels_N`` from ``x_NH``, and chance
    (the majority class of the held-out labels)."""
    x = np.asarray(x_NH, dtype=np.float64)
    classes, y = np.unique(np.asarray(labels_N), return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(y))
    num_train = int(train_fraction * len(y))
    train, test = order[:num_train], order[num_train:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-8
    x = (x - mean) / std
    w, b = ridge_fit(x[train], np.eye(len(classes))[y[train]], l2 * num_train / 1000)
    predicted = (x[test] @ w + b).argmax(axis=1)
    return {
        "accuracy": float((predicted == y[test]).mean()),
        "chance": float(np.bincount(y[test], minlength=len(classes)).max() / len(test)),
        "num_classes": int(len(classes)),
        "num_train": int(num_train),
        "num_test": int(len(test)),
    }
