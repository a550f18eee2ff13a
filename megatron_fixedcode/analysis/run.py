"""`tools/analyze_model.py`: every analysis on one checkpoint, written as JSON plus PNG plots.

The model is rebuilt at TP=1 in one process from the checkpoint's ``trainer.model_config`` and its
weights loaded with ``dist_checkpointing`` (any saving layout). Data: windows of held-out tokens
from an indexed dataset (default: the run's ``--valid-data-path``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import torch

from megatron_fixedcode.analysis.hooks import hidden_states
from megatron_fixedcode.analysis.interventions import activation_patching, layer_ablation
from megatron_fixedcode.analysis.probes import probe_accuracy
from megatron_fixedcode.analysis.stats import activation_stats

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class AnalysisConfig:
    load: str
    output_dir: str
    data_path: str | None = None  # indexed-dataset prefix; default the run's validation data
    num_windows: int = 32
    seq_length: int | None = None  # default the model's
    probe_classes: int = 32  # token-identity probe over the most frequent tokens
    patch_length: int = 24
    patch_position: int = 12
    seed: int = 0

    def __post_init__(self):
        if self.num_windows < 2:
            raise ValueError(f"num_windows must be >= 2, got {self.num_windows}")
        if not 0 <= self.patch_position < self.patch_length - 1:
            raise ValueError(f"patch_position={self.patch_position} must be in [0, patch_length - 1)")


def token_windows(prefix: str, num_windows: int, seq_length: int) -> torch.Tensor:
    """The first ``num_windows × seq_length`` tokens of the dataset (documents concatenated)."""
    from megatron_fixedcode.eval.perplexity import indexed_documents

    flat = np.concatenate([np.asarray(d) for d in indexed_documents(prefix)])
    if flat.size < num_windows * seq_length:
        num_windows = flat.size // seq_length
        if num_windows < 2:
            raise ValueError(f"--data-path {prefix}: only {flat.size} tokens")
    return torch.from_numpy(flat[: num_windows * seq_length].astype(np.int64)).reshape(num_windows, seq_length)


def lexical_labels(tokenizer, ids_N: np.ndarray) -> dict[str, np.ndarray]:
    """Per position: does the token start a word (leading space), is it capitalized."""
    text = {int(t): tokenizer.detokenize([int(t)]) for t in np.unique(ids_N)}
    space = np.array([text[int(t)].startswith(" ") for t in ids_N])
    capital = np.array([text[int(t)].lstrip()[:1].isupper() for t in ids_N])
    return {"starts_with_space": space, "capitalized": capital}


def probes_by_depth(states, ids_BS, lexical: dict[str, np.ndarray], probe_classes: int, seed: int) -> dict:
    ids_N = ids_BS.reshape(-1).numpy()
    tokens, counts = np.unique(ids_N, return_counts=True)
    top = tokens[np.argsort(-counts, kind="stable")[:probe_classes]]
    in_top = np.isin(ids_N, top)
    random_labels = np.random.default_rng(seed + 1).integers(0, 2, ids_N.size)
    out: dict[str, list] = {"token_identity": [], "random_labels": [], **{k: [] for k in lexical}}
    for states_BSH in states:
        x_NH = states_BSH.reshape(ids_N.size, -1).numpy()
        out["token_identity"].append(probe_accuracy(x_NH[in_top], ids_N[in_top], seed=seed))
        out["random_labels"].append(probe_accuracy(x_NH, random_labels, seed=seed))
        for name, labels in lexical.items():
            out[name].append(probe_accuracy(x_NH, labels.astype(np.int64), seed=seed))
    return out


def patching_pair(ids_BS: torch.Tensor, cfg: AnalysisConfig, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A held-out context and the same context with one token replaced by another frequent one."""
    clean = ids_BS[0, : cfg.patch_length].clone()
    corrupt = clean.clone()
    others = [int(t) for t in torch.unique(ids_BS) if int(t) != int(clean[cfg.patch_position])]
    corrupt[cfg.patch_position] = others[np.random.default_rng(cfg.seed).integers(len(others))]
    return clean, corrupt


def run_analysis(cfg: AnalysisConfig) -> dict:
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
    from megatron_fixedcode.tokenizers import checkpoint_tokenizer

    ckpt = load_megatron_checkpoint(cfg.load)
    model, model_cfg, state = ckpt.model, ckpt.model_cfg, ckpt.trainer_state
    run = state.get("run_config", {})
    prefix = (
        cfg.data_path or (run.get("valid_data_path") or run.get("data_path") or run.get("train_data_path") or [None])[0]
    )
    if prefix is None:
        raise ValueError("no --data-path given and the checkpoint names no validation data")
    ids_BS = token_windows(prefix, cfg.num_windows, cfg.seq_length or model_cfg.seq_length)
    tokenizer = checkpoint_tokenizer(state.get("tokenizer") or {}, ckpt.path.parent, f"--load {cfg.load}")
    vocab = model_cfg.vocab_size
    torch.manual_seed(cfg.seed)
    states = hidden_states(model, ids_BS)
    lexical = lexical_labels(tokenizer, ids_BS.reshape(-1).numpy()) if tokenizer else {}
    clean, corrupt = patching_pair(ids_BS, cfg, vocab)
    report = {
        "checkpoint": str(ckpt.path),
        "step": ckpt.step,
        "input_embedding": model_cfg.input_embedding,
        "data_path": prefix,
        "windows": list(ids_BS.shape),
        "sites": ["input"] + [f"block {i}" for i in range(model_cfg.num_layers)],
        "activations": activation_stats(states, ids_BS, seed=cfg.seed),
        "ablation": layer_ablation(model, ids_BS, vocab),
        "probes": probes_by_depth(states, ids_BS, lexical, cfg.probe_classes, cfg.seed),
        "patching": {
            "clean": clean.tolist(),
            "corrupt": corrupt.tolist(),
            **activation_patching(model, clean, corrupt, vocab),
        },
    }
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(report, indent=1))
    from megatron_fixedcode.analysis.plots import plot_report

    report["plots"] = [str(p) for p in plot_report(report, out)]
    return report
