"""The Slurm launchers of examples/ run with --dry-run outside Slurm: their environment and what they print."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO as ROOT

EXAMPLES = ROOT / "examples"


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # this venv's python first
    env.update(
        {
            "DATA_PATH": "/data/shard_000_train_text_document /data/shard_001_train_text_document",
            "VALID_DATA_PATH": "/data/valid_text_document",
            "TOKENIZER": "/tok/tokenizer.json",
            "FINEWEB_PREFIX": "/data/fineweb",
            "COSMOPEDIA_PREFIX": "/data/cosmopedia",
            "CKPT_DIR": str(tmp_path / "ckpt"),
            "LOG_DIR": str(tmp_path / "logs"),
            "TENSORBOARD_DIR": "",  # the CPU venv has no tensorboard; the default is checked separately
            "PYTHONWARNINGS": "ignore",
            "MFC_REQUIRE_CUDA": "0",  # runs here start the trainer on CPU; the launcher's default (1) is checked separately
            **extra,
        }
    )
    return env


def run_dry(script: str, args: list[str], env: dict[str, str]) -> tuple[list[str], dict, str]:
    """(launch command as argv, the printed resolved config, stderr) of a launcher's --dry-run."""
    out = subprocess.run(
        ["bash", str(EXAMPLES / script), *args, "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    command = shlex.split(lines[lines.index("# command:") + 1])
    config = json.loads(lines[lines.index("# resolved config:") + 1])
    return command, config, out.stderr
