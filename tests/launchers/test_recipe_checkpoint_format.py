"""The Slurm recipes' distributed-optimizer checkpoint format (docs/SCALING.md, "Checkpoint I/O at 16
GPUs"): dp_reshardable, Megatron-LM's default, because fully_reshardable gathers the whole optimizer
state onto every rank at each save (>= 20.5 GB of host memory per rank for the 1.7B model)."""

import json

import pytest

from megatron_fixedcode.pretrain import main


@pytest.mark.parametrize("variant", ["binary", "gf2", "learned"])
def test_paper2_recipes_save_the_distributed_optimizer_dp_reshardable(capsys, variant):
    assert main(["--config", f"examples/recipes/paper2_1p7b_{variant}.yaml", "--dry-run"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["use_distributed_optimizer"] and config["dist_ckpt_optim_fully_reshardable"] is False
