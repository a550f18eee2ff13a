"""The process entry point and the training loop: plan the run, lock ``--save``, build the
:class:`~megatron_fixedcode.training.trainer.Trainer`, then step, evaluate and save until the
budget, a signal or a time limit ends it.

Where each decision lives (docs/training.md, "How the trainer is put together"):
``run_plan`` (before any process group: budget, resume identity, load step, what a load restores),
``trainer`` (the parts and a step, an evaluation, a save), :mod:`megatron_fixedcode.checkpoint` (the format on disk).
"""

from __future__ import annotations

import logging
import os
import signal
import time

import torch

from megatron_fixedcode.arguments.parse import PretrainConfig
from megatron_fixedcode.arguments.user_errors import let_rank0_report, traceback_requested
from megatron_fixedcode.checkpoint import CorruptCheckpoint
from megatron_fixedcode.checkpoint.save_checks import check_save_dir
from megatron_fixedcode.compat import describe_runtime, destroy_distributed
from megatron_fixedcode.models.cost import model_flops_per_token
from megatron_fixedcode.checkpoint.checkpointer import Checkpointer
from megatron_fixedcode.errors import DataError, ExportFailed, NonFiniteTraining, SaveFailed, is_collective_failure
from megatron_fixedcode.recovery.attempts import Attempts
from megatron_fixedcode.training.downstream_evals import DownstreamEvals
from megatron_fixedcode.training.exit_record import ExitRecord
from megatron_fixedcode.training.hf_export import HFExport
from megatron_fixedcode.training.progress_log import ProgressLog
from megatron_fixedcode.recovery.ft_integration import ResiliencyClient, request_no_restart, start_resiliency_client
from megatron_fixedcode.recovery.in_job_restarts import (
    InJobRestarts,
    read_attempts,
    refuse_restart,
)
from megatron_fixedcode.training.metrics import MetricsSink, matmul_precision
from megatron_fixedcode.recovery.rerun import end_on_rerun, skip_step
from megatron_fixedcode.training.run_health import RunHealth
from megatron_fixedcode.training.profiling import start_memory_history
from megatron_fixedcode.training.run_plan import RunPlan, plan_run
from megatron_fixedcode.training.run_start import log_run_start
from megatron_fixedcode.training.run_watch import RunWatch
from megatron_fixedcode.training.trainer import Trainer
from megatron_fixedcode.utils.exit_signals import end_start_up
from megatron_fixedcode.utils.locks import lock_save_dir
from megatron_fixedcode.utils.log_records import configure_megatron_logging
from megatron_fixedcode.utils.rank_agreement import any_rank

logger = logging.getLogger(__name__)


class ExitRequest:
    """Set by --exit-signal (default SIGTERM, as Megatron-LM) under --exit-signal-handler; acted
    on at the next step boundary."""

    def __init__(self, enabled: bool, exit_signal: str = "SIGTERM"):
        self.flag = False
        end_start_up()  # the start-up's exit-at-once handlers end here, whatever --exit-signal is
        if enabled:
            signal.signal(signal.Signals[exit_signal], self._handle)

    def _handle(self, signum, frame):
        logger.warning("received signal %d: saving a checkpoint at the end of this step", signum)
        self.flag = True


def run_pretraining(cfg: PretrainConfig) -> int:
    """Train; the exit code (and, for a launcher, the exit record) says how it ended."""
    configure_megatron_logging()  # LEVEL:logger.name:message, as Megatron-LM's log checks read them
    with ExitRecord() as last_word:  # after basicConfig, which does nothing once the root logger has a handler
        code = _run_pretraining(cfg, last_word)
        if code in (2, 17):  # a restart cannot fix a user error or a reproduced fault (the launcher ends the job)
            request_no_restart(f"exit {code}: {last_word.error or 'see the log'}")
        last_word.write(code)
        return code


def _run_pretraining(cfg: PretrainConfig, last_word: ExitRecord) -> int:
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its INFO lines drown ours
    if int(os.environ.get("RANK", "0")) == 0:
        logger.info("%s", describe_runtime())
    rank0 = int(os.environ.get("RANK", "0")) == 0
    save_lock = None
    client = None
    attempts = read_attempts(cfg.checkpoint.save)  # this job's attempts so far (in-job restarts)
    try:
        plan = plan_run(cfg)  # every rank decides alike, before any process group: one line, on rank 0
        refused = refuse_restart(attempts, rank0)  # an in-job restart that cannot help: at once
        if refused is not None:
            return refused
        if cfg.checkpoint.save and not cfg.schedule.skip_train and os.environ.get("LOCAL_RANK", "0") == "0":
            check_save_dir(
                cfg.checkpoint.save, rank0
            )  # a read-only filesystem or a path under a file: now, not at the first save
            if cfg.checkpoint.non_persistent_ckpt_type == "local":
                check_save_dir(cfg.checkpoint.non_persistent_local_ckpt_dir, rank0, "--non-persistent-local-ckpt-dir")
        if rank0 and cfg.checkpoint.save:
            # One job writes a --save directory at a time: a second one is refused naming the holder;
            # the kernel drops the lock of a killed run, so the next run takes it over.
            save_lock = lock_save_dir(cfg.checkpoint.save)
        client = start_resiliency_client(cfg)  # --enable-ft-package: its "setup" section from here
    except (ValueError, FileNotFoundError) as e:
        if rank0:
            logger.error("%s", e, exc_info=traceback_requested())
        else:
            let_rank0_report()
        return 2
    last_word.max_steps = plan.max_steps
    try:
        return _train(cfg, plan, last_word, client, attempts)
    finally:
        if save_lock is not None:
            save_lock.release()


