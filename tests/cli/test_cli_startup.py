"""Every command answers ``-h`` and refuses a bad flag without importing torch, megatron.core,
transformers or lm_eval (they take seconds to import; parsing needs none of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

HEAVY = ("torch", "megatron.core", "transformers", "lm_eval")
COMMANDS = [str(p.relative_to(REPO)) for p in sorted((REPO / "tools").glob("*.py"))] + [
    "megatron_fixedcode.pretrain",
    "megatron_fixedcode.quickstart_pipeline",
]
# Runs one command in this interpreter, then reports its exit code and which heavy modules it imported.
PROBE = """
import json, runpy, sys
target = sys.argv[1]
sys.argv = [target] + sys.argv[2:]
code = 0
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.__stdout__)
""" % (HEAVY,)


def _probe(command: str, *args: str) -> tuple[dict, str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, command, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout, proc.stderr


def test_commands_listed():
    assert len(COMMANDS) >= 10 and "tools/preprocess_data.py" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_import_light(command):
    result, out, err = _probe(command, "-h")
    assert result == {"code": 0, "heavy": []}, (result, err)
    assert "usage:" in out and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_flag_is_one_line_exit_2(command):
    result, _, err = _probe(command, "--no-such-flag")
    assert result == {"code": 2, "heavy": []}, (result, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and lines[0].endswith("(see --help)"), err


def test_pretrain_dry_run_is_import_light():
    """A dry run validates a recipe on a login node without torch."""
    result, out, err = _probe("megatron_fixedcode.pretrain", "--config", "examples/recipes/tiny_cpu.yaml", "--dry-run")
    assert result == {"code": 0, "heavy": []}, (result, err)
