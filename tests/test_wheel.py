"""``pip install`` of the wheel gives working commands, as a user meets them: the wheel is built
from a copy of the sources and installed **with its dependencies** (pip resolves them from the
index) into a fresh venv where only torch and megatron-core are already installed, as on a cluster.
From a temporary directory, with nothing of the checkout on the path: every command answers ``-h``;
a tokenizer is trained, a corpus indexed, a tiny model trained, exported to Hugging Face and
evaluated (``--load`` with the core; ``--hf-model`` first refused in one line naming the ``hf``
extra, then run after ``pip install 'wheel[hf]'``).

torch and megatron-core sit in a base venv cached per (Python, torch, megatron-core) under
``${MFC_VENV_CACHE:-~/.cache/megatron-fixedcode}`` (built once, ~2 min; torch is large); the fresh
venv sees it through a ``.pth`` file, so pip counts them as installed and installs the rest.
"""
from __future__ import annotations

import configparser
import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

TORCH = os.environ.get("MFC_WHEEL_TORCH", "torch==2.13.0")
MCORE = os.environ.get("MFC_WHEEL_MCORE", "megatron-core==0.16.1")
PIP = ["-m", "pip", "--disable-pip-version-check", "-q"]
TEXT = ("The binary code replaces the embedding table. Each token id becomes its bits, tiled across the "
        "model width. A learned table is the control. ") * 40


def _run(cmd: list[str], ctx: dict, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=ctx["env"], cwd=ctx["cwd"], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def _site_packages(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _base_venv() -> Path:
    """A venv with only torch and megatron-core (and what they require), built once and reused."""
    cache = Path(os.environ.get("MFC_VENV_CACHE", Path.home() / ".cache" / "megatron-fixedcode"))
    tag = f"py{sys.version_info[0]}.{sys.version_info[1]}-{TORCH}-{MCORE}".replace("==", "-")
    base = cache / f"wheel-base-{tag}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"wheel-base-{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers and concurrent checkouts build it once
        if not (base / ".mfc-ready").is_file():
            shutil.rmtree(base, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(base)], check=True, timeout=300)
            py = base / "bin" / "python"
            subprocess.run([str(py), *PIP, "install", TORCH], check=True, timeout=1800)  # torch first: no CUDA build pulled in
            subprocess.run([str(py), *PIP, "install", TORCH, MCORE], check=True, timeout=1800)
            (base / ".mfc-ready").write_text(f"{TORCH} {MCORE}\n")
    return base


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
    subprocess.run([sys.executable, *PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
                    str(src)], check=True, cwd=root, capture_output=True, timeout=300)
    wheel = next((root / "dist").glob("megatron_fixedcode-*.whl"))
    base = _base_venv()
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    Path(_site_packages(python), "_mfc_base.pth").write_text(_site_packages(base / "bin" / "python") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    work = root / "elsewhere"
    work.mkdir()
    ctx = {"env": env, "cwd": work, "wheel": wheel, "python": python}
    _run([str(python), *PIP, "install", str(wheel)], ctx, timeout=1200)  # pip resolves the dependencies
    return venv, ctx


def _scripts() -> list[str]:
    import tomllib

    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def test_wheel_carries_data_and_scripts(installed):
    venv, ctx = installed
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
    out = _run([str(ctx["python"]), "-c", probe], ctx).stdout.split()
    assert out[0].startswith(_site_packages(ctx["python"])) and out[1:] == ["True", "True"]
    for script in _scripts():  # each is one short process: -h parses before importing torch
        proc = _run([str(venv / "bin" / script), "-h"], ctx, timeout=300)
        assert "usage:" in proc.stdout, (script, proc.stderr)


def test_installed_analyze_code_and_dry_run(installed):
    venv, ctx = installed
    proc = _run([str(venv / "bin" / "mfc-analyze-code"), "--vocab-size", "49152", "--hidden-size", "2048", "--json"], ctx)
    assert json.loads(proc.stdout)["K"] == 16 and json.loads(proc.stdout)["collisions"] == 0, proc.stderr
    recipe = Path(_site_packages(ctx["python"])) / "megatron_fixedcode" / "recipes" / "tiny_cpu.yaml"
    proc = _run([str(venv / "bin" / "mfc-pretrain"), "--config", str(recipe), "--dry-run"], ctx)
    assert '"num_layers"' in proc.stdout, proc.stderr


def test_installed_tool_trains_exports_and_evaluates(installed):
    """The first commands a user runs, each from the installed wheel with only its core dependencies."""
    venv, ctx = installed
    bin_ = venv / "bin"
    work = ctx["cwd"]
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}. {TEXT}"}) + "\n" for i in range(24)))
    (work / "text").mkdir()
    (work / "text" / "doc.txt").write_text(TEXT)
    _run([str(bin_ / "mfc-train-tokenizer"), "--input", str(work / "text"), "--output", "tok", "--vocab-size", "300"], ctx)
    _run([str(bin_ / "mfc-preprocess-data"), "--input", str(corpus), "--output-prefix", "data/corpus",
          "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok", "--append-eod", "--workers", "1"], ctx)
    prefix = str(work / "data" / "corpus_train_text_document")
    assert Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()
    recipe = Path(_site_packages(ctx["python"])) / "megatron_fixedcode" / "recipes" / "tiny_cpu.yaml"
    _run([str(bin_ / "mfc-pretrain"), "--config", str(recipe), "--data-path", prefix, "--tokenizer-model", "tok",
          "--split", "90,10,0", "--train-iters", "2", "--eval-iters", "1", "--seq-length", "32", "--micro-batch-size", "2",
          "--global-batch-size", "2", "--save", "ckpt", "--save-interval", "2"], ctx)
    _run([str(bin_ / "mfc-convert-checkpoint-to-hf"), "--load", "ckpt", "--output", "hf"], ctx)
    assert (work / "hf" / "config.json").is_file()
    out = json.loads(_run([str(bin_ / "mfc-evaluate"), "--load", "ckpt", "--text-files", "text/doc.txt", "--json"],
                          ctx).stdout)
    assert out["tokens"] > 0 and out["loss"] > 0
    # --hf-model needs transformers: without the extra, one line naming it
    proc = _run([str(bin_ / "mfc-evaluate"), "--hf-model", "hf", "--text-files", "text/doc.txt", "--json"], ctx,
                check=False)
    assert proc.returncode == 2 and "pip install 'megatron-fixedcode[hf]'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    _run([str(ctx["python"]), *PIP, "install", f"{ctx['wheel']}[hf]"], ctx, timeout=1200)
    hf = json.loads(_run([str(bin_ / "mfc-evaluate"), "--hf-model", "hf", "--text-files", "text/doc.txt",
                          "--seq-length", "32", "--json"], ctx).stdout)
    assert hf["tokens"] > 0 and abs(hf["loss"] - out["loss"]) < 1e-3 * out["loss"], (hf, out)
