"""The research input interfaces under TP=2 with sequence parallelism match one rank (same loss,
same gradients, fp32 rtol 1e-5) — including lowdim's TP-replicated coordinates, whose gradient
only adds up when finalize_model_grads sums the two sequence halves — and issue no collective."""

import json

import pytest

from tests.distributed.parity_worker import EXTRA_VARIANTS
from tests.helpers import REPO, torchrun

WORKER = REPO / "tests" / "distributed" / "parity_worker.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("parity_codes")
    variants = ["--variants", *EXTRA_VARIANTS]
    torchrun(WORKER, "run", "--layout", "single", "--workdir", str(work), "--save-weights", *variants, nproc=1)
    torchrun(WORKER, "run", "--layout", "tp2sp", "--workdir", str(work), *variants, nproc=2)
    torchrun(WORKER, "compare", "--layout", "tp2sp", "--workdir", str(work), *variants, nproc=1)
    read = lambda name: json.loads((work / name).read_text())  # noqa: E731
    return read("result_single.json"), read("result_tp2sp.json"), read("compare_tp2sp.json")


@pytest.mark.parametrize("variant", sorted(EXTRA_VARIANTS))
def test_tp2_sequence_parallel_matches_one_rank(runs, variant):
    single, tp2, compare = runs
    for rank_result in tp2:
        assert rank_result[variant]["loss"] == pytest.approx(single[0][variant]["loss"], rel=1e-5)
        assert rank_result[variant]["embedding_collectives"] == 0
    report = compare[variant]
    assert report["min_grad_scale"] > 0, "a parameter got no gradient at all"
    assert report["max_rel_diff"] < 1e-5, report
    assert report["num_params"] == (27 if variant == "lowdim" else 26)