def _train(
    cfg: PretrainConfig,
    plan: RunPlan,
    last_word: ExitRecord | None = None,
    client: ResiliencyClient | None = None,
    attempts: Attempts | None = None,
) -> int:
    rank0 = int(os.environ.get("RANK", "0")) == 0
    restarts = InJobRestarts(  # attempts, goodput, the resiliency package's sections
        client,
        attempts if attempts is not None else read_attempts(cfg.checkpoint.save),
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
    )
    try:
        start_memory_history(cfg.watch)  # --record-memory-history: before the model is built (profiling.py)
        try:
            ready = None if cfg.schedule.skip_train else restarts.process_group_ready
            trainer = Trainer(cfg, plan, on_process_group=ready)
        except BaseException as e:  # a peer lost while starting (loading): this attempt fails, counted
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or not is_collective_failure(e):
                raise
            code = restarts.failed(e)
            restarts.end(code, last_word)
            return code
        if not rank0:
            logging.getLogger().setLevel(logging.WARNING)
        return train(trainer, last_word, restarts=restarts)
    except (DataError, SaveFailed, CorruptCheckpoint) as e:  # every rank raises them alike (see where they are raised)
        if rank0:
            logger.error("%s", e, exc_info=traceback_requested())
        return 2
    except NonFiniteTraining as e:
        if rank0 or e.local:
            logger.error("%s", e, exc_info=traceback_requested())
        return 3
    except ExportFailed as e:  # rank 0 only, once training and saving are done
        logger.error("%s", e, exc_info=traceback_requested())
        return 4
    finally:
        destroy_distributed()


def _metrics_sink(trainer: Trainer, flops_per_token: float) -> MetricsSink:
    """The iteration lines, metrics.jsonl, TensorBoard and W&B of this run (rank 0 writes)."""
    cfg = trainer.cfg
    return MetricsSink(
        cfg.logging,
        enabled=trainer.ranks["rank"] == 0,
        max_steps=trainer.max_steps,
        flops_per_token=flops_per_token,
        num_gpus=trainer.ranks["world_size"] if torch.cuda.is_available() else 1,
        run_config=cfg.as_dict(),
        global_batch=trainer.global_batch,
        matmul=matmul_precision(cfg.performance.precision, trainer.tf32),
        code=trainer.identity["code_fingerprint"],
        log_throughput=cfg.logging.log_throughput,
        wandb_run_id=trainer.wandb_run_id,
        start_step=None if cfg.schedule.skip_train else trainer.step,
    )


def _checkpointer(trainer: Trainer, flops_per_token: float, restarts: InJobRestarts) -> Checkpointer:
    """The run's one owner of saves, with the hand-offs of a complete checkpoint: Megatron-LM's progress.txt
    (--log-progress), the downstream evaluation jobs (--downstream-eval-*), the Hugging Face export."""
    cfg, rank0 = trainer.cfg, trainer.ranks["rank"] == 0
    progress = ProgressLog(
        cfg.checkpoint.save,
        enabled=bool(cfg.logging and cfg.logging.log_progress),
        rank0=rank0,
        world_size=trainer.ranks["world_size"],
        flops_per_sample=flops_per_token * cfg.schedule.seq_length,
        seq_length=cfg.schedule.seq_length,
    )
    return Checkpointer(
        trainer,
        restarts.saving,  # the fault-tolerance "checkpointing" section around every save
        progress=progress,
        downstream=DownstreamEvals(trainer),
        export=HFExport(cfg.checkpoint, rank0),
    )


def _evaluate_only(trainer: Trainer, sink: MetricsSink) -> int:
    """``--skip-train``: load, evaluate once, exit."""
    record = {"step": trainer.step, "tokens": trainer.tokens, **trainer.evaluate()}
    if trainer.ranks["rank"] == 0:
        logger.info(
            "evaluation at step %d: val loss %.6f ppl %.3f", trainer.step, record["val_loss"], record["val_ppl"]
        )
    if sink.metrics_file:
        sink.metrics_file.write(record)
    sink.close()
    return 0


