"""An ``argparse.ArgumentParser`` whose user errors are one line (``prog: error: ...``), exit code 2."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before an error; a user needs the error and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.replace(chr(10), ' ')} (see --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        sys.exit(status)
