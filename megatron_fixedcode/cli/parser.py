"""User errors of the command lines, one line each, exit code 2: an ``argparse.ArgumentParser`` whose
own errors read ``prog: error: ...``, and :func:`user_errors` for the library's ``ValueError``."""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before an error; a user needs the error and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.replace(chr(10), ' ')} (see --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        sys.exit(status)


def user_errors(main: Callable[..., int]) -> Callable[..., int]:
    """The library raises ``ValueError`` for input a user can fix (it names the file, line or
    flag): print it as ``error: ...`` and return exit code 2 instead of a traceback."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return wrapped
