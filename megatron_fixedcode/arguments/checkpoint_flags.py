"""Megatron-LM's checkpoint flags that act (core_v0.16.1's names, dests and defaults): saving, loading, keeping
and exporting checkpoints, what a resume restores, and the exit conditions of a long run. Read after parsing as
:class:`CheckpointConfig`."""

from __future__ import annotations

import argparse
import importlib.util
import dataclasses
import os
import signal

from megatron_fixedcode.arguments.config_fields import converted, from_dests, renamed


def _signal(text: str) -> signal.Signals:
    """SIGTERM / TERM / 15 -> signal.SIGTERM (Megatron-LM's parser gives the enum too; JSON prints 15)."""
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
        )
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a signal: {text!r} (e.g. SIGTERM, SIGUSR1, 15)") from None
    return sig


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints and exits")
    g.add_argument(
        "--override-opt_param-scheduler",
        "--override-opt-param-scheduler",
        dest="override_opt_param_scheduler",
        action="store_true",
        help="on resume, use this run's LR schedule flags instead of the checkpoint's",
    )
    g.add_argument(
        "--use-checkpoint-opt_param-scheduler",
        "--use-checkpoint-opt-param-scheduler",
        dest="use_checkpoint_opt_param_scheduler",
        action="store_true",
        help="on resume, keep the checkpoint's LR schedule whatever this run's flags say",
    )
    g.add_argument(
        "--no-dist-ckpt-optim-fully-reshardable",
        dest="dist_ckpt_optim_fully_reshardable",
        action="store_false",
        default=True,
        help="save the distributed optimizer's state in megatron's dp_reshardable format (no gather "
        "at save time, but a resume keeps Adam's state only on the same TP and PP sizes); "
        "default here: fully_reshardable, which resumes on any layout (docs/training.md)",
    )
    g.add_argument(
        "--dist-ckpt-optim-fully-reshardable",
        dest="dist_ckpt_optim_fully_reshardable",
        action="store_true",
        help="Megatron-LM's flag for this project's default",
    )
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
    g.add_argument(
        "--save-retain-interval",
        type=int,
        default=None,
        help="keep only checkpoints whose step is a multiple of N, and the newest (default: keep all)",
    )
    g.add_argument(
        "--no-load-optim",
        action="store_true",
        default=None,
        help="resume without the optimizer's state (Adam moments start fresh)",
    )
    g.add_argument("--no-load-rng", action="store_true", default=None, help="resume without the saved RNG states")
    g.add_argument(
        "--exit-signal",
        type=_signal,
        default=signal.SIGTERM,
        help="the signal --exit-signal-handler catches (e.g. SIGUSR1 for Slurm's --signal=B:USR1@300)",
    )
    g.add_argument(
        "--non-persistent-save-interval",
        type=int,
        default=None,
        help="steps between non-persistent checkpoints: frequent, cheap, only the newest kept; a resume "
        "loads the newest complete one of these and the persistent ones (Megatron-LM)",
    )
    g.add_argument(
        "--non-persistent-ckpt-type",
        choices=("global", "local"),
        default=None,
        help="global: a directory of its own on the shared filesystem; local: each rank's file in node-local "
        "storage (--non-persistent-local-ckpt-dir, nvidia-resiliency-ext's manager), which a restart on the same "
        "nodes loads",
    )
    g.add_argument(
        "--non-persistent-global-ckpt-dir",
        default=None,
        help="where global non-persistent checkpoints go (default SAVE/non_persistent, as Megatron-LM)",
    )
    g.add_argument(
        "--non-persistent-local-ckpt-dir",
        default=None,
        help="local non-persistent checkpoints' node-local directory (each rank writes DIR/RANK/)",
    )
    g.add_argument(
        "--non-persistent-local-ckpt-algo",
        choices=("fully_parallel", "atomic"),
        default="fully_parallel",
        help="local non-persistent checkpoints: fully_parallel spreads the replicated tensors over the data-parallel "
        "ranks (one copy in all); atomic: each rank saves all it holds",
    )


