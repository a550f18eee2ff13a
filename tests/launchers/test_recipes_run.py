"""The paper recipes run as written: each paper-1 and paper-2 pretraining recipe,
every variant, trains two steps on 2 CPU ranks with only the sizes overridden (layers, width,
heads, FFN, sequence, batch), ``--transformer-impl local`` (Transformer Engine is GPU-only) and
the run length. Everything else — the distributed optimizer, overlap, precision, the data
pipeline, the schedule — is the recipe's, its ``${VAR}`` placeholders filled from the
environment as the launchers do. (``paper1_sft.yaml`` continues a checkpoint: tests/training/test_sft.py.)"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.helpers.data import write_indexed_dataset
from tests.helpers import REPO, SMOLLM2
from tests.helpers.pretrain import read_metrics

pytestmark = pytest.mark.slow

RECIPES = sorted(p.name for p in (REPO / "examples" / "recipes").glob("paper[12]_*.yaml") if "sft" not in p.name)
SIZES = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--num-query-groups",
    "4",
    "--ffn-hidden-size",
    "128",
    "--seq-length",
    "32",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "8",
]
TOKENIZER = SMOLLM2


@pytest.fixture(scope="module")
def data_env(tmp_path_factory):
    """Indexed shards under the names the recipes expect (ids below every recipe's vocabulary)."""
    root = tmp_path_factory.mktemp("recipe_data")
    rng = np.random.default_rng(0)
    for name in ("fw", "cosmo"):
        for split, n in (("train", 60), ("valid", 8)):
            docs = [rng.integers(1, 4096, size=int(rng.integers(40, 200))) for _ in range(n)]
            write_indexed_dataset(root / f"{name}_{split}_text_document", docs, dtype=np.uint16)
    return {
        "TOKENIZER": str(TOKENIZER),
        "DATA_PATH": str(root / "fw_train_text_document"),
        "VALID_DATA_PATH": str(root / "fw_valid_text_document"),
        "FINEWEB_PREFIX": str(root / "fw"),
        "COSMOPEDIA_PREFIX": str(root / "cosmo"),
    }


@pytest.mark.parametrize("name", RECIPES)
def test_paper_recipe_trains_as_written(name, data_env, tmp_path):
    recipe = yaml.safe_load((REPO / "examples" / "recipes" / name).read_text())
    metrics = tmp_path / "m.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        f"examples/recipes/{name}",
        *SIZES,
        "--transformer-impl",
        "local",
        "--train-iters",
        "2",
        "--metrics-file",
        str(metrics),
    ]
    env = {**os.environ, **data_env, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    losses = [r["loss"] for r in read_metrics(metrics)]
    assert len(losses) == 2 and all(abs(ln - math.log(recipe["vocab_size"])) < 1.0 for ln in losses), losses
    wants = "megatron DistributedOptimizer" if recipe.get("use_distributed_optimizer") else "torch AdamW"
    assert f"optimizer: {wants}" in log
    if name.startswith("paper2_"):  # the paper-2 recipes run megatron's overlap (turned off with --no-overlap-*)
        assert "overlap: grad reduce, param gather" in log
    else:
        assert "overlap: none" in log
