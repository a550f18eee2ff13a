"""Exit signals over a run's two phases. During start-up (data, model, checkpoint load, kernel
build) there is nothing new to checkpoint, so SIGTERM/SIGUSR1 end the rank at once with exit 0
and the next run starts from the last checkpoint. Once the loop runs, it hands these signals back
(:func:`end_start_up`) and catches only Megatron-LM's ``--exit-signal`` (training/loop.py's
ExitRequest), which finishes the step and saves. Import-light: the entry point installs it before
its imports take seconds."""

from __future__ import annotations

import os
import signal
import sys

_BEFORE_START_UP: dict[signal.Signals, object] = {}  # the handler each signal had before start-up took it


def _exit_at_once(signum, frame) -> None:
    print(f"received signal {signum} during start-up: nothing to checkpoint yet, exiting", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)


def _start_up_signals() -> set[signal.Signals]:
    """TERM, USR1 and the launcher's --exit-signal (``MFC_EXIT_SIGNAL``, set by the Slurm launchers)."""
    signals = {signal.SIGTERM, signal.SIGUSR1}
    name = os.environ.get("MFC_EXIT_SIGNAL", "")
    if name in signal.Signals.__members__:
        signals.add(signal.Signals[name])
    return signals


def exit_at_once_until_training() -> None:
    for sig in _start_up_signals():
        _BEFORE_START_UP.setdefault(sig, signal.signal(sig, _exit_at_once))  # a second call keeps the first
    # A rank that started after the launcher signalled the job's steps missed that signal; the launcher
    # wrote its stop file first (examples/slurm_common.sh), so the signal or the file reaches every rank.
    stop_file = os.environ.get("MFC_STOP_FILE")
    if stop_file and os.path.exists(stop_file):
        print(
            f"the launcher asked the job to stop ({stop_file}) before this rank started: nothing to checkpoint "
            "yet, exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(0)


def end_start_up() -> None:
    """Give each start-up signal back the handler it had before (ignored under the Slurm launchers,
    the default elsewhere): a signal other than --exit-signal must not end a training rank with exit 0."""
    while _BEFORE_START_UP:
        sig, handler = _BEFORE_START_UP.popitem()
        signal.signal(sig, handler)


def launcher_signals(exit_signal: str | None = None) -> set[signal.Signals]:
    """What a launcher sends every process of a job step: TERM (scancel, preemption), INT, USR1 and the
    trainer's --exit-signal (``exit_signal``, else ``MFC_EXIT_SIGNAL``)."""
    signals = _start_up_signals() | {signal.SIGINT}
    if exit_signal in signal.Signals.__members__:
        signals.add(signal.Signals[exit_signal])
    return signals


def ignore_launcher_signals(exit_signal: str | None = None) -> None:
    """In a helper process of a rank (checkpoint writer, data worker): the rank alone acts on the launcher's
    signals (it finishes the step and saves through its helpers); a helper that died of one would take the
    save down with it."""
    for sig in launcher_signals(exit_signal):
        signal.signal(sig, signal.SIG_IGN)
