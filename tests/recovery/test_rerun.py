"""Megatron-LM's rerun state machine as wired here (recovery/rerun.py): an injected or real fault is
caught and handled in each --rerun-mode, a re-run replays the same microbatches, the spike detector's
statistics survive a checkpoint, --iterations-to-skip reads its batch without an update; one 2-rank
run checks the wiring (the loss function, megatron DDP's checks, the loop's exit codes and checkpoint)."""

from __future__ import annotations

import json
import math
import os
import re
from types import SimpleNamespace

import pytest
import torch

from megatron_fixedcode.arguments.health_flags import HealthConfig
from megatron_fixedcode.errors import NonFiniteTraining
from megatron_fixedcode.recovery import rerun
from tests.helpers.pretrain import data_args, pretrain, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _args(mode="validate_results", rate=0, kind="transient_error", spiky=False, tracker=None, skip=()):
    return HealthConfig(
        rerun_mode=mode,
        error_injection_rate=rate,
        error_injection_type=kind,
        check_for_nan_in_loss_and_grad=True,
        check_for_spiky_loss=spiky,
        check_for_large_grads=False,
        result_rejected_tracker_filename=tracker,
        iterations_to_skip=tuple(skip),
        manual_gc=False,
        manual_gc_interval=0,
        empty_unused_memory_level=0,
        distributed_timeout_minutes=10,
    )


class _Trainer:
    """What forward_backward_step and skip_step use of a Trainer: two microbatches a step, named (step, m);
    the loss of step n is ``loss(n)``, validated per microbatch as the loss function does."""

    def __init__(self, loss=lambda n: 1.0, step=0):
        self.step, self.num_microbatches, self.global_batch, self.ranks = step, 2, 4, {"rank": 0}
        self.chunks, self.optimizer, self.loss, self.seen = [], SimpleNamespace(zero_grad=lambda: None), loss, []
        self.train_iter = rerun.RerunDataIterator(rerun.StepBatches(lambda s: [(s, 0), (s, 1)], step))
        rerun.get_rerun_state_machine().current_iteration = step  # as restore_from after a load

    def _run(self, microbatches, forward_only):
        self.seen.append(tuple(microbatches))
        value = self.loss(self.step + 1)
        for _ in microbatches:
            rerun.validate_loss(torch.tensor(value))
        return value, 10.0, None  # (loss, targets, sample digest)


def _train(trainer, steps):
    """Step like the loop: (exit code or None, the verdicts of save-and-exit)."""
    for _ in range(steps):
        loss, _, _, (save, stop, code) = rerun.forward_backward_step(trainer)
        if stop:
            return code, save
        trainer.step += 1
    return None, False


def test_disabled_mode_stops_at_a_nan_and_injects_nothing(single_rank):
    rerun.start_rerun(_args("disabled", rate=1))
    trainer = _Trainer()
    assert _train(trainer, 4) == (None, False) and len(trainer.seen) == 4  # each step once, no injection
    rerun.start_rerun(_args("disabled"))
    with pytest.raises(NonFiniteTraining, match=r"step 3: rank 0: .*found NaN in local forward loss"):
        _train(_Trainer(loss=lambda n: math.nan if n == 3 else 1.0), 5)


def test_validate_results_transient_fault_reruns_the_same_batch_and_exits_17(single_rank, tmp_path):
    tracker = tmp_path / "rejected.txt"
    rerun.start_rerun(_args(rate=1, kind="transient_error", tracker=str(tracker)))
    trainer = _Trainer()
    assert _train(trainer, 5) == (17, True)  # Megatron's EXIT_CODE_FAILED_ON_RESULT_VALIDATION, with a checkpoint
    # step 1 is never judged (no checkpoint before it); step 2 is injected, re-run on the same microbatches
    assert trainer.seen == [((0, 0), (0, 1)), ((1, 0), (1, 1)), ((1, 0), (1, 1))] and trainer.step == 1
    statuses = re.findall(r"iteration=(\d+) status=\S*?(\w+) ", tracker.read_text())
    assert statuses == [("2", "INITIAL_RUN"), ("2", "FIRST_RERUN_NOT_REPRODUCIBLE")]


