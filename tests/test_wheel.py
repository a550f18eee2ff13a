"""``pip install .`` gives working commands from any directory: the wheel carries the console
scripts, the recipes, the local eval tasks and the C++ kernel source, and reads nothing from the
checkout. Built offline (``--no-build-isolation``, this environment's setuptools) from a copy of
the sources, installed with ``--target`` beside the already installed torch/megatron-core."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    # symlinks=False: the recipe and task links are copied as the files they point to
    shutil.copytree(REPO / "megatron_fixedcode", src / "megatron_fixedcode", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)],
                   check=True, cwd=root, capture_output=True, timeout=300)
    wheel = next((root / "dist").glob("megatron_fixedcode-*.whl"))
    target = root / "site"
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, cwd=root, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    work = root / "elsewhere"
    work.mkdir()
    return target, {"env": env, "cwd": work, "wheel": wheel}


def _scripts() -> list[str]:
    import tomllib

    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def test_wheel_carries_data_and_scripts(installed):
    target, ctx = installed
    names = set(zipfile.ZipFile(ctx["wheel"]).namelist())
    for needed in ("megatron_fixedcode/kernels/fixed_code_cpu.cpp", "megatron_fixedcode/recipes/tiny_cpu.yaml",
                   "megatron_fixedcode/eval/tasks/fixedcode_local.yaml", "megatron_fixedcode/eval/tasks/local_data.py",
                   "megatron_fixedcode/export/modeling_fixedcode.py"):
        assert needed in names, needed
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    parser = configparser.ConfigParser()
    parser.read_string(zipfile.ZipFile(ctx["wheel"]).read(entry).decode())
    assert sorted(parser["console_scripts"]) == _scripts() and len(_scripts()) >= 10
    probe = ("import megatron_fixedcode, megatron_fixedcode.quickstart_pipeline as q, megatron_fixedcode.eval.harness as h;"
             "print(megatron_fixedcode.__file__, q.TINY_RECIPE.is_file(), (h.LOCAL_TASKS_DIR / 'fixedcode_local.yaml').is_file())")
    out = subprocess.run([sys.executable, "-c", probe], env=ctx["env"], cwd=ctx["cwd"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0].startswith(str(target)) and out[1:] == ["True", "True"]


@pytest.mark.parametrize("script", _scripts())
def test_installed_command_answers_help(installed, script):
    target, ctx = installed
    proc = subprocess.run([str(target / "bin" / script), "-h"], env=ctx["env"], cwd=ctx["cwd"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


def test_installed_analyze_code_and_dry_run(installed):
    target, ctx = installed
    proc = subprocess.run([str(target / "bin" / "mfc-analyze-code"), "--vocab-size", "49152", "--hidden-size", "2048",
                           "--json"], env=ctx["env"], cwd=ctx["cwd"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["K"] == 16 and json.loads(proc.stdout)["collisions"] == 0, proc.stderr
    recipe = target / "megatron_fixedcode" / "recipes" / "tiny_cpu.yaml"
    proc = subprocess.run([str(target / "bin" / "mfc-pretrain"), "--config", str(recipe), "--dry-run"],
                          env=ctx["env"], cwd=ctx["cwd"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and '"num_layers"' in proc.stdout, proc.stderr
