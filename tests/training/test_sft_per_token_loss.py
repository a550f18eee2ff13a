"""SFT weights each loss token, not each microbatch: with response-only loss masks the gradient is
the mean over all loss positions of the global batch, whatever the microbatch split (2 ranks, gloo)."""

import json

import pytest

from megatron_fixedcode.training.forward_backward import loss_config_fields
from tests.helpers import REPO, torchrun

WORKER = REPO / "tests" / "distributed" / "per_token_worker.py"


def test_sft_turns_on_megatrons_per_token_loss_and_pretraining_keeps_the_default():
    assert loss_config_fields("sft") == {"calculate_per_token_loss": True}
    for dataset_type in ("gpt", "document_windows"):  # every position counts: the two means agree
        assert loss_config_fields(dataset_type) == {"calculate_per_token_loss": False}


@pytest.mark.slow
def test_sft_gradient_is_the_token_mean_for_every_microbatch_split(tmp_path):
    out = tmp_path / "grads.json"
    torchrun(WORKER, "--out", str(out), "--dataset-types", "sft", "gpt")
    for rank in json.loads(out.read_text()):
        assert set(rank["sft"]) == {"1x4", "2x2", "4x1"}
        assert all(err < 1e-5 for err in rank["sft"].values()), rank  # FP32 summation order only
        # the per-microbatch mean that pretraining keeps depends on the split (these masks differ in length)
        assert all(err > 1e-3 for err in rank["gpt"].values()), rank
