"""The repository itself: no merge leftovers or editor backups tracked, and the trainer's layout
keeps its layers (the run plan decides without a process group)."""

import ast
import fnmatch
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRAY_PATTERNS = ("*.orig", "*.rej", "*~", "*.bak", "*.swp", "*.swo", ".#*", "#*#", "*.pyc")


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.splitlines()


def test_no_stray_files_are_tracked():
    stray = [f for f in _tracked_files() if any(fnmatch.fnmatch(Path(f).name, p) for p in STRAY_PATTERNS)]
    assert stray == [], f"merge leftovers or editor backups tracked: {stray}"


def test_the_stray_file_check_catches_a_merge_leftover():
    assert any(fnmatch.fnmatch("evaluate.py.orig", p) for p in STRAY_PATTERNS)
    assert any(fnmatch.fnmatch("loop.py~", p) for p in STRAY_PATTERNS)
    assert not any(fnmatch.fnmatch("loop.py", p) for p in STRAY_PATTERNS)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_run_plan_decides_without_a_process_group():
    """The run plan is pure decisions on flags and checkpoint metadata: it imports neither
    torch.distributed nor the trainer (the trainer imports it)."""
    pkg = ROOT / "megatron_fixedcode"
    for module in ("training/run_plan.py", "training/runtime_checks.py", "arguments/memory_estimate.py"):
        imported = _imports(pkg / module)
        assert "torch.distributed" not in imported, module
        assert not {"megatron_fixedcode.training.trainer", "megatron_fixedcode.training.loop"} & imported, module
