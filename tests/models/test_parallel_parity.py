"""TP=2 with sequence parallelism and PP=2 match one rank: same loss, same gradients (fp32,
rtol 1e-5), for learned, binary and gf2 inputs and Megatron-LM's GPT-2 block (tied table, learned
positions, biases); the fixed-code input layer issues no collective."""

import json

import pytest

from tests.helpers import REPO, torchrun

WORKER = REPO / "tests" / "distributed" / "parity_worker.py"
VARIANTS = ("learned", "binary", "gf2", "gpt2")
# parameter tensors: learned = binary + the table; gpt2 adds linear and LayerNorm biases and the
# position table, and has no head of its own (tied to the table)
NUM_PARAMS = {"learned": 27, "binary": 26, "gf2": 26, "gpt2": 52}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def parity_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("parity")
    torchrun(WORKER, "run", "--layout", "single", "--workdir", str(work), "--save-weights", nproc=1)
    for layout in ("tp2sp", "pp2"):
        torchrun(WORKER, "run", "--layout", layout, "--workdir", str(work), nproc=2)
        torchrun(WORKER, "compare", "--layout", layout, "--workdir", str(work), nproc=1)
    read = lambda name: json.loads((work / name).read_text())  # noqa: E731
    return {
        "single": read("result_single.json"),
        "tp2sp": read("result_tp2sp.json"),
        "pp2": read("result_pp2.json"),
        "compare_tp2sp": read("compare_tp2sp.json"),
        "compare_pp2": read("compare_pp2.json"),
    }


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", ["tp2sp", "pp2"])
def test_loss_matches_single_rank(parity_runs, layout, variant):
    reference = parity_runs["single"][0][variant]["loss"]
    losses = [r[variant]["loss"] for r in parity_runs[layout] if r[variant]["loss"] is not None]
    assert losses, "no rank reported a loss"
    for loss in losses:
        assert loss == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", ["tp2sp", "pp2"])
def test_gradients_match_single_rank(parity_runs, layout, variant):
    report = parity_runs[f"compare_{layout}"][variant]
    assert report["min_grad_scale"] > 0, "a parameter got no gradient at all"
    assert report["max_rel_diff"] < 1e-5, report
    assert report["num_params"] == NUM_PARAMS[variant]


def test_fixed_code_input_issues_no_collective(parity_runs):
    for rank_result in parity_runs["tp2sp"]:
        assert rank_result["binary"]["embedding_collectives"] == 0
        assert rank_result["gf2"]["embedding_collectives"] == 0
        # The counter works: the vocab-parallel table reduce-scatters forward, all-gathers backward.
        assert rank_result["learned"]["embedding_collectives"] == 2


def test_distributed_checkpoint_of_another_code_is_refused(parity_runs):
    from tests.distributed.parity_worker import model_config

    message = parity_runs["compare_tp2sp"]["code_mismatch_error"]
    saved, wanted = model_config("gf2").code_spec().fingerprint, model_config("binary").code_spec().fingerprint
    assert saved in message and wanted in message, message
