"""The trainer's log records as Megatron-LM's runs write them: ``LEVEL:logger.name:message`` (the
logging module's default format, which ``megatron/training/training.py`` keeps by calling
``logging.basicConfig`` with a handler and no format), with torch.distributed's records dropped as
its ``log_handler.CustomHandler`` drops them. Megatron-LM's functional tests and users' log parsers
grep for that prefix (``check_log -F "WARNING:megatron.core.rerun_state_machine:..."``).

One difference, on purpose: the records go to stderr, where this trainer has always written them (its
launchers merge stderr into the node log and Slurm's output, as they do stdout); Megatron-LM writes
them to stdout."""

from __future__ import annotations

import logging
import sys

DROPPED_LOGGERS = ("torch.distributed",)  # Megatron-LM's BLACKLISTED_MODULES


class MegatronLogHandler(logging.StreamHandler):
    """A stream handler without torch.distributed's records."""

    def __init__(self, stream=None):
        super().__init__(stream=sys.stderr if stream is None else stream)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(DROPPED_LOGGERS) and super().filter(record)


def configure_megatron_logging(level: int = logging.INFO) -> None:
    """Megatron-LM's ``logging.basicConfig(handlers=[CustomHandler()], level=INFO)``; like basicConfig, it
    does nothing when the root logger already has a handler (a test's, an embedding program's)."""
    logging.basicConfig(handlers=[MegatronLogHandler()], level=level)
