"""The code passes the linter the project configures (pyproject.toml [tool.ruff]): unused imports and
names, undefined names, ambiguous names, whitespace."""
from __future__ import annotations

import shutil
import subprocess

from tests.helpers import REPO


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    res = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]