def test_validate_results_persistent_fault_saves_and_is_decided_after_the_resume(single_rank, monkeypatch):
    rerun.start_rerun(_args(rate=1, kind="persistent_error"))
    trainer = _Trainer()
    assert _train(trainer, 5) == (16, True)  # EXIT_CODE_RESUME_TO_DISAMBIGUATE: save, resume elsewhere
    saved = rerun.checkpoint_state()
    assert saved["ranks"][0]["machine"]["state"] == rerun.RerunState.WILL_RERUN_FROM_CHECKPOINT.value
    # resumed on the same node and device: Megatron-LM asks for yet another resume, without a save
    rerun.start_rerun(_args(rate=1, kind="persistent_error"))
    rerun.restore_checkpoint_state(saved, trainer.step)
    again = _Trainer(step=trainer.step)
    assert _train(again, 3) == (16, False) and again.seen == [((1, 0), (1, 1))]
    # resumed elsewhere: the persistent fault is confirmed, the run fails validation
    saved["ranks"][0]["machine"]["suspicious_node"] = "another-node"
    rerun.start_rerun(_args(rate=1, kind="persistent_error"))
    rerun.restore_checkpoint_state(saved, trainer.step)
    assert _train(_Trainer(step=trainer.step), 3) == (17, False)


def test_report_stats_reruns_every_step_and_trains_on(single_rank, caplog):
    rerun.start_rerun(_args("report_stats", rate=1))
    trainer = _Trainer()
    assert _train(trainer, 3) == (None, False)
    assert trainer.seen == [b for s in range(3) for b in [((s, 0), (s, 1))] * 2]
    assert "From validation call 'found NaN in local forward loss calculation'" in caplog.text


def test_a_spike_is_rerun_reproduced_and_trained_through(single_rank, tmp_path):
    tracker = tmp_path / "rejected.txt"
    rerun.start_rerun(_args(spiky=True, tracker=str(tracker)))
    trainer = _Trainer(loss=lambda n: 500.0 if n == 60 else 2.0 + (n % 7) / 10)
    assert _train(trainer, 70) == (None, False) and trainer.step == 70  # not fatal: training goes on
    assert trainer.seen.count(((59, 0), (59, 1))) == 2
    assert re.findall(r"iteration=(\d+) status=\S*?(\w+) ", tracker.read_text()) == [
        ("60", "INITIAL_RUN"),
        ("60", "FIRST_RERUN_REPRODUCIBLE"),
    ]
    assert rerun.RerunStateMachine.get_skipped_iterations_from_tracker_file(str(tracker)) == []


def test_spike_statistics_survive_a_checkpoint(single_rank, monkeypatch):
    """Stop at step 30 + resume judges step 60 as the straight run does, with the same statistics after."""
    monkeypatch.setattr(rerun, "SPIKY_LOSS_FACTOR", 3)
    loss = lambda n: 1000.0 if n == 60 else 10.0 + n  # noqa: E731 - judged from step 51 (100 samples) on
    states = []
    rerun.start_rerun(_args(spiky=True))
    straight = _Trainer(loss=loss)
    _train(straight, 70)
    states.append(rerun.checkpoint_state())
    rerun.start_rerun(_args(spiky=True))
    first = _Trainer(loss=loss)
    _train(first, 30)
    saved = rerun.checkpoint_state()
    rerun.start_rerun(_args(spiky=True))
    rerun.restore_checkpoint_state(saved, 30)
    resumed = _Trainer(loss=loss, step=30)
    _train(resumed, 40)
    states.append(rerun.checkpoint_state())
    assert states[0] == states[1]
    assert states[0]["ranks"][0]["large_value_counts"] == {"loss": 100}
    assert straight.seen.count(((59, 0), (59, 1))) == 2 and resumed.seen.count(((59, 0), (59, 1))) == 2


