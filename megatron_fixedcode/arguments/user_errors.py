"""User errors of the command lines, one line each, exit code 2: an ``argparse.ArgumentParser`` whose
own errors read ``prog: error: ...``, and :func:`user_errors` for the library's ``ValueError``.
``MFC_TRACEBACK=1`` in the environment prints the full traceback above that line (every command, every
rank): for an error that is a bug of ours rather than an input to fix."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback
from typing import Callable, NoReturn, TextIO

from megatron_fixedcode.utils.files import DiskFull, is_disk_full


RANK0_REPORT_GRACE_S = 30.0
TRACEBACK_ENV = "MFC_TRACEBACK"


def traceback_requested() -> bool:
    """``MFC_TRACEBACK`` set to anything but empty, 0, false or no."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def report_error(e: BaseException, stream: TextIO | None = None) -> None:
    """``error: <message>`` on one line; with ``MFC_TRACEBACK=1`` the traceback first."""
    stream = stream or sys.stderr
    if traceback_requested():
        traceback.print_exception(e, file=stream)
    print(f"error: {e}", file=stream)


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def let_rank0_report() -> None:
    """A rank other than 0 that found the same user error as rank 0 waits before exiting: the
    launcher (torchrun, srun --kill-on-bad-exit) stops every rank when the first one exits, and
    that must be rank 0 after printing its one line. Bounded, in case rank 0 saw other files."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        time.sleep(RANK0_REPORT_GRACE_S)


class ArgumentParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before an error; a user needs the error and where help is."""

    def error(self, message: str) -> NoReturn:
        if not is_rank0():  # under torchrun every rank parses alike: rank 0 speaks for all
            let_rank0_report()
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {message.replace(chr(10), ' ')} (see --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        sys.exit(status)


def user_errors(main: Callable[..., int]) -> Callable[..., int]:
    """The library raises ``ValueError`` for input a user can fix (it names the file, line or
    flag), and a full disk is one too: print it as ``error: ...`` and return exit code 2 instead of a
    traceback (shown with ``MFC_TRACEBACK=1``)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except (ValueError, DiskFull) as e:
            report_error(e)
            return 2
        except OSError as e:  # a full disk where no caller named what it was writing
            if not is_disk_full(e):
                raise
            report_error(DiskFull(e.filename or os.getcwd(), e, "what was written before is as it was"))
            return 2

    return wrapped