NON_PERSISTENT_SUBDIR = "non_persistent"  # Megatron-LM's _NON_PERSISTENT_CKPT_SUBDIR


def refuse_non_persistent(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The non-persistent flags together (before anything starts)."""
    if a.non_persistent_save_interval is None:
        if a.non_persistent_ckpt_type or a.non_persistent_global_ckpt_dir or a.non_persistent_local_ckpt_dir:
            p.error(
                "--non-persistent-ckpt-type/--non-persistent-global-ckpt-dir/--non-persistent-local-ckpt-dir act "
                "with --non-persistent-save-interval"
            )
        return
    if a.non_persistent_save_interval < 1:
        p.error(f"--non-persistent-save-interval must be >= 1, got {a.non_persistent_save_interval}")
    if a.non_persistent_ckpt_type is None:
        p.error("--non-persistent-save-interval needs --non-persistent-ckpt-type global or local (Megatron-LM's pair)")
    if not a.save:
        p.error("--non-persistent-save-interval saves checkpoints: it needs --save")
    if a.non_persistent_ckpt_type == "global" and a.non_persistent_local_ckpt_dir:
        p.error("--non-persistent-local-ckpt-dir acts with --non-persistent-ckpt-type local, not global")
    if a.non_persistent_ckpt_type != "local":
        return
    if a.non_persistent_global_ckpt_dir:
        p.error("--non-persistent-global-ckpt-dir acts with --non-persistent-ckpt-type global, not local")
    if not a.non_persistent_local_ckpt_dir:  # Megatron-LM's assertion
        p.error("--non-persistent-ckpt-type local needs --non-persistent-local-ckpt-dir (node-local storage)")
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:  # Megatron-LM's RuntimeError, before any rank
        p.error("--non-persistent-ckpt-type local needs nvidia-resiliency-ext (pip install 'megatron-fixedcode[ft]')")


def _signal_name(value) -> str:
    return signal.Signals(value).name


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    save: str | None
    load: str | None
    save_interval: int | None
    keep_last: int | None = renamed("ckpt_keep_last")  # None: keep every checkpoint (Megatron-LM)
    load_step: int | None = renamed("ckpt_step")
    finetune: bool
    exit_duration_in_mins: float | None
    exit_signal_handler: bool
    exit_interval: int | None
    override_opt_param_scheduler: bool = False
    use_checkpoint_opt_param_scheduler: bool = False
    verify: bool = renamed("verify_checkpoint", default=True)  # --no-verify-checkpoint: load without the checksums
    exit_signal: str = converted(_signal_name, default="SIGTERM")
    retain_interval: int | None = renamed("save_retain_interval", default=None)
    no_load_optim: bool = converted(bool, default=False)
    no_load_rng: bool = converted(bool, default=False)
    async_save: bool = False
    use_persistent_ckpt_worker: bool = False  # --async-save's writer (without it --async-save is off)
    fully_reshardable: bool = renamed("dist_ckpt_optim_fully_reshardable", default=True)
    hf_export_interval: int | None = None  # a Hugging Face export of every N-th checkpoint, in the background
    hf_export_dir: str | None = None
    non_persistent_save_interval: int | None = None  # cheap checkpoints between persistent ones, newest kept
    non_persistent_ckpt_type: str | None = None  # "global" (shared filesystem) or "local" (node-local, per rank)
    non_persistent_global_ckpt_dir: str | None = None  # default SAVE/non_persistent
    non_persistent_local_ckpt_dir: str | None = None  # the local type's node-local directory
    non_persistent_local_ckpt_algo: str = "fully_parallel"

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "CheckpointConfig":
        return from_dests(cls, a)

    def non_persistent_dir(self, root: str | None = None) -> str | None:
        """Where global non-persistent checkpoints of ``root`` (default --save) go and are looked for: the
        flag's directory, else ROOT/non_persistent (Megatron-LM's); None when there are none."""
        root = self.save if root is None else root
        if self.non_persistent_global_ckpt_dir:
            return self.non_persistent_global_ckpt_dir
        return None if root is None else os.path.join(root, NON_PERSISTENT_SUBDIR)