def test_iterations_to_skip_read_their_batch_and_do_not_update(single_rank):
    rerun.start_rerun(_args())
    trainer = _Trainer()
    _train(trainer, 1)
    rerun.skip_step(trainer)
    assert trainer.step == 2 and trainer.skipped_samples == 4
    _train(trainer, 1)
    assert trainer.seen == [((0, 0), (0, 1)), ((2, 0), (2, 1))]  # step 3 reads step 3's batch


def test_user_errors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--error-injection-rate -1"):
        rerun.check_rerun_flags(_args(rate=-1))
    with pytest.raises(ValueError, match="--result-rejected-tracker-filename .*cannot be appended"):
        rerun.check_rerun_flags(_args(tracker=str(tmp_path / "no" / "such" / "dir.txt")))


@pytest.mark.slow
def test_two_ranks_persistent_fault_exits_16_with_a_checkpoint_then_again_on_the_same_node(
    corpus, tmp_path, monkeypatch
):
    """The wiring: the loss function's checks, megatron DDP's (--check-for-large-grads), the rerun data
    iterator, --iterations-to-skip in the loop, the exit code and the checkpoint with the machine's state."""
    from megatron_fixedcode.checkpoint import latest_step, read_trainer_state

    ck, tracker = tmp_path / "ck", tmp_path / "rejected.txt"
    common = [
        "--train-iters",
        "6",
        "--save",
        str(ck),
        "--save-interval",
        "100",
        "--rerun-mode",
        "validate_results",
        "--error-injection-rate",
        "1",
        "--error-injection-type",
        "persistent_error",
        "--check-for-spiky-loss",
        "--check-for-large-grads",
        "--result-rejected-tracker-filename",
        str(tracker),
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        *data_args(corpus, "document_windows"),
    ]
    monkeypatch.setenv("MFC_EXIT_RECORD", str(tmp_path / "exit.json"))  # what the Slurm launchers read
    first = pretrain(*common, "--iterations-to-skip", "2", nproc=2, check=False)
    out = first.stdout + first.stderr
    assert set(re.findall(r"exitcode\s*: (\d+)", out)) == {"16"}, out[-4000:]  # each rank; torchrun says 1
    assert "skipped iteration 2 (--iterations-to-skip)" in out
    assert "exiting at step 2 with code 16" in out and "re-run step 3" in out
    assert latest_step(str(ck)) == 2
    ranks = read_trainer_state(str(ck), 2)["rerun"]["ranks"]
    assert len(ranks) == 2 and all(r["machine"]["state"] == 3 for r in ranks)  # WILL_RERUN_FROM_CHECKPOINT
    assert "FIRST_RERUN_REPRODUCIBLE" in tracker.read_text()
    record = json.loads((tmp_path / "exit.json").read_text())
    host = os.uname()[1]
    assert (record["code"], record["step"], record["max_steps"], record["stopped_by"]) == (
        16,
        2,
        6,
        "rerun state machine",
    ), record
    assert record["rerun_nodes"] and all(n.startswith(f"{host} (device ") for n in record["rerun_nodes"]), record
    second = pretrain(*common, "--load", str(ck), nproc=2, check=False)
    out = second.stdout + second.stderr
    assert set(re.findall(r"exitcode\s*: (\d+)", out)) == {"16"}, out[-4000:]
    assert "Need to restart job from the same checkpoint" in out
    assert latest_step(str(ck)) == 2


def test_a_nan_in_evaluation_is_one_error_line_not_a_traceback(single_rank):
    """Megatron-LM's evaluate validates the loss as disabled mode: fatal at once; here as NonFiniteTraining."""
    from megatron_fixedcode.training.trainer import Trainer

    rerun.start_rerun(_args())
    evaluator = _Trainer(loss=lambda n: math.nan, step=6)
    evaluator.cfg = SimpleNamespace(schedule=SimpleNamespace(eval_iters=2))
    evaluator.valid_ds, evaluator._microbatches = None, lambda ds, k: [(k, 0), (k, 1)]
    with pytest.raises(NonFiniteTraining, match=r"evaluation at step 6: rank 0: .*found NaN in local forward loss"):
        Trainer.evaluate(evaluator)