def _evaluation_due(trainer: Trainer) -> bool:
    schedule = trainer.cfg.schedule
    return bool(
        trainer.valid_ds is not None
        and schedule.eval_interval
        and schedule.eval_iters
        and (trainer.step % schedule.eval_interval == 0 or trainer.step == trainer.max_steps)
    )


def train(trainer: Trainer, last_word: ExitRecord | None = None, restarts: InJobRestarts | None = None) -> int:
    """Step until the budget (``max_steps``), a signal, ``--exit-duration-in-mins`` or
    ``--exit-interval``; evaluate and save on their intervals and always at the end. A collective that
    fails (a peer died or hung) ends this attempt with exit 1: the elastic launcher restarts the group."""
    if restarts is None:  # one attempt, no launcher: its goodput only
        r = trainer.ranks
        restarts = InJobRestarts(None, read_attempts(trainer.cfg.checkpoint.save), r["rank"], r["world_size"])
    try:
        code = _train_loop(trainer, last_word, restarts)
    except BaseException as e:  # torch's CheckpointException from a save is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)) or not is_collective_failure(e):
            raise
        code = restarts.failed(e)
    restarts.end(code, last_word)
    return code


def _train_loop(trainer: Trainer, last_word: ExitRecord | None, restarts: InJobRestarts) -> int:
    cfg, ck = trainer.cfg, trainer.cfg.checkpoint
    rank0 = trainer.ranks["rank"] == 0
    if rank0:
        log_run_start(trainer)
    flops_per_token = model_flops_per_token(
        trainer.report, trainer.model_cfg.num_layers, trainer.model_cfg.hidden_size, cfg.schedule.seq_length
    )
    sink = _metrics_sink(trainer, flops_per_token)
    health = RunHealth(trainer, sink, flops_per_token)  # --log-params-norm, timers, --manual-gc (run_health.py)
    saves = _checkpointer(trainer, flops_per_token, restarts)  # every save, its store and waits (checkpointer.py)
    health.start()
    saves.start()
    if cfg.schedule.skip_train:
        return _evaluate_only(trainer, sink)
    exit_request = ExitRequest(ck.exit_signal_handler, ck.exit_signal)
    watch = RunWatch(trainer, flops_per_token)  # straggler detector, weight hashes, profiler (run_watch.py)
    watch.start()
    restarts.start(trainer)
    started = time.time()
    while trainer.step < trainer.max_steps:
        saves.poll()
        if trainer.step + 1 in trainer.iterations_to_skip:  # Megatron-LM: read its batch, no update, log or save
            skip_step(trainer)
            continue
        watch.before_step()
        restarts.before_step()
        record = trainer.train_step()
        if "rerun_exit" in record:  # the rerun state machine's verdict: save (or not) and exit with its code
            sink.close()
            code = end_on_rerun(trainer, saves, record, last_word)
            watch.close()
            saves.close()  # its checkpoint complete before the exit (the launcher requeues on 16)
            return code
        health.after_step(record)
        restarts.after_step(record)
        if _evaluation_due(trainer):
            stop = lambda: any_rank(exit_request.flag, trainer.device)  # noqa: E731
            record.update(health.evaluate(stop=stop, around_batch=restarts.evaluation_batch))
        sink.record(record)
        if trainer.step % cfg.logging.log_interval == 0 and rank0:
            sink.scalars({"goodput": restarts.goodput()}, trainer.step)
        health.after_record(trainer.step)
        watch.after_step(record)
        timed_out = ck.exit_duration_in_mins is not None and (time.time() - started) / 60 >= ck.exit_duration_in_mins
        stop = any_rank(exit_request.flag or timed_out, trainer.device) or bool(
            ck.exit_interval and trainer.step % ck.exit_interval == 0
        )
        last = stop or trainer.step == trainer.max_steps
        if saves.after_step(last):  # the save due, if any (checkpoint/checkpointer.py)
            # A signal that came during the save (seconds, at scale) would otherwise cost one
            # more step and one more save inside the grace window: this checkpoint is the last.
            stop = stop or any_rank(exit_request.flag, trainer.device)
        if stop:
            reason = "signal" if exit_request.flag else "--exit-duration-in-mins" if timed_out else "--exit-interval"
            if rank0:
                logger.info("exiting at step %d (%s)", trainer.step, reason)
            if last_word is not None and trainer.step < trainer.max_steps:
                last_word.stopped_by = reason
            break
    watch.close()
    try:  # the last step saved, the save in flight complete (a requeued job resumes from it), the final export done
        saves.finish()
    finally:
        sink.close()
    if last_word is not None:
        last_word.step, last_word.max_steps = trainer.step, trainer.max_steps
    if rank0:
        logger.info(
            "done: step %d, %d prediction targets (budget %s)", trainer.step, trainer.tokens, cfg.schedule.train_tokens
        )
    return 0
