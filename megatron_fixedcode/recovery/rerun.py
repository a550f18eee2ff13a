"""Megatron-LM's rerun state machine (megatron-core's ``RerunStateMachine``), wired as Megatron-LM's
``training.py`` and ``pretrain_gpt.py`` wire it: ``--rerun-mode``, the NaN/Inf and spiky-loss checks of
the loss function, megatron DDP's gradient checks (``--check-for-large-grads``), fault injection
(``--error-injection-rate/-type``), the result-rejected tracker file and ``--iterations-to-skip``.

A step's forward-backward runs while the state machine asks for it (a re-run replays the same
microbatches from the :class:`RerunDataIterator`); then it says whether to save and exit, with its exit
codes (16: resume to decide, 17: failed validation). Beyond Megatron-LM, whatever the spike detector
keeps (its counts and maxima, per rank) goes into every checkpoint and is restored on load, so a
resumed run judges the next step as the straight run would.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.distributed as dist
from megatron.core.rerun_state_machine import (
    Call,
    Caller,
    RerunDataIterator,
    RerunDiagnostic,
    RerunErrorInjector,
    RerunMode,
    RerunState,
    RerunStateMachine,
    destroy_rerun_state_machine,
    get_rerun_state_machine,
    initialize_rerun_state_machine,
)
from megatron.core.tensor_parallel import get_cuda_rng_tracker

from megatron_fixedcode.arguments.health_flags import HealthConfig
from megatron_fixedcode.errors import NonFiniteTraining

logger = logging.getLogger(__name__)
machine_logger = logging.getLogger("megatron.core.rerun_state_machine")

SPIKY_LOSS_FACTOR = 10  # Megatron-LM's pretrain_gpt.py: a loss 10x the largest observed is spiky
MODES = {
    "disabled": RerunMode.DISABLED,
    "validate_results": RerunMode.VALIDATE_RESULTS,
    "report_stats": RerunMode.REPORT_DETERMINISM_STATS,
}
_CHECKS = {"nan": False, "spiky": False}  # what the loss function validates (Megatron-LM reads get_args())
_FLAGS = ("rerun_requested", "checkpoint_requested", "restart_again_requested", "continue_requested")


def check_rerun_flags(health: HealthConfig) -> None:
    """User errors, before anything is built (a ValueError: one line on rank 0, exit code 2)."""
    if health.error_injection_rate < 0:
        raise ValueError(f"--error-injection-rate {health.error_injection_rate}: give 0 (no injection) or more")
    if health.result_rejected_tracker_filename:
        try:
            with open(health.result_rejected_tracker_filename, "a"):
                pass
        except OSError as e:
            raise ValueError(
                f"--result-rejected-tracker-filename {health.result_rejected_tracker_filename}: "
                f"cannot be appended to ({e.strerror})"
            ) from None


def _report_stats(self: RerunStateMachine) -> None:
    """megatron-core >= 0.20's ``_maybe_report_stats``: 0.16's names the caller's file and line, which its
    ``Caller`` no longer has (an AttributeError every other step under report_stats)."""
    if self.current_iteration % RerunStateMachine.REPORTING_INTERVAL_ITERATIONS:
        return
    gathered = [None] * dist.get_world_size()
    dist.gather_object(dict(self.stats), gathered if dist.get_rank() == 0 else None)
    if dist.get_rank() != 0:
        for stats in self.stats.values():
            stats.reset()
        return
    machine_logger.info("Stats on computation determinism in validation calls")
    for caller in {c for s in gathered for c in s}:
        self.stats[caller].combine([s[caller] for s in gathered[1:] if s.get(caller)])
        machine_logger.info(f"  From validation call '{caller.message}':")
        machine_logger.info(f"    {self.stats[caller].print_stats()}")


if "filename" not in Caller._fields:
    RerunStateMachine._maybe_report_stats = _report_stats


def start_rerun(health: HealthConfig) -> tuple[int, ...]:
    """megatron-core's state machine for this run (Megatron-LM's ``initialize_megatron``); the iterations to
    skip: ``--iterations-to-skip`` and those the tracker file names (Megatron-LM's validate_args)."""
    destroy_rerun_state_machine()  # one per process; an in-process test may build several trainers
    machine_logger.setLevel(logging.INFO)  # its verdicts and report_stats' lines (megatron's INFO is hidden)
    tracker = get_cuda_rng_tracker()
    initialize_rerun_state_machine(
        state_save_func=lambda: {"rng_tracker_states": tracker.get_states()},
        state_restore_func=lambda s: s["rng_tracker_states"] and tracker.set_states(s["rng_tracker_states"]),
        mode=MODES[health.rerun_mode],
        error_injector=RerunErrorInjector(
            error_injection_rate=health.error_injection_rate,
            error_injection_type=RerunDiagnostic(health.error_injection_type),
        ),
        result_rejected_tracker_filename=health.result_rejected_tracker_filename,
    )
    _CHECKS.update(nan=health.check_for_nan_in_loss_and_grad, spiky=health.check_for_spiky_loss)
    tracked = (
        RerunStateMachine.get_skipped_iterations_from_tracker_file(health.result_rejected_tracker_filename)
        if health.result_rejected_tracker_filename
        else []
    )
    return (*health.iterations_to_skip, *tracked)


def validate_loss(loss: torch.Tensor) -> None:
    """Megatron-LM's ``loss_func`` checks of this rank's microbatch loss, before any all-reduce.
    Outside a training step (evaluation) the machine validates as disabled, as Megatron-LM's evaluate."""
    if not (_CHECKS["nan"] or _CHECKS["spiky"]):
        return
    m = get_rerun_state_machine()
    mode = m.mode
    if m.state == RerunState.NOT_RUNNING_YET:
        m.mode = RerunMode.DISABLED
    try:
        if _CHECKS["nan"]:
            m.validate_result(
                result=loss,
                rejection_func=torch.isnan,
                tolerance=0.0,
                fatal=True,
                message="found NaN in local forward loss calculation",
            )
            m.validate_result(
                result=loss,
                rejection_func=torch.isinf,
                tolerance=0.0,
                fatal=True,
                message="found Inf in local forward loss calculation",
            )
        if _CHECKS["spiky"]:
            m.validate_result(
                result=loss,
                rejection_func=functools.partial(m.is_unexpectedly_large, threshold=SPIKY_LOSS_FACTOR, context="loss"),
                message="Spiky loss",
                tolerance=0.0,
                fatal=False,
            )
    finally:
        m.mode = mode


class StepBatches:
    """The trainer's microbatches in order, step after step, from step ``step`` on (a sample is a pure
    function of its index, so this is the whole data iterator's state)."""

    def __init__(self, fetch, step: int):
        self.fetch, self.step, self.pending = fetch, step, []

    def __iter__(self):
        return self

    def __next__(self):
        if not self.pending:
            self.pending = list(self.fetch(self.step))
            self.step += 1
        return self.pending.pop(0)


def train_iterator(trainer) -> RerunDataIterator:
    return RerunDataIterator(StepBatches(lambda step: trainer._microbatches(trainer.train_ds, step), trainer.step))


def as_non_finite(e: RuntimeError, where: str, consequence: str) -> RuntimeError:
    """A fatal NaN/Inf check's RuntimeError (megatron's, raised on the rank that saw it) as one error line
    (NonFiniteTraining: exit 3, no traceback); any other error as it is."""
    if "found NaN" not in str(e) and "found Inf" not in str(e):
        return e
    return NonFiniteTraining(
        f"{where}: {e}; {consequence} (--no-check-for-nan-in-loss-and-grad to train on)", local=True
    )


def forward_backward_step(trainer) -> tuple[float, float, str | None, tuple[bool, bool, int]]:
    """Megatron-LM's train_step up to the optimizer: (loss, targets, sample digest, (save, exit, exit code))."""
    m = get_rerun_state_machine()
    loss = targets = float("nan")
    samples = None
    while m.should_run_forward_backward(trainer.train_iter):
        for chunk in trainer.chunks:
            chunk.zero_grad_buffer()
        trainer.optimizer.zero_grad()
        microbatches = [next(trainer.train_iter) for _ in range(trainer.num_microbatches)]
        try:
            loss, targets, samples = trainer._run(microbatches, forward_only=False)
        except RuntimeError as e:  # a fatal check under --rerun-mode disabled (the loss's or megatron DDP's)
            raise as_non_finite(
                e,
                f"step {trainer.step + 1}: rank {trainer.ranks['rank']}",
                "stopping before the optimizer step, nothing of this step is saved",
            ) from None
    return loss, targets, samples, m.should_checkpoint_and_exit()


def skip_step(trainer) -> None:
    """``--iterations-to-skip``: the step reads its batch (Megatron-LM's dummy_train_step) and counts, but
    neither the model, the optimizer nor the LR schedule moves."""
    for _ in range(trainer.num_microbatches):
        next(trainer.train_iter)
    trainer.train_iter.advance()
    trainer.step += 1
    get_rerun_state_machine().current_iteration += 1  # its iteration numbers stay the steps' (tracker file)
    trainer.skipped_samples = getattr(trainer, "skipped_samples", 0) + trainer.global_batch
    if trainer.ranks["rank"] == 0:
        logger.info(
            "skipped iteration %d (--iterations-to-skip): its batch is read, the model is not updated; "
            "skipped samples: %d",
            trainer.step,
            trainer.skipped_samples,
        )


def checkpoint_state() -> dict:
    """Every rank's spike statistics (and, mid-rerun, the machine's state), gathered for the common state."""
    m = get_rerun_state_machine()
    mine = {"large_value_counts": dict(m.large_value_counts), "max_values": dict(m.max_values)}
    if m.state == RerunState.WILL_RERUN_FROM_CHECKPOINT:  # exit code 16: the resume re-runs the step
        call = m.failed_validation_call
        mine["machine"] = {
            "mode": m.mode.value,
            "state": m.state.value,
            "current_iteration": m.current_iteration,
            **{k: getattr(m, k) for k in _FLAGS},
            "error_injector": {k: getattr(v, "value", v) for k, v in m.error_injector.state_dict().items()},
            "failed_validation_call": None if call is None else [call.caller.message, call.caller.rank, call.sequence],
            "initial_result": None if m.initial_result is None else float(m.initial_result),
            "suspicious_node": m.suspicious_node,
            "suspicious_device": str(m.suspicious_device),
        }
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {"ranks": ranks}


def restore_from(trainer, resumed: dict | None) -> RerunDataIterator:
    """After the trainer's load: the state saved with the checkpoint resumed from (``resumed``, its trainer state:
    None for a fresh start or a --finetune), and the data iterator from the trainer's step on."""
    saved = None
    if resumed:
        saved, layout = resumed.get("rerun"), resumed.get("layout")
        if saved and layout and layout != {k: trainer.ranks[k] for k in layout}:
            # Megatron-LM's rule: on another world size, TP/PP or DP size the machine's state is ignored
            if trainer.ranks["rank"] == 0:
                logger.warning(
                    "rerun state machine: saved on layout %s, resumed on %s: its state is ignored (spike "
                    "statistics start afresh)",
                    layout,
                    {k: trainer.ranks[k] for k in layout},
                )
            saved = None
    restore_checkpoint_state(saved, trainer.step)
    return train_iterator(trainer)


def restore_checkpoint_state(saved: dict | None, step: int) -> None:
    """This rank's share of :func:`checkpoint_state` (same world size only), and Megatron-LM's
    ``current_iteration = iteration`` after a load."""
    m = get_rerun_state_machine()
    m.current_iteration = step
    ranks = (saved or {}).get("ranks") or []
    if len(ranks) != dist.get_world_size():
        if ranks and dist.get_rank() == 0:
            logger.warning(
                "rerun state machine: saved by %d ranks, resumed on %d: spike statistics start afresh",
                len(ranks),
                dist.get_world_size(),
            )
        return
    mine = ranks[dist.get_rank()]
    m.large_value_counts, m.max_values = dict(mine["large_value_counts"]), dict(mine["max_values"])
    m.first_iteration_complete = step > 0  # a checkpoint exists: the next step is judged as in the straight run
    machine = mine.get("machine")
    if machine is None or m.mode == RerunMode.DISABLED:
        return
    logger.warning("rerun state machine: resuming mid-rerun (state %s): re-running step %d", machine["state"], step + 1)
    m.mode, m.state, m.current_iteration = RerunMode(machine["mode"]), RerunState(machine["state"]), step
    for k in _FLAGS:
        setattr(m, k, machine[k])
    inj = machine["error_injector"]
    m.error_injector.load_state_dict(
        {
            "error_injection_rate": inj["error_injection_rate"],
            "error_injection_type": RerunDiagnostic(inj["error_injection_type"]),
            "injected_error_type": inj["injected_error_type"] and RerunDiagnostic(inj["injected_error_type"]),
        }
    )
    call = machine["failed_validation_call"]
    m.failed_validation_call = (
        None if call is None else Call(caller=Caller(message=call[0], rank=call[1]), sequence=call[2])
    )
    m.initial_result = None if machine["initial_result"] is None else torch.tensor(machine["initial_result"])
    m.suspicious_node = machine["suspicious_node"]
    device = machine["suspicious_device"]
    m.suspicious_device = int(device) if device.isdigit() else device


def suspicious_nodes() -> list[str]:
    """The hosts (and devices) where the machine found a reproducible unexpected result, from every rank (a
    collective): where exit 16's resume must not run again."""
    m = get_rerun_state_machine()
    mine = None if m.suspicious_node is None else f"{m.suspicious_node} (device {m.suspicious_device})"
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return sorted({r for r in ranks if r})


def end_on_rerun(trainer, saves, record: dict, last_word=None) -> int:
    """Megatron-LM's ``should_checkpoint_and_exit``: the checkpoint of the step before this one (with the
    machine's state when the step is to be re-run after a resume), then its exit code; the exit record
    (``last_word``) gets the step, what stopped it and, for 16, the node the resume must avoid."""
    if record["rerun_save"] and trainer.cfg.checkpoint.save:
        saves.save(final=True)  # the run's Checkpointer (checkpoint/checkpointer.py)
    nodes = suspicious_nodes()
    if last_word is not None:
        last_word.step, last_word.max_steps = trainer.step, trainer.max_steps
        last_word.stopped_by, last_word.rerun_nodes = "rerun state machine", nodes
    if trainer.ranks["rank"] == 0:
        logger.error(
            "exiting at step %d with code %d (rerun state machine, --rerun-mode %s)%s",
            trainer.step,
            record["rerun_exit"],
            trainer.cfg.health.rerun_mode,
            "; resume from the checkpoint saved to re-run step %d" % (trainer.step + 1)
            if record["rerun_exit"] == 16 and record["rerun_save"]
            else "",
        )
        if record["rerun_exit"] == 16 and nodes:
            logger.warning(
                "rerun state machine: the unexpected result was reproducible on %s: the resume must run step %d "
                "on another GPU to tell a transient fault from a persistent one",
                ", ".join(nodes),
                trainer.step + 1,
            )
    return record["rerun_exit"]
