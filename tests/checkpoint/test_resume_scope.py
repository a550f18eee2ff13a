"""What a resume keeps (checkpoint/resume_scope.py), decided once by the run plan: every combination of
--finetune, --no-load-optim, --no-load-rng and a layout change, by a table; the refusals of an optimizer-state
format the new layout or optimizer cannot read."""

import itertools

import pytest

from megatron_fixedcode.checkpoint.resume_scope import DP_RESHARDABLE, FULLY_RESHARDABLE, PER_PARAMETER, resume_scope

SAVED = {"world_size": 4, "tp_size": 2, "pp_size": 1, "dp_size": 2}
LAYOUTS = {
    "same": SAVED,
    "dp": {"world_size": 8, "tp_size": 2, "pp_size": 1, "dp_size": 4},  # DP changes, TP x PP kept
    "tp": {"world_size": 4, "tp_size": 1, "pp_size": 1, "dp_size": 4},
    "pp": {"world_size": 4, "tp_size": 2, "pp_size": 2, "dp_size": 1},
}
# the RNG each layout change keeps on a full resume (checkpoints record per-model-parallel-rank RNG)
FULL_RNG = {"same": "per_rank", "dp": "per_model_parallel_rank", "tp": "fresh", "pp": "fresh"}


def _expected(finetune: bool, no_optim: bool, no_rng: bool, change: str) -> tuple[bool, bool, str]:
    if finetune:  # the weights only, whatever else is given
        return False, False, "none"
    return not no_optim, not no_optim, "none" if no_rng else FULL_RNG[change]


@pytest.mark.parametrize(
    "finetune, no_optim, no_rng, change", list(itertools.product((False, True), (False, True), (False, True), LAYOUTS))
)
def test_every_combination_of_the_flags_and_a_layout_change(finetune, no_optim, no_rng, change):
    scope = resume_scope(
        SAVED,
        LAYOUTS[change],
        finetune=finetune,
        no_load_optim=no_optim,
        no_load_rng=no_rng,
        rng_by_model_parallel_rank=True,
    )
    assert (scope.optimizer, scope.scheduler, scope.rng) == _expected(finetune, no_optim, no_rng, change)
    assert scope.finetune is finetune and scope.reload_main_weights is not scope.optimizer
    assert scope.note and ("--no-load-optim" in scope.note) == (no_optim and not finetune)
    assert ("--no-load-rng" in scope.note) == (no_rng and not finetune)


def test_a_checkpoint_without_per_model_parallel_rank_rng_starts_the_rng_afresh_on_a_dp_change():
    scope = resume_scope(SAVED, LAYOUTS["dp"], rng_by_model_parallel_rank=False)
    assert (scope.optimizer, scope.rng) == (True, "fresh")
    assert "without per-model-parallel-rank RNG" in scope.note
    assert resume_scope(SAVED, SAVED).note == "everything kept"


@pytest.mark.parametrize(
    "saved_format, distributed, change, refused",
    [
        (PER_PARAMETER, True, "same", "saved without --use-distributed-optimizer"),
        (FULLY_RESHARDABLE, False, "same", "saved with --use-distributed-optimizer"),
        (DP_RESHARDABLE, True, "tp", "dp_reshardable format"),
        (DP_RESHARDABLE, True, "pp", "dp_reshardable format"),
        (DP_RESHARDABLE, True, "dp", None),
        (FULLY_RESHARDABLE, True, "tp", None),
    ],
)
def test_an_optimizer_state_the_run_cannot_read_is_refused_unless_it_is_not_loaded(
    saved_format, distributed, change, refused
):
    kwargs = dict(saved_optimizer_format=saved_format, distributed_optimizer=distributed)
    if refused is None:
        assert resume_scope(SAVED, LAYOUTS[change], **kwargs).optimizer
        return
    with pytest.raises(ValueError, match=refused):
        resume_scope(SAVED, LAYOUTS[change], **kwargs)
    # what is not loaded cannot be misread: --no-load-optim and --finetune load the weights alone
    assert not resume_scope(SAVED, LAYOUTS[change], no_load_optim=True, **kwargs).optimizer
    assert not resume_scope(SAVED, LAYOUTS[change], finetune=True, **kwargs).optimizer
