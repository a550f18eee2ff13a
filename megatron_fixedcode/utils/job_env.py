"""The environment of a job the trainer starts on its own (a downstream evaluation, a Hugging Face export):
the trainer's without what makes a process one rank of the trainer's launch.

torchrun gives its workers ``TORCHELASTIC_USE_AGENT_STORE=True``: a child that inherits it opens its one-process
TCP store as a client of an agent store that does not exist and waits out the process-group timeout. The Slurm
launchers' ``MFC_*`` files (exit record, stop file, node log) are the training job's: a child that wrote or read
them would speak for the trainer. ``MFC_LAUNCH_TOKEN`` marks the processes of one node's launch, which the node
script ends when the launch ends (recovery/job_processes.py): a job that outlives the training must not carry it."""

from __future__ import annotations

import os

_RANK_VARIABLES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MFC_EXIT_RECORD",
        "MFC_STOP_FILE",
        "MFC_NODE_LOG_DIR",
        "MFC_LAUNCH_TOKEN",
    }
)
_RANK_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


def standalone_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) less the launch's rank and launcher variables."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k not in _RANK_VARIABLES and not k.startswith(_RANK_PREFIXES)}
