"""Tiny corpora and launch helpers for trainer tests (synthetic token documents, vocab 1000)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers.data import write_indexed_dataset
from tests.helpers import REPO
from tests.helpers.rank_launch import forked_ranks_wanted, run_ranks

TINY = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--ffn-hidden-size",
    "128",
    "--seq-length",
    "32",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "8",
    "--lr",
    "3e-3",
    "--min-lr",
    "3e-4",
    "--lr-warmup-iters",
    "2",
    "--transformer-impl",
    "local",
    "--log-interval",
    "1",
    "--vocab-size",
    "1024",
    "--make-vocab-size-divisible-by",
    "8",
    # the project's defaults before Megatron-LM's, which these tests were written for
    "--block",
    "llama",
    "--input-embedding",
    "binary",
    "--hidden-dropout",
    "0",
    "--attention-dropout",
    "0",
    "--adam-beta2",
    "0.95",
    "--lr-decay-style",
    "cosine",
    "--eval-iters",
    "10",
    "--ckpt-keep-last",
    "2",
    "--split",
    "99,1,0",
]

# TINY without --block llama: Megatron-LM's default GPT-2 block (LayerNorm, GELU, linear biases, learned
# positions, the output layer tied to the learned table)
TINY_MEGATRON_BLOCK = [
    *TINY[: TINY.index("--block")],
    *TINY[TINY.index("--block") + 2 :],
    "--input-embedding",
    "learned",
]


def write_corpus(root: Path, num_active: int = 128) -> tuple[str, str]:
    """Learnable documents, split into train and valid shards: ids 1..num_active where the next
    token is a fixed successor of the current one 80% of the time (a bigram to learn through
    the input interface), else uniform."""
    rng = np.random.default_rng(0)
    successor = rng.permutation(num_active) + 1
    docs = []
    for _ in range(300):
        doc = [int(rng.integers(1, num_active + 1))]
        for _ in range(int(rng.integers(40, 200)) - 1):
            doc.append(int(successor[doc[-1] - 1]) if rng.random() < 0.8 else int(rng.integers(1, num_active + 1)))
        docs.append(np.array(doc))
    return (
        write_indexed_dataset(root / "train", docs[:270], dtype=np.uint16),
        write_indexed_dataset(root / "valid", docs[270:], dtype=np.uint16),
    )


def data_args(corpus: tuple[str, str], dataset_type: str) -> list[str]:
    train, valid = corpus
    if dataset_type == "document_windows":  # a validation blend of its own: --train-data-path (Megatron-LM)
        return [
            "--train-data-path",
            train,
            "--dataset-type",
            dataset_type,
            "--eval-iters",
            "2",
            "--valid-data-path",
            valid,
            "--samples-per-shard-visit",
            "16",
        ]
    args = ["--data-path", train, "--dataset-type", dataset_type, "--eval-iters", "2"]
    return args


# TINY without --vocab-size: the vocabulary is the tokenizer's (--tokenizer-model, or the one --load carries)
TINY_TOKENIZER_VOCAB = [x for i, x in enumerate(TINY) if "--vocab-size" not in TINY[max(i - 1, 0) : i + 1]]


def pretrain(
    *args: str, nproc: int = 1, check: bool = True, timeout: int = 300, base: list[str] = TINY, torchrun: bool = False
) -> subprocess.CompletedProcess:
    """One training run; a single rank runs without torchrun (world size 1 on gloo). ``base``: the
    flags before ``args`` (:data:`TINY_MEGATRON_BLOCK` for Megatron-LM's GPT-2 block). The ranks are forked
    from a pre-imported server (tests/helpers/rank_launch.py), except a multi-rank run that may fail
    (``check=False``): its exit code and output are torchrun's; ``torchrun=True`` launches through torchrun
    always (runs whose ranks spawn megatron's persistent checkpoint worker: from forked ranks their exit hung)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    if forked_ranks_wanted() and (check or nproc == 1) and not torchrun:
        proc = run_ranks([*base, *args], nproc=nproc, env=env, cwd=REPO, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        return proc
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1 else []
    cmd = [sys.executable, *launcher, "-m", "megatron_fixedcode.pretrain", *base, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_steps(straight: list[dict], resumed: list[dict]) -> None:
    """Every step of ``resumed`` logged the loss, gradient norm, LR, tokens and validation loss of the
    same step of ``straight``, bit for bit."""
    by_step = {r["step"]: r for r in straight}
    assert resumed, "the resumed run logged no step"
    for b in resumed:
        a = by_step[b["step"]]
        assert (a["loss"], a["grad_norm"], a["lr"], a["tokens"], a.get("val_loss")) == (
            b["loss"],
            b["grad_norm"],
            b["lr"],
            b["tokens"],
            b.get("val_loss"),
        ), b["step"]
