"""Megatron-LM's checkpoint and logging flags that act (core_v0.16.1's names, dests and defaults): saving,
loading, keeping and exporting checkpoints, the exit conditions of a long run, metrics, TensorBoard, W&B,
timers and the downstream evaluations of checkpoints. Read after parsing through ``CheckpointConfig``,
``LoggingConfig`` and ``DownstreamConfig`` (``training_configs.py``, ``downstream_flags.py``)."""

from __future__ import annotations

import argparse

from megatron_fixedcode.arguments.downstream_flags import add_downstream_args


def add_checkpoint_and_logging_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save", default=None, help="checkpoint directory to write")
    g.add_argument("--load", default=None, help="checkpoint directory to resume from")
    g.add_argument(
        "--save-interval",
        "--persistent-save-interval",
        dest="save_interval",
        type=int,
        default=None,
        help="steps between checkpoints",
    )
    g.add_argument(
        "--ckpt-keep-last",
        type=int,
        default=None,
        help="delete all but the newest N checkpoints (default: keep all, as Megatron-LM)",
    )
    g.add_argument("--ckpt-step", type=int, default=None, help="load this iteration instead of the latest")
    g.add_argument(
        "--no-verify-checkpoint",
        dest="verify_checkpoint",
        action="store_false",
        help="load --load without checking its recorded checksums (a checkpoint whose record is missing "
        "or incomplete is refused otherwise)",
    )
    g.add_argument(
        "--hf-export-interval",
        type=int,
        default=None,
        help="also write a Hugging Face export of every N-th saved checkpoint (and the last)",
    )
    g.add_argument("--hf-export-dir", default=None, help="where the exports go: DIR/iter_0000N (default SAVE/hf)")
    g.add_argument(
        "--finetune",
        action="store_true",
        help="load only the model weights from --load (any layout) and start at step 0",
    )
    g.add_argument("--exit-duration-in-mins", type=int, default=None, help="save and exit after this many minutes")
    g.add_argument(
        "--exit-signal-handler", action="store_true", help="on --exit-signal, save at the end of the step and exit"
    )
    g.add_argument("--exit-interval", type=int, default=None, help="save and exit at a step that is a multiple of N")
    g.add_argument(
        "--async-save",
        action="store_true",
        help="with --use-persistent-ckpt-worker (else off, as Megatron-LM): write the checkpoint files in "
        "a background worker while training goes on; 'latest' moves once every rank's files and "
        "checksums are complete, checked at each step; a save, the run's end, a signal or a time "
        "limit waits for the one in flight",
    )
    g.add_argument(
        "--use-persistent-ckpt-worker",
        action="store_true",
        help="--async-save's writer: one persistent process per rank (megatron-core's), which dies with it",
    )
    g = p.add_argument_group("logging")
    g.add_argument("--log-interval", type=int, default=100, help="steps between log lines")
    g.add_argument("--eval-interval", type=int, default=None, help="steps between evaluations (default: none)")
    g.add_argument("--eval-iters", type=int, default=100, help="global batches per evaluation")
    g.add_argument("--skip-train", action="store_true", help="load, evaluate once, exit")
    g.add_argument("--tensorboard-dir", default=None, help="TensorBoard event directory (Megatron-LM's tags)")
    g.add_argument("--metrics-file", default=None, help="JSON Lines file: one record per step")
    g.add_argument("--wandb-project", default=None, help="W&B project (needs wandb)")
    g = p.add_argument_group("run health (Megatron-LM's log lines and TensorBoard tags; docs/training.md)")
    g.add_argument(
        "--log-params-norm",
        action="store_true",
        help="'params norm' in the iteration line, TensorBoard 'params-norm' (each weight counted once)",
    )
    g.add_argument(
        "--log-num-zeros-in-grad",
        action="store_true",
        help="'num zeros' (gradient entries equal to zero) in the iteration line, TensorBoard 'num-zeros'",
    )
    g.add_argument(
        "--log-memory-to-tensorboard",
        action="store_true",
        help="TensorBoard 'mem-reserved-bytes', 'mem-allocated-bytes', 'mem-max-allocated-bytes' (CUDA); "
        "'mem-rss-bytes' on the CPU",
    )
    g.add_argument(
        "--timing-log-level",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="megatron-core timers: 0 save/evaluate, 1 + the step's phases, 2 + compute and batches",
    )
    g.add_argument(
        "--timing-log-option",
        choices=("max", "minmax", "all"),
        default="minmax",
        help="the timers' lines: max over ranks, (min, max), or every rank",
    )
    g.add_argument(
        "--log-timers-to-tensorboard",
        action="store_true",
        help="each timer as TensorBoard '<name>-time' (max over ranks) every --log-interval",
    )
    g.add_argument(
        "--log-progress",
        action="store_true",
        help="append Megatron-LM's job and checkpoint lines (throughput, FLOPs, tokens) to SAVE/progress.txt",
    )
    g.add_argument(
        "--distributed-timeout-minutes",
        type=int,
        default=10,
        help="timeout of the process groups' collectives (torch's and megatron-core's groups)",
    )
    add_downstream_args(p)
