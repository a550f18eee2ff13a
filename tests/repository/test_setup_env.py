"""scripts/setup_env.sh's stages: one line each on success (pip's banners and warnings hidden), the
command's whole output and its exit code on failure."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO


def _stage(*command: str) -> subprocess.CompletedProcess:
    script = (REPO / "scripts" / "setup_env.sh").read_text()
    function = re.search(r"^stage\(\) \{.*?^\}$", script, re.S | re.M).group(0)
    return subprocess.run(
        ["bash", "-c", function + '\nstage "$@"', "bash", *command], capture_output=True, text=True, timeout=30
    )


def test_a_stage_that_works_is_one_line():
    proc = _stage("install demo", "sh", "-c", "echo 'WARNING: a banner'; echo noise >&2")
    assert proc.returncode == 0 and proc.stdout == ""
    assert re.fullmatch(r"setup_env: install demo \.\.\. \d+ s\n", proc.stderr), proc.stderr


def test_a_failing_stage_shows_its_output_and_exit_code():
    proc = _stage("install demo", "sh", "-c", "echo 'ERROR: No matching distribution for torch==9.9'; exit 3")
    assert proc.returncode == 3
    first, *rest = proc.stderr.splitlines()
    assert re.fullmatch(r"setup_env: install demo \.\.\. FAILED \(exit 3 after \d+ s\):", first), first
    assert rest == ["ERROR: No matching distribution for torch==9.9"]
