"""A small tmpfs for the full-disk tests: root mounts it; elsewhere (or in a container that may not
mount) the test skips, naming why."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(directory: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("filling a disk needs a tmpfs mount (root)")
    directory.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if res.returncode != 0:  # a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)])
