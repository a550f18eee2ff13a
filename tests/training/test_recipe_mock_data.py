"""A recipe with --mock-data on the command line trains on megatron's mock data: the recipe's data keys
give way (one line names them); the same keys given on the command line are still refused."""

import json
import os
import subprocess
import sys

import pytest

from megatron_fixedcode.pretrain import main
from tests.helpers import REPO, SMOLLM2

RECIPE = str(REPO / "examples" / "recipes" / "paper2_1p7b_binary.yaml")
NOTE = "note: --mock-data: the recipe's train_data_path, valid_data_path, dataset_type are ignored"


def test_recipe_data_keys_give_way_to_mock_data_in_one_line(capsys):
    assert main(["--config", RECIPE, "--mock-data", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    resolved = json.loads(out.splitlines()[0])
    assert resolved["mock_data"] is True and resolved["dataset_type"] == "gpt"
    assert all(resolved[k] is None for k in ("data_path", "train_data_path", "valid_data_path", "test_data_path"))
    notes = [line for line in err.splitlines() if line.startswith("note: --mock-data")]
    assert notes == [f"{NOTE} (--config {RECIPE})"]
    with pytest.raises(SystemExit) as e:  # given on the command line: refused as before
        main(["--config", RECIPE, "--mock-data", "--valid-data-path", "x", "--dry-run"])
    assert e.value.code == 2
    assert "--mock-data is a data source of its own: drop --valid-data-path" in capsys.readouterr().err


@pytest.mark.slow
def test_a_recipe_trains_on_mock_data(tmp_path):
    tiny = [
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
        "4",
        "--train-iters",
        "2",
        "--lr-warmup-iters",
        "1",
        "--eval-iters",
        "1",
        "--transformer-impl",
        "local",
        "--precision",
        "fp32",
        "--no-overlap-grad-reduce",
        "--no-overlap-param-gather",
    ]
    cmd = [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        RECIPE,
        "--mock-data",
        *tiny,
        "--tokenizer-model",
        str(SMOLLM2),
        "--save",
        str(tmp_path / "ckpt"),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert log.count("note: --mock-data") == 1 and NOTE in log
    saved = json.loads((tmp_path / "ckpt" / "iter_0000002" / "run_config.json").read_text())
    assert saved["mock_data"] is True and saved["train_data_path"] is None and saved["dataset_type"] == "gpt"
