"""The code passes the linter and the formatter the project configures (pyproject.toml [tool.ruff]):
unused imports and names, undefined names, ambiguous names, whitespace; ``ruff format``'s layout."""

from __future__ import annotations

import shutil
import subprocess

from tests.helpers import REPO


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    res = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_format_leaves_the_code_as_it_is():
    """Run ``ruff format .`` to lay out what this names."""
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    res = subprocess.run([ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
